"""Exercise "best_k": the draft length the cost model says decodes fastest (chapter 11, section 4).

With K drafts a step and each accepted with probability alpha, independently, a step emits
expected_tokens(alpha, K) = 1 + alpha + ... + alpha^K tokens and costs K * c + v[K] one-token target
forwards: K draft forwards at c each, and one verification forward over K + 1 rows, v[K] (v[0] = 1, plain
decoding). Its speed over plain decoding is speedup(alpha, K, c, v[K]) (cost.py, the speedup exercise);
the best K is the one that maximises it over 0..len(v) - 1, the smaller K on a tie. K = 0 is plain
decoding, speed 1, and wins where no draft pays for itself.

The check compares with analysis.roofline's optimal_k(alpha, c, 0, len(v) - 1, verify_cost=v), the
argmax that CostAwareController (policies/adaptive.py) takes after every step; serve/policy.py's
GoodputPolicy takes the same argmax with measured step costs. The cases use this chapter's figures:
the stored run's c and v_K (docs/bench_full.json) and the machine profile's (docs/machine_profile.json).
"""
import math
import operator

from ...analysis.roofline import expected_speedup, optimal_k
from .cost import HINTS as COST_HINTS
from .cost import expected_tokens, speedup
from .report import Exercise, Failure, grade_cases

TIE = 1e-9  # relative: speeds this close count as equal, and the smaller K wins


def _fastest(speeds):
    """The first index whose speed is within TIE of the highest."""
    top = max(speeds)
    return next(k for k, s in enumerate(speeds) if s >= top * (1 - TIE))


def best_k(alpha, c, v):
    """The K in 0..len(v) - 1 with the highest speedup(alpha, K, c, v[K]); the smallest on a tie."""
    return _fastest([speedup(alpha, k, c, v[k]) for k in range(len(v))])


def _library_k(alpha, c, v):
    return optimal_k(alpha, c, 0, len(v) - 1, verify_cost=dict(enumerate(v)))


def _choose(tokens=expected_tokens, cost=lambda k, c, v: k * c + v[k], first=0, last=0, longer_on_tie=False):
    """A learner's argmax with one piece changed: tokens(alpha, k), cost(k, c, v), the first K searched, how
    many of the longest K are left out (last), and which K a tie keeps."""
    def fn(alpha, c, v):
        ks = list(range(first, len(v) - last))
        speeds = [tokens(alpha, k) / cost(k, c, v) for k in ks]
        if longer_on_tie:
            return ks[len(ks) - 1 - _fastest(speeds[::-1])]
        return ks[_fastest(speeds)]
    return fn


def _nan_at_one(alpha, c, v):
    """The closed form as numpy or torch evaluate it: 0 / 0 is nan at alpha = 1, no speed compares above
    nan, and the search keeps K = 0."""
    return 0 if alpha == 1 else best_k(alpha, c, v)


MISTAKES = [
    ("linear_tokens", _choose(tokens=lambda a, k: 1 + k * a)),
    ("verification_free", _choose(cost=lambda k, c, v: k * c + 1)),
    ("draft_free", _choose(cost=lambda k, c, v: v[k])),
    ("most_tokens", _choose(cost=lambda k, c, v: 1.0)),
    ("one_token_short", _choose(tokens=lambda a, k: math.fsum(a ** i for i in range(k)))),  # 1 + ... + a^(k-1)
    ("one_token_short", _choose(tokens=lambda a, k: math.fsum(a ** i for i in range(1, k + 1)))),  # a + ... + a^k
    ("never_plain_decoding", _choose(first=1)),
    ("longest_k_left_out", _choose(last=1)),
    ("ties_to_the_longer_k", _choose(longer_on_tie=True)),
    ("division_by_zero_at_one", _nan_at_one),
]

HINTS = {
    "linear_tokens": "You counted 1 + K * alpha tokens per step, as if every draft counted on its own. Draft i "
                     "counts only when it and every draft before it are accepted, chance alpha^i, so a step "
                     "emits 1 + alpha + ... + alpha^K. The straight line overrates long drafts, and your K "
                     "comes out too long.",
    "verification_free": "You priced the verification forward as one plain forward (v[K] = 1). Here a forward "
                         "over K + 1 rows costs v[K], and v[K] grows with K, so a step costs K * c + v[K]. "
                         "Free verification makes long drafts look cheap, and your K comes out too long.",
    "draft_free": "You left out the drafts' cost. Each of the K drafts costs a draft forward, c, so a step "
                  "costs K * c + v[K], not v[K]. Free drafts make a longer K look better than it is.",
    "most_tokens": "You picked the K with the most tokens per step. Every extra draft adds tokens when "
                   "alpha > 0, so that is always the longest K. The fastest K weighs the tokens against what "
                   "the step costs: maximise tokens / (K * c + v[K]).",
    "one_token_short": "You left out the step's extra token: a step emits the accepted drafts plus one more "
                       "(the correction after a rejection, or the bonus when all are accepted), "
                       "1 + alpha + ... + alpha^K. Without it plain decoding (K = 0) seems to emit nothing "
                       "and short drafts lose most of their worth, so your K comes out too long.",
    "never_plain_decoding": "You searched K from 1. When alpha is low no draft pays for itself, and plain "
                            "decoding (K = 0, speed 1) is the fastest: search range(len(v)), which starts at 0. "
                            "(analysis.roofline's optimal_k starts at k_min, 1 unless you pass 0.)",
    "longest_k_left_out": "You left out the longest K. v has one entry for each K from 0 to len(v) - 1, so "
                          "search range(len(v)). At high alpha the longest draft can be the fastest.",
    "ties_to_the_longer_k": "On a tie you kept the longer K (a loop that updates on >= instead of >). The same "
                            "speed for more drafting gains nothing: keep the smaller K, the first one whose "
                            "speed is within a small relative tolerance of the best.",
    "division_by_zero_at_one": COST_HINTS["division_by_zero_at_one"],
}

# This chapter's figures, rounded to three decimals: the stored run (docs/bench_full.json: c, and v_K over
# K = 1 to 8, with alpha = 0.454 at temperature 0), and the machine profile (docs/machine_profile.json: the
# token draft's c, and the target's forward over K + 1 = 1 to 9 rows, 7 rows between the measured 6 and 8).
C_STORED, V_STORED = 0.029, [1.0, 1.043, 1.09, 1.134, 1.284, 1.223, 1.245, 1.302, 1.512]
C_PROFILE, V_PROFILE = 0.026, [1.0, 1.07, 1.131, 1.383, 1.669, 1.941, 2.289, 2.637, 2.989]

CASES = [(0.454, C_STORED, V_STORED), (0.42, C_PROFILE, V_PROFILE)] \
    + [(alpha, C_STORED, V_STORED) for alpha in (0.0, 0.05, 0.3, 0.7, 0.9, 1.0)] \
    + [(alpha, C_PROFILE, V_PROFILE) for alpha in (0.8, 1.0)] \
    + [(0.5, 0.25, [1.0, 1.25, 2.0]),  # K = 1 ties plain decoding exactly: 1.5 tokens for 1.5 forwards
       (0.6, 0.1, [1.0, 1.0, 1.0, 1.0, 1.0]),  # verification as cheap as one row, as where decode is memory-bound
       (1.0, 0.0, [1.0, 1.05, 1.1, 1.2]),
       (0.95, 0.05, [1.0, 1.01, 1.02, 1.03, 1.04, 1.05, 1.06])]


def _figures(v):
    return "[" + ", ".join(f"{x:g}" for x in v) + "]"


def _describe(case):
    alpha, c, v = case
    return f"alpha = {alpha:g}, c = {c:g} and v = {_figures(v)}"


def _read_k(out, case):
    v = case[2]
    try:
        if isinstance(out, bool):
            raise TypeError
        k = operator.index(out)  # an int, or a numpy or 0-d torch integer
    except TypeError:
        speed = ", not its speed" if isinstance(out, float) else ""
        nan = "division_by_zero_at_one" if out is None and case[0] == 1 else None  # no speed compared above nan
        raise Failure(f"Your function returned {out!r} ({type(out).__name__}) for {_describe(case)}: it should "
                      f"return the draft length K, an int from 0 to {len(v) - 1}{speed}.", nan) from None
    if not 0 <= k < len(v):
        raise Failure(f"Your function returned K = {k} for {_describe(case)}: v has {len(v)} entries, one for "
                      f"each K from 0 to {len(v) - 1}, so K must be in that range.")
    return k


def _speed(case, k):
    alpha, c, v = case
    return expected_speedup(alpha, k, c, v[k])


def _explain(case, got, want):
    fast, yours = _speed(case, want), _speed(case, got)
    text = (f"With {_describe(case)}, the fastest K is {want}, at {fast:.3f}x plain decoding's speed, but you "
            f"returned K = {got}, at {yours:.3f}x.")
    if yours >= fast * (1 - TIE):
        text += " The two tie: return the smaller K."
    return text


def _division_error(exc):
    return "division_by_zero_at_one" if isinstance(exc, ZeroDivisionError) else None


def grade_best_k(fn):
    grade_cases(fn, CASES, _library_k, MISTAKES, describe=_describe, read=_read_k, explain=_explain,
                on_error=_division_error)
    return (f"Your K equals analysis.roofline's optimal_k (K from 0, v as verify_cost) on {len(CASES)} cases: this "
            f"chapter's stored run and machine profile, alpha from 0 (plain decoding wins) to 1, and a tie.")


BEST_K = Exercise("best_k", best_k, grade_best_k, HINTS)
