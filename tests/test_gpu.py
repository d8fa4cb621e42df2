"""On CUDA: the engine, the batched step (serve/) and the tree engine (tree/) stay lossless and sync
once per step (skipped without a GPU). The GPU check (scripts/gpu_check.sh) runs this file first."""
import pytest
import torch

import specdec_lab as sl
from specdec_lab.analysis.syncs import count_cuda_syncs, count_host_syncs
from specdec_lab.drafters import ModelDrafter

pytestmark = pytest.mark.gpu


def _pair():
    t = sl.tiny_model(0, vocab_size=256, dim=64).to("cuda")
    d = sl.tiny_model(1, vocab_size=256, dim=32, n_heads=2, n_kv_heads=1).to("cuda")
    return t, d


def test_greedy_on_cuda_equals_autoregressive():
    t, d = _pair()
    base = sl.autoregressive_generate(t, [1, 2, 3], max_new_tokens=32).tokens
    for k in (1, 4, 8):
        assert sl.SpeculativeEngine(t, d, k=k).generate([1, 2, 3], max_new_tokens=32).tokens == base


@pytest.mark.parametrize("cache", ["contiguous", "paged"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_one_host_sync_per_step_on_cuda(temperature, cache):
    t, d = _pair()
    engine = sl.SpeculativeEngine(t, d, k=4, cache=cache)
    kwargs = dict(max_new_tokens=32, temperature=temperature, seed=0)
    engine.generate([1, 2, 3], **{**kwargs, "max_new_tokens": 8})  # warm-up
    seen = []
    with count_host_syncs() as syncs:
        res = engine.generate([1, 2, 3], on_step=lambda rec, out: seen.append(syncs.count), **kwargs)
    per_step = [b - a for a, b in zip(seen, seen[1:])]  # the first step also holds the prompt's copies
    assert per_step and set(per_step) == {1}, f"host syncs per step {per_step}: {syncs.calls}"
    assert res.stats.syncs == res.stats.steps
    res, n = count_cuda_syncs(lambda: engine.generate([1, 2, 3], **kwargs))  # CUDA's own count
    assert n <= res.stats.steps + 2, f"CUDA counted {n} syncs over {res.stats.steps} steps and the prompt's 2 copies"


def _bf16_pair():
    t, d = _pair()
    return t.to(torch.bfloat16), d.to(torch.bfloat16)


@pytest.mark.parametrize("cache", ["contiguous", "paged"])
def test_bfloat16_engine_runs_on_cuda_and_mostly_matches(cache):
    """In bfloat16 a T=1 and a T=K+1 forward may round a near-tie differently, so greedy output
    is compared token by token up to the first difference, where the gap must be a near-tie."""
    from specdec_lab.bench.run import first_difference
    t, d = _bf16_pair()
    base = sl.autoregressive_generate(t, [1, 2, 3], max_new_tokens=32).tokens
    out = sl.SpeculativeEngine(t, d, k=4, cache=cache).generate([1, 2, 3], max_new_tokens=32).tokens
    diff = first_difference(t, [1, 2, 3], base, out)
    assert diff is None or abs(diff["logit_gap"]) < 0.1, diff


@pytest.mark.parametrize("drafter", ["lookup", "stop_below"])
def test_lookup_and_early_stop_are_lossless_on_cuda(drafter):
    t, d = _pair()
    base = sl.autoregressive_generate(t, [1, 2, 3, 1, 2, 3], max_new_tokens=32).tokens
    draft = sl.LookupThenModelDrafter(d, 256) if drafter == "lookup" else ModelDrafter(d, 256, stop_below=0.5)
    res = sl.SpeculativeEngine(t, draft, k=4).generate([1, 2, 3, 1, 2, 3], max_new_tokens=32)
    assert res.tokens == base
    _, n = count_cuda_syncs(lambda: sl.SpeculativeEngine(t, draft, k=4).generate([1, 2, 3, 1, 2, 3], max_new_tokens=32))
    assert n <= res.stats.syncs + 2  # every sync CUDA sees is one the engine counted (and the prompt's copies)


def test_reference_verifier_runs_on_cuda():
    """verify_reference builds its verdict on the tensors' device."""
    t, d = _pair()
    base = sl.autoregressive_generate(t, [1, 2, 3], max_new_tokens=24).tokens
    assert sl.SpeculativeEngine(t, d, k=4, verifier="reference").generate([1, 2, 3], max_new_tokens=24).tokens == base


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_compiled_engine_on_cuda_is_lossless_with_one_sync_per_step(temperature):
    """Static shapes and CUDA graphs (torch.compile mode reduce-overhead)."""
    t, d = _pair()
    from specdec_lab.compiled import graph_counts
    ct, cd = sl.compiled_twin(t, rows=(1, 5)), sl.compiled_twin(d, rows=(1,))  # the draft: one row, always
    kwargs = dict(max_new_tokens=32, temperature=temperature, seed=0)
    want = sl.SpeculativeEngine(t, d, k=4).generate([1, 2, 3], **kwargs)
    engine = sl.SpeculativeEngine(ct, cd, k=4)
    for _ in range(3):  # compiles, then records the CUDA graphs
        engine.generate([1, 2, 3], **{**kwargs, "max_new_tokens": 16})
    before = graph_counts()
    got = engine.generate([1, 2, 3], **kwargs)
    if temperature == 0:
        assert got.tokens == want.tokens
    res, n = count_cuda_syncs(lambda: engine.generate([1, 2, 3], **kwargs))
    assert graph_counts()["graphs"] == before["graphs"], "nothing compiles once warm"
    assert n <= res.stats.steps + 2, f"CUDA counted {n} syncs over {res.stats.steps} steps"


SERVE_PROMPTS = [[1, 2, 3, 4, 5], [7, 8], [9, 10, 11, 12, 13, 14, 15, 16, 17], [3], [20, 21, 22]]


def test_the_batched_step_runs_on_cuda_with_one_sync_per_step():
    from specdec_lab.serve.engine import BatchEngine, make_sequence
    t, d = _pair()
    engine = BatchEngine(t, d, num_blocks=64, block_size=4, max_seq_len=128)
    seqs = [make_sequence(p, 16, k=k, device="cuda") for p, k in zip(SERVE_PROMPTS, [4, 2, 0, 3, 1])]
    engine.prefill(seqs)
    _, syncs = count_cuda_syncs(lambda: engine.step(seqs))
    assert syncs == 1, "one host read per batched step, counted by CUDA"
    live = [s for s in seqs if not s.finished]
    while live:
        engine.step(live)
        engine.release([s for s in live if s.finished])
        live = [s for s in live if not s.finished]
    for p, s in zip(SERVE_PROMPTS, seqs):
        assert s.output == sl.autoregressive_generate(t, p, max_new_tokens=16).tokens, p


def test_a_sampled_row_on_cuda_gives_the_same_tokens_alone_and_in_a_served_batch():
    from specdec_lab.serve import Server
    t, d = _pair()
    kw = dict(max_new_tokens=20, temperature=0.8, top_p=0.9, seed=7, k=3)
    alone = Server(t, d, max_batch=1, max_seq_len=128)
    h = alone.submit([5, 6, 7], **kw)
    alone.run_until_idle()
    crowd = Server(t, d, max_batch=4, max_seq_len=128)
    others = [crowd.submit(p, max_new_tokens=20, temperature=1.0, seed=i, k=2) for i, p in enumerate(SERVE_PROMPTS[:3])]
    mine = crowd.submit([5, 6, 7], **kw)
    crowd.run_until_idle()
    assert mine.result().tokens == h.result().tokens
    assert all(len(o.result().tokens) == 20 for o in others)


@pytest.mark.parametrize("cache", ["contiguous", "paged"])
def test_greedy_trees_on_cuda_equal_autoregressive_with_one_sync_per_step(cache):
    from specdec_lab.tree.draft import DynamicTree
    from specdec_lab.tree.engine import TreeEngine
    t, d = _pair()
    base = sl.autoregressive_generate(t, [1, 2, 3], max_new_tokens=32).tokens
    for tree in ((4, 2, 1), DynamicTree(3, 3, 8)):
        engine = TreeEngine(t, d, tree=tree, cache=cache)
        assert engine.generate([1, 2, 3], max_new_tokens=32).tokens == base, tree
        res, n = count_cuda_syncs(lambda: engine.generate([1, 2, 3], max_new_tokens=32))
        assert n <= res.stats.steps + 2, f"{tree}: CUDA counted {n} syncs over {res.stats.steps} steps"


def test_a_sampled_tree_on_cuda_runs_each_rule():
    from specdec_lab.tree.engine import TreeEngine
    t, d = _pair()
    for rule in ("sampled", "deterministic"):
        res = TreeEngine(t, d, tree=(3, 2), rule=rule).generate([1, 2, 3], max_new_tokens=24, temperature=0.9, seed=0)
        assert len(res.tokens) == 24 and all(0 <= x < t.cfg.vocab_size for x in res.tokens), rule
