"""Chapter 15's checks (specdec_lab/lab/checks/live_demo.py): each holds on a correct run and fails on a
broken one (the off-by-one target cache, a strip that is not the output, a comparison that contradicts itself)."""
import pytest

import specdec_lab as sl
from specdec_lab.bench.machine import load_profile
from specdec_lab.lab import pitfalls
from specdec_lab.lab.checks import live_demo as checks
from specdec_lab.lab.widgets import DemoPanel

PROMPT = [1, 2, 3]  # tests/test_pitfalls.py shows the off-by-one cache corrupting this one


def test_the_run_claims_hold_for_a_correct_engine_and_fail_for_the_off_by_one_target_cache():
    target = sl.tiny_model(0)
    reference = sl.autoregressive_generate(target, PROMPT, max_new_tokens=30)
    checks.run_claims(sl.SpeculativeEngine(target, sl.tiny_model(1, n_layers=1), k=4).generate(PROMPT, 30), reference)
    broken = pitfalls.off_by_one_rollback_engine(target, target, k=4).generate(PROMPT, max_new_tokens=30)
    with pytest.raises(AssertionError, match="the target's own tokens"):
        checks.run_claims(broken, reference)


@pytest.mark.slow
def test_what_the_panel_shows_is_the_run_it_made(default_target):
    panel = DemoPanel(default_target, default_target)
    panel.prompt.value, panel.temperature.value, panel.max_new_tokens.value = "Why is the sky blue?", 0.0, 8
    result = panel.run()
    checks.panel_shows(panel, result)
    other = sl.SpeculativeEngine(default_target, default_target, k=2).generate("Name a colour.", max_new_tokens=5)
    with pytest.raises(AssertionError):
        checks.panel_shows(panel, other)


def test_the_comparison_holds_when_consistent_and_fails_when_it_contradicts_itself():
    compare = {"spec_k2": {"same_as_ar": True, "speedup": 1.2, "ci": (1.0, 1.4), "tokens_per_step": 1.6},
               "spec_self_k6": {"same_as_ar": True, "speedup": 1.5, "ci": (1.2, 1.9), "tokens_per_step": 6.2}}
    checks.comparison(compare, {("spec_k2", "spec_self_k6"): "cannot tell"})
    with pytest.raises(AssertionError, match="never below"):
        checks.comparison(compare, {("spec_k2", "spec_self_k6"): "faster"})
    outside = {**compare, "spec_k2": {**compare["spec_k2"], "ci": (1.3, 1.4)}}
    with pytest.raises(AssertionError, match="must contain"):
        checks.comparison(outside, {})
    with pytest.raises(AssertionError, match="greedy output"):
        checks.comparison({**compare, "spec_k2": {**compare["spec_k2"], "same_as_ar": False}}, {})


def test_the_stored_figures_hold_and_fail_on_another_profile():
    profile = load_profile()
    checks.stored_figures(profile)
    with pytest.raises(AssertionError, match="ridge"):
        checks.stored_figures({**profile, "forward": {**profile["forward"], "ridge_rows": 4}})


def test_every_system_must_give_the_targets_answers():
    reference = [[1, 2], [3]]
    checks.every_system({"a": (reference, 1.5)}, reference)
    with pytest.raises(AssertionError, match="target's own"):
        checks.every_system({"a": ([[1, 2], [4]], 1.5)}, reference)
    with pytest.raises(AssertionError, match="at least one token"):
        checks.every_system({"a": (reference, 0.9)}, reference)
