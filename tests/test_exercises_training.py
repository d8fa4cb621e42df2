"""lab/exercises/training.py: the acceptance rate sum_v min(p, q). The reference passes and is the library's
beta, each classic mistake fails with its own diagnosis, the other correct ways pass, and a wrong shape is
told in plain words. The mistakes are written as a learner would write them; nothing is mocked."""
import time

import pytest
import torch

from specdec_lab.lab import exercises
from specdec_lab.lab.exercises.training import _rates_cases
from specdec_lab.verification.expect import rates
from test_exercises import assert_diagnosed

NAME = "acceptance_rate"


# ---- mistakes, as a learner writes them ----

def product(p, q):
    return torch.einsum("tv,tv->t", p, q)  # the chance two independent draws agree


def top_tokens_agree(p, q):
    return (p.argmax(dim=1) == q.argmax(dim=1)).float()


def total_variation(p, q):
    return (p - q).abs().sum(dim=1) / 2


def sum_of_max(p, q):
    return torch.max(p, q).sum(1)


def mean_of_min(p, q):
    return torch.min(p, q).mean(dim=-1)


def expectation_over_q(p, q):
    return (q * torch.minimum(torch.ones_like(p), p / q)).sum(-1)  # 0/0 where neither model has the token


MISTAKES = [
    (product, "two_draws_agree"),
    (top_tokens_agree, "greedy_agreement"),
    (total_variation, "forgot_one_minus"),
    (sum_of_max, "max_not_min"),
    (mean_of_min, "mean_not_sum"),
    (expectation_over_q, "nan_where_q_is_zero"),
]


# ---- correct, written another way ----

def expectation_guarded(p, q):
    """E_{x~q}[min(1, p/q)], the tokens the draft never proposes set to 0 before the division's nan spreads."""
    return torch.where(q > 0, q * (p / q).clamp(max=1.0), torch.zeros_like(q)).sum(-1)


def expectation_nan_to_num(p, q):
    return torch.nan_to_num(q * torch.clamp(p / q, max=1.0)).sum(-1)


def one_minus_total_variation(p, q):
    return 1 - 0.5 * (p - q).abs().sum(-1)


def loop_over_positions(p, q):
    out = []
    for t in range(p.shape[0]):
        out.append(sum(min(a, b) for a, b in zip(p[t].tolist(), q[t].tolist())))
    return torch.tensor(out)


OTHER_WAYS = [expectation_guarded, expectation_nan_to_num, one_minus_total_variation, loop_over_positions]


def test_the_reference_passes_and_is_the_librarys_beta():
    report = exercises.check(NAME, exercises.solution(NAME))
    assert report.passed and report.diagnosis is None, repr(report)
    cases, _ = _rates_cases()
    for p, q in cases:
        beta, _, _ = rates(p, q)  # verification/expect.py: the rate the chain formula uses
        assert torch.allclose(exercises.solution(NAME)(p, q).double(), torch.from_numpy(beta), atol=1e-6)


def test_the_cases_cover_the_edges_the_exercise_names():
    cases, labels = _rates_cases()
    solution = exercises.solution(NAME)

    def case(start):
        p, q = next((p, q) for p, q in cases if labels[id(p)].startswith(start))
        return p, q, solution(p, q)
    assert all(torch.allclose(p.sum(-1), torch.ones((), dtype=p.dtype)) for p, _ in cases), "rows are distributions"
    assert torch.allclose(case("3 positions where q equals p")[2], torch.ones(3)), "p = q: every draft accepted"
    assert torch.equal(case("2 positions where p and q share no token")[2], torch.zeros(2)), "disjoint: none accepted"
    p, q, alpha = case("3 positions of a greedy draft")
    assert torch.equal(alpha, p.gather(-1, q.argmax(-1, keepdim=True)).squeeze(-1)), "one-hot q: p at its token"
    assert {p.dtype for p, _ in cases} == {torch.float32, torch.float64} and max(p.shape[0] for p, _ in cases) > 1


def test_the_chapters_predict_first_case():
    p, q = torch.tensor([[0.5, 0.3, 0.2]]), torch.tensor([[0.2, 0.3, 0.5]])
    assert torch.allclose(exercises.solution(NAME)(p, q), torch.tensor([0.7]))
    assert top_tokens_agree(p, q).item() == 0.0, "greedy decoding never accepts this draft"


@pytest.mark.parametrize("fn, diagnosis", MISTAKES, ids=[d for _, d in MISTAKES])
def test_each_mistake_fails_with_its_own_diagnosis(fn, diagnosis):
    report = exercises.check(NAME, fn)
    assert_diagnosed(report, diagnosis)


def test_a_failure_names_the_case_and_both_values():
    report = exercises.check(NAME, product)
    assert "p = (0.5, 0.3, 0.2) and q = (0.2, 0.3, 0.5)" in report.message
    assert "the acceptance rate is 0.700, but you returned 0.290" in report.message
    nan = exercises.check(NAME, expectation_over_q)
    assert "share no token" in nan.message and "at position 0 the right value is 0.000 and you returned nan" \
        in nan.message


@pytest.mark.parametrize("fn", OTHER_WAYS, ids=[f.__name__ for f in OTHER_WAYS])
def test_a_correct_answer_written_another_way_passes(fn):
    report = exercises.check(NAME, fn)
    assert report.passed, repr(report)


@pytest.mark.parametrize("fn, says", [
    (lambda p, q: torch.minimum(p, q).sum(), "a single number means the sum ran over the positions as well"),
    (lambda p, q: torch.minimum(p, q).sum(0), "one number per token means the sum ran over the positions"),
    (lambda p, q: torch.minimum(p, q).sum(-1, keepdim=True), "drop the kept dimension"),
], ids=["summed_everything", "summed_positions", "keepdim"])
def test_a_wrong_shape_is_told_which_shape_to_return(fn, says):
    report = exercises.check(NAME, fn)
    assert not report.passed and report.diagnosis is None
    assert "it should return shape (1,), one acceptance rate per position" in report.message and says in report.message


def test_a_value_that_is_not_a_tensor_is_told_so():
    report = exercises.check(NAME, lambda p, q: torch.minimum(p, q).sum(-1).tolist())
    assert not report.passed and "returned a list" in report.message and "tensor of shape (1,)" in report.message


def test_the_check_is_quick():
    start = time.perf_counter()
    exercises.check(NAME, exercises.solution(NAME))
    exercises.check(NAME, product)  # a failure also runs every mistake's candidate
    assert time.perf_counter() - start < 1.0
