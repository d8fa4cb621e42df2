"""On CUDA: the engine stays lossless and syncs once per step (skipped without a GPU)."""
import pytest

import specdec_lab as sl
from specdec_lab.analysis.syncs import count_cuda_syncs, count_host_syncs

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
