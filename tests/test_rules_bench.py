"""bench/rules.py: the three verification rules side by side, on tiny models."""
import json

import specdec_lab as sl
from specdec_lab.bench.rules import RULES, expected_rules, figure, format_table, main, measure_rules


def test_the_rules_bench_measures_every_rule_and_greedy_makes_them_one():
    target, draft = sl.tiny_model(0), sl.tiny_model(0, std=0.4)  # a draft close to its target: it is accepted
    doc = measure_rules(target, draft, [[1, 2, 3], [4, 5], [7, 8, 9]], temperatures=(0.0, 1.0), ks=(2,),
                        max_new_tokens=12, samples=2)
    rules = ("token", "block", "match", "match_argmax")
    assert tuple(RULES) == rules
    assert [(r["temperature"], r["rule"]) for r in doc["rows"]] == [(t, n) for t in (0.0, 1.0) for n in rules]
    greedy = [r for r in doc["ratios"] if r["temperature"] == 0.0]
    assert [r["over_token"] for r in greedy] == [1.0, 1.0, 1.0], "at temperature 0 the rules are one rule"
    for r in doc["rows"]:
        assert 0 <= r["accepted_per_step"] <= 2 and r["tokens_per_step"] >= 1 and r["tokens_per_second"] > 0
        assert len(r["per_prompt"]["steps"]) == 3
    sampled = [r for r in doc["rows"] if r["temperature"] == 1.0 and r["rule"] == "token"][0]["per_prompt"]
    greedy_steps = [r for r in doc["rows"] if r["temperature"] == 0.0 and r["rule"] == "token"][0]["per_prompt"]
    assert sampled["tokens"] == [24, 24, 24] and greedy_steps["tokens"] == [12, 12, 12], "two samples when sampling"
    assert "accepted drafts per step over token-by-token's" in format_table(doc)
    json.dumps(doc)


def test_the_rules_bench_command_takes_its_models_and_refuses_bad_lists(capsys):
    pair = (sl.tiny_model(0), sl.tiny_model(1, n_layers=1))
    try:
        main(["--ks", "two"], load=lambda: pair)
    except SystemExit as e:
        assert "--ks must be a comma list" in str(e)
    else:
        raise AssertionError("a bad --ks must be refused")


def test_expected_figures_order_the_rules_and_make_greedy_one_rule():
    """Along the target's own answers: at temperature 0 every rule expects the same; sampling,
    block >= token >= exact match with q sampled, each below K; the figure has a panel per temperature."""
    target, draft = sl.tiny_model(0), sl.tiny_model(0, std=0.4)
    rows = expected_rules(target, draft, [[1, 2, 3], [4, 5]], temperatures=(0.0, 1.0), ks=(1, 3), max_new_tokens=10)
    e = {(r["temperature"], r["k"], r["rule"]): r["expected_accepted_per_step"] for r in rows}
    for k in (1, 3):
        assert len({round(e[0.0, k, rule], 9) for rule in RULES}) == 1, "greedy: one rule"
        assert e[1.0, k, "block"] >= e[1.0, k, "token"] - 2e-3 >= e[1.0, k, "match"] - 2e-3
        assert 0 < e[1.0, k, "match"] and e[1.0, k, "block"] <= k
    assert abs(e[1.0, 1, "block"] - e[1.0, 1, "token"]) < 2e-3, "at K = 1 the block rule is the token rule"
    assert e[1.0, 3, "block"] > e[1.0, 3, "token"], "over three tokens the block rule keeps more"
    doc = {"rows": [{"temperature": r["temperature"], "k": r["k"], "rule": r["rule"], "accepted_per_step": 0.5}
                    for r in rows], "expected": rows}
    assert len(figure(doc).layout.annotations) == 2


def test_a_checkpointed_run_resumes_without_running_its_finished_parts_again(tmp_path):
    """Each finished (temperature, K) is written at once; a second run with the same file reads them
    and runs nothing (its engines would make different timings, not the same ones)."""
    from specdec_lab.bench.rules import Checkpoint
    target, draft = sl.tiny_model(0), sl.tiny_model(0, std=0.4)
    path = tmp_path / "ckpt.json"
    first = measure_rules(target, draft, [[1, 2, 3], [4, 5]], temperatures=(1.0,), ks=(2, 3), max_new_tokens=8,
                          checkpoint=Checkpoint(path))
    ran = []
    second = measure_rules(target, draft, [[1, 2, 3], [4, 5]], temperatures=(1.0,), ks=(2, 3), max_new_tokens=8,
                           checkpoint=Checkpoint(path), log=ran.append)
    assert second["rows"] == first["rows"] and second["ratios"] == first["ratios"]
    assert ran == ["T=1 K=2: in the checkpoint", "T=1 K=3: in the checkpoint"]
    rows = expected_rules(target, draft, [[1, 2, 3]], temperatures=(1.0,), ks=(1, 2), max_new_tokens=6,
                          checkpoint=Checkpoint(path))
    assert Checkpoint(path).get("expected", 1.0) == rows
