"""Fixed shapes (gpt-fast's design) and torch.compile, installed from outside (compiled/): the same
tokens and logits as the eager path, one shape per forward kind for a whole generation, and three
compiled graphs for a speculative pair."""
import copy

import pytest
import torch

from specdec_lab.api import SpeculativeEngine, autoregressive_generate
from specdec_lab.compiled import (StaticKVCache, StaticRows, compiled_twin, graph_counts, runner,
                                  use_static_shapes)
from specdec_lab.core.kv_cache import KVCache
from specdec_lab.core.masks import verification_mask
from specdec_lab.io.pair import tiny_model

PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]


def pair(static=False, compile=False, k=4, **kw):
    target = tiny_model(seed=0, vocab_size=64, dim=64, n_layers=2, **kw)
    draft = tiny_model(seed=1, vocab_size=64, dim=32, n_layers=1, n_heads=2, n_kv_heads=1, **kw)
    if static:
        use_static_shapes(target, compile=compile, rows=(1, k + 1) if compile else None)
        use_static_shapes(draft, compile=compile, rows=(1,) if compile else None)
    return target, draft


def test_the_runner_names_the_forward_and_makes_the_caches():
    model = tiny_model(seed=0)
    assert model.forward_kind == "eager" and type(model.new_cache(16)) is KVCache
    use_static_shapes(model, capacity=64)
    assert model.forward_kind == "static" and model.fixed_shapes
    cache = model.new_cache(16)
    assert isinstance(cache, StaticKVCache) and cache.capacity == 64, "every cache has the runner's capacity"
    assert not cache.k.is_inference(), "made outside inference mode, whatever the caller's mode"
    with pytest.raises(ValueError, match="needs a plain model"):
        use_static_shapes(model)


def test_static_cache_writes_by_index_and_masks_the_stale_slots():
    """After a rollback the slots beyond the length hold rejected keys; the static forward must
    give the logits of a cache that never saw them."""
    model = tiny_model(seed=0)
    static_model = use_static_shapes(copy.copy(model), capacity=32)
    plain, static = KVCache.for_model(model.cfg, 32), static_model.new_cache(32)
    x = torch.tensor([PROMPT])
    with torch.inference_mode():
        for m, cache in ((model, plain), (static_model, static)):
            m(x, cache=cache)
            m(torch.tensor([[7, 8, 9, 10, 11]]), cache=cache)  # a verification window ...
            cache.rollback(len(PROMPT) + 1)  # ... of which one position is kept
        assert static.k.shape[3] == 32  # the whole capacity, always
        a = model(torch.tensor([[12, 13, 14]]), cache=plain)
        b = static_model(torch.tensor([[12, 13, 14]]), cache=static)
    assert plain.length == static.length == len(PROMPT) + 4
    torch.testing.assert_close(b, a, atol=1e-4, rtol=1e-4)


def test_static_forward_with_an_explicit_mask_matches_the_eager_one():
    model = tiny_model(seed=2)
    static_model = use_static_shapes(copy.copy(model), capacity=24)
    plain, static = KVCache.for_model(model.cfg, 24), static_model.new_cache(24)
    with torch.inference_mode():
        outs = []
        for m, cache in ((model, plain), (static_model, static)):
            m(torch.tensor([PROMPT]), cache=cache)
            mask = verification_mask(cache.length, 3)
            mask[..., 0, cache.length + 1] = 0.0  # a leak: row 0 sees position 1
            outs.append(m(torch.tensor([[1, 2, 3]]), cache=cache, mask=mask))
    torch.testing.assert_close(outs[1], outs[0], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_static_engine_gives_the_eager_engines_tokens(temperature):
    target, draft = pair()
    s_target, s_draft = pair(static=True)
    want = SpeculativeEngine(target, draft, k=4).generate(PROMPT, 40, temperature=temperature, seed=3)
    got = SpeculativeEngine(s_target, s_draft, k=4).generate(PROMPT, 40, temperature=temperature, seed=3)
    # Near the budget the eager engine drafts fewer than K; with fixed shapes it drafts a full K
    # (one graph, not several). When sampling, those steps draw other random numbers, so only the
    # steps before the first shortened one must match.
    full = next((i for i, r in enumerate(want.steps) if r.k < 4), len(want.steps))
    n = sum(len(r.committed) for r in want.steps[:full])
    assert full > 3 and got.tokens[:n] == want.tokens[:n]
    assert [r.num_accepted for r in got.steps[:full]] == [r.num_accepted for r in want.steps[:full]]
    if temperature == 0:
        assert got.tokens == want.tokens
    assert autoregressive_generate(s_target, PROMPT, 40).tokens == autoregressive_generate(target, PROMPT, 40).tokens


def test_one_shape_per_forward_kind_for_a_whole_generation(monkeypatch):
    """Every forward after the prompt sees the same cache tensors, and T is K + 1 for the target and
    1 for the draft: the draft's two pending tokens after a fully accepted step go one at a time."""
    target, _ = pair(static=True)
    draft = use_static_shapes(tiny_model(seed=0, vocab_size=64, dim=64, n_layers=2))  # agrees
    for m in (target, draft):
        m.runner.compiles = lambda T: T == 1 or T == 5  # as the compiled runners of pair(compile=True)
    seen = []

    def record(model, tokens, input_pos, cache, *args, **kw):
        seen.append(("target" if model is target else "draft", tokens.shape[1], cache.k.data_ptr(),
                     tuple(cache.k.shape)))
        return runner.static_forward(model, tokens, input_pos, cache, *args, **kw)
    for m in (target, draft):
        m.runner.compiled = record
    res = SpeculativeEngine(target, draft, k=4).generate(PROMPT, 48)
    assert any(r.num_accepted == 4 for r in res.steps), "the draft's two-token feed must have happened"
    for name in ("target", "draft"):
        rows = [s for s in seen if s[0] == name]
        assert len({s[2:] for s in rows}) == 1  # one cache, one shape
        assert {s[1] for s in rows} == ({5} if name == "target" else {1})


def test_static_rows_check_their_arguments():
    model = tiny_model()
    with pytest.raises(ValueError, match="mode must be"):
        StaticRows(model, compile=True, mode="fastest")
    with pytest.raises(ValueError, match="rows must be"):
        StaticRows(model, rows=(0,))
    with pytest.raises(ValueError, match="capacity must be"):
        StaticRows(model, capacity=0)
    with pytest.raises(TypeError, match="compile must be"):
        use_static_shapes(model, compile="yes")
    assert model.runner is None, "a refused call leaves the model as it was"


# torch.compile on the CPU (inductor, C++): compiles each forward once, about ten seconds apiece.
@pytest.mark.slow
@pytest.mark.parametrize("tied", [False, True])
def test_compiled_pair_equals_eager_in_exactly_three_graphs(tied):
    """The target's verification forward (T = K + 1), its autoregressive forward (T = 1) and the
    draft's one-row forward, compiled: logits within 1e-4 of the same models eager, tokens equal,
    and three graphs for the whole run, none of them compiled on a later call."""
    target, draft = pair(tie_embeddings=tied)
    c_target, c_draft = pair(static=True, compile=True, tie_embeddings=tied)
    before = graph_counts()["graphs"]
    with torch.inference_mode():
        for model, compiled, rows in ((target, c_target, (1, 5)), (draft, c_draft, (1, 2))):
            a, b = KVCache.for_model(model.cfg, 256), compiled.new_cache(256)
            model(torch.tensor([PROMPT]), cache=a)
            compiled(torch.tensor([PROMPT]), cache=b)
            for step in range(3):
                for T in rows:
                    x = torch.randint(0, 64, (1, T), generator=torch.Generator().manual_seed(step * 10 + T))
                    last = model is draft  # the draft reads its last row only, as ModelDrafter does
                    want, got = model(x, cache=a, last_only=last), compiled(x, cache=b, last_only=last)
                    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
                    a.rollback(a.length - T + 1)
                    b.rollback(b.length - T + 1)
    assert graph_counts()["graphs"] - before == 3, "target T = 1 and T = 5, draft T = 1"
    warm = graph_counts()["graphs"]
    want = SpeculativeEngine(target, draft, k=4).generate(PROMPT, 40)
    got = SpeculativeEngine(c_target, c_draft, k=4).generate(PROMPT, 40)
    assert got.tokens == want.tokens
    assert autoregressive_generate(c_target, PROMPT, 40).tokens == autoregressive_generate(target, PROMPT, 40).tokens
    assert graph_counts()["graphs"] == warm, "nothing compiles once the three shapes have run"


def test_a_feature_draft_reads_the_static_targets_states():
    """The target's hidden-state forward (a feature draft's input) takes the static path too."""
    from specdec_lab.drafters import FeatureDraft
    target, _ = pair()
    s_target, _ = pair(static=True)
    fd = FeatureDraft(target, seed=2).eval().requires_grad_(False)
    want = SpeculativeEngine(target, fd, k=3).generate(PROMPT, 32)
    got = SpeculativeEngine(s_target, fd, k=3).generate(PROMPT, 32)
    assert got.tokens == want.tokens
    assert [r.num_accepted for r in got.steps] == [r.num_accepted for r in want.steps]


def test_compiled_twin_leaves_the_model_alone():
    model = tiny_model()
    twin = compiled_twin(model, rows=(1,))
    assert twin.forward_kind == "compiled" and model.forward_kind == "eager"
    assert twin.head.weight is model.head.weight
