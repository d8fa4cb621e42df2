"""Chapter 02's checks (specdec_lab/lab/checks/speculative_sampling.py) pass on the chapter's pieces and fail
on broken ones: an engine that draws the correction from p, and the quoted figures with one value changed."""
import dataclasses
import json
from pathlib import Path

import pytest
import torch

from specdec_lab.api import SpeculativeEngine
from specdec_lab.io.pair import tiny_model
from specdec_lab.lab import lossless, pitfalls
from specdec_lab.lab.checks import speculative_sampling as checks

DOCS = Path(__file__).resolve().parents[1] / "docs"
PROMPT, N_NEW = [1, 2], 2


@pytest.fixture(scope="module")
def pair():
    """The chapter's pair: two tiny models over 6 tokens, the draft's head flattened (0.3)."""
    shape = dict(vocab_size=6, dim=16, n_heads=2, n_kv_heads=1, eos_token_ids=(10 ** 6,))
    target, draft = tiny_model(3, **shape), tiny_model(4, **shape)
    with torch.no_grad():
        draft.head.weight.mul_(0.3)
    return target, draft


def test_the_rule_is_exact_and_the_correction_from_p_is_not():
    g = torch.Generator().manual_seed(0)
    p, q = (torch.rand(50, generator=g, dtype=torch.float64) ** 4 for _ in range(2))
    p, q = p / p.sum(), q / q.sum()
    beta, accepted = torch.minimum(p, q).sum(), q * torch.clamp(p / q, max=1.0)
    residual = (p - q).clamp_min(0) / (p - q).clamp_min(0).sum()
    checks.rule(p, accepted + (1 - beta) * residual, accepted + (1 - beta) * p)
    with pytest.raises(AssertionError, match="must equal p"):
        checks.rule(p, accepted + (1 - beta) * p, accepted + (1 - beta) * p)


def test_the_engine_check_passes_the_engine_and_fails_resampling_from_p(pair):
    target, draft = pair
    run = dict(exact=lossless.exact_sequence_probs(target, PROMPT, N_NEW, 1.0), prompt=PROMPT, n_new=N_NEW,
               n_samples=600)   # 600 seeds: the correct engine's p-value is 0.027, the broken one's 6e-7
    checks.engine_lossless(SpeculativeEngine(target, draft, k=2), **run)
    with pytest.raises(AssertionError, match="chi-square"):
        checks.engine_lossless(SpeculativeEngine(target, draft, k=2, verifier=pitfalls.verify_resample_from_p), **run)


def test_pvalue_runs_and_the_formula():
    spread = [0.39, 0.05, 0.8, 0.6, 0.2, 0.95, 0.12, 0.45, 0.7, 0.3, 0.5, 0.02]
    checks.pvalue_runs({"correct": spread, "resample from p": [1e-5] * 12})
    with pytest.raises(AssertionError, match="pile up near 0"):
        checks.pvalue_runs({"correct": [1e-5] * 12, "resample from p": [1e-5] * 12})
    with pytest.raises(AssertionError, match="passes too often"):
        checks.pvalue_runs({"correct": spread, "resample from p": spread})
    checks.speedup_formula(0.05)


def stored():
    """The chapter's stored figures, as its cells compute them."""
    profile = json.loads((DOCS / "machine_profile.json").read_text())

    def result(pvalue, tv=0.05):
        return lossless.ChiSquareResult(statistic=0.0, pvalue=pvalue, dof=19, n=1500, impossible=0,
                                        total_variation=tv)
    results = dict(zip(checks.SAMPLERS, map(result, (4.5e-2, 2.8e-18, 3.4e-28))))
    answer2 = dict(zip(checks.SAMPLERS, (0.86, 7.2e-12, 2.9e-11)))
    return profile["forward"], result(0.85, 0.033), results, result(3.1e-47, 0.165), answer2, (0.406, 1.64)


def test_figures_hold_and_reject_a_changed_copy():
    args = stored()
    checks.figures(*args)
    fwd, scratch, results, answer1, answer2, answer3 = args
    with pytest.raises(AssertionError, match="power against resampling"):
        checks.figures(fwd, scratch, {**results, "resample from p": dataclasses.replace(results["correct"])},
                       answer1, answer2, answer3)
    with pytest.raises(AssertionError):
        checks.figures(fwd, scratch, results, answer1, answer2, (0.406, 1.65))
