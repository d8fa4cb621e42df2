"""Exercise "eagle_pairs" (chapter 10): the training entries of a feature draft (EAGLE, arXiv 2401.15077).

A feature draft reads a token together with the target's final hidden state that predicted it, and
estimates the state the target computes after reading that token (drafters/feature.py). Training
builds those entries from a sequence the target has read: with states[j] the target's state after
reading tokens[j] (it predicts tokens[j + 1]),

    entry j:  reads tokens[j + 1] with states[j],  its estimate regresses to states[j + 1]

for j = 0 .. L - 2. That is train/feature.py's pairing: collate_entries writes `tok[b, :L - 1] =
tokens[1:]` beside `feat[b, :L - 1] = states`, and feature_draft_loss regresses `h[:, :-1]` on
`feat[:, 1:]`. The stored states there stop one short (the target never reads the answer's last
token), so the library's last entry has no state to regress to; here the states cover every token,
and every entry has one.
"""
import torch

from .report import Exercise, Failure, grade_cases


def eagle_pairs(tokens, states):
    """tokens (L,) long, states (L, d): the target's final state after reading each token.
    Returns the L - 1 entries: entry_tokens (L - 1,), entry_states (L - 1, d), regress_to (L - 1, d)."""
    return tokens[1:], states[:-1], states[1:]


PAIRS_MISTAKES = [
    ("token_not_shifted", lambda tokens, states: (tokens[:-1], states[:-1], states[1:])),
    ("reads_its_target", lambda tokens, states: (tokens[1:], states[1:], states[1:])),
    ("regresses_to_its_input", lambda tokens, states: (tokens[1:], states[:-1], states[:-1])),
    ("states_swapped", lambda tokens, states: (tokens[1:], states[1:], states[:-1])),
]

PAIRS_HINTS = {
    "token_not_shifted": "Entry j read tokens[j] with states[j], a state the target computed after reading "
                         "that very token, so the token tells the draft nothing new. While drafting, the draft "
                         "holds the state that predicted the token it has just drafted, not one that has read "
                         "it: trained on your pairs, it learns to ignore the token. Pair tokens[j + 1] with "
                         "states[j].",
    "reads_its_target": "Each entry read states[j + 1], the very state its estimate must match, so training "
                        "looks perfect: copying the input is enough. While drafting, that state does not exist "
                        "yet (the target has not read the drafted token), so the draft has learnt nothing it "
                        "can use. Read the state that predicted the token, states[j].",
    "regresses_to_its_input": "Your estimates regress to states[j], the state the entry already reads, so the "
                              "draft learns to copy its input. That state predicted the token just read, so the "
                              "head on the copy proposes that token again instead of the next one. Regress to "
                              "states[j + 1], the state the target computes after reading the token.",
    "states_swapped": "You swapped the two states: each entry reads states[j + 1], the state it should "
                      "estimate, and regresses to states[j], the one it should read. The input hands the draft "
                      "its answer, which drafting cannot do, and the estimate learns to step backwards. Read "
                      "states[j] and regress to states[j + 1].",
}

NAMES = ("entry_tokens", "entry_states", "regress_to")


def _pairs_cases():
    """(tokens, states) for L = 2, 3, 5 and 6: distinct tokens and distinct states, so that each
    position can be told from every other by its value."""
    g = torch.Generator().manual_seed(10)
    return [(torch.randperm(50, generator=g)[:L], torch.randn(L, d, generator=g))
            for L, d in ((2, 3), (3, 2), (5, 4), (6, 1))]


def _describe(case):
    return f"tokens {case[0].tolist()} (L = {len(case[0])}) with states of shape {tuple(case[1].shape)}"


def _read_pairs(out, case):
    tokens, states = case
    L, d = states.shape
    if not isinstance(out, (tuple, list)) or len(out) != 3:
        kind = f"{len(out)} items" if isinstance(out, (tuple, list)) else f"a value of type {type(out).__name__}"
        raise Failure(f"For {_describe(case)}, your function returned {kind}: it should return three tensors, "
                      f"(entry_tokens, entry_states, regress_to).")
    for name, x, shape in zip(NAMES, out, ((L - 1,), (L - 1, d), (L - 1, d))):
        if not isinstance(x, torch.Tensor):
            raise Failure(f"For {_describe(case)}, your {name} has type {type(x).__name__}; it should be a tensor "
                          f"of shape {shape}.")
        if tuple(x.shape) != shape:
            raise Failure(f"For {_describe(case)}, your {name} has shape {tuple(x.shape)}; it should have shape "
                          f"{shape}: one row per entry, and a sequence of L tokens makes L - 1 = {L - 1}.")
    return out[0].long(), out[1].float(), out[2].float()


def _same_pairs(a, b):
    return torch.equal(a[0], b[0]) and torch.allclose(a[1], b[1]) and torch.allclose(a[2], b[2])


def _position(row, rows):
    """The position whose value `row` holds, or None where it is none of them."""
    close = torch.equal if not rows.is_floating_point() else torch.allclose
    hits = [i for i in range(len(rows)) if rows[i].shape == row.shape and close(rows[i], row.to(rows.dtype))]
    return hits[0] if hits else None


def _token(tokens, value):
    at = _position(value, tokens)
    return f"the token at position {at}" if at is not None else f"token {int(value)} (not in the sequence)"


def _state(states, row):
    at = _position(row, states)
    return f"the state at position {at}" if at is not None else "a state that is none of the target's"


def _explain(case, got, want):
    tokens, states = case
    j = next(j for j in range(len(want[0])) if not _same_pairs(tuple(x[j:j + 1] for x in got),
                                                                   tuple(x[j:j + 1] for x in want)))
    reads = f"{_token(tokens, got[0][j])} with {_state(states, got[1][j])}"
    pair_right = torch.equal(got[0][j], want[0][j]) and torch.allclose(got[1][j], want[1][j])
    regress = _state(states, got[2][j])
    if pair_right:
        return (f"For {_describe(case)}: entry {j} reads the right token and state (positions {j + 1} and {j}), "
                f"but its estimate regresses to {regress}; it should regress to the state at position {j + 1}, "
                f"the one the target computes after reading that token.")
    if torch.allclose(got[2][j], want[2][j]):
        return (f"For {_describe(case)}: entry {j} reads {reads}; it should read the token at position {j + 1} "
                f"with the state at position {j}, the state that predicted it.")
    return (f"For {_describe(case)}: entry {j} reads {reads} and regresses to {regress}; it should read the "
            f"token at position {j + 1} with the state at position {j} and regress to the state at position {j + 1}.")


def grade_eagle_pairs(fn):
    cases = _pairs_cases()
    grade_cases(fn, cases, eagle_pairs, PAIRS_MISTAKES, describe=_describe, read=_read_pairs,
                explain=_explain, same=_same_pairs)
    return (f"Your entries equal the library's (train/feature.py) on {len(cases)} sequences of 2 to 6 tokens: "
            f"entry j reads the token at position j + 1 with the state at position j that predicted it, and "
            f"its estimate regresses to the state at position j + 1.")


EAGLE_PAIRS = Exercise("eagle_pairs", eagle_pairs, grade_eagle_pairs, PAIRS_HINTS)
