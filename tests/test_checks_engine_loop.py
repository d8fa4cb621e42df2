"""Chapter 07's checks (specdec_lab/lab/checks/engine_loop.py): they pass on a correct engine, the chapter's
sweep and the stored machine profile, and fail on the off-by-one target cache and on a figure changed."""
import copy
import json
from pathlib import Path

import pytest

from specdec_lab.api import SpeculativeEngine
from specdec_lab.core.engine import autoregressive_generate
from specdec_lab.lab import pitfalls
from specdec_lab.lab.checks import engine_loop as checks, must_fail

PROMPT, MAX_NEW_TOKENS, K = [1, 5, 9, 2, 7], 24, 3
PROFILE = json.loads((Path(__file__).resolve().parents[1] / "docs" / "machine_profile.json").read_text())
# the sweep as the chapter's stored run printed it: K -> tokens/step, speedup (interval), draft and target ms
SWEEP = {k: {"same_as_ar": True, "tokens_per_step": tps, "speedup": s, "ci": ci, "draft_ms": d, "target_ms": t}
         for k, tps, s, ci, d, t in [(1, 1.43, 1.26, (1.17, 1.36), 1.1, 27.8), (2, 1.57, 1.27, (1.19, 1.39), 1.7, 29.3),
                                     (3, 1.64, 1.27, (1.14, 1.42), 2.3, 30.4), (4, 1.66, 1.23, (1.09, 1.43), 3.0, 31.3),
                                     (6, 1.66, 1.09, (0.97, 1.22), 3.7, 36.0)]}


def test_engine_claims_hold_and_catch_the_off_by_one_cache(tiny_pair):
    target, draft = tiny_pair.target, tiny_pair.draft
    baseline = autoregressive_generate(target, PROMPT, max_new_tokens=MAX_NEW_TOKENS)
    checks.engine_claims(SpeculativeEngine(target, draft, k=K), PROMPT, MAX_NEW_TOKENS, baseline.tokens)
    broken = pitfalls.off_by_one_rollback_engine(target, draft, k=K)
    with pytest.raises(AssertionError):
        checks.engine_claims(broken, PROMPT, MAX_NEW_TOKENS, baseline.tokens)
    must_fail(checks.engine_claims, pitfalls.off_by_one_rollback_engine(target, draft, k=K), PROMPT, MAX_NEW_TOKENS,
              baseline.tokens, name="the engine with the off-by-one target cache")


def test_engine_claims_reject_other_tokens(tiny_pair):
    baseline = autoregressive_generate(tiny_pair.target, PROMPT, max_new_tokens=MAX_NEW_TOKENS)
    wrong = [(t + 1) % 64 for t in baseline.tokens]
    with pytest.raises(AssertionError, match="greedy output"):
        checks.engine_claims(SpeculativeEngine(tiny_pair.target, tiny_pair.draft, k=K), PROMPT, MAX_NEW_TOKENS, wrong)


def test_time_split_holds_on_the_stored_sweep_and_not_on_a_changed_one():
    checks.time_split(0.998, SWEEP)
    with pytest.raises(AssertionError):
        checks.time_split(0.7, SWEEP)
    for key, value in (("draft_ms", 10.0), ("tokens_per_step", 4.5), ("same_as_ar", False), ("speedup", 1.5)):
        changed = copy.deepcopy(SWEEP)
        changed[2][key] = value
        with pytest.raises(AssertionError, match="K=2"):
            checks.time_split(0.998, changed)


def test_profile_figures_hold_on_the_stored_profile_and_not_on_a_changed_one():
    checks.profile_figures(PROFILE)
    for change in (lambda p: p["c"].update(token=0.03), lambda p: p["forward"].update(ridge_rows=4),
                   lambda p: p["forward"]["ratio_to_one_row"].__setitem__(4, 1.5)):
        changed = copy.deepcopy(PROFILE)
        change(changed)
        with pytest.raises(AssertionError):
            checks.profile_figures(changed)
