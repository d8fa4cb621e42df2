"""syncs.py: host synchronisations counted from the outside."""
import pytest
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


def _per_step(engine, prompt, **kwargs):
    """The syncs counted from outside between one step's end and the next's: steps 2.. (the first
    also holds the prefill's copies of the prompt)."""
    seen = []
    with count_host_syncs() as syncs:
        res = engine.generate(prompt, max_new_tokens=30, on_step=lambda rec, out: seen.append(syncs.count), **kwargs)
    return res, [b - a for a, b in zip(seen, seen[1:])]


@pytest.mark.parametrize("cache", ["contiguous", "paged"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_step_reads_the_device_once_counted_from_outside(temperature, cache):
    """c, the draft's pending tokens and the drafted ids stay on the device, and a paged cache's new
    blocks enter as scalars: the verdict's one read is a step's only sync. A step that copies c or
    the pending tokens to the device counts 3."""
    engine = sl.SpeculativeEngine(sl.tiny_model(0), sl.tiny_model(1, n_layers=1), k=3, cache=cache, block_size=4)
    res, per_step = _per_step(engine, [1, 2, 3], temperature=temperature, seed=0)
    assert len(per_step) >= 10 and set(per_step) == {1}, f"syncs per step, counted: {per_step}"
    assert [r.syncs for r in res.steps[1:]] == per_step, "the engine must report what was counted"


def test_what_costs_more_than_one_read_is_counted_and_reported():
    """The early stop reads q(d) per drafted token, and prompt lookup copies its proposal to the
    device: each costs syncs, and the engine's figure is the one counted from outside."""
    target, draft = sl.tiny_model(0, eos_token_ids=()), sl.tiny_model(1, n_layers=1, eos_token_ids=())
    for drafter in (sl.ModelDrafter(draft, 256, stop_below=0.3), sl.LookupThenModelDrafter(draft, 256),
                    sl.NGramDrafter()):
        engine = sl.SpeculativeEngine(target, drafter, k=4)
        res, per_step = _per_step(engine, [1, 2, 3, 1, 2, 3, 1, 2])
        assert [r.syncs for r in res.steps[1:]] == per_step, type(drafter).__name__
        if isinstance(drafter, sl.ModelDrafter):
            assert max(per_step) > 1, "the early stop reads q(d) to the host"
