"""syncs.py: host synchronisations counted from the outside."""
import torch

import specdec_lab as sl
from specdec_lab.analysis.syncs import count_host_syncs, is_sync_free
from specdec_lab.core.verify import verify, verify_reference


def _case(K=4, V=50, seed=0):
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(K + 1, V, generator=g), -1)
    q = torch.softmax(torch.randn(K, V, generator=g), -1)
    d = torch.multinomial(q, 1, generator=g).view(K)
    return d, p, q, torch.rand(K, generator=g), torch.empty(V).exponential_(generator=g)


def test_each_kind_of_host_read_is_counted():
    t = torch.tensor([1.5, 2.0])
    with count_host_syncs() as syncs:
        t[0].item()
        t.tolist()
        int(t[1])
        float(t[0])
        bool(t[0] > 1)
        t.nonzero()
    assert syncs.calls == ["item", "tolist", "__int__", "__float__", "__bool__", "nonzero"]


def test_device_ops_are_not_counted():
    t = torch.arange(10.0)
    assert is_sync_free(lambda: (t * 2).cumsum(0).argmax().view(1))


def test_vectorised_verify_is_sync_free_and_the_loop_count_matches_its_own_record():
    for seed in range(10):
        case = _case(seed=seed)
        assert is_sync_free(verify, *case), "verify must not read a value on the host"
        own = {}
        with count_host_syncs() as syncs:
            verify_reference(*case, syncs=own)
        assert syncs.count == own["count"] > 0


def test_the_engine_syncs_once_per_step_by_the_external_count():
    engine = sl.SpeculativeEngine(sl.tiny_model(0), sl.tiny_model(1, n_layers=1), k=3)
    with count_host_syncs() as syncs:
        res = engine.generate([1, 2, 3], max_new_tokens=20, temperature=1.0, seed=0)
    assert syncs.count == res.stats.steps == res.stats.syncs
