"""TreeEngine on tiny models: greedy equals autoregressive, the chain as a one-child tree, compaction,
one sync per step, sampled outputs distributed as the target (exact enumeration), bad input."""
import pytest
import torch

import specdec_lab as sl
from specdec_lab.analysis.syncs import count_host_syncs
from specdec_lab.core.kv_cache import KVCache
from specdec_lab.core.sampling import logits_to_probs
from specdec_lab.lab import lossless
from specdec_lab.tree.compact import compact, compact_reference
from specdec_lab.tree.draft import DynamicTree
from specdec_lab.tree.engine import TreeEngine

PROMPTS = [[1, 2, 3], [5], [7, 7, 7, 7, 2, 9]]
TREES = [(1,), (4, 2, 1), (2, 2, 2), (3,), DynamicTree(3, 3, 8), DynamicTree(4, 2, 6)]


@pytest.fixture(scope="module")
def target():
    return sl.tiny_model(0)


@pytest.fixture(scope="module")
def draft(target):
    # A draft that agrees with the target part of the time: the target with noise on its head.
    d = sl.tiny_model(0)
    with torch.no_grad():
        d.head.weight.add_(torch.randn(d.head.weight.shape, generator=torch.Generator().manual_seed(1)) * 0.4)
    return d


@pytest.mark.parametrize("cache", ["contiguous", "paged"])
@pytest.mark.parametrize("tree", TREES, ids=str)
def test_greedy_tree_output_equals_autoregressive(target, draft, tree, cache):
    engine = TreeEngine(target, draft, tree=tree, cache=cache, block_size=4)
    accepted = 0
    for prompt in PROMPTS:
        base = sl.autoregressive_generate(target, prompt, max_new_tokens=30).tokens
        res = engine.generate(prompt, max_new_tokens=30)
        assert res.tokens == base, f"{tree}: greedy tree decoding diverged from the target's own"
        accepted += res.stats.accepted
    assert accepted > 0, "the test draft never agreed: the tree paths were not exercised"


def test_the_target_as_its_own_draft_accepts_the_full_depth(target):
    res = TreeEngine(target, target, tree=(4, 2, 1)).generate([1, 2, 3], max_new_tokens=41)
    assert all(s.num_accepted == 3 for s in res.steps[:-1]), [s.num_accepted for s in res.steps]
    # A dynamic tree keeps the best-scored paths: the draft's argmax child of the root always, and the
    # full greedy path only where it outscores the budget's other candidates.
    res = TreeEngine(target, target, tree=DynamicTree(3, 3, 8)).generate([1, 2, 3], max_new_tokens=41)
    assert all(s.num_accepted >= 1 for s in res.steps[:-1]), [s.num_accepted for s in res.steps]
    assert res.stats.mean_tokens_per_step > 2.5


@pytest.mark.parametrize("k", [1, 3, 5])
def test_a_one_child_tree_gives_the_chain_engines_outputs_and_logits(target, draft, k):
    chain = sl.SpeculativeEngine(target, draft, k=k)
    tree = TreeEngine(target, draft, tree=(1,) * k)
    for prompt in PROMPTS:
        a, b = chain.generate(prompt, max_new_tokens=25), tree.generate(prompt, max_new_tokens=25)
        assert a.tokens == b.tokens
        assert [s.num_accepted for s in a.steps] == [s.num_accepted for s in b.steps], "acceptance differs"
    # The verification forward itself: the chain's default K+1 mask and the tree's mask give the same logits.
    x = torch.tensor([[4, 8, 15, 16, 23, 42][:k + 1]])
    c1, c2 = KVCache.for_model(target.cfg, 64), KVCache.for_model(target.cfg, 64)
    for c in (c1, c2):
        target(torch.tensor([[1, 2, 3]]), cache=c)
    from specdec_lab.tree.structure import Tree, positions, static_parents, tree_mask
    parents, depth = static_parents((1,) * k)
    t = Tree(x[0], parents, depth, k)
    want = target(x, cache=c1)
    got = target(x, input_pos=positions(t, 3), cache=c2, mask=tree_mask(t, 3))
    assert torch.equal(want, got)


def test_compact_equals_its_reference():
    a = KVCache(2, 1, 2, 16, 4)
    a.k.copy_(torch.randn(a.k.shape))
    a.v.copy_(torch.randn(a.v.shape))
    a.length = 12
    b = KVCache(2, 1, 2, 16, 4)
    b.k.copy_(a.k), b.v.copy_(a.v)
    b.length = 12
    compact(a, torch.tensor([5, 7, 11]), 5)
    compact_reference(b, [5, 7, 11], 5)
    assert torch.equal(a.k, b.k) and torch.equal(a.v, b.v) and a.length == b.length == 8


def keys_values(cache):
    """A cache's committed keys and values, (L, Hkv, length, D) each, contiguous or paged."""
    if hasattr(cache, "paged"):
        return (torch.stack([cache.keys(i)[0] for i in range(cache.n_layers)]),
                torch.stack([cache.values(i)[0] for i in range(cache.n_layers)]))
    return cache.k[:, 0, :, :cache.length], cache.v[:, 0, :, :cache.length]


@pytest.mark.parametrize("cache", ["contiguous", "paged"])
@pytest.mark.parametrize("tree", [(4, 2, 1), DynamicTree(3, 3, 8)], ids=str)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_after_compaction_the_caches_hold_what_a_plain_forward_over_the_text_holds(target, draft, tree, temperature,
                                                                                    cache):
    engine = TreeEngine(target, draft, tree=tree, cache=cache, block_size=4)
    checked = []

    def check(rec, out):
        text = [1, 2, 3] + out
        assert engine.cache.length == len(text) - 1, "the target holds every committed token but the last (c)"
        assert engine.drafter.cache.length + len(engine.drafter.pending) == len(text)
        for model, kv in ((target, engine.cache), (draft, engine.drafter.cache)):
            fresh = KVCache.for_model(model.cfg, 64)
            model(torch.tensor([text[:kv.length]]), cache=fresh)
            for got, want in zip(keys_values(kv), keys_values(fresh)):
                torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
        checked.append(rec.num_accepted)

    engine.generate([1, 2, 3], max_new_tokens=60, temperature=temperature, seed=0,
                    on_step=lambda rec, out: None if len(out) >= 40 else check(rec, out))
    assert len(checked) >= 5 and max(checked) >= (2 if temperature == 0 else 1), f"accepted per step: {checked}"


@pytest.mark.parametrize("cache", ["contiguous", "paged"])
@pytest.mark.parametrize("tree", [(3, 2), DynamicTree(3, 2, 5)], ids=str)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_step_reads_the_device_once_counted_from_outside(target, draft, tree, temperature, cache):
    engine = TreeEngine(target, draft, tree=tree, cache=cache, block_size=4)
    seen = []
    with count_host_syncs() as syncs:
        res = engine.generate([1, 2, 3], max_new_tokens=30, temperature=temperature, seed=0,
                              on_step=lambda rec, out: seen.append(syncs.count))
    per_step = [b - a for a, b in zip(seen, seen[1:])]
    assert len(per_step) >= 5 and set(per_step) == {1}, f"syncs per step, counted: {per_step}"
    assert all(r.syncs == 1 for r in res.steps)


# --------------------------------------------------------------------------- sampled: exact enumeration

V = 5
SHAPE = dict(vocab_size=V, dim=16, n_heads=2, n_kv_heads=1, eos_token_ids=(10 ** 6,))


@pytest.fixture(scope="module")
def small_pair():
    t, d = sl.tiny_model(3, **SHAPE), sl.tiny_model(4, **SHAPE)
    with torch.no_grad():
        d.head.weight.mul_(0.3)  # a weak draft: rejections are common
    return t, d


@pytest.mark.parametrize("tree,rule,temperature,top_k,top_p", [
    ((2, 2), "sampled", 1.0, 0, 1.0),
    ((3, 1), "sampled", 0.7, 0, 0.8),
    ((2, 2), "deterministic", 1.3, 3, 1.0),
    (DynamicTree(2, 2, 4), "deterministic", 1.0, 0, 0.9),
], ids=str)
def test_sampled_tree_decoding_is_distributed_as_the_target(small_pair, tree, rule, temperature, top_k, top_p):
    target, draft = small_pair
    probs = lossless.exact_sequence_probs(target, [1, 2], 2, temperature, top_k, top_p)
    engine = TreeEngine(target, draft, tree=tree, rule=rule)
    counts = lossless.sample_sequences(engine, [1, 2], 2, 1500, temperature, top_k, top_p)
    result = lossless.chi_square_test(counts, probs)
    assert result.impossible == 0 and result.pvalue > 1e-3, f"not distributed as the target: {result}"


def test_typical_acceptance_through_the_engine_is_not_distributed_as_the_target(small_pair):
    target, draft = small_pair
    probs = lossless.exact_sequence_probs(target, [1, 2], 2, 1.0)
    engine = TreeEngine(target, target, tree=(2, 2), rule="typical")
    counts = lossless.sample_sequences(engine, [1, 2], 2, 1500, 1.0)
    assert lossless.chi_square_test(counts, probs).pvalue < 1e-4, "typical acceptance passed: the test has no power"


# --------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("kwargs,match", [
    (dict(tree=(0, 2)), "shape"),
    (dict(tree=[4, 2]), "tree must be"),
    (dict(tree=DynamicTree(2, 2, 4), rule="sampled"), "static tree"),
    (dict(rule="greedy"), "rule must be"),
    (dict(max_seq_len=1), "max_seq_len"),
    (dict(cache="ring"), "cache must be"),
    (dict(cache="paged", block_size=0), "block_size"),
])
def test_bad_options_are_refused_with_their_value(target, draft, kwargs, match):
    with pytest.raises(ValueError, match=match):
        TreeEngine(target, draft, **kwargs)


def test_a_bad_dynamic_tree_and_a_bad_draft_are_refused(target):
    with pytest.raises(ValueError, match="budget"):
        DynamicTree(2, 2, 99)
    with pytest.raises(TypeError, match="draft must be"):
        TreeEngine(target, "draft")


def test_a_failed_generate_leaves_the_engine_usable(target, draft):
    engine = TreeEngine(target, draft, tree=(2, 2), max_seq_len=40)
    with pytest.raises(ValueError, match="exceeds the cache capacity"):
        engine.generate([1, 2, 3], max_new_tokens=60)
    base = sl.autoregressive_generate(target, [1, 2, 3], max_new_tokens=20).tokens
    assert engine.generate([1, 2, 3], max_new_tokens=20).tokens == base


def test_a_one_child_trees_acceptance_by_depth_is_the_chains_exact_one():
    """From a fixed context, P(m >= 1) = sum min(p_1, q_1) and P(m >= 2) = sum_x min(p_1, q_1)(x) alpha_2(x):
    a tree that accepted less than this would still be lossless, and only slower."""
    T, V = 0.7, 64
    t = sl.tiny_model(0, vocab_size=V, eos_token_ids=(10 ** 6,))
    d = sl.tiny_model(0, vocab_size=V, eos_token_ids=(10 ** 6,))
    with torch.no_grad():
        d.head.weight.add_(torch.randn(d.head.weight.shape, generator=torch.Generator().manual_seed(1)) * 0.05)
        probs = lambda m, ids: logits_to_probs(m(torch.tensor(ids))[:, -1], T)  # noqa: E731
        prompt = [0, 7, 3]
        a1 = torch.minimum(probs(t, [prompt])[0], probs(d, [prompt])[0])  # (V,)
        rows = [prompt + [x] for x in range(V)]
        a2 = torch.minimum(probs(t, rows), probs(d, rows)).sum(-1)  # (V,)
    exact = [a1.sum().item(), (a1 * a2).sum().item()]
    engine, n = TreeEngine(t, d, tree=(1, 1, 1, 1)), 1500
    m = [engine.generate(prompt, max_new_tokens=6, temperature=T, seed=s).steps[0].num_accepted for s in range(n)]
    got = [sum(x >= 1 for x in m) / n, sum(x >= 2 for x in m) / n]
    assert got == pytest.approx(exact, abs=0.05), f"acceptance by depth {got}, exact {exact}"
