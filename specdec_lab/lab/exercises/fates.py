"""Exercise "step_fates" (chapter 15): what the live demo's token strip shows for one step.

A step drafts K tokens d_1..d_K, the target accepts the first n of them, and adds one token of its own,
next_token. The strip shows the accepted drafts, then for n < K the rejected draft d_(n+1), struck through
where it was proposed, and the correction that replaced it; for n == K > 0 the bonus; for K = 0 (nothing
drafted) a plain target token. The drafts after d_(n+1) were never tested: they are discarded, and the
strip lists them only in the rejected token's hover.

The reference writes out the rule of lab/widgets.py's token_fates for a whole step (every token committed:
the engine's cut at EOS or max_new_tokens is left out), so that a learner can read it; the tests hold the
two equal on every K and n and on steps the engine recorded.
"""
import operator

from .report import Exercise, Failure, grade_cases

FATES = ("accepted", "rejected", "correction", "bonus", "target")  # the strip's fates, as lab/widgets.py's


def step_fates(drafted, num_accepted, next_token):
    """drafted: the K draft tokens d_1..d_K (K may be 0); num_accepted: n, the drafts the target accepted;
    next_token: the token the target added. Returns the strip's [(fate, token)], in the order it shows them."""
    n, k = num_accepted, len(drafted)
    strip = [("accepted", t) for t in drafted[:n]]
    if k == 0:  # a plain target step: nothing drafted, nothing tested
        return strip + [("target", next_token)]
    if n < k:  # d_(n+1) failed its test; d_(n+2)..d_K were never tested and are not shown
        return strip + [("rejected", drafted[n]), ("correction", next_token)]
    return strip + [("bonus", next_token)]  # all K accepted: p at position K+1 gives one more token


def _relabel(old, new):
    return lambda d, n, t: [(new if f == old else f, x) for f, x in step_fates(d, n, t)]


def _every_draft_after_rejected(d, n, t):
    if n == len(d):
        return step_fates(d, n, t)
    return [("accepted", x) for x in d[:n]] + [("rejected", x) for x in d[n:]] + [("correction", t)]


def _ending_in(condition, fate):
    """The reference, except that a step where condition(n, k) holds ends in `fate` (in nothing where None)."""
    def fates(d, n, t):
        strip = step_fates(d, n, t)
        if not condition(n, len(d)):
            return strip
        return strip[:-1] + ([(fate, t)] if fate else [])
    return fates


def _correction_first(d, n, t):
    strip = step_fates(d, n, t)
    return strip[:-2] + [strip[-1], strip[-2]] if n < len(d) else strip


MISTAKES = [
    ("discarded_shown_as_rejected", _every_draft_after_rejected),
    ("rejected_left_out", lambda d, n, t: [(f, x) for f, x in step_fates(d, n, t) if f != "rejected"]),
    ("correction_before_rejected", _correction_first),
    ("bonus_forgotten", _ending_in(lambda n, k: n == k > 0, None)),
    ("bonus_called_correction", _relabel("bonus", "correction")),
    ("correction_called_bonus", _relabel("correction", "bonus")),
    ("one_accepted_too_many", lambda d, n, t: step_fates(d, min(n + 1, len(d)), t)),
    ("plain_step_as_bonus", _ending_in(lambda n, k: k == 0, "bonus")),
    ("plain_step_as_correction", _ending_in(lambda n, k: k == 0, "correction")),
    ("plain_step_forgotten", _ending_in(lambda n, k: k == 0, None)),
    ("target_token_left_out", lambda d, n, t: step_fates(d, n, t)[:-1]),
]

HINTS = {
    "discarded_shown_as_rejected": "You marked every draft after the first rejection as rejected. Only d_(n+1) "
                                   "was tested and failed; the drafts after it were never tested, because the "
                                   "target's text has changed under them. They are discarded, not rejected: the "
                                   "strip leaves them out (the rejected token's hover lists them).",
    "rejected_left_out": "You left out the rejected draft. The strip shows d_(n+1) struck through where it was "
                         "proposed, just before the correction that replaced it, so that you can see what the "
                         "draft guessed and what the target chose instead.",
    "correction_before_rejected": "You put the correction before the rejected draft. The rejected draft sits "
                                  "where it was proposed, and the correction that replaced it comes right after.",
    "bonus_forgotten": "When all K drafts are accepted you showed no token after them. The verification pass "
                       "also scored position K+1, so the target adds one more token for free: the bonus.",
    "bonus_called_correction": "You called the bonus a correction. A correction replaces a rejected draft, so it "
                               "exists only when n < K. When all K drafts pass, nothing needs correcting: the "
                               "target's token, drawn from p at position K+1, is a bonus.",
    "correction_called_bonus": "You called the correction a bonus. A bonus comes only when all K drafts pass. "
                               "After a rejection the target's token replaces the rejected draft, drawn from "
                               "norm(max(0, p - q)): a correction.",
    "one_accepted_too_many": "You showed one accepted draft too many: n counts the accepted drafts, so they are "
                             "drafted[:n], and the rejected one is d_(n+1), which is drafted[n] in Python.",
    "plain_step_as_bonus": "With K = 0 you showed a bonus. A bonus needs K > 0 drafts, all accepted. With nothing "
                           "drafted the step is a plain target step, and its one token is a target token.",
    "plain_step_as_correction": "With K = 0 you showed a correction. A correction needs a rejected draft. With "
                                "nothing drafted the step is a plain target step, and its one token is a target "
                                "token.",
    "plain_step_forgotten": "With K = 0 you showed nothing. A plain step still adds one token, the target's own: "
                            "the strip shows it grey, as a target token.",
    "target_token_left_out": "You left out the target's own token. Every step adds next_token after the accepted "
                             "drafts: a correction after a rejection, a bonus when all K pass, a target token "
                             "when nothing was drafted.",
    "index_past_the_drafts": "Your function read past the end of drafted. With K drafts, d_1..d_K are "
                             "drafted[0]..drafted[K-1]: the rejected draft d_(n+1) is drafted[n], which exists "
                             "only when n < K, and a step with K = 0 has no drafts at all.",
}

CASES = [  # (drafted, n, next_token): some accepted, none, all (a bonus), nothing drafted, and K = 1 both ways
    ([17, 4, 9, 30], 2, 12),
    ([5, 8, 21], 0, 40),
    ([3, 14, 15], 3, 92),
    ([], 0, 7),
    ([26], 0, 53),
    ([58], 1, 97),
]


def strip_text(strip):
    """A strip as words: "accepted 17, rejected 9, correction 12"."""
    return ", ".join(f"{fate} {token}" for fate, token in strip) or "nothing"


def _describe(case):
    drafted, n, t = case
    return f"drafted {drafted}, n = {n} and next_token = {t}"


def _read_strip(out, case):
    """The learner's output as [(fate, token)], or a Failure that says what form it should have."""
    example = 'a list of (fate, token) pairs, such as [("accepted", 17), ("rejected", 4), ("correction", 12)]'
    if not isinstance(out, (list, tuple)):
        raise Failure(f"Your function returned {out!r} for {_describe(case)}: "
                      f"it should return {example}.")
    strip = []
    for i, item in enumerate(out):
        try:
            fate, token = item
            token = operator.index(token)
        except (TypeError, ValueError):
            raise Failure(f"Your function returned {out!r} for {_describe(case)}, and its item {i}, {item!r}, "
                          f"is not a (fate, token) pair: it should return {example}.") from None
        if fate not in FATES:
            raise Failure(f"Your function returned the fate {fate!r} for {_describe(case)}: the fates are "
                          f"{', '.join(map(repr, FATES))}.")
        strip.append((fate, token))
    return strip


def _explain(case, got, want):
    return (f"For {_describe(case)}, the strip shows: {strip_text(want)}. "
            f"Yours shows: {strip_text(got)}.")


def _on_error(exc):
    return "index_past_the_drafts" if isinstance(exc, IndexError) else None


def grade_step_fates(fn):
    def on_a_copy(drafted, n, t):  # a function that edits drafted must not edit the case
        return fn(list(drafted), n, t)
    grade_cases(on_a_copy, CASES, step_fates, MISTAKES, describe=_describe, read=_read_strip, explain=_explain,
                on_error=_on_error)
    return (f"Your strips equal the demo's (token_fates in specdec_lab/lab/widgets.py) on {len(CASES)} steps: "
            f"some drafts accepted, none, all of them (a bonus), K = 1 accepted and rejected, and a plain step "
            f"with nothing drafted.")


STEP_FATES = Exercise("step_fates", step_fates, grade_step_fates, HINTS)
