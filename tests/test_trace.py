"""trace.py: a run's steps as rows, checked against what the target really received."""
from string import Formatter

import pytest

import specdec_lab as sl
from specdec_lab.train.distill import CARD
from specdec_lab.lab.trace import card_curve, check_fed_forward, format_trace, record_forward_inputs, show_piece, step_kind, trace_rows


def _run(target, draft, k=3, n=20, temperature=0.0):
    engine = sl.SpeculativeEngine(target, draft, k=k)
    with record_forward_inputs(target) as seen:
        res = engine.generate([1, 2, 3], max_new_tokens=n, temperature=temperature, seed=0)
    return res, seen


def test_rows_split_each_step_into_accepted_rejected_discarded_and_next(tiny_pair):
    res, seen = _run(tiny_pair.target, tiny_pair.draft)
    rows = trace_rows(res.steps, None, res.prompt_ids, seen)
    assert len(rows) == len(res.steps)
    for row, rec in zip(rows, res.steps):
        assert row["accepted"] + row["rejected"] + row["discarded"] == rec.drafted
        assert len(row["accepted"]) == rec.num_accepted
        assert len(row["rejected"]) == (1 if rec.num_accepted < rec.k else 0), "only the first miss is rejected"
        assert row["committed"] == rec.committed
        assert row["kind"] == step_kind(rec)
    assert sum(len(r["committed"]) for r in rows) == len(res.tokens)
    assert [t for r in rows for t in r["committed"]] == res.tokens


def test_the_next_token_is_the_first_input_of_the_following_verification_pass(tiny_pair):
    for temperature in (0.0, 1.0):
        res, seen = _run(tiny_pair.target, tiny_pair.draft, temperature=temperature)
        rows = trace_rows(res.steps, None, res.prompt_ids, seen)
        assert len(seen) == 1 + len(res.steps), "one prefill, then exactly one target forward per step"
        assert seen[0] == res.prompt_ids[:-1], "the prefill must leave the prompt's last token unseen"
        assert check_fed_forward(rows) == [], check_fed_forward(rows)


def test_check_fed_forward_names_a_step_whose_input_was_not_the_previous_next_token(tiny_pair):
    res, seen = _run(tiny_pair.target, tiny_pair.draft)
    rows = trace_rows(res.steps, None, res.prompt_ids, seen)
    rows[2]["target_input"] = [rows[1]["next_token"] + 1] + rows[2]["drafted"]
    problems = check_fed_forward(rows)
    assert problems and any("step 2" in p for p in problems)


def test_a_model_drafting_for_itself_gets_bonus_steps_only():
    target = sl.tiny_model(0)
    res, seen = _run(target, target, k=4, n=20)  # 4 steps of 4 drafts + bonus
    rows = trace_rows(res.steps, None, res.prompt_ids)  # draft calls are recorded too, so no target_input here
    assert [r["kind"] for r in rows] == ["bonus"] * len(rows)
    assert all(r["rejected"] == [] and r["discarded"] == [] for r in rows)


def test_recording_stops_when_the_block_ends(tiny_pair):
    with record_forward_inputs(tiny_pair.target) as seen:
        sl.autoregressive_generate(tiny_pair.target, [1, 2], max_new_tokens=3)
    n = len(seen)
    sl.autoregressive_generate(tiny_pair.target, [1, 2], max_new_tokens=3)
    assert n == 3 and len(seen) == n, "the hook must be removed on leaving the block"


def test_trace_rows_rejects_a_recording_shorter_than_the_run(tiny_pair):
    res, seen = _run(tiny_pair.target, tiny_pair.draft)
    with pytest.raises(ValueError, match="target_inputs"):
        trace_rows(res.steps, None, res.prompt_ids, seen[:2])


def test_format_trace_has_a_line_per_step_and_escapes_newlines(tiny_pair):
    res, seen = _run(tiny_pair.target, tiny_pair.draft)
    rows = trace_rows(res.steps, None, res.prompt_ids, seen)
    rows[0]["next_text"] = "a\nb"
    text = format_trace(rows)
    assert len(text.splitlines()) == 2 + len(rows)
    assert "a\\nb" in text.splitlines()[2], "a newline inside a token must not break the table"
    assert show_piece(" the") == "\u2423the" and show_piece("") == "''"
    assert format_trace(rows, max_rows=2).splitlines()[-1].startswith(f"... {len(rows) - 2} more")


def test_card_curve_reads_the_curve_distill_writes_and_nothing_from_a_card_without_one():
    fields = {name: 1 for _, name, _, _ in Formatter().parse(CARD) if name}  # whatever the card asks for
    fields["curve"] = "1000: 0.210, 52000: 0.480"
    assert card_curve(CARD.format(**fields)) == [(1000, 0.21), (52000, 0.48)]
    assert card_curve("Curve of held-out alpha against training tokens: 10: 0.1, 20: 0.25\n") == [(10, 0.1), (20, 0.25)]
    assert card_curve("# interim draft (training in progress)\n") == []
