"""Exercises "verify_greedy" and "rollback": which row to read, and how many positions to keep.

Both are deterministic, so the learner's function is compared with the reference case by case, and
a mistake is named when one of the candidates below (each makes one mistake) gives the learner's
answers.
"""
import torch

from .report import Exercise, grade_cases


# ---- verify_greedy ----

def verify_greedy(target_logits, drafted):
    """Greedy verification. target_logits (K+1, V): row i is the target's prediction at the position of
    d_{i+1} (row K the one after d_K); drafted (K,) int64. Keep d_i while it is the target's argmax at
    its position; the next token is the argmax of row n, the first mismatch, or of row K when all K
    matched (the bonus). Returns (n, token) as ints."""
    best = target_logits.argmax(-1)  # (K+1,)
    K, n = drafted.shape[0], 0
    while n < K and int(drafted[n]) == int(best[n]):
        n += 1
    return n, int(best[n])


def _greedy_with(row=lambda n, K: n, judge=lambda i: i, late=False, keep_counting=False, bonus=None):
    """verify_greedy with one mistake: the token from row(n, K), draft i judged by row judge(i), n one
    too many at a mismatch (late), matches counted past a mismatch, or bonus(best, drafted) at n = K."""
    def fn(target_logits, drafted):
        best, K = target_logits.argmax(-1).tolist(), drafted.shape[0]
        match = [int(drafted[i]) == best[judge(i)] for i in range(K)]
        n = sum(match) if keep_counting else next((i for i, m in enumerate(match) if not m), K)
        if n == K and bonus is not None:
            return n, bonus(best, drafted.tolist())
        return (n + 1, best[n]) if late and n < K else (n, best[row(n, K)])
    return fn


GREEDY_MISTAKES = [
    ("no_bonus", _greedy_with(bonus=lambda best, d: best[len(d) - 1])),
    ("no_bonus", _greedy_with(bonus=lambda best, d: d[-1])),
    ("off_by_one", _greedy_with(row=lambda n, K: n - 1)),
    ("off_by_one", _greedy_with(row=lambda n, K: min(n + 1, K))),
    ("off_by_one", _greedy_with(judge=lambda i: i + 1, row=lambda n, K: min(n + 1, K))),
    ("off_by_one", _greedy_with(late=True)),
    ("no_stop_at_mismatch", _greedy_with(keep_counting=True)),
]

GREEDY_HINTS = {
    "no_bonus": "When all K drafts match you return the last draft's row (or the last draft itself) instead of "
                "the argmax of row K, the target's prediction after d_K: the bonus token is lost.",
    "off_by_one": "You read the wrong row: row i of the target's logits is its prediction at the position of "
                  "d_{i+1}, so d_{i+1} is judged by row i and the next token after n accepted drafts is the "
                  "argmax of row n.",
    "no_stop_at_mismatch": "You count every draft that matches, also after the first mismatch. A draft after a "
                           "rejected one was drafted from a text that will not exist, so counting stops there.",
}


def greedy_cases():
    """(logits, drafted) with the first m drafts equal to the argmax and the (m+1)-th not, for every m;
    the drafts after the mismatch equal the argmax too, so counting past it shows."""
    g, cases = torch.Generator().manual_seed(0), []
    for K in (1, 3, 4):
        for m in range(K + 1):
            logits = torch.randn(K + 1, 8, generator=g)  # (K+1, V)
            best = logits.argmax(-1)
            drafted = best[:K].clone()
            if m < K:
                drafted[m] = (best[m] + 1) % 8
            cases.append((logits, drafted))
    return cases


def _read_pair(out, case):
    try:
        n, token = out
        return int(n), int(token)
    except (TypeError, ValueError):
        return ("not a pair", repr(out))


def _explain_greedy(case, got, want):
    logits, drafted = case
    best = logits.argmax(-1).tolist()
    if got[0] == "not a pair":
        return f"Your function returned {got[1]}: it should return a pair (n, token) of ints."
    return (f"The drafts are {drafted.tolist()} and the target's argmax at each row is {best}: the answer is "
            f"n = {want[0]} and the token {want[1]} (the argmax of row {want[0]}), but you returned n = {got[0]} "
            f"and the token {got[1]}.")


def grade_verify_greedy(fn):
    cases = greedy_cases()
    grade_cases(fn, cases, verify_greedy, GREEDY_MISTAKES,
                describe=lambda case: f"the drafts {case[1].tolist()}", read=_read_pair, explain=_explain_greedy,
                on_error=lambda exc: "off_by_one" if isinstance(exc, IndexError) else None)
    return (f"You returned the right n and token on {len(cases)} blocks of K = 1, 3 and 4 drafts, from a "
            f"mismatch at the first draft to every draft matching.")


# ---- rollback ----

def rollback(target_len, draft_len, k, n):
    """The caches' lengths after one step that drafted k >= 1 tokens and accepted n of them.

    target_len: positions in the target's cache before the step: every committed token but c.
    draft_len: positions in the draft model's cache before the step. The draft holds every committed
      token but its pending ones, which it feeds at the start of its next proposal: 1 (c) usually,
      2 (d_k and c) after a step that accepted all its drafts. So pending = target_len + 1 - draft_len.
    Returns (new_target_len, new_draft_len, draft_pending).

    The step feeds the target [c, d_1..d_k] (k + 1 positions) and keeps c, d_1..d_n: n + 1 of them
    (core/kv_cache.py's drop_rejected(fed=k + 1, kept=n + 1)). The draft fed its pending tokens and
    d_1..d_{k-1} while drafting (d_k is drafted from the last of them and never fed); it keeps the
    pending tokens and d_1..d_n (drafters/model.py's commit_draft), and the next token becomes its
    only pending one. When all k are accepted there is nothing to drop, but d_k was never fed: it is
    pending with the next token, 2 of them, and the draft is one position behind the target.
    """
    pending = target_len + 1 - draft_len  # committed tokens the draft has not read yet: 1 or 2
    new_target_len = target_len + n + 1
    if n < k:
        return new_target_len, draft_len + pending + n, 1
    return new_target_len, draft_len + pending + k - 1, 2


def _rollback_with(target_keep=1, draft_keep=0, all_accepted=None, pending_known=True):
    """rollback with one mistake: the target keeps n + target_keep, the draft keeps draft_keep more (or
    fewer) than it should at a rejection, all_accepted(fed) gives (draft length, pending) when n = k
    from the draft's length after drafting, or pending is taken to be 1 whatever draft_len says."""
    def fn(target_len, draft_len, k, n):
        pending = target_len + 1 - draft_len if pending_known else 1
        fed = draft_len + pending + k - 1  # the draft's length after drafting
        new_target = target_len + n + target_keep
        if n < k:
            return new_target, draft_len + pending + n + draft_keep, 1
        return (new_target,) + (all_accepted(fed) if all_accepted else (fed, 2))
    return fn


ROLLBACK_MISTAKES = [
    ("off_by_one_rollback", _rollback_with(target_keep=0)),
    ("off_by_one_rollback", _rollback_with(draft_keep=-1)),
    ("off_by_one_rollback", _rollback_with(target_keep=0, draft_keep=-1)),
    ("off_by_one_rollback", _rollback_with(draft_keep=-1, all_accepted=lambda fed: (fed, 1))),
    ("all_accepted_pending", _rollback_with(all_accepted=lambda fed: (fed + 1, 1))),
    ("all_accepted_pending", _rollback_with(all_accepted=lambda fed: (fed, 1))),
    ("pending_ignored", _rollback_with(pending_known=False)),
]

ROLLBACK_HINTS = {
    "off_by_one_rollback": "A cache keeps n positions instead of n + 1: the step fed c before the drafts, so "
                           "keeping c, d_1..d_n is n + 1 positions. Every step then loses one committed token "
                           "from that cache: the target's output goes wrong, the draft's acceptance falls.",
    "all_accepted_pending": "When all k drafts are accepted, d_k was drafted but never fed to the draft: its "
                            "cache is one position shorter than it would be after a rejection, and d_k is "
                            "pending with the next token (2 pending), or the draft never sees d_k.",
    "pending_ignored": "The draft may hold 2 pending tokens (after a step that accepted everything): it fed "
                       "both before its drafts, so its length after drafting is draft_len + pending + k - 1, "
                       "with pending = target_len + 1 - draft_len.",
}


def rollback_cases():
    return [(t, t + 1 - pending, k, n) for t in (6, 11) for pending in (1, 2) for k in (1, 2, 4)
            for n in range(k + 1)]


def _read_lengths(out, case):
    try:
        return tuple(int(x) for x in out) if len(out) == 3 else ("not a triple", repr(out))
    except (TypeError, ValueError):
        return ("not a triple", repr(out))


def _explain_rollback(case, got, want):
    t, d, k, n = case
    if got[0] == "not a triple":
        return (f"Your function returned {got[1]}: it should return three ints (new_target_len, new_draft_len, "
                f"draft_pending).")
    what = "all of them" if n == k else f"{n}"
    return (f"With target_len = {t}, draft_len = {d} (so {t + 1 - d} pending), k = {k} drafted and {what} "
            f"accepted, the answer is (new_target_len, new_draft_len, draft_pending) = {want}, but you returned "
            f"{got}.")


def grade_rollback(fn):
    cases = rollback_cases()
    grade_cases(fn, cases, rollback, ROLLBACK_MISTAKES, describe=lambda c: "target_len = {}, draft_len = {}, "
                "k = {}, n = {}".format(*c), read=_read_lengths, explain=_explain_rollback)
    return (f"Your lengths agree with the engine's arithmetic on {len(cases)} steps: k = 1, 2 and 4, every n "
            f"from 0 to k, with 1 or 2 tokens pending in the draft before the step.")


VERIFY_GREEDY = Exercise("verify_greedy", verify_greedy, grade_verify_greedy, GREEDY_HINTS)
ROLLBACK = Exercise("rollback", rollback, grade_rollback, ROLLBACK_HINTS)
