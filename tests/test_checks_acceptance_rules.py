"""Chapter 03's checks (specdec_lab/lab/checks/acceptance_rules.py) pass on the chapter's pieces and fail on
broken ones: each broken rule of lab/pitfalls.py in place of the library's, and figures with one value changed."""
import copy
import json
from fractions import Fraction
from pathlib import Path

import pytest
import torch

from specdec_lab.core.verify import verify
from specdec_lab.lab import lossless, pitfalls
from specdec_lab.lab.checks import acceptance_rules as checks
from specdec_lab.verification import block_weights, verify_block, verify_match
from specdec_lab.verification.expect import rates

DOCS = Path(__file__).resolve().parents[1] / "docs"
CORRECT = {"token": (lossless.exact_token_rule, verify), "block": (lossless.exact_block_rule, verify_block),
           "match": (lossless.exact_match_rule, verify_match)}
P1 = (Fraction(1, 5), Fraction(1, 2), Fraction(3, 10))
Q1 = (Fraction(1, 2), Fraction(3, 10), Fraction(1, 5))
PB, QB = (Fraction(1, 3), Fraction(2, 3)), (Fraction(2, 3), Fraction(1, 3))


def test_the_library_rules_are_lossless():
    checks.rules_lossless(CORRECT)


@pytest.mark.parametrize("slot, in_fractions, code", [
    ("block", pitfalls.exact_block_ratio_test, pitfalls.verify_block_ratio_test),
    ("block", pitfalls.exact_block_unscaled_residual, pitfalls.verify_block_unscaled_residual),
    ("match", pitfalls.exact_match_any_positive, pitfalls.verify_match_any_positive)])
def test_each_broken_rule_fails(slot, in_fractions, code):
    with pytest.raises(AssertionError, match="chi-square"):
        checks.rules_lossless({**CORRECT, slot: (in_fractions, code)})


def as_tensor(rows):
    return torch.tensor([[float(x) for x in r] for r in rows], dtype=torch.float64)


def toy_pieces():
    """Sections 1 to 3's pieces as the chapter computes them; the code's shares are the exact laws here."""
    one_hot = tuple(Fraction(int(x == 0)) for x in range(3))
    cases = {"token by token": (lossless.exact_token_rule, (0, 1, 1), Q1),
             "block": (lossless.exact_block_rule, (0, 1, 1), Q1),
             "exact match, q sampled": (lossless.exact_match_rule, (0, 1, 1), Q1),
             "exact match, argmax": (lossless.exact_match_rule, (0, 0, 0), one_hot)}
    laws = {}
    for name, (rule, drafts, q) in cases.items():
        laws[name] = [Fraction(0)] * 4
        for n, _, prob in rule([P1] * 4, [q] * 3, drafts):
            laws[name][n] += prob
    shares = {name: [float(x) for x in law] for name, law in laws.items()}
    weights = block_weights(torch.tensor((0, 1, 1)), as_tensor([P1] * 4).float(), as_tensor([Q1] * 3).float())
    per_block = {}
    for drafts in [(0, 0), (0, 1), (1, 0), (1, 1)]:
        P, h = lossless.block_thresholds([PB] * 3, [QB] * 2, drafts)
        P_code, h_code = block_weights(torch.tensor(drafts), as_tensor([PB] * 3), as_tensor([QB] * 2))
        kept = [sum(n * prob for n, _, prob in rule([PB] * 3, [QB] * 2, drafts))
                for rule in lossless.EXACT_RULES.values()]
        per_block["AB"[drafts[0]] + "AB"[drafts[1]]] = (P, h, P_code, h_code, kept)
    p2, q2 = lossless.iid_lm(PB), lossless.iid_lm(QB)
    binary = ({name: lossless.exact_step_output(rule, p2, q2, 2, 2)[1] for name, rule in lossless.EXACT_RULES.items()},
              lossless.ideal_accepted(p2, q2, 2, 2))
    examples = {"flat q, top token p's": ([0.7, 0.1, 0.1, 0.1], [0.28, 0.24, 0.24, 0.24]),
                "q's top token unlikely": ([0.1, 0.6, 0.3], [0.4, 0.35, 0.25])}
    kept3 = {name: tuple(float(x[0]) for x in rates(torch.tensor([p], dtype=torch.float64),
                                                     torch.tensor([q], dtype=torch.float64)))
             for name, (p, q) in examples.items()}
    return laws, shares, weights, per_block, binary, (-3.5e-16, kept3)


def test_toy_figures_hold_and_reject_a_changed_copy():
    pieces = toy_pieces()
    checks.toy_figures(*pieces)
    laws, shares, weights, per_block, (kept, ideal), rates_ = pieces
    off = {**shares, "block": [0.0, 0.0, 0.02, 0.98]}
    with pytest.raises(AssertionError):
        checks.toy_figures(laws, off, weights, per_block, (kept, ideal), rates_)
    with pytest.raises(AssertionError):
        checks.toy_figures(laws, shares, weights, per_block, ({**kept, "block": Fraction(10, 9)}, ideal), rates_)
    with pytest.raises(AssertionError, match="never keeps more"):
        checks.toy_figures(laws, shares, weights, per_block, (kept, ideal), (0.01, rates_[1]))


def test_answers_hold_and_reject_a_changed_copy():
    args = ({"token": Fraction(18, 25), "block": Fraction(4, 5), "match": Fraction(13, 50)}, [0, 0, Fraction(4, 15)],
            {"token": Fraction(2, 3), "block": Fraction(2, 3), "match": Fraction(4, 9)}, [1.0, 0.38, 0.5])
    checks.answers(*args)
    with pytest.raises(AssertionError):
        checks.answers(*args[:3], [1.0, 0.5, 0.5])


def stored_pieces(stored):
    """Section 4's dicts, as the chapter computes them from docs/verification_rules.json."""
    expected = {(r["temperature"], r["k"], r["rule"]): r["expected_accepted_per_step"] for r in stored["expected"]}
    measured = {(r["temperature"], r["k"], r["rule"]): r for r in stored["rows"]}
    over_token = {(r["temperature"], r["k"], r["rule"]): r for r in stored["ratios"]}
    gain = {(T, k): (1 + expected[(T, k, "block")]) / (1 + expected[(T, k, "token")]) for T, k, _ in expected}
    rules = {rule for _, _, rule in expected}
    spread = {k: max(measured[(0.0, k, r)]["tokens_per_second"] for r in rules)
              / min(measured[(0.0, k, r)]["tokens_per_second"] for r in rules) for k in (2, 4, 8)}
    return expected, measured, over_token, gain, spread


def test_default_pair_holds_and_rejects_a_changed_copy():
    stored = json.loads((DOCS / "verification_rules.json").read_text())
    live, greedy = {"token": 0.9, "block": 0.6, "match": 0.05, "match_argmax": 0.3}, {"token": [1, 2], "block": [1, 2]}
    checks.default_pair(*stored_pieces(stored), live, greedy)
    changed = copy.deepcopy(stored)
    row = next(r for r in changed["rows"] if (r["temperature"], r["k"], r["rule"]) == (1.0, 4, "match"))
    row["tokens_per_second"] *= 1.1
    with pytest.raises(AssertionError):
        checks.default_pair(*stored_pieces(changed), live, greedy)
    with pytest.raises(AssertionError, match="today"):
        checks.default_pair(*stored_pieces(stored), {**live, "match": 1.0}, greedy)
    with pytest.raises(AssertionError, match="same tokens"):
        checks.default_pair(*stored_pieces(stored), live, {"token": [1, 2], "block": [1, 3]})
