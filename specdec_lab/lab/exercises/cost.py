"""Exercises "expected_tokens" and "speedup": the cost model of arXiv 2211.17192 (section 3.4, Theorem 3.8).

With K drafts a step and each accepted with probability alpha, independently, a step emits
1 + alpha + ... + alpha^K tokens on average: the accepted prefix plus the one correction or bonus
token. A step costs K draft forwards (c each, in units of a one-token target forward) and one
verification forward over K+1 tokens (v; 1 where decode is memory-bound). The references are
analysis/roofline.py's expected_tokens_per_step and expected_speedup.
"""
import math

from ...analysis.roofline import expected_speedup, expected_tokens_per_step
from .report import Exercise, Failure, grade_cases


def expected_tokens(alpha, k):
    """E[tokens per step] = (1 - alpha^(k+1)) / (1 - alpha); at alpha = 1 every draft is accepted and the
    step emits k + 1 (the formula's limit, which a division by 1 - alpha = 0 cannot give)."""
    if alpha == 1:
        return k + 1.0
    return (1 - alpha ** (k + 1)) / (1 - alpha)


def speedup(alpha, k, c, v):
    """Tokens per unit of time against plain decoding (one token per target forward, cost 1):
    expected_tokens(alpha, k) / (k * c + v)."""
    return expected_tokens(alpha, k) / (k * c + v)


def _read_number(out, case):
    try:
        return float(out)
    except (TypeError, ValueError):
        raise Failure(f"Your function returned {out!r} for the arguments {case}: it should return a number.") from None


def _same(a, b):
    return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-12)


def _nan_at_one(formula):
    """The closed form evaluated as numpy or torch would: 0 / 0 is nan at alpha = 1."""
    return lambda alpha, k, *rest: math.nan if alpha == 1 else formula(alpha, k, *rest)


def _without_one(alpha, k):
    return math.fsum(alpha ** i for i in range(1, k + 1))  # alpha + ... + alpha^k: the bonus token missing


def _k_terms(alpha, k):
    return math.fsum(alpha ** i for i in range(k))  # 1 + ... + alpha^(k-1): k terms instead of k + 1


def _division_error(exc):
    return "division_by_zero_at_one" if isinstance(exc, ZeroDivisionError) else None


TOKENS_MISTAKES = [
    ("missing_bonus", _without_one),
    ("missing_bonus", _k_terms),
    ("division_by_zero_at_one", _nan_at_one(lambda a, k: (1 - a ** (k + 1)) / (1 - a))),
]

SPEEDUP_MISTAKES = [
    ("missing_bonus", lambda a, k, c, v: _without_one(a, k) / (k * c + v)),
    ("missing_bonus", lambda a, k, c, v: _k_terms(a, k) / (k * c + v)),
    ("c_not_times_k", lambda a, k, c, v: expected_tokens(a, k) / (c + v)),
    ("ignores_v", lambda a, k, c, v: expected_tokens(a, k) / (k * c + 1)),
    ("ignores_v", lambda a, k, c, v: expected_tokens(a, k) / (k * c)),
    ("division_by_zero_at_one", _nan_at_one(lambda a, k, c, v: (1 - a ** (k + 1)) / (1 - a) / (k * c + v))),
]

HINTS = {
    "missing_bonus": "You left out the step's extra token: a step emits the accepted drafts plus one more (the "
                     "correction after a rejection, or the bonus when all are accepted), so the sum is "
                     "1 + alpha + ... + alpha^k, k + 1 terms, and even alpha = 0 gives 1 token.",
    "division_by_zero_at_one": "At alpha = 1 the closed form divides 0 by 0. Every draft is accepted there and "
                               "the step emits k + 1 tokens: return that limit (or sum the series).",
    "c_not_times_k": "Each of the k drafts costs a draft forward, so drafting costs k * c, not c.",
    "ignores_v": "The step also pays for the verification forward, v (one target forward over k + 1 tokens), "
                 "not 1 or nothing: the denominator is k * c + v.",
}

TOKENS_CASES = [(alpha, k) for alpha in (0.0, 0.3, 0.6, 0.9, 1.0) for k in (1, 2, 4, 7)]
SPEEDUP_CASES = [(alpha, k, c, v) for alpha in (0.0, 0.5, 0.8, 1.0) for k in (1, 3, 5)
                 for c, v in ((0.1, 1.0), (0.25, 1.3), (0.05, 2.0))]


def _explain(name):
    def explain(case, got, want):
        args = ", ".join(f"{n} = {x}" for n, x in zip(("alpha", "k", "c", "v"), case))
        return f"With {args} the {name} is {want:.4g}, but you returned {got:.4g}."
    return explain


def grade_expected_tokens(fn):
    grade_cases(fn, TOKENS_CASES, expected_tokens_per_step, TOKENS_MISTAKES,
                describe=lambda c: "alpha = {}, k = {}".format(*c), read=_read_number,
                explain=_explain("expected number of tokens per step"), same=_same, on_error=_division_error)
    return (f"Your expected tokens per step equal analysis.roofline's on {len(TOKENS_CASES)} cases, alpha from 0 "
            f"to 1 (where every draft is accepted) and k from 1 to 7.")


def grade_speedup(fn):
    grade_cases(fn, SPEEDUP_CASES, lambda a, k, c, v: expected_speedup(a, k, c, verify_cost=v), SPEEDUP_MISTAKES,
                describe=lambda c: "alpha = {}, k = {}, c = {}, v = {}".format(*c), read=_read_number,
                explain=_explain("expected speedup"), same=_same, on_error=_division_error)
    return (f"Your speedups equal analysis.roofline's expected_speedup on {len(SPEEDUP_CASES)} cases: alpha from 0 "
            f"to 1, k from 1 to 5, draft costs c from 0.05 to 0.25 and verification costs v from 1 to 2.")


EXPECTED_TOKENS = Exercise("expected_tokens", expected_tokens, grade_expected_tokens, HINTS)
SPEEDUP = Exercise("speedup", speedup, grade_speedup, HINTS)
