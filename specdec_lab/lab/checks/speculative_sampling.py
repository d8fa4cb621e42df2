"""Chapter 02's checks: the rule's exactness, the engine's samples against the target's exact distribution,
p-values over runs, the speedup formula against the paper's corollary, and the figures the chapter quotes."""
import numpy as np

from ...analysis import roofline as rf
from .. import lossless

SAMPLERS = ("correct", "resample from p", "greedy draft, verified as sampled")


def rule(p, emitted, emitted_from_p):
    """At one position, P(emit x) = min(p, q) + (1 - beta) r equals p (`emitted`) to float64 rounding, and
    the same sum with p in place of the residual r (`emitted_from_p`) does not."""
    assert (emitted - p).abs().max() < 1e-12, "min(p, q) + (1 - beta) r must equal p"
    assert (emitted_from_p - p).abs().max() > 1e-3, "drawing the correction from p must break it"


def engine_lossless(engine, exact, prompt, n_new, n_samples, temperature=1.0, top_p=1.0, level=1e-3):
    """`engine` sampled with seeds 0 .. n_samples - 1 is distributed as the target: no sequence the target
    cannot produce, and a chi-square p-value against `exact` (sequence -> probability) above `level`.
    A broken verifier or draft (lab/pitfalls.py) fails it. Returns the test's result."""
    counts = lossless.sample_sequences(engine, prompt, n_new, n_samples, temperature, top_p=top_p)
    result = lossless.chi_square_test(counts, exact)
    assert result.impossible == 0, "the engine produced a sequence the target cannot produce"
    assert result.pvalue > level, f"the engine failed the chi-square check at level {level:g}"
    return result


def pvalue_runs(pvalues):
    """Over runs on disjoint seeds (`pvalues`: sampler -> p-values), the correct engine's p-values spread
    over [0, 1] and do not pile up near 0, while resampling from p sits near 0."""
    median = {name: sorted(ps)[len(ps) // 2] for name, ps in pvalues.items()}
    low = sum(x < 0.01 for x in pvalues["correct"]) / len(pvalues["correct"])
    assert low <= 0.2 and median["correct"] > 0.1, f"the correct engine's p-values pile up near 0: {pvalues['correct']}"
    assert median["resample from p"] < 0.05, f"resampling from p passes too often: {pvalues['resample from p']}"


def speedup_formula(c):
    """The speedup formula meets Leviathan et al.'s Corollary 3.9 at a draft cost `c`, and tau's limits."""
    for alpha in (0.0, 0.3, 0.8):
        assert abs(rf.expected_speedup(alpha, 1, c) - (1 + alpha) / (1 + c)) < 1e-12, \
            "K = 1 gives (1 + alpha) / (1 + c)"
        assert abs(rf.expected_speedup(alpha, 1, alpha) - 1) < 1e-12, "alpha = c is break-even at K = 1"
    assert rf.expected_tokens_per_step(1.0, 4) == 5 and rf.expected_tokens_per_step(0.0, 4) == 1


def figures(profile_forward, scratch_result, results, answer1, answer2, answer3):
    """The figures the prose quotes: the profile's ridge (`profile_forward`, the machine profile's forward),
    the from-scratch loop's test, the three samplers' p-values (`results`, sampler -> chi-square result, the
    broken two far below 1e-4), answer 1's test of the loop drawing from p, answer 2's p-values at a
    sharpness of 3.0 (sampler -> p-value), and answer 3's (beta, tau at K = 3)."""
    fwd = profile_forward
    assert fwd["ridge_rows"] == 3 and max(r for T, r in zip(fwd["rows"], fwd["ratio_to_one_row"]) if T <= 3) <= 1.25, \
        "the profile: up to 3 tokens at most 1.25x one"
    # the theorem's best K against the one priced with the profile's v_K, at alpha = 0.8 and c = 0.05
    v = {k: float(np.interp(k + 1, fwd["rows"], fwd["ratio_to_one_row"])) for k in range(1, 17)}
    priced = max(v, key=lambda k: rf.expected_speedup(0.8, k, 0.05, v[k]))
    assert [f"{v[k]:.2f}" for k in (1, 2, 3, 4)] == ["1.07", "1.13", "1.38", "1.67"], v
    assert (priced, f"{rf.expected_speedup(0.8, priced, 0.05, v[priced]):.2f}") == (2, "1.98")
    assert (rf.best_k(0.8, 0.05), f"{rf.expected_speedup(0.8, 8, 0.05):.2f}") == (8, "3.09"), "the theorem's K"
    assert scratch_result.impossible == 0 and scratch_result.pvalue > 1e-3, "the from-scratch loop is not lossless"
    assert results["resample from p"].pvalue < 1e-4, "the check has no power against resampling from p"
    assert results["greedy draft, verified as sampled"].pvalue < 1e-4, "the check has no power against a greedy draft"
    assert f"{answer1.pvalue:.0e}" == "3e-47" and round(answer1.total_variation, 3) == 0.165, answer1
    assert round(scratch_result.pvalue, 2) == 0.85 and round(scratch_result.total_variation, 3) == 0.033, scratch_result
    assert [f"{answer2[name]:.1e}" for name in SAMPLERS] == ["8.6e-01", "7.2e-12", "2.9e-11"], answer2
    assert [f"{results[name].pvalue:.1e}" for name in SAMPLERS] == ["4.5e-02", "2.8e-18", "3.4e-28"], \
        "the figures at 0.3"
    beta8, tau3 = answer3
    assert round(beta8, 3) == 0.406 and round(tau3, 2) == 1.64, (beta8, tau3)
