"""Greedy agreement per drafted position (train/acceptance.greedy_agreement) on tiny models: the
drafter run from every answer position against the obvious twin, one teacher-forced forward."""
import copy

import pytest
import torch

import specdec_lab as sl
from specdec_lab.drafters.feature import FeatureDraft
from specdec_lab.train.acceptance import agreement_table, greedy_agreement

PROMPTS = [[1, 2, 3], [5, 9], [7, 7, 7, 7, 2, 9], [3, 4, 40, 41]]


@pytest.fixture(scope="module")
def target():
    return sl.tiny_model(0)


@pytest.fixture(scope="module")
def noisy_draft(target):
    """The target with noise on its weights: it agrees often, not always."""
    draft = copy.deepcopy(target)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(0.05 * p.std() * torch.randn(p.shape, generator=g))
    return draft


def teacher_forced_counts(target, agree_at, k_max):
    """The slow twin: per prompt, m[t] = whether the draft's argmax at answer position t, given the
    target's answer before it, is the target's token; position i is drafted from t when
    m[t..t+i-2] all hold and t + i <= n, and agreed when m[t+i-1] holds too."""
    drafted, agreed, committed, starts = [0] * k_max, [0] * k_max, dict.fromkeys(range(1, k_max + 1), 0), 0
    for prompt in PROMPTS:
        a = sl.autoregressive_generate(target, prompt, max_new_tokens=20).tokens
        m = agree_at(prompt, a)
        n = len(a)
        for t in range(n):
            run = 0
            for i in range(1, min(k_max, n - t) + 1):
                drafted[i - 1] += 1
                if not m[t + i - 1]:
                    break
                agreed[i - 1] += 1
                run += 1
            for k in committed:
                committed[k] += min(min(run, k) + 1, n - t)
            starts += 1
    return drafted, agreed, {k: v / starts for k, v in committed.items()}


def test_a_token_draft_agrees_position_by_position_as_one_teacher_forced_forward_says(target, noisy_draft):
    def agree_at(prompt, a):
        seq = torch.tensor([prompt + a])
        pred = noisy_draft(seq)[0, len(prompt) - 1:len(prompt) - 1 + len(a)].argmax(-1)  # (n,)
        return (pred == torch.tensor(a)).tolist()

    rep = greedy_agreement(target, noisy_draft, PROMPTS, max_new_tokens=20, k_max=4, progress=False)
    drafted, agreed, per_k = teacher_forced_counts(target, agree_at, 4)
    assert (rep.drafted, rep.agreed) == (drafted, agreed)
    assert rep.tokens_per_step == pytest.approx(per_k)
    assert 0.2 < rep.agreement < 0.95, "the noisy draft should agree often, not always"
    assert rep.drafted[0] == rep.answer_tokens and rep.drafted == sorted(rep.drafted, reverse=True)
    assert all(rep.tokens_per_step[k] <= rep.tokens_per_step[k + 1] for k in range(1, 4))


def test_the_target_as_its_own_draft_agrees_everywhere(target):
    rep = greedy_agreement(target, target, PROMPTS, max_new_tokens=20, k_max=3, progress=False)
    assert [rep.at(i) for i in (1, 2, 3)] == [1.0, 1.0, 1.0]
    answers = [sl.autoregressive_generate(target, p, max_new_tokens=20).tokens for p in PROMPTS]
    for k in (1, 2, 3):  # each step commits K + 1 tokens, cut to what is left of the answer
        expect = sum(min(k + 1, len(a) - t) for a in answers for t in range(len(a))) / rep.answer_tokens
        assert rep.tokens_per_step[k] == pytest.approx(expect)


def test_a_feature_draft_agrees_at_position_1_as_its_teacher_forced_forward_says(target):
    fdraft = FeatureDraft(target, seed=2).eval().requires_grad_(False)  # a seed at which it agrees sometimes

    def agree_at(prompt, a):
        seq = torch.tensor([prompt + a])
        h = target.hidden(seq)  # (1, N, dim): h[j] predicts seq[j + 1]
        _, logits = fdraft(seq[:, 1:], h[:, :-1])  # entry r reads (seq[r + 1], h[r]) and predicts seq[r + 2]
        pred = logits[0, len(prompt) - 2:len(prompt) - 2 + len(a)].argmax(-1)
        return (pred == torch.tensor(a)).tolist()

    prompts_2 = [p for p in PROMPTS if len(p) >= 2]
    rep = greedy_agreement(target, fdraft, prompts_2, max_new_tokens=20, k_max=3, name="tiny", progress=False)
    m = [x for p in prompts_2 for x in agree_at(p, sl.autoregressive_generate(target, p, max_new_tokens=20).tokens)]
    assert rep.agreed[0] == sum(m) > 0 and rep.drafted[0] == len(m) == rep.answer_tokens
    assert rep.agreed[1] <= rep.drafted[1] <= rep.agreed[0]
    assert "tiny" in agreement_table([rep])


def test_kinds_split_position_1_by_kind(target, noisy_draft):
    kinds = ["a", "b", "a", "b"]
    rep = greedy_agreement(target, noisy_draft, PROMPTS, max_new_tokens=12, k_max=2, kinds=kinds, progress=False)
    assert sum(a for a, _ in rep.by_kind.values()) == rep.agreed[0]
    assert sum(d for _, d in rep.by_kind.values()) == rep.drafted[0]
    with pytest.raises(ValueError, match="kinds"):
        greedy_agreement(target, noisy_draft, PROMPTS, kinds=["a"], progress=False)
    with pytest.raises(ValueError, match="k_max"):
        greedy_agreement(target, noisy_draft, PROMPTS, k_max=0, progress=False)



@pytest.mark.parametrize("kind", ["token", "feature", "eagle3"])
def test_each_engine_step_accepts_what_the_walk_found_at_its_start(target, noisy_draft, kind):
    """A greedy engine run at K = k_max visits some of the starts the walk visits; at each, the
    engine accepts exactly the walk's leading agreements (cut to the step's K): the walk feeds each
    kind of drafter what the engine feeds it, the target's states from the layers it declares."""
    from specdec_lab.drafters.eagle3 import Eagle3Draft
    draft = {"token": lambda: noisy_draft,
             "feature": lambda: FeatureDraft(target, seed=2).eval().requires_grad_(False),  # seeds at which
             "eagle3": lambda: Eagle3Draft(target, seed=2).eval().requires_grad_(False)}[kind]()  # they agree at all
    prompts = [p for p in PROMPTS if len(p) >= 2]
    rep = greedy_agreement(target, draft, prompts, max_new_tokens=20, k_max=4, progress=False)
    engine = sl.SpeculativeEngine(target, draft, k=4)
    checked = 0
    for prompt, runs in zip(prompts, rep.runs):
        t = 0
        for step in engine.generate(prompt, max_new_tokens=20).steps:
            assert step.num_accepted == min(runs[t], step.k), f"start {t} of {prompt}"  # K is cut near the end
            t += len(step.committed)
            checked += 1
    assert checked >= 2 * len(prompts) and max(max(r) for r in rep.runs) > 0
