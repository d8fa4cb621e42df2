"""lab/lossless.py's exact step enumeration in fractions and sampler, and lab/pitfalls.py's broken rules.

Chapter 03 proves its claims with these: the three rules of verification/ are lossless by exact
enumeration and their code passes a chi-square test on the same toy models; each broken variant is not
lossless in fractions, its code fails the chi-square test, and its code and its fractions are the same
rule (the code's samples fit the fractions' distribution); the paper's binary example to the fraction.
"""
from fractions import Fraction

import pytest
import torch

from specdec_lab.core.verify import verify
from specdec_lab.lab import lossless, pitfalls
from specdec_lab.verification import block_weights, verify_block, verify_match

CODE = {"token": verify, "block": verify_block, "match": verify_match}
BROKEN = {"block, per-token test": (pitfalls.exact_block_ratio_test, pitfalls.verify_block_ratio_test),
          "block, unscaled residual": (pitfalls.exact_block_unscaled_residual, pitfalls.verify_block_unscaled_residual),
          "match, any p > 0": (pitfalls.exact_match_any_positive, pitfalls.verify_match_any_positive)}
HALF = (Fraction(1, 3), Fraction(2, 3)), (Fraction(2, 3), Fraction(1, 3))  # the paper's p and q


def toy(seed, V, zeros=False, power=1):
    return (lossless.random_fraction_lm(f"p{seed}", V, zeros=zeros, power=power),
            lossless.random_fraction_lm(f"q{seed}", V, power=power))


@pytest.mark.parametrize("V,K,seed", [(V, K, s) for V in (2, 3) for K in (1, 2, 3) for s in range(2)])
def test_the_exact_rules_are_lossless(V, K, seed):
    p, q = toy(100 * seed + 10 * V + K, V, zeros=seed == 1)
    want = lossless.exact_target_joint(p, K, V)
    assert sum(want.values()) == 1
    for name, rule in lossless.EXACT_RULES.items():
        assert lossless.exact_step_output(rule, p, q, K, V)[0] == want, name


def test_the_broken_exact_rules_are_not_lossless():
    """On this toy pair all three fail. An unscaled residual goes unseen where every residual it draws
    from has P_tau = 1 or the same normalised shape: on the toy pair of seed 11 at K = 3, on most of
    them at K = 2, and on the paper's binary example."""
    p, q = toy(1, 3)
    want = lossless.exact_target_joint(p, 3, 3)
    for name, (rule, _) in BROKEN.items():
        out = lossless.exact_step_output(rule, p, q, 3, 3)[0]
        assert out != want and sum(out.values()) == 1, name


def test_where_an_unscaled_residual_goes_unseen():
    p, q = toy(11, 3)
    assert lossless.exact_step_output(pitfalls.exact_block_unscaled_residual, p, q, 3, 3)[0] == \
        lossless.exact_target_joint(p, 3, 3)
    p, q = lossless.iid_lm(HALF[0]), lossless.iid_lm(HALF[1])
    assert lossless.exact_step_output(pitfalls.exact_block_unscaled_residual, p, q, 2, 2)[0] == \
        lossless.exact_target_joint(p, 2, 2)


def test_toy_models_do_not_depend_on_the_order_of_their_questions():
    a, b = lossless.random_fraction_lm("x", 3), lossless.random_fraction_lm("x", 3)
    first = [a(s) for s in [(), (0,), (1, 2)]]
    assert [b(s) for s in [(1, 2), (0,), ()]][::-1] == first and all(sum(d) == 1 for d in first)
    assert lossless.random_fraction_lm("y", 3)(()) != a(()) or lossless.random_fraction_lm("z", 3)(()) != a(())


def test_the_papers_binary_example():
    p, q = lossless.iid_lm(HALF[0]), lossless.iid_lm(HALF[1])
    kept = {name: lossless.exact_step_output(rule, p, q, 2, 2)[1] for name, rule in lossless.EXACT_RULES.items()}
    assert kept == {"token": Fraction(10, 9), "block": Fraction(11, 9), "match": Fraction(4, 9) + Fraction(16, 81)}
    assert lossless.ideal_accepted(p, q, 2, 2) == Fraction(12, 9)
    P, h = lossless.block_thresholds([HALF[0]] * 3, [HALF[1]] * 2, (0, 1))
    assert P == [1, Fraction(1, 2), 1] and h == [0, 1], "drafts (A, B): the first test cannot pass, the second must"


@pytest.mark.parametrize("seed", range(8))
def test_ideal_block_token_match_in_order(seed):
    V, K = 2 + seed % 2, 1 + seed % 3
    p, q = toy(600 + seed, V, zeros=seed % 2 == 0)
    kept = {name: lossless.exact_step_output(rule, p, q, K, V)[1] for name, rule in lossless.EXACT_RULES.items()}
    assert lossless.ideal_accepted(p, q, K, V) >= kept["block"] >= kept["token"] >= kept["match"]


def test_the_fraction_thresholds_are_the_codes():
    g = torch.Generator().manual_seed(0)
    for trial in range(40):
        K, V = trial % 4 + 1, 4
        p = torch.softmax(2 * torch.randn(K + 1, V, generator=g, dtype=torch.float64), -1)
        q = torch.softmax(2 * torch.randn(K, V, generator=g, dtype=torch.float64), -1)
        d = torch.multinomial(q, 1, generator=g).view(-1)
        rows = lambda t: [[Fraction(float(x)) for x in r] for r in t.tolist()]  # noqa: E731
        P, h = lossless.block_thresholds(rows(p), rows(q), d.tolist())
        P_code, h_code = block_weights(d, p, q)
        assert P_code.tolist() == pytest.approx([float(x) for x in P], abs=1e-12)
        assert h_code.tolist() == pytest.approx([float(x) for x in h], abs=1e-12)


def chi_square(rule, want, p, q, K, V, seed=0):
    counts = lossless.sample_step_outputs(rule, p, q, K, V, samples=20000, seed=seed)
    assert sum(counts.values()) == 20000 and all(len(s) == K + 1 for s in counts)
    return lossless.chi_square_test(counts, {s: float(x) for s, x in want.items()})


def test_the_code_passes_and_the_broken_code_fails_the_chi_square_test():
    p, q = toy(1, 3, power=2)
    want = lossless.exact_target_joint(p, 2, 3)
    for name, rule in CODE.items():
        r = chi_square(rule, want, p, q, 2, 3)
        assert r.impossible == 0 and r.pvalue > 1e-3, (name, r)
    for name, (_, rule) in BROKEN.items():
        assert chi_square(rule, want, p, q, 2, 3).pvalue < 1e-6, name


def test_each_broken_code_is_its_fractions():
    """The broken code is the broken rule it claims to be: its samples fit its exact (wrong) distribution."""
    p, q = toy(1, 3, power=2)
    for name, (exact, code) in BROKEN.items():
        wrong = lossless.exact_step_output(exact, p, q, 2, 3)[0]
        r = chi_square(code, wrong, p, q, 2, 3, seed=1)
        assert r.impossible == 0 and r.pvalue > 1e-3, (name, r)


def test_the_broken_rules_change_nothing_greedy_and_nothing_at_k1_but_their_bug():
    g = torch.Generator().manual_seed(2)
    for _ in range(100):
        logits = torch.randn(3, 5, generator=g)
        d = torch.randint(5, (2,), generator=g)
        for _, code in BROKEN.values():
            assert torch.equal(code(d, logits, None, torch.zeros(2), None, greedy=True),
                               verify(d, logits, None, torch.zeros(2), None, greedy=True))
    for _ in range(200):  # K = 1: the per-token test is the block rule's, so that variant is correct there
        p = torch.softmax(torch.randn(2, 5, generator=g), -1)
        q = torch.softmax(torch.randn(1, 5, generator=g), -1)
        d, u, e = torch.multinomial(q, 1, generator=g).view(-1), torch.rand(1, generator=g), torch.rand(5, generator=g) + 0.1
        assert torch.equal(pitfalls.verify_block_ratio_test(d, p, q, u, e), verify_block(d, p, q, u, e))


def test_sample_step_outputs_repeats_with_a_seed():
    p, q = toy(3, 2)
    a = lossless.sample_step_outputs(verify_block, p, q, 2, 2, samples=500, seed=4)
    assert a == lossless.sample_step_outputs(verify_block, p, q, 2, 2, samples=500, seed=4)
    assert sum(a.values()) == 500
