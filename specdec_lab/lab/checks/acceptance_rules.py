"""Chapter 03's checks: every acceptance rule lossless (its code by a chi-square test, its law in fractions),
the toy examples' figures, the answers, the stored run of docs/verification_rules.json as the prose reads it,
and today's live run."""
from fractions import Fraction

import torch

from .. import lossless

BINARY_KEPT = {"token": Fraction(10, 9), "block": Fraction(11, 9), "match": Fraction(52, 81)}


def toy(seed, V, power=1):
    """A toy pair of models in fractions over V tokens: the target's p and the draft's q."""
    return (lossless.random_fraction_lm(f"p{seed}", V, power=power),
            lossless.random_fraction_lm(f"q{seed}", V, power=power))


def rules_lossless(rules):
    """What correct rules must do (`rules`: name -> (the rule in fractions, the library's code)). Each rule's
    code passes the chi-square test against the target's exact distribution of K+1 tokens on a toy pair
    (`lossless.sample_step_outputs`, 20,000 steps), each rule in fractions gives that distribution exactly on
    three toy pairs, and on the binary example token, block and match keep 10/9, 11/9 and 52/81 drafts.
    Each broken rule of lab/pitfalls.py in place of the library's fails it."""
    for name, (exact, code) in rules.items():
        p, q = toy(1, 3, power=2)
        want = {s: float(x) for s, x in lossless.exact_target_joint(p, 2, 3).items()}
        r = lossless.chi_square_test(lossless.sample_step_outputs(code, p, q, 2, 3, samples=20000), want)
        assert r.impossible == 0 and r.pvalue > 1e-3, f"{name}'s code fails the chi-square test"
        for seed, V, K in ((1, 3, 3), (2, 3, 2), (3, 2, 3)):
            p, q = toy(seed, V)
            assert lossless.exact_step_output(exact, p, q, K, V)[0] == lossless.exact_target_joint(p, K, V), \
                f"{name} is not lossless in fractions (toy pair {seed}, K = {K})"
    p2, q2 = lossless.iid_lm((Fraction(1, 3), Fraction(2, 3))), lossless.iid_lm((Fraction(2, 3), Fraction(1, 3)))
    kept = {name: lossless.exact_step_output(exact, p2, q2, 2, 2)[1] for name, (exact, _) in rules.items()}
    assert kept == BINARY_KEPT, kept


def toy_figures(laws, shares, block_weights, per_block, binary, rates):
    """Sections 1 to 3's figures. Section 1: each rule's exact law of kept drafts (`laws`), the code's shares
    of 100,000 verdicts within 0.01 of it (`shares`), the block rule's (P, h) on A B B (`block_weights`).
    Section 2: the binary example block by block (`per_block`: block -> (P, h, P code, h code, kept)) and in
    sum (`binary`: (rule -> kept, the ideal coupling)). Section 3: `rates` = (the largest gamma - beta over
    random pairs, example -> (beta, gamma, p(x*)))."""
    assert laws["token by token"] == [Fraction(3, 5), 0, 0, Fraction(2, 5)] and laws["block"] == [0, 0, 0, 1]
    assert laws["exact match, q sampled"] == [Fraction(4, 5), Fraction(1, 10), Fraction(1, 20), Fraction(1, 20)]
    assert laws["exact match, argmax"] == [Fraction(4, 5), Fraction(4, 25), Fraction(4, 125), Fraction(1, 125)]
    assert all(abs(s - float(x)) < 0.01 for name in laws for s, x in zip(shares[name], laws[name])), shares
    P1, h1 = block_weights
    assert [round(x, 3) for x in P1.tolist()] == [1.0, 0.4, 0.667, 1.0] and h1[-1] == 1.0 and h1[0] == 0.0
    # section 2: the binary example, block by block and in sum
    assert per_block["AB"][0][1:] == [Fraction(1, 2), 1] and per_block["AB"][1] == [0, 1], "A B: h_1 = 0, P_2 = 1"
    assert per_block["AB"][4][:2] == [1, 2] and per_block["AA"][4][:2] == [Fraction(3, 4), Fraction(1, 2)]
    for P, h, P_code, h_code, _ in per_block.values():
        assert torch.allclose(P_code, torch.tensor([float(x) for x in P], dtype=torch.float64), atol=1e-12)
        assert torch.allclose(h_code, torch.tensor([float(x) for x in h], dtype=torch.float64), atol=1e-12)
    kept, ideal = binary
    assert kept == BINARY_KEPT and ideal == Fraction(12, 9)
    # section 3
    worst, kept3 = rates
    assert worst <= 1e-12, "exact match with q sampled never keeps more than the rejection rule"
    beta, gamma, top_p = kept3["flat q, top token p's"]
    assert top_p > beta > gamma and (round(beta, 2), round(top_p, 2)) == (0.58, 0.7)
    beta, gamma, top_p = kept3["q's top token unlikely"]
    assert beta > gamma > top_p and (round(beta, 3), round(gamma, 3), round(top_p, 1)) == (0.7, 0.325, 0.1)


def answers(answer1, answer1_h, answer2, answer3):
    """The answers' figures: A A B's expected kept drafts per rule and block thresholds, the binary example
    at K = 1, and what each rule keeps when the draft is the target."""
    assert [round(float(x), 2) for x in answer1.values()] == [0.72, 0.8, 0.26] and answer1_h == [0, 0, Fraction(4, 15)]
    assert answer2 == {"token": Fraction(2, 3), "block": Fraction(2, 3), "match": Fraction(4, 9)}
    assert [round(x, 2) for x in answer3] == [1.0, 0.38, 0.5]


def default_pair(expected, measured, over_token, gain, spread, live, greedy):
    """Section 4 on the default pair. The stored run as the prose reads it: `expected` and `measured` by
    (T, K, rule), block's ratio over token by token (`over_token`), block's expected gain by (T, K) (`gain`),
    the tokens/s spread of the identical T = 0 steps by K (`spread`). And today's run: accepted drafts per
    step by rule at T = 1 (`live`), and each rule's tokens at T = 0 (`greedy`)."""
    rules = sorted({rule for _, _, rule in expected})
    for k in (2, 4, 8):
        assert len({round(expected[(0.0, k, r)], 9) for r in rules}) == 1, "T = 0: every rule is greedy's"
        assert len({measured[(0.0, k, r)]["accepted_per_step"] for r in rules}) == 1
        assert measured[(0.0, k, "token")]["accepted_per_step"] < expected[(0.0, k, "token")], \
            "measured below expected at T = 0"
        for T in (0.7, 1.0):
            e = {r: expected[(T, k, r)] for r in rules}
            assert e["block"] > e["token"] > e["match_argmax"] > e["match"], (T, k, e)
            lo, hi = over_token[(T, k, "block")]["ci95"]
            assert lo < 1 < hi, f"T = {T:g}, K = {k}: the interval of block over token contains 1"
    assert (round(1 + expected[(1.0, 8, "block")], 2), round(1 + expected[(1.0, 8, "token")], 2)) == (1.61, 1.54)
    assert round(100 * (gain[(1.0, 8)] - 1), 1) == 4.7 and round(100 * (gain[(1.0, 2)] - 1), 1) == 1.3, gain
    assert round(max(spread.values()), 2) == 1.25 and max(spread, key=spread.get) == 4, spread
    assert max(gain.values()) < max(spread.values()), "block's largest expected gain is within the clock's spread"
    assert round(max(1 + expected[(1.0, k, "match")] for k in (2, 4, 8)), 2) == 1.13
    speed = {k: measured[(1.0, k, "match")]["tokens_per_second"] / measured[(1.0, k, "token")]["tokens_per_second"]
             for k in (4, 8)}
    assert (round(speed[4], 2), round(speed[8], 2)) == (0.72, 0.74), speed
    assert max(speed.values()) < 1 / max(spread.values()), speed
    # today's run
    assert live["match"] < live["token"], \
        "today: exact match with q sampled keeps fewer drafts than token by token at T = 1"
    assert len({tuple(t) for t in greedy.values()}) == 1, "today: at T = 0 every rule gives the same tokens"
