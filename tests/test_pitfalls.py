"""pitfalls.py: each broken variant shows its bug, and only its bug."""
import torch

import specdec_lab as sl
from specdec_lab.lab import pitfalls
from specdec_lab.core.config import SamplingConfig
from specdec_lab.core.kv_cache import KVCache
from specdec_lab.core.verify import verify

PROMPT = [1, 2, 3]


def test_resampling_from_p_keeps_the_acceptance_and_changes_the_correction():
    changed = 0
    for seed in range(50):
        g = torch.Generator().manual_seed(seed)
        p = torch.softmax(2 * torch.randn(3, 8, generator=g), -1)
        q = torch.softmax(2 * torch.randn(2, 8, generator=g), -1)
        d, u = torch.multinomial(q, 1, generator=g).view(2), torch.rand(2, generator=g)
        e = torch.empty(8).exponential_(generator=g)
        good, bad = verify(d, p, q, u, e), pitfalls.verify_resample_from_p(d, p, q, u, e)
        assert good[0] == bad[0], "the bug is in the correction token, not in the number accepted"
        if int(good[0]) == 2:
            assert good.tolist() == bad.tolist(), "the bonus comes from p either way"
        changed += good[1] != bad[1]
    assert changed > 0


def test_greedy_draft_sampled_q_proposes_the_argmax_with_a_soft_q():
    model = sl.tiny_model(1)
    drafter = pitfalls.GreedyDraftSampledQ(model, 64)
    drafter.prefill(PROMPT)
    ids, q = drafter.propose(3, SamplingConfig(temperature=1.0), torch.Generator())
    assert ids.tolist() == q.argmax(-1).tolist(), "it proposes the argmax"
    assert (q.max(-1).values < 1).all(), "but reports a soft q"


def test_seed_draft_cache_loses_one_token_per_step_and_the_output_stays_correct():
    target = sl.tiny_model(0)
    base = sl.autoregressive_generate(target, PROMPT, max_new_tokens=30).tokens
    drafter = pitfalls.OffByOneDraftCache(target, 256)
    engine = sl.SpeculativeEngine(target, drafter, k=4)
    lags = []
    res = engine.generate(PROMPT, max_new_tokens=30, on_step=lambda rec, out: lags.append(pitfalls.draft_lag(engine)))
    drafting = [i for i, s in enumerate(res.steps) if s.k > 0]
    assert [lags[i] for i in drafting] == list(range(1, len(drafting) + 1)), "one committed token lost per step"
    assert len(drafter.committed) - len(drafter.seen) == len(drafting)
    assert res.tokens == base, "verification keeps the output right whatever the draft does"
    assert res.stats.accepted_share < 1.0, "a model drafting for itself should lose acceptance to the drift"


def test_the_correct_drafter_has_no_lag():
    target = sl.tiny_model(0)
    engine = sl.SpeculativeEngine(target, target, k=4)
    lags = []
    engine.generate(PROMPT, max_new_tokens=30, on_step=lambda rec, out: lags.append(pitfalls.draft_lag(engine)))
    assert set(lags) == {0}


def test_seed_rollback_on_the_target_cache_corrupts_the_output():
    target = sl.tiny_model(0)
    base = sl.autoregressive_generate(target, PROMPT, max_new_tokens=30).tokens
    engine = pitfalls.off_by_one_rollback_engine(target, target, k=4)
    assert isinstance(engine.cache, pitfalls.OffByOneRollbackCache)
    assert engine.generate(PROMPT, max_new_tokens=30).tokens != base


def test_unmasked_target_changes_only_the_verification_pass():
    model = sl.tiny_model(0)
    leaky = pitfalls.UnmaskedTarget(model)
    x = torch.tensor([[4, 5, 6, 7]])
    with torch.no_grad():
        assert torch.equal(leaky(x), model(x)), "no cache: untouched"
        a, b = KVCache.for_model(model.cfg, 16), KVCache.for_model(model.cfg, 16)
        assert torch.equal(leaky(x, cache=a), model(x, cache=b)), "prefill into an empty cache: untouched"
        assert torch.equal(leaky(x[:, :1], cache=a), model(x[:, :1], cache=b)), "single-token decode: untouched"
        diff = (leaky(x, cache=a) - model(x, cache=b)).abs().amax(-1)[0]  # (T,)
    assert (diff > 1e-4).all(), "every position of an unmasked verification pass changes"
    assert leaky.cfg is model.cfg and leaky.device == model.device and leaky.dtype == model.dtype


def test_targets_one_position_late_moves_each_stored_target_back_one_answer_position():
    top_ids = torch.arange(12).view(4, 3)  # 4 answer positions, top-3 stored at each
    top_lp = -torch.arange(12, dtype=torch.float32).view(4, 3)
    ex = (torch.tensor([1, 2]), torch.tensor([5, 6, 7, 8]), top_ids, top_lp, 1.0)
    (prompt, answer, ids, lp, temperature), = pitfalls.targets_one_position_late([ex])
    assert torch.equal(prompt, ex[0]) and torch.equal(answer, ex[1]) and temperature == 1.0
    assert ids.shape == top_ids.shape and lp.shape == top_lp.shape
    assert torch.equal(ids[:3], top_ids[1:]) and torch.equal(lp[:3], top_lp[1:]), "position t holds t + 1's target"
    assert torch.equal(ids[3], top_ids[3]), "the last position keeps its own"
