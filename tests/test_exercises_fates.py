"""The step_fates exercise (chapter 15): the reference is the demo's own rule (lab/widgets.py's token_fates) on
every K and n and on steps the engine recorded, each classic mistake fails with its own diagnosis, a correct
answer written another way passes, and a wrong form is told what form to take. The mistaken answers are
written as a learner would write them."""
import itertools
import time

import pytest
import torch

from specdec_lab.api import SpeculativeEngine
from specdec_lab.core.records import StepRecord
from specdec_lab.drafters import NGramDrafter
from specdec_lab.io.pair import tiny_model
from specdec_lab.lab import exercises, widgets
from specdec_lab.lab.exercises.fates import CASES, FATES, HINTS, MISTAKES, step_fates, strip_text
from test_exercises import assert_diagnosed


def check(fn):
    return exercises.check("step_fates", fn)


def record(drafted, n, next_token, committed=None, step=0):
    """A StepRecord as the engine writes it: every token committed unless `committed` says otherwise."""
    k = len(drafted)
    return StepRecord(step, k, list(drafted), n, next_token, [0.5] * k, [0.25] * k, [0.1] * k, 0.0, 0.0, 1,
                      list(drafted[:n]) + [next_token] if committed is None else committed)


def shown(rec):
    """What the demo's strip shows for one step, without the hover's numbers."""
    return [(fate, token) for fate, token, _ in widgets.token_fates(rec)]


# ---- a learner's mistakes ----

def rest_rejected_too(drafted, num_accepted, next_token):
    strip = [("accepted", t) for t in drafted[:num_accepted]]
    strip += [("rejected", t) for t in drafted[num_accepted:]]
    if num_accepted < len(drafted):
        strip.append(("correction", next_token))
    else:
        strip.append(("bonus" if drafted else "target", next_token))
    return strip


def output_tokens_only(drafted, num_accepted, next_token):
    strip = [("accepted", t) for t in drafted[:num_accepted]]
    if not drafted:
        return strip + [("target", next_token)]
    return strip + [("correction" if num_accepted < len(drafted) else "bonus", next_token)]


def correction_then_rejected(drafted, num_accepted, next_token):
    strip = [("accepted", t) for t in drafted[:num_accepted]]
    if not drafted:
        strip.append(("target", next_token))
    elif num_accepted < len(drafted):
        strip += [("correction", next_token), ("rejected", drafted[num_accepted])]
    else:
        strip.append(("bonus", next_token))
    return strip


def no_bonus(drafted, num_accepted, next_token):
    strip = [("accepted", t) for t in drafted[:num_accepted]]
    if not drafted:
        strip.append(("target", next_token))
    elif num_accepted < len(drafted):
        strip += [("rejected", drafted[num_accepted]), ("correction", next_token)]
    return strip


def always_a_correction(drafted, num_accepted, next_token):
    if not drafted:
        return [("target", next_token)]
    strip = [("accepted", t) for t in drafted[:num_accepted]]
    if num_accepted < len(drafted):
        strip.append(("rejected", drafted[num_accepted]))
    return strip + [("correction", next_token)]


def always_a_bonus(drafted, num_accepted, next_token):
    if not drafted:
        return [("target", next_token)]
    strip = [("accepted", t) for t in drafted[:num_accepted]]
    if num_accepted < len(drafted):
        strip.append(("rejected", drafted[num_accepted]))
    return strip + [("bonus", next_token)]


def counted_from_one(drafted, num_accepted, next_token):
    last = num_accepted + 1 if drafted else 0  # "n is the position of the last accepted draft"
    last = min(last, len(drafted))
    strip = [("accepted", t) for t in drafted[:last]]
    if not drafted:
        return strip + [("target", next_token)]
    if last < len(drafted):
        return strip + [("rejected", drafted[last]), ("correction", next_token)]
    return strip + [("bonus", next_token)]


def all_accepted_means_bonus(drafted, num_accepted, next_token):
    strip = [("accepted", t) for t in drafted[:num_accepted]]
    if num_accepted == len(drafted):  # true at K = 0 as well
        return strip + [("bonus", next_token)]
    return strip + [("rejected", drafted[num_accepted]), ("correction", next_token)]


def nothing_accepted_means_correction(drafted, num_accepted, next_token):
    strip = [("accepted", t) for t in drafted[:num_accepted]]
    if drafted and num_accepted == len(drafted):
        return strip + [("bonus", next_token)]
    if num_accepted < len(drafted):
        strip.append(("rejected", drafted[num_accepted]))
    return strip + [("correction", next_token)]


def no_plain_step(drafted, num_accepted, next_token):
    strip = [("accepted", t) for t in drafted[:num_accepted]]
    if num_accepted < len(drafted):
        strip += [("rejected", drafted[num_accepted]), ("correction", next_token)]
    elif drafted:
        strip.append(("bonus", next_token))
    return strip


def drafts_only(drafted, num_accepted, next_token):
    strip = [("accepted", t) for t in drafted[:num_accepted]]
    if num_accepted < len(drafted):
        strip.append(("rejected", drafted[num_accepted]))
    return strip


LEARNER_MISTAKES = [
    (rest_rejected_too, "discarded_shown_as_rejected"),
    (output_tokens_only, "rejected_left_out"),
    (correction_then_rejected, "correction_before_rejected"),
    (no_bonus, "bonus_forgotten"),
    (always_a_correction, "bonus_called_correction"),
    (always_a_bonus, "correction_called_bonus"),
    (counted_from_one, "one_accepted_too_many"),
    (all_accepted_means_bonus, "plain_step_as_bonus"),
    (nothing_accepted_means_correction, "plain_step_as_correction"),
    (no_plain_step, "plain_step_forgotten"),
    (drafts_only, "target_token_left_out"),
]


# ---- correct, written another way ----

def with_a_loop(drafted, num_accepted, next_token):
    strip = []
    for i, token in enumerate(drafted):
        if i < num_accepted:
            strip.append(("accepted", token))
        else:
            strip.append(("rejected", token))
            break  # the drafts after the first rejection were never tested
    if not drafted:
        fate = "target"
    elif num_accepted == len(drafted):
        fate = "bonus"
    else:
        fate = "correction"
    strip.append((fate, next_token))
    return strip


def with_the_library(drafted, num_accepted, next_token):
    return shown(record(drafted, num_accepted, next_token))


def as_tuples_of_lists(drafted, num_accepted, next_token):
    return tuple([fate, torch.tensor(token)] for fate, token in step_fates(drafted, num_accepted, next_token))


def popping_the_drafts(drafted, num_accepted, next_token):
    k = len(drafted)
    strip = [("accepted", drafted.pop(0)) for _ in range(num_accepted)]  # edits the list it was given
    if k == 0:
        return [("target", next_token)]
    if num_accepted < k:
        return strip + [("rejected", drafted.pop(0)), ("correction", next_token)]
    return strip + [("bonus", next_token)]


OTHER_WAYS = [with_a_loop, with_the_library, as_tuples_of_lists, popping_the_drafts]


# ---- the reference is the demo's rule ----

def test_the_fates_are_the_demos():
    assert FATES == widgets.FATES and set(FATES) == set(widgets.FATE_LABELS)


def test_the_reference_agrees_with_the_demo_on_every_k_and_n():
    for k in range(6):
        for n in range(k + 1):
            drafted, next_token = list(range(10, 10 + k)), 99
            assert step_fates(drafted, n, next_token) == shown(record(drafted, n, next_token)), (k, n)
            rec = record(drafted, n, next_token, committed=[])  # a record without committed: the same strip
            assert step_fates(drafted, n, next_token) == shown(rec), (k, n)


def _noisy_copy(model, scale, seed):
    """The model with a little noise on every weight: a draft that agrees with it often, not always."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))
    return model


@pytest.fixture(scope="module")
def recorded_steps():
    """Steps of short engine runs on tiny models: a draft that is the target (every draft accepted, a bonus),
    a noisy copy of it (some accepted), another model (rejections) and prompt lookup (plain steps)."""
    target = tiny_model(0, eos_token_ids=())
    drafts = [(target, 1.0), (_noisy_copy(tiny_model(0, eos_token_ids=()), 0.02, 1), 1.0),
              (tiny_model(5, n_layers=1, eos_token_ids=()), 1.0), (NGramDrafter(2), 0.0)]
    steps = []
    for draft, temperature in drafts:
        res = SpeculativeEngine(target, draft, k=4, max_seq_len=128).generate(
            [1, 2, 3, 1, 2, 3, 1, 2], max_new_tokens=24, temperature=temperature, seed=0)
        steps += res.steps
    return steps


def test_the_reference_agrees_with_the_demo_on_steps_the_engine_recorded(recorded_steps):
    whole = [r for r in recorded_steps if r.committed == r.drafted[:r.num_accepted] + [r.next_token]]
    assert len(whole) >= 0.9 * len(recorded_steps), "a step is cut only at the end of a run"
    for rec in whole:
        assert step_fates(rec.drafted, rec.num_accepted, rec.next_token) == shown(rec), rec
    seen = {fate for rec in whole for fate, _ in shown(rec)}
    assert seen == set(FATES), f"the runs should show every fate, showed {seen}"
    assert any(0 < r.num_accepted < r.k for r in whole), "some steps accept part of their draft"


def test_the_cases_show_every_fate_and_tell_every_mistake_apart():
    assert {fate for case in CASES for fate, _ in step_fates(*case)} == set(FATES)
    outputs = {name: [candidate(*case) for case in CASES] for name, candidate in MISTAKES}
    want = [step_fates(*case) for case in CASES]
    for name, outs in outputs.items():
        assert outs != want, f"{name} gives the right strip on every case"
    for (a, outs_a), (b, outs_b) in itertools.combinations(outputs.items(), 2):
        assert outs_a != outs_b, f"{a} and {b} give the same strips on every case"
    assert set(HINTS) == {name for name, _ in MISTAKES} | {"index_past_the_drafts"}


# ---- the check ----

def test_the_reference_passes():
    report = check(exercises.solution("step_fates"))
    assert report.passed, repr(report)
    assert report.diagnosis is None and "6 steps" in report.message


@pytest.mark.parametrize("fn, diagnosis", LEARNER_MISTAKES, ids=[f"{d}-{f.__name__}" for f, d in LEARNER_MISTAKES])
def test_each_mistake_fails_with_its_own_diagnosis(fn, diagnosis):
    report = check(fn)
    assert_diagnosed(report, diagnosis)


def test_the_failure_shows_both_strips_for_the_step_it_fails_on():
    message = check(rest_rejected_too).message
    assert message == ("For drafted [17, 4, 9, 30], n = 2 and next_token = 12, the strip shows: accepted 17, "
                       "accepted 4, rejected 9, correction 12. Yours shows: accepted 17, accepted 4, rejected 9, "
                       "rejected 30, correction 12."), message
    message = check(no_plain_step).message
    assert message == "For drafted [], n = 0 and next_token = 7, the strip shows: target 7. Yours shows: nothing."


def test_swapping_bonus_and_correction_is_told_what_each_one_is():
    def swapped(drafted, num_accepted, next_token):
        return [(("bonus" if f == "correction" else "correction" if f == "bonus" else f), t)
                for f, t in step_fates(drafted, num_accepted, next_token)]
    report = check(swapped)
    assert not report.passed and report.diagnosis == "correction_called_bonus", repr(report)
    assert "A bonus comes only when all K drafts pass" in report.hint


@pytest.mark.parametrize("fn", OTHER_WAYS, ids=[f.__name__ for f in OTHER_WAYS])
def test_a_correct_answer_written_another_way_passes(fn):
    report = check(fn)
    assert report.passed, repr(report)


@pytest.mark.parametrize("returned, says", [
    (None, "it should return a list of (fate, token) pairs"),
    ({"accepted": [17, 4]}, "it should return a list of (fate, token) pairs"),
    (["accepted", "accepted", "rejected", "correction"], "is not a (fate, token) pair"),
    ([("accepted", "17")], "is not a (fate, token) pair"),
    ([(17, "accepted")], "is not a (fate, token) pair"),
    ([("accept", 17)], "the fates are 'accepted', 'rejected', 'correction', 'bonus', 'target'"),
])
def test_a_wrong_form_gets_a_clear_message(returned, says):
    report = check(lambda *args: returned)
    assert not report.passed and report.diagnosis is None, repr(report)
    assert says in report.message and "drafted [17, 4, 9, 30]" in report.message, report.message


def test_reading_past_the_drafts_is_diagnosed():
    def one_based_rejected(drafted, num_accepted, next_token):
        strip = [("accepted", t) for t in drafted[:num_accepted]]
        if not drafted:
            return [("target", next_token)]
        if num_accepted < len(drafted):
            return strip + [("rejected", drafted[num_accepted + 1]), ("correction", next_token)]  # d_(n+1)
        return strip + [("bonus", next_token)]
    report = check(one_based_rejected)
    assert not report.passed and report.diagnosis == "index_past_the_drafts", repr(report)
    assert "IndexError" in report.message and "drafted [26], n = 0 and next_token = 53" in report.message


def test_a_starter_that_raises_not_implemented_is_not_written_yet():
    def my_fates(drafted, num_accepted, next_token):
        raise NotImplementedError("write the strip here")
    report = check(my_fates)
    assert not report.passed and report.diagnosis is None and "not written" in report.message


def test_strip_text_reads_as_the_strip():
    assert strip_text(step_fates([17, 4, 9], 2, 12)) == "accepted 17, accepted 4, rejected 9, correction 12"
    assert strip_text([]) == "nothing"


def test_the_check_runs_well_under_a_second():
    start = time.perf_counter()
    check(step_fates), check(rest_rejected_too), check(drafts_only)
    assert time.perf_counter() - start < 0.5
