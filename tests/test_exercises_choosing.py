"""lab/exercises/choosing.py, exercise best_k: the reference passes, each mistake a learner makes when choosing
K fails with its own diagnosis, a correct answer written another way passes, and the reference is the
library's own choice (analysis.roofline, policies/adaptive.py, serve/policy.py) on this chapter's figures."""
import json
import math
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from specdec_lab.analysis.roofline import expected_speedup, optimal_k
from specdec_lab.bench.machine import forward_cost
from specdec_lab.lab import exercises
from specdec_lab.lab.exercises import choosing
from specdec_lab.serve.policy import GoodputPolicy
from test_exercises import assert_diagnosed

DOCS = Path(__file__).resolve().parents[1] / "docs"


# ---- a learner's answers: the argmax, with one piece wrong ----

def tokens(alpha, k):
    return sum(alpha ** i for i in range(k + 1))


def argmax_loop(speed, ks):
    best_k, best = None, -math.inf
    for k in ks:
        if speed(k) > best:
            best_k, best = k, speed(k)
    return best_k


def linear_tokens(alpha, c, v):
    return argmax_loop(lambda k: (1 + k * alpha) / (k * c + v[k]), range(len(v)))


def verification_free(alpha, c, v):
    return argmax_loop(lambda k: tokens(alpha, k) / (k * c + 1), range(len(v)))


def draft_free(alpha, c, v):
    return argmax_loop(lambda k: tokens(alpha, k) / v[k], range(len(v)))


def most_tokens(alpha, c, v):
    return max(range(len(v)), key=lambda k: tokens(alpha, k))


def one_token_short(alpha, c, v):
    return argmax_loop(lambda k: sum(alpha ** i for i in range(k)) / (k * c + v[k]), range(len(v)))


def one_token_short_closed_form(alpha, c, v):
    return argmax_loop(lambda k: (k if alpha == 1 else (1 - alpha ** k) / (1 - alpha)) / (k * c + v[k]), range(len(v)))


def never_plain_decoding(alpha, c, v):
    return optimal_k(alpha, c, k_max=len(v) - 1, verify_cost=dict(enumerate(v)))  # k_min left at its default, 1


def longest_k_left_out(alpha, c, v):
    return argmax_loop(lambda k: tokens(alpha, k) / (k * c + v[k]), range(len(v) - 1))


def ties_to_the_longer_k(alpha, c, v):
    best_k, best = 0, -math.inf
    for k in range(len(v)):
        s = tokens(alpha, k) / (k * c + v[k])
        if s >= best:
            best_k, best = k, s
    return best_k


def closed_form_python(alpha, c, v):
    return argmax_loop(lambda k: (1 - alpha ** (k + 1)) / (1 - alpha) / (k * c + v[k]), range(len(v)))


def closed_form_numpy(alpha, c, v):
    a, k = np.float64(alpha), np.arange(len(v))
    with np.errstate(divide="ignore", invalid="ignore"):
        speed = (1 - a ** (k + 1)) / (1 - a) / (k * c + np.array(v))  # nan everywhere at alpha = 1
    return int(np.argmax(speed))  # the first nan: K = 0


def closed_form_numpy_loop(alpha, c, v):
    a, k = np.float64(alpha), np.arange(len(v))
    with np.errstate(divide="ignore", invalid="ignore"):
        speed = (1 - a ** (k + 1)) / (1 - a) / (k * c + np.array(v))
    return argmax_loop(lambda j: speed[j], range(len(v)))  # nothing beats -inf by being nan: None


MISTAKES = [
    (linear_tokens, "linear_tokens"),
    (verification_free, "verification_free"),
    (draft_free, "draft_free"),
    (most_tokens, "most_tokens"),
    (one_token_short, "one_token_short"),
    (one_token_short_closed_form, "one_token_short"),
    (never_plain_decoding, "never_plain_decoding"),
    (longest_k_left_out, "longest_k_left_out"),
    (ties_to_the_longer_k, "ties_to_the_longer_k"),
    (closed_form_python, "division_by_zero_at_one"),
    (closed_form_numpy, "division_by_zero_at_one"),
    (closed_form_numpy_loop, "division_by_zero_at_one"),
]


# ---- correct answers written other ways ----

def max_over_a_comprehension(alpha, c, v):
    speeds = [tokens(alpha, k) / (k * c + v[k]) for k in range(len(v))]
    return max(range(len(v)), key=lambda k: (speeds[k] > max(speeds) * (1 - 1e-9), -k))


def via_the_speedup_exercise(alpha, c, v):
    speedup = exercises.solution("speedup")  # the closed form, with alpha = 1's limit
    best = 0
    for k in range(1, len(v)):
        if speedup(alpha, k, c, v[k]) > speedup(alpha, best, c, v[best]) * (1 + 1e-9):
            best = k
    return best


def torch_argmax(alpha, c, v):
    k = torch.arange(len(v), dtype=torch.float64)
    tau = torch.stack([torch.tensor(alpha, dtype=torch.float64) ** i for i in range(len(v))]).cumsum(0)
    speed = tau / (k * c + torch.tensor(v, dtype=torch.float64))
    return speed.argmax()  # a 0-d integer tensor: the first K at the maximum


OTHER_WAYS = [max_over_a_comprehension, via_the_speedup_exercise, torch_argmax]


def test_the_reference_passes_and_is_the_librarys_choice():
    report = exercises.check("best_k", exercises.solution("best_k"))
    assert report.passed and report.diagnosis is None, repr(report)
    assert "optimal_k" in report.message, "the report names the library function it compares with"
    for case in choosing.CASES:
        assert exercises.solution("best_k")(*case) == optimal_k(case[0], case[1], 0, len(case[2]) - 1,
                                                                 dict(enumerate(case[2]))), case


@pytest.mark.parametrize("fn, diagnosis", MISTAKES, ids=[f"{d}-{f.__name__}" for f, d in MISTAKES])
def test_each_mistake_fails_with_its_own_diagnosis(fn, diagnosis):
    report = exercises.check("best_k", fn)
    assert_diagnosed(report, diagnosis)


def test_the_failure_says_where_and_both_speeds():
    report = exercises.check("best_k", verification_free)
    assert "alpha = 0.454, c = 0.029 and v = [1, 1.043," in report.message, report.message
    assert "the fastest K is 2, at 1.446x" in report.message and "K = 3, at 1.436x" in report.message
    tie = exercises.check("best_k", ties_to_the_longer_k)
    assert "The two tie: return the smaller K." in tie.message, tie.message


@pytest.mark.parametrize("fn", OTHER_WAYS, ids=[f.__name__ for f in OTHER_WAYS])
def test_a_correct_answer_written_another_way_passes(fn):
    report = exercises.check("best_k", fn)
    assert report.passed, repr(report)


@pytest.mark.parametrize("out, words", [(1.446, "not its speed"), (None, "an int from 0 to 8"),
                                        (True, "an int from 0 to 8"), (9, "K = 9"), (-1, "K = -1")])
def test_a_k_that_is_not_an_int_in_range_is_told_so(out, words):
    report = exercises.check("best_k", lambda alpha, c, v: out)
    assert not report.passed and report.diagnosis is None and words in report.message, repr(report)


def test_a_starter_is_not_written_yet():
    def starter(alpha, c, v):
        raise NotImplementedError("write best_k here")
    report = exercises.check("best_k", starter)
    assert not report.passed and "not written" in report.message


def test_every_mistake_is_told_apart_and_every_case_is_clear_of_near_ties():
    outputs = {}
    for name, candidate in choosing.MISTAKES:
        got = tuple(candidate(*case) for case in choosing.CASES)
        assert got not in outputs.values(), f"{name} gives the same K as another mistake on every case"
        outputs[name + str(len(outputs))] = got
    for alpha, c, v in choosing.CASES:
        speeds = [expected_speedup(alpha, k, c, v[k]) for k in range(len(v))]
        best = choosing.best_k(alpha, c, v)
        for k, s in enumerate(speeds):
            assert k == best or s < speeds[best] * (1 - 1e-6) or (s == speeds[best] and k > best), (alpha, c, v, k)
    ks = [choosing.best_k(*case) for case in choosing.CASES]
    assert 0 in ks and any(k == len(v) - 1 for k, (_, _, v) in zip(ks, choosing.CASES)), "plain and the longest K"


def test_the_cases_are_this_chapters_figures():
    stored = json.loads((DOCS / "bench_full.json").read_text())
    assert round(stored["costs"]["c"], 3) == choosing.C_STORED
    assert [round(stored["costs"]["verify_cost"][str(k)], 3) for k in range(1, 9)] == choosing.V_STORED[1:]
    assert round(stored["results"][0]["alpha"], 3) == choosing.CASES[0][0]
    profile = json.loads((DOCS / "machine_profile.json").read_text())
    assert round(profile["c"]["token"], 3) == choosing.C_PROFILE
    assert [round(forward_cost(profile, k + 1), 3) for k in range(9)] == choosing.V_PROFILE


def test_the_choice_is_the_serving_policys_at_one_row():
    """GoodputPolicy's K at batch size 1, its step costs K * c + v[K], is the exercise's K (v rising with K,
    as the policy's costs do)."""
    c, v = choosing.C_PROFILE, choosing.V_PROFILE
    costs = {(1, k): k * c + v[k] for k in range(len(v))}
    for alpha in (0.05, 0.3, 0.42, 0.6, 0.8, 0.95):
        policy = GoodputPolicy(costs, k_max=len(v) - 1, alpha=alpha)
        assert policy.k_for(1) == choosing.best_k(alpha, c, v), alpha


def test_the_stored_runs_best_predicted_k_at_its_alpha():
    """Section 1's pred_v column peaks at K = 2 for the stored run (alpha = 0.454): the exercise's first case."""
    assert choosing.best_k(*choosing.CASES[0]) == 2


def test_the_check_is_fast():
    t0 = time.perf_counter()
    for fn in (exercises.solution("best_k"), linear_tokens, ties_to_the_longer_k):
        exercises.check("best_k", fn)
    assert time.perf_counter() - t0 < 2.0


def test_the_chapters_prediction():
    """Chapter 11's 'Predict first': the machine profile's c and v_K at alpha = 0.42, K from 0 to 4."""
    alpha, c, v = 0.42, choosing.C_PROFILE, choosing.V_PROFILE[:5]
    assert [f"{x:.2f}" for x in v[1:]] == ["1.07", "1.13", "1.38", "1.67"]
    speeds = [f"{expected_speedup(alpha, k, c, v[k]):.2f}" for k in range(5)]
    assert choosing.best_k(alpha, c, v) == 2 and speeds == ["1.00", "1.30", "1.35", "1.14", "0.96"], speeds
    assert f"{sum(alpha ** i for i in range(5)):.2f} {4 * c + v[4]:.2f}" == "1.70 1.77"
    assert f"{4 * c + 1:.2f} {expected_speedup(alpha, 4, c):.2f}" == "1.10 1.54"
