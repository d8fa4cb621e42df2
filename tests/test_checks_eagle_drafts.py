"""Chapter 10's checks (specdec_lab/lab/checks/eagle_drafts.py) pass on the chapter's pieces and fail on
broken ones: the EAGLE-3 claim on the four broken drafts' figures, the stored figures on a copy of a stored
run with one figure changed, and the shapes on the fed-back state taken after the norm."""
import copy
import json
import re
from pathlib import Path

import pytest
import torch

from specdec_lab.analysis.roofline import expected_speedup, expected_tokens_per_step, optimal_k
from specdec_lab.bench.machine import load_profile
from specdec_lab.lab.checks import eagle_drafts as checks

DOCS = Path(__file__).resolve().parents[1] / "docs"
STORED_EAGLE3 = 0.435
# The chapter's live figures (its saved outputs): agreement by depth of the correct draft and the two broken ones.
OWN, STALE, TOP_THREE = [0.445, 0.354, 0.342], [0.445, 0.285, 0.236], [0.073, 0.066, 0.068]
OFF_BY_ONE = [0.365, 0.362, 0.310]   # layers 2, 15 and 27: vLLM's 1-based ids taken as 0-based
NORM_FED = [0.445, 0.080, 0.139]     # the port that feeds back norm(h), what the head reads, instead of h
ANSWERS = [[1, 2, 3], [4, 5]]


def test_the_eagle3_claim_holds_on_the_draft_and_fails_on_the_broken_ones():
    checks.eagle3_claims(OWN, ANSWERS, ANSWERS, STORED_EAGLE3)
    for agree in (TOP_THREE, STALE, OFF_BY_ONE, NORM_FED):
        with pytest.raises(AssertionError):
            checks.eagle3_claims(agree, ANSWERS, ANSWERS, STORED_EAGLE3)
    with pytest.raises(AssertionError, match="greedy"):
        checks.eagle3_claims(OWN, [[1, 2, 4], [4, 5]], ANSWERS, STORED_EAGLE3)


def test_the_live_runs():
    broken = {"the draft fed the top three layers": {"same": True, "tau": 1.11, "caught": "depth 1"},
              "the drafter that feeds back the last true state": {"same": True, "tau": 1.89, "caught": "depths 2"}}
    checks.live_run(True, broken, 1.91)
    escaped = copy.deepcopy(broken)
    escaped["the draft fed the top three layers"]["caught"] = None
    for args in ((False, broken, 1.91), (True, escaped, 1.91), (True, broken, 2.2)):
        with pytest.raises(AssertionError):
            checks.live_run(*args)


def test_layer_readings_and_confidence():
    lens = {"after layer 1": 0.044, "after layer 14": 0.086, "after layer 26": 0.432, "final state": 1.0}
    readings = {(1, 14, 26): OWN, (2, 15, 27): [0.365, 0.362, 0.310], (27, 28, 29): TOP_THREE}
    checks.layer_readings(lens, readings, (1, 14, 26), (2, 15, 27), (27, 28, 29))
    with pytest.raises(AssertionError, match="off-by-one"):
        checks.layer_readings(lens, {**readings, (2, 15, 27): [0.2, 0.2, 0.2]}, (1, 14, 26), (2, 15, 27), (27, 28, 29))
    table = [(0.0, 0.2, 117, 16, 0.12), (0.2, 0.4, 118, 52, 0.28), (0.8, 1.0, 21, 21, 0.91)]
    checks.confidence(table, {True: 0.47, False: 0.26})
    with pytest.raises(AssertionError):
        checks.confidence(table, {True: 0.26, False: 0.47})


def test_training_time_test_on_the_cards():
    import specdec_lab as sl
    card = (sl.shipped_eagle3_draft_dir() / "README.md").read_text()
    rows = {int(m[1]): [float(m[2]), float(m[3]), float(m[4])]
            for m in re.finditer(r"^\| (\d+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|$", card, re.M)}
    feature_card = (sl.shipped_feature_draft_dir() / "README.md").read_text()
    by_depth = {"own h (EAGLE-3)": OWN, "last true state": STALE}
    checks.training_time_test(by_depth, list(OWN), rows, card, feature_card)
    with pytest.raises(AssertionError, match="fed-back"):
        checks.training_time_test({**by_depth, "last true state": [0.445, 0.36, 0.236]}, list(OWN), rows, card,
                                  feature_card)
    with pytest.raises(AssertionError, match="eagle3_loss"):
        checks.training_time_test(by_depth, [0.445, 0.35, 0.342], rows, card, feature_card)


def alpha_for(tau, k):
    """The chapter's bisection: the acceptance rate whose expected tokens per step at K is tau."""
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_tokens_per_step(mid, k) < tau else (lo, mid)
    return (lo + hi) / 2


def section_5(acc, run):
    """What chapter 10's section 5 computes from the stored runs."""
    profile = load_profile()
    ratios = dict(zip(profile["forward"]["rows"], profile["forward"]["ratio_to_one_row"]))
    speed = {}
    for name, d in acc["drafts"].items():
        k, tau, c = d["k"], d["engines"]["lab"]["tau"], profile["c"][name]
        a, v = alpha_for(tau, k), ratios[k + 1]
        speed[name] = {"k": k, "tau": tau, "c": c, "v": v, "speedup": expected_speedup(a, k, c, v),
                       "free": expected_speedup(a, k, 0.0, v)}
    measured = {"token": run["shipped draft, K = 2"], "eagle3": run["EAGLE-3 draft, K = 3"]}
    return profile, speed, measured, ratios


def stored():
    acc = json.loads((DOCS / "engine_acceptance.json").read_text())
    return acc, json.loads((DOCS / "lab_drafts.json").read_text())["systems"]


def feature_run():
    """The greedy systems of docs/bench_feature_draft.json, as the chapter reads them."""
    bench = json.loads((DOCS / "bench_feature_draft.json").read_text())
    return next(r for r in bench["results"] if r["temperature"] == 0.0)["systems"]


def test_the_stored_figures_and_a_copy_with_one_figure_changed():
    acc, run = stored()
    profile, speed, measured, ratios = section_5(acc, run)
    bench = feature_run()
    checks.stored_figures(profile, acc, speed, measured, ratios, bench)
    changed = copy.deepcopy(run)
    changed["EAGLE-3 draft, K = 3"]["over_autoregressive"] = 1.2
    with pytest.raises(AssertionError, match="both pay"):
        checks.stored_figures(profile, acc, *section_5(acc, changed)[1:], bench)
    changed = copy.deepcopy(acc)
    changed["drafts"]["eagle3"]["engines"]["lab"]["tau"] = 1.7
    profile, speed, measured, ratios = section_5(changed, run)
    with pytest.raises(AssertionError, match="tau"):
        checks.stored_figures(profile, changed, speed, measured, ratios, bench)
    profile, speed, measured, ratios = section_5(acc, run)
    changed = copy.deepcopy(bench)
    changed["spec_feat_k3"]["vs_ar"] = 1.3
    with pytest.raises(AssertionError, match="its own run"):
        checks.stored_figures(profile, acc, speed, measured, ratios, changed)


def test_the_answers_figures():
    acc, run = stored()
    profile, speed, measured, ratios = section_5(acc, run)
    verify = {k: ratios[k + 1] for k in range(1, 5)}
    card_alpha = {"token": 0.535, "feature": 0.608}
    by_card = {n: expected_speedup(a, k := optimal_k(a, profile["c"][n], 1, 4, verify), profile["c"][n], verify[k])
               for n, a in card_alpha.items()}
    ties = [{"draft": "token", "gap": 0.0041}, {"draft": "eagle3", "gap": 0.0043}]
    checks.exercise_answers(acc, speed, ratios, card_alpha, by_card, ties)
    with pytest.raises(AssertionError, match="near-tie"):
        checks.exercise_answers(acc, speed, ratios, card_alpha, by_card, ties + [{"draft": "token", "gap": 0.2}])
    stored_agreement = {"token draft": {"agreement": 0.336, "num_prompts": 72},
                        "feature draft": {"agreement": 0.372, "num_prompts": 72},
                        "EAGLE-3 draft": {"agreement": 0.435, "num_prompts": 72}}
    checks.stored_agreement(profile, stored_agreement)
    with pytest.raises(AssertionError, match="72"):
        checks.stored_agreement(profile, {**stored_agreement, "token draft": {"agreement": 0.336, "num_prompts": 8}})


@pytest.mark.slow
def test_the_shapes_on_the_shipped_drafts(default_target):
    import specdec_lab as sl
    from specdec_lab.io.pair import default_draft_dir, load_model_cached
    feature, eagle3 = sl.load_feature_draft(default_target), sl.load_eagle3_draft(default_target)
    token_draft = load_model_cached(default_draft_dir())
    config = json.loads((sl.shipped_eagle3_draft_dir() / "config.json").read_text())
    x = torch.tensor([list(range(100, 120))])
    with torch.no_grad():
        f = default_target.hidden(x)
        h, _ = feature(x[:, 1:], f[:, :-1])
        _, states = default_target.hidden(x, layers=eagle3.hidden_layers)
        h3, _ = eagle3(x[:, 1:], eagle3.fuse_states(states)[:, :-1])
        checks.draft_shapes(default_target, token_draft, feature, eagle3, h, f, h3, config)
        with pytest.raises(AssertionError, match="residual stream"):
            checks.draft_shapes(default_target, token_draft, feature, eagle3, h, f, eagle3.norm(h3), config)


def run_rows():
    """Section 5's within-run rows, as the chapter builds them from the two stored bench runs."""
    rows = {}
    for file, draft in (("bench_feature_draft", "feature"), ("bench_eagle3", "eagle3*")):
        systems = next(r for r in json.loads((DOCS / f"{file}.json").read_text())["results"]
                       if r["temperature"] == 0.0)["systems"]
        unit = 1 / systems["ar"]["decode_tokens_per_second"]
        for key, name in (("spec_k2", "token"), ("spec_feat_k3", draft)):
            m = systems[key]
            rows[file, name] = {"k": m["k"], "tps": m["mean_tokens_per_step"], "c": m["c"],
                                "v": m["target_seconds_per_step"] / unit,
                                "loop": m["mean_tokens_per_step"] / m["decode_speedup"],
                                "rel": m["vs_ar"] / systems["spec_k2"]["vs_ar"]}
    return rows


def test_the_within_run_prices_and_a_copy_with_one_figure_changed():
    rows = run_rows()
    checks.run_prices(rows)
    changed = copy.deepcopy(rows)
    changed["bench_eagle3", "eagle3*"]["c"] = 0.2
    with pytest.raises(AssertionError, match="price per step"):
        checks.run_prices(changed)
    changed = copy.deepcopy(rows)
    changed["bench_eagle3", "eagle3*"]["rel"] = 0.9
    with pytest.raises(AssertionError, match="own run"):
        checks.run_prices(changed)
