"""bench/rules.py: the three verification rules side by side, on tiny models."""
import json

import specdec_lab as sl
from specdec_lab.bench.rules import format_table, main, measure_rules


def test_the_rules_bench_measures_every_rule_and_greedy_makes_them_one():
    target, draft = sl.tiny_model(0), sl.tiny_model(0, std=0.4)  # a draft close to its target: it is accepted
    doc = measure_rules(target, draft, [[1, 2, 3], [4, 5], [7, 8, 9]], temperatures=(0.0, 1.0), ks=(2,),
                        max_new_tokens=12)
    assert [(r["temperature"], r["rule"]) for r in doc["rows"]] == [(t, n) for t in (0.0, 1.0)
                                                                    for n in ("token", "block", "match")]
    greedy = [r for r in doc["ratios"] if r["temperature"] == 0.0]
    assert [r["over_token"] for r in greedy] == [1.0, 1.0], "at temperature 0 the three rules are one rule"
    for r in doc["rows"]:
        assert 0 <= r["accepted_per_step"] <= 2 and r["tokens_per_step"] >= 1 and r["tokens_per_second"] > 0
        assert len(r["per_prompt"]["steps"]) == 3
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
