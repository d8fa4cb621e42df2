"""Chapter 04's checks (specdec_lab/lab/checks/kv_cache_rollback.py) pass on the chapter's pieces and fail on
broken ones: the off-by-one draft cache, and figures with one value changed. A tiny random model drafting for
itself at temperature 0 stands in for the default target: it too accepts every draft when the engine is right."""
import pytest
import torch

from specdec_lab.api import SpeculativeEngine, autoregressive_generate
from specdec_lab.core.kv_cache import KVCache
from specdec_lab.io.pair import tiny_model
from specdec_lab.lab import pitfalls
from specdec_lab.lab.checks import kv_cache_rollback as checks

IDS, N_NEW, K = [5, 9, 2, 7, 3, 1], 40, 4


@pytest.fixture(scope="module")
def target():
    return tiny_model(0)


@pytest.fixture(scope="module")
def baseline(target):
    return autoregressive_generate(target, IDS, max_new_tokens=N_NEW).tokens


def test_the_hand_step_holds_and_rejects_a_leak(target):
    cache = KVCache.for_model(target.cfg, capacity=32)
    prompt, verify_pass, address = [5, 9, 2, 7], [11, 12, 13, 14], cache.k.data_ptr()
    with torch.no_grad():
        target(torch.tensor([prompt]), cache=cache)
        target(torch.tensor([verify_pass]), cache=cache)
        cache.rollback(len(prompt) + 2)
        after = target(torch.tensor([[21]]), cache=cache)[0, -1]
        reference = target(torch.tensor([prompt + verify_pass[:2] + [21]]),
                           cache=KVCache.for_model(target.cfg, capacity=32))[0, -1]
    diff = (after - reference).abs().max().item()
    checks.hand_step(diff, reference, cache, address, prompt, target.forward_kind)
    with pytest.raises(AssertionError, match="never saw the rejected tokens"):
        checks.hand_step(1.0, reference, cache, address, prompt, target.forward_kind)
    with pytest.raises(AssertionError, match="reallocate"):
        checks.hand_step(diff, reference, cache, address + 1, prompt, target.forward_kind)


def test_self_draft_holds_on_the_engine_and_fails_on_the_off_by_one_draft_cache(target, baseline):
    engine = SpeculativeEngine(target, target, k=K)
    checks.self_draft(engine, IDS, N_NEW, baseline)
    broken = SpeculativeEngine(target, pitfalls.OffByOneDraftCache(target, engine.max_seq_len), k=K)
    with pytest.raises(AssertionError, match="fell behind"):
        checks.self_draft(broken, IDS, N_NEW, baseline)


def test_the_off_by_one_figures_hold_and_reject_a_changed_copy(target, baseline):
    correct = SpeculativeEngine(target, target, k=K)
    obo = SpeculativeEngine(target, pitfalls.OffByOneDraftCache(target, correct.max_seq_len), k=K)
    lag = []
    res_obo = obo.generate(IDS, max_new_tokens=N_NEW, on_step=lambda rec, out: lag.append(pitfalls.draft_lag(obo)))
    res_correct = correct.generate(IDS, max_new_tokens=N_NEW)
    res_broken = pitfalls.off_by_one_rollback_engine(target, target, k=K).generate(IDS, max_new_tokens=N_NEW)
    checks.off_by_one(res_correct, res_obo, lag, baseline, res_broken)
    with pytest.raises(AssertionError, match="one token per drafting step"):
        checks.off_by_one(res_correct, res_obo, lag[:-1] + [lag[-1] + 1], baseline, res_broken)
    with pytest.raises(AssertionError, match="corrupt the output"):
        checks.off_by_one(res_correct, res_obo, lag, baseline, res_correct)
