"""On CUDA: the engine stays lossless and syncs once per step (skipped without a GPU)."""
import pytest

import specdec_lab as sl
from specdec_lab.analysis.syncs import count_host_syncs

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


def test_one_host_sync_per_step_on_cuda():
    t, d = _pair()
    engine = sl.SpeculativeEngine(t, d, k=4)
    engine.generate([1, 2, 3], max_new_tokens=8, temperature=1.0, seed=0)  # warm-up
    with count_host_syncs() as syncs:
        res = engine.generate([1, 2, 3], max_new_tokens=32, temperature=1.0, seed=0)
    assert res.stats.syncs == res.stats.steps
    assert syncs.count == res.stats.steps, f"host reads per step: {syncs.calls}"
