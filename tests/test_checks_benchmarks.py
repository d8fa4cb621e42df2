"""Chapter 11's checks (specdec_lab/lab/checks/benchmarks.py) pass on the chapter's pieces and fail on broken
ones: the engine claim on the engine whose target cache rolls back one position too few, the stored figures on
a copy of a stored run with one figure changed, and adaptive K on a run whose output K changed."""
import copy
import json
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from specdec_lab.api import SpeculativeEngine, autoregressive_generate
from specdec_lab.bench.machine import AVX512_PROFILE, forward_cost, load_profile
from specdec_lab.bench.report import prediction_rows, prediction_gap
from specdec_lab.io.pair import tiny_model
from specdec_lab.lab.checks import benchmarks as checks
from specdec_lab.lab.pitfalls import off_by_one_rollback_engine
from specdec_lab.policies.adaptive import CostAwareController, ThresholdController

DOCS = Path(__file__).resolve().parents[1] / "docs"
REPORT = prediction_rows, prediction_gap
EXPANSION = 5.6  # the float32 target's bytes over its Q4_1 file's, as the chapter reads them from the file


def doc(name):
    return json.loads((DOCS / f"{name}.json").read_text())


def test_the_engine_claim_holds_on_the_engine_and_fails_on_the_off_by_one_cache():
    target, draft, prompt = tiny_model(0), tiny_model(1, n_layers=1), [1, 2, 3]
    base = autoregressive_generate(target, prompt, max_new_tokens=30, temperature=0.0, seed=0).tokens
    checks.cost_aware_greedy(SpeculativeEngine(target, draft, k=8), prompt, 30, base, 1, 8)
    with pytest.raises(AssertionError, match="greedy output"):
        checks.cost_aware_greedy(off_by_one_rollback_engine(target, draft, k=8), prompt, 30, base, 1, 8)


def test_the_live_run_checks_on_a_stored_run():
    stored = doc("bench_full")
    checks.live_run(stored, *REPORT)
    changed = copy.deepcopy(stored)
    changed["results"][0]["systems"]["spec_k2"]["same_output_as_ar"] = 0.96
    with pytest.raises(AssertionError, match="token for token"):
        checks.live_run(changed, *REPORT)


def section_3(stored):
    """The chapter's section 3: the best speedup over K against alpha, under three pricings."""
    from specdec_lab.analysis.roofline import expected_speedup
    c = stored["costs"]["c"]
    v = {int(k): x for k, x in stored["costs"]["verify_cost"].items()}
    alphas = [round(0.3 + 0.05 * i, 2) for i in range(13)]
    lines = {"this machine's c and v_K": [max(expected_speedup(a, k, c, v[k]) for k in v) for a in alphas],
             "verification free (v_K = 1)": [max(expected_speedup(a, k, c) for k in v) for a in alphas],
             "draft and verification free": [max(expected_speedup(a, k, 0.0) for k in v) for a in alphas]}
    return lines, alphas


def test_the_stored_run_and_a_copy_with_one_figure_changed():
    stored, profile = doc("bench_full"), load_profile()
    lines, alphas = section_3(stored)
    checks.stored_run(stored, profile, lines, alphas, *REPORT)
    checks.exercise_answers(stored, alphas, prediction_rows)
    changed = copy.deepcopy(stored)
    changed["results"][0]["systems"]["spec_lookup"]["vs_ar"] = 1.30
    with pytest.raises(AssertionError, match="highest ratio"):
        checks.stored_run(changed, profile, lines, alphas, *REPORT)
    changed = copy.deepcopy(stored)
    changed["costs"]["verify_cost"]["4"] = 1.0
    with pytest.raises(AssertionError, match="answer 2"):
        checks.exercise_answers(changed, alphas, prediction_rows)


def stored_runs():
    runs = {name: doc(f"bench_{name}") for name in ("fast_memory", "feature_draft", "eagle3")}
    c_runs = {p.stem: json.loads(p.read_text()) for p in sorted(DOCS.glob("bench_*.json"))}
    return runs, doc("peer"), c_runs


def distilled_k2(runs, stored):
    """The distilled draft at K = 2 in each stored run: (ratio, low, high), as the chapter collects them."""
    k2 = {name: run["results"][0]["systems"]["spec_k2"] for name, run in {"full": stored, **runs}.items()}
    k2 = {name: (s["vs_ar"], *s["vs_ar_ci95"]) for name, s in k2.items()}
    lab = doc("lab_drafts")["systems"]["shipped draft, K = 2"]
    three = doc("three_drafts")["systems"]["token"]
    return {**k2, "lab_drafts": (lab["over_autoregressive"], *lab["interval"]),
            "three_drafts": (three["over_autoregressive"], *three["interval"])}


def test_every_system_and_the_values_of_c():
    runs, peer, c_runs = stored_runs()
    checks.systems(runs, peer, c_runs, EXPANSION)
    k2 = distilled_k2(runs, doc("bench_full"))
    checks.systems(runs, peer, c_runs, EXPANSION, k2)
    with pytest.raises(AssertionError, match="six runs"):
        checks.systems(runs, peer, c_runs, EXPANSION, {**k2, "eagle3": (1.30, 1.18, 1.42)})
    checks.c_values(load_profile(), c_runs, doc("bench_full"))
    changed = copy.deepcopy(runs)
    changed["fast_memory"]["results"][0]["systems"]["int4_decode"]["vs_ar"] = 2.95
    with pytest.raises(AssertionError, match="fastest decodes"):
        checks.systems(changed, peer, c_runs, EXPANSION)
    changed = copy.deepcopy(c_runs)
    changed["bench_full"]["costs"]["c"] = 0.05
    with pytest.raises(AssertionError, match="1.8x"):
        checks.c_values(load_profile(), changed, doc("bench_full"))


KIND_ROWS = {("bench_full", "spec_k2"): "distilled draft, K = 2", ("bench_full", "spec_k4"): "distilled draft, K = 4",
             ("bench_full", "spec_stop"): "distilled draft, K <= 6, stop at q < 0.2",
             ("bench_full", "spec_lookup"): "the same, prompt lookup first",
             ("bench_feature_draft", "spec_feat_k4"): "feature draft, K = 4",
             ("bench_eagle3", "spec_feat_k4"): "EAGLE-3-style draft, K = 4"}


def test_by_kind_of_prompt():
    tau = {label: {kind: x["mean_tokens_per_step"]
                   for kind, x in doc(run)["results"][0]["systems"][key]["by_kind"].items()}
           for (run, key), label in KIND_ROWS.items()}
    kinds = list(tau["distilled draft, K = 2"])
    checks.by_kind(tau, kinds)
    changed = copy.deepcopy(tau)
    changed["feature draft, K = 4"]["code"] += 0.5
    with pytest.raises(AssertionError, match="chat"):
        checks.by_kind(changed, kinds)


def fake_run(k, steps, new_tokens):
    """A served request's record, as far as the pricing reads it: `steps` steps that drafted k tokens each."""
    return SimpleNamespace(steps=[SimpleNamespace(k=k)] * steps,
                           stats=SimpleNamespace(new_tokens=new_tokens, steps=steps))


def test_the_model_drafts_pricing():
    profile = load_profile()
    runs = {("model draft", p): ([fake_run(k, 40, 60)], None, None, None)
            for p, k in (("K=1", 1), ("K=8", 8), ("threshold", 4), ("cost-aware", 4))}
    per_step = {("model draft", "K=1"): [1.5], ("model draft", "K=8"): [1.8]}
    checks.model_draft_pricing(runs, per_step, profile, forward_cost)
    with pytest.raises(AssertionError, match="a fifth"):
        checks.model_draft_pricing(runs, {**per_step, ("model draft", "K=8"): [2.4]}, profile, forward_cost)
    told = {**runs, ("model draft", "told v_K, AVX2"): ([fake_run(2, 40, 60)], None, None, None)}
    checks.model_draft_pricing(told, per_step, profile, forward_cost, told={"told v_K, AVX2": profile})
    told["model draft", "told v_K, AVX2"] = ([fake_run(8, 40, 60)], None, None, None)
    with pytest.raises(AssertionError, match="best fixed K"):
        checks.model_draft_pricing(told, per_step, profile, forward_cost, told={"told v_K, AVX2": profile})


def test_each_told_controller_is_priced_with_its_own_profile():
    # Drafting 4 a step for 1.9 tokens pays where 5 rows cost about one (AVX-512), not where they cost 1.67 (AVX2).
    profile, second = load_profile(), load_profile(AVX512_PROFILE)
    runs = {("model draft", p): ([fake_run(k, 40, 60)], None, None, None)
            for p, k in (("K=1", 1), ("K=8", 8), ("threshold", 4), ("cost-aware", 4))}
    runs["model draft", "told v_K, AVX-512"] = ([fake_run(4, 40, 75)], None, None, None)
    per_step = {("model draft", "K=1"): [1.5], ("model draft", "K=8"): [1.8]}
    checks.model_draft_pricing(runs, per_step, profile, forward_cost, told={"told v_K, AVX-512": second})
    with pytest.raises(AssertionError, match="priced with the profile it was told"):
        checks.model_draft_pricing(runs, per_step, profile, forward_cost, told={"told v_K, AVX-512": profile})


def serve(target, drafter, k, controller, workload):
    """The chapter's serve(): one engine serves the workload in order."""
    engine = SpeculativeEngine(target, drafter, k=k)
    engine.controller = controller
    results, chosen, estimates = [], [], []
    t0 = time.process_time()
    for _, prompt, n in workload:
        results.append(engine.generate(prompt, max_new_tokens=n, temperature=0.0, seed=0))
        if controller is not None:
            chosen.append(list(controller.history))
            estimates.append({"k": controller.k, "observed": controller.observed, "warmup": controller.warmup,
                              "alpha": getattr(controller, "alpha", None), "c": getattr(controller, "c", None)})
    return results, chosen, estimates, time.process_time() - t0


@pytest.mark.slow
def test_adaptive_k_on_prompt_lookup_and_a_changed_output():
    import specdec_lab as sl
    from specdec_lab.drafters import NGramDrafter
    pair = sl.load_default_pair()
    items = "apple, banana, cherry, date, elderberry, fig, grape, honeydew, kiwi, lemon, mango, nectarine"
    workload = [("chat", "Why is the sky blue?", 24), ("copy", f"Copy this list exactly: {items}.", 40)]
    policies = {"K=4": (4, None), "threshold": (8, ThresholdController(k_min=1, k_max=8)),  # the ones the check compares
                "cost-aware": (8, CostAwareController(k_min=1, k_max=8))}
    runs = {("n-gram", p): serve(pair.target, NGramDrafter(), k, ctrl, workload) for p, (k, ctrl) in policies.items()}
    res = SpeculativeEngine(pair.target, pair.draft, k=4).generate(workload[0][1], max_new_tokens=32)
    replay = CostAwareController(k_min=1, k_max=8, decay=1.0)
    replay.reset()
    for record in res.steps:
        replay.update(record)
    drafting = [s for s in res.steps if s.k > 0]
    profile = load_profile()
    ns = {"runs": runs, "WORKLOAD": workload, "DRAFTERS": {"n-gram": NGramDrafter}, "TEMPERATURE": 0.0,
          "K_MIN": 1, "K_MAX": 8, "profile": profile, "forward_cost": forward_cost,
          "baselines": {name: autoregressive_generate(pair.target, prompt, max_new_tokens=n, temperature=0.0, seed=0)
                        for name, prompt, n in workload},
          "tokens_per_step": {key: [r.stats.mean_tokens_per_step for r in run[0]] for key, run in runs.items()},
          "row_cost": dict(zip(profile["forward"]["rows"], profile["forward"]["ratio_to_one_row"])), "replay": replay,
          "alpha_by_hand": sum(s.num_accepted for s in drafting)
          / sum(s.num_accepted + (1 if s.num_accepted < s.k else 0) for s in drafting),
          "c_by_hand": (sum(s.draft_seconds for s in drafting) / sum(s.k for s in drafting))
          / (sum(s.target_seconds for s in drafting) / len(drafting))}
    checks.adaptive_k(ns)
    results = list(runs["n-gram", "K=4"][0])
    results[1] = copy.copy(results[1])
    results[1].tokens = results[1].tokens[:-1] + [results[1].tokens[-1] + 1]
    broken = {**ns, "runs": {**runs, ("n-gram", "K=4"): (results, *runs["n-gram", "K=4"][1:])}}
    with pytest.raises(AssertionError, match="never change the greedy output"):
        checks.adaptive_k(broken)
