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
from specdec_lab.bench.machine import AVX512_PROFILE, load_profile
from specdec_lab.lab.checks import eagle_drafts as checks

DOCS = Path(__file__).resolve().parents[1] / "docs"
STORED_EAGLE3 = 0.435
# The chapter's live figures (its saved outputs): agreement by depth of the correct draft and the two broken ones.
OWN, STALE, TOP_THREE = [0.445, 0.354, 0.342], [0.445, 0.285, 0.236], [0.073, 0.066, 0.068]
OFF_BY_ONE = [0.365, 0.362, 0.310]   # layers 2, 15 and 27: vLLM's 1-based ids taken as 0-based
NORM_FED = [0.445, 0.080, 0.139]     # the port that feeds back norm(h), what the head reads, instead of h
# how often each guessed the shipped draft's token at depths 1, 2, 3 (the chapter's saved outputs)
SAME, TOP_THREE_MATCH, OFF_BY_ONE_MATCH = [1.0, 1.0, 1.0], [0.083, 0.090, 0.101], [0.672, 0.718, 0.723]
NORM_FED_MATCH, STALE_MATCH = [1.0, 0.093, 0.190], [1.0, 0.463, 0.364]
SE = 0.041                           # the bootstrap standard error of depth 1 over the 8 prompts
ANSWERS = [[1, 2, 3], [4, 5]]


def test_the_eagle3_claim_holds_on_the_draft_and_fails_on_the_broken_ones():
    checks.eagle3_claims(OWN, SAME, ANSWERS, ANSWERS, STORED_EAGLE3, SE)
    for agree, match in ((TOP_THREE, TOP_THREE_MATCH), (STALE, STALE_MATCH), (OFF_BY_ONE, OFF_BY_ONE_MATCH),
                         (NORM_FED, NORM_FED_MATCH)):
        with pytest.raises(AssertionError):
            checks.eagle3_claims(agree, match, ANSWERS, ANSWERS, STORED_EAGLE3, SE)
    with pytest.raises(AssertionError, match="greedy"):
        checks.eagle3_claims(OWN, SAME, [[1, 2, 4], [4, 5]], ANSWERS, STORED_EAGLE3, SE)
    with pytest.raises(AssertionError, match="0.98"):  # one depth under: a port that rounds too much
        checks.eagle3_claims(OWN, [1.0, 0.99, 0.97], ANSWERS, ANSWERS, STORED_EAGLE3, SE)


@pytest.mark.slow
def test_guess_match_on_the_shipped_draft_and_a_broken_reading(default_target):
    """guess_match on real states: the shipped EAGLE-3 draft matches itself everywhere; the same weights
    fed the layers one above their own do not, nor does the drafter that feeds back the last true state."""
    import specdec_lab as sl
    from specdec_lab.core.text import encode_prompt
    from specdec_lab.lab import eagle
    from specdec_lab.train.handwritten import HANDWRITTEN_PROMPTS
    eagle3 = sl.load_eagle3_draft(default_target)
    prompts = [encode_prompt(default_target.tokenizer, p) for p in HANDWRITTEN_PROMPTS[:2]]
    answers = [sl.autoregressive_generate(default_target, p, max_new_tokens=16).tokens for p in prompts]
    layers = tuple(sorted({*eagle3.hidden_layers, 2, 15, 27}))
    with torch.no_grad():
        examples = eagle.answer_examples(default_target, layers, prompts, answers)
        assert eagle.guess_match(eagle3, eagle3, examples, layers) == [1.0, 1.0, 1.0]
        off = eagle.guess_match(eagle.reading_layers(eagle3, default_target, (2, 15, 27)), eagle3, examples, layers)
        stale = eagle.guess_match(eagle3, eagle3, examples, layers, feed_back="last_true")
    assert max(off) < 0.98 and stale[0] == 1.0 and min(stale[1:]) < 0.98


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


def section_5(acc):
    """What chapter 10's section 5 computes from the engines' run and the two profiles."""
    profile, second = load_profile(), load_profile(AVX512_PROFILE)
    ratios = dict(zip(profile["forward"]["rows"], profile["forward"]["ratio_to_one_row"]))
    ratios_512 = dict(zip(second["forward"]["rows"], second["forward"]["ratio_to_one_row"]))
    speed = {}
    for name, d in acc["drafts"].items():
        k, tau, c = d["k"], d["engines"]["lab"]["tau"], profile["c"][name]
        a, v = alpha_for(tau, k), ratios[k + 1]
        speed[name] = {"k": k, "tau": tau, "c": c, "v": v, "speedup": expected_speedup(a, k, c, v),
                       "free": expected_speedup(a, k, 0.0, v),
                       "second": expected_speedup(a, k, second["c"][name], ratios_512[k + 1])}
    return profile, speed, ratios


def stored():
    acc = json.loads((DOCS / "engine_acceptance.json").read_text())
    return acc, json.loads((DOCS / "three_drafts.json").read_text())


def test_the_stored_figures_and_a_copy_with_one_figure_changed():
    acc, _ = stored()
    profile, speed, ratios = section_5(acc)
    checks.stored_figures(profile, acc, speed, ratios)
    changed = copy.deepcopy(acc)
    changed["drafts"]["eagle3"]["engines"]["lab"]["tau"] = 1.7
    profile, speed, ratios = section_5(changed)
    with pytest.raises(AssertionError, match="tau"):
        checks.stored_figures(profile, changed, speed, ratios)


def test_the_speed_run_and_a_copy_with_one_figure_changed():
    _, run = stored()
    second = load_profile(AVX512_PROFILE)
    checks.speed_run(run, second)
    for path, value, message in ((("systems", "eagle3", "c"), 0.2, "price per step"),
                                 (("systems", "eagle3", "over_autoregressive"), 1.3, "quotes"),
                                 (("systems", "token", "accepted_by_position"), [0.3, 0.1], "passes most often"),
                                 (("commit",), "d553d2c6d941+changes", "clean commit"),
                                 (("systems", "feature", "by_pass"), [1.2, 1.3, 1.25], "passes agree")):
        changed = copy.deepcopy(run)
        *outer, last = path
        node = changed
        for key in outer:
            node = node[key]
        node[last] = value
        with pytest.raises(AssertionError, match=message):
            checks.speed_run(changed, second)


def test_the_answers_figures():
    acc, _ = stored()
    profile, speed, ratios = section_5(acc)
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
