"""Exercises "grammar_rows" and "lookup": a request's grammar under speculation, and prompt lookup.

grammar_rows: a verification pass scores K + 1 positions at once, and a grammar (structured output) must
mask each as plain constrained decoding would have: row i, the token after d_1..d_i, with the tokens the
grammar allows after those drafts. The reference is what options/grammar.py's GrammarProcessor does with
a matcher; here the grammar is a function `allowed(prefix)` so that the exercise is the rows alone.

lookup: prompt lookup (drafters/ngram.py) drafts by copying: find the last earlier place where the
context's final n tokens occurred, and propose the k tokens that followed there, copying on over its own
copy where the context ends first.
"""
import torch

from ...drafters.ngram import ngram_lookup_reference
from .report import Exercise, Failure, grade_cases

V = 10  # the toy grammar's vocabulary


def toy_allowed(committed):
    """A toy grammar over 10 tokens: after `prefix` (a list of ints), a token t is allowed when it differs
    from the last token and (t + len(prefix)) % 3 != 0; token 9 (the end) is always allowed."""
    def allowed(prefix):
        whole = list(committed) + list(prefix)
        mask = torch.tensor([(t + len(whole)) % 3 != 0 and (not whole or t != whole[-1]) for t in range(V)])
        mask[V - 1] = True
        return mask
    return allowed


def grammar_rows(logits, drafted, allowed):
    """logits (K+1, V), drafted: K ints, allowed(prefix) -> (V,) bool. Row i masked (-inf where the grammar
    refuses) with allowed(drafted[:i]): the tokens the grammar allows after c, d_1..d_i."""
    rows = [logits[i].masked_fill(~allowed(list(drafted[:i])), float("-inf")) for i in range(logits.shape[0])]
    return torch.stack(rows)


def _rows_with(choose):
    return lambda logits, drafted, allowed: torch.stack(
        [logits[i].masked_fill(~allowed(choose(list(drafted), i)), float("-inf")) for i in range(logits.shape[0])])


ROWS_MISTAKES = [
    ("one_mask_for_every_row", _rows_with(lambda d, i: [])),
    ("mask_shifted_by_one", _rows_with(lambda d, i: d[:i + 1])),
    ("bonus_row_unmasked", lambda logits, drafted, allowed: torch.cat(
        [grammar_rows(logits[:-1], drafted, allowed), logits[-1:]]) if len(drafted) else logits),
    ("zero_not_minus_inf", lambda logits, drafted, allowed: torch.stack(
        [logits[i].masked_fill(~allowed(list(drafted[:i])), 0.0) for i in range(logits.shape[0])])),
]

ROWS_HINTS = {
    "one_mask_for_every_row": "Every row got the mask of the committed text. Row i scores the token after the "
                              "drafts d_1..d_i, and the grammar allows other tokens there: a row masked as of "
                              "the wrong prefix lets verification accept tokens the grammar forbids, or refuse "
                              "ones it allows, and the output no longer follows constrained decoding.",
    "mask_shifted_by_one": "Row i got the mask after d_1..d_{i+1}, one draft too many. Row 0 scores the token "
                           "after c alone, so its mask is the committed text's; row i's is after d_1..d_i.",
    "bonus_row_unmasked": "The last row (the bonus token's, after every draft) was left unmasked: when all drafts "
                          "are accepted the bonus is drawn from it, and may break the grammar.",
    "zero_not_minus_inf": "A refused token's logit was set to 0, which softmax turns into a positive "
                          "probability. Refused tokens need -inf, probability exactly 0.",
}


def _rows_cases():
    g = torch.Generator().manual_seed(3)
    cases = []
    for committed, drafted in (([], []), ([4], [1]), ([2, 5], [1, 4]), ([7], [2, 2, 8]), ([1, 2, 3], [5, 7, 1, 4])):
        logits = torch.randn(len(drafted) + 1, V, generator=g)
        cases.append((logits, drafted, toy_allowed(committed)))
    return cases


def _same_rows(a, b):
    return a.shape == b.shape and torch.equal(torch.isinf(a) & (a < 0), torch.isinf(b) & (b < 0)) and torch.allclose(
        a.nan_to_num(neginf=0.0), b.nan_to_num(neginf=0.0))


def _read_rows(out, case):
    logits = case[0]
    if not isinstance(out, torch.Tensor) or out.shape != logits.shape:
        raise Failure(f"Your function returned {type(out).__name__} "
                      f"{tuple(out.shape) if isinstance(out, torch.Tensor) else ''} for {len(case[1])} drafts: "
                      f"it should return a tensor of the logits' shape {tuple(logits.shape)}.")
    return out.float()


def grade_grammar_rows(fn):
    cases = _rows_cases()

    def explain(case, got, want):
        bad = next(i for i in range(want.shape[0]) if not _same_rows(got[i:i + 1], want[i:i + 1]))
        return (f"With drafts {case[1]}, row {bad} (the token after {'c' if bad == 0 else 'd_1..d_%d' % bad}) "
                f"allows tokens {(~torch.isinf(got[bad])).nonzero().flatten().tolist()}, where the grammar allows "
                f"{(~torch.isinf(want[bad])).nonzero().flatten().tolist()}.")
    grade_cases(fn, cases, grammar_rows, ROWS_MISTAKES, describe=lambda c: f"the drafts {c[1]}", read=_read_rows,
                explain=explain, same=_same_rows)
    return (f"Your rows equal the reference on {len(cases)} steps of 0 to 4 drafts: each row masked with what the "
            f"grammar allows after the drafts before it, refused tokens at -inf, the bonus row included.")


def lookup(context, n, k):
    """k drafts copied from after the most recent earlier occurrence of the context's final n tokens, or []
    where they never occurred before. Near the end the copy runs on over what it has just copied (as
    drafters/ngram.py's does: "a b a b" continues "a b a b ...")."""
    return ngram_lookup_reference(list(context), k, max_ngram=n, min_ngram=n)


def _lookup_cut_short(context, n, k):
    tail = context[-n:]
    for start in range(len(context) - n - 1, -1, -1):
        if context[start:start + n] == tail:
            return list(context[start + n:start + n + k])
    return []


def _lookup_first(context, n, k):
    tail = context[-n:]
    for start in range(len(context) - n):
        if context[start:start + n] == tail:
            return list(context[start + n:start + n + k])
    return []


def _lookup_self(context, n, k):
    tail = context[-n:]
    for start in range(len(context) - n, -1, -1):  # the context's own tail matches itself: nothing follows
        if context[start:start + n] == tail:
            return list(context[start + n:start + n + k])
    return []


def _lookup_includes_match(context, n, k):
    tail = context[-n:]
    for start in range(len(context) - n - 1, -1, -1):
        if context[start:start + n] == tail:
            return list(context[start + n - 1:start + n - 1 + k])
    return []


LOOKUP_MISTAKES = [("first_occurrence", _lookup_first), ("matches_itself", _lookup_self),
                   ("copies_from_the_match", _lookup_includes_match), ("stops_at_the_end", _lookup_cut_short)]
LOOKUP_HINTS = {
    "first_occurrence": "You copied after the first occurrence; prompt lookup takes the most recent one, "
                        "whose continuation is the likeliest to repeat now.",
    "matches_itself": "The context's last n tokens match themselves, where nothing follows yet: start the "
                      "search one position earlier, so that the match has tokens after it.",
    "copies_from_the_match": "You copied starting inside the match (its last token) instead of the token "
                             "after it.",
    "stops_at_the_end": "Your copy stopped at the context's end. When the match is recent, the tokens after it "
                        "run into the tokens being drafted: keep copying from your own drafts (a repeating "
                        "pattern goes on repeating), as the library's lookup does.",
}
LOOKUP_CASES = [([1, 2, 3, 4, 1, 2], 2, 3), ([5, 6, 7, 5, 6, 8, 5, 6], 2, 2), ([1, 2, 3], 2, 2),
                ([9, 9, 9, 9], 1, 2), ([3, 1, 4, 1, 5, 9, 2, 6, 1, 4], 2, 4), ([7, 7, 8, 7, 7], 2, 5)]


def grade_lookup(fn):
    grade_cases(fn, LOOKUP_CASES, lookup, LOOKUP_MISTAKES,
                describe=lambda c: f"context {c[0]}, n = {c[1]}, k = {c[2]}",
                read=lambda out, case: list(out) if isinstance(out, (list, tuple)) else out,
                explain=lambda c, got, want: f"For the context {c[0]} with n = {c[1]} and k = {c[2]}, the drafts "
                                             f"are {want}, but you returned {got}.")
    return (f"Your lookup equals the library's (drafters/ngram.py) on {len(LOOKUP_CASES)} contexts: the most recent "
            f"earlier match, no match at all, and a copy that runs on past the context's end.")


GRAMMAR_ROWS = Exercise("grammar_rows", grammar_rows, grade_grammar_rows, ROWS_HINTS)
LOOKUP = Exercise("lookup", lookup, grade_lookup, LOOKUP_HINTS)
