"""The lab's exported drafts inside vLLM for CPU and llama.cpp themselves (bench/engines.py): both
engines are set up by `make test` (scripts/setup_vllm.sh, scripts/build_llama_cpp.sh) and run here
for real. Each draft gives the lab's greedy tokens in each engine, and each engine's own counters
give a mean acceptance length within 10% of the lab's on the same prompts."""
import pytest

from specdec_lab.bench.engines import (acceptance, counts_since, format_engine_acceptance, lab_counts,
                                       parse_spec_counters, run_engine_acceptance)

METRICS = """# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0
vllm:spec_decode_num_drafts_created{engine="0",model_name="m"} 1.7e+09
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 30.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 12.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 7.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="2"} 1.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 4.0
"""


def test_vllms_counters_are_read_by_name_and_position_and_differenced():
    c = parse_spec_counters(METRICS)
    assert c == {"drafts": 10.0, "draft_tokens": 30.0, "accepted": 12.0, "accepted_per_pos": [7.0, 4.0, 1.0]}
    later = {**c, "drafts": 14.0, "draft_tokens": 42.0, "accepted": 15.0, "accepted_per_pos": [9.0, 5.0, 1.0]}
    assert counts_since(c, later) == {"drafts": 4.0, "draft_tokens": 12.0, "accepted": 3.0,
                                      "accepted_per_pos": [2.0, 1.0, 0.0]}
    row = acceptance(**counts_since(c, later))
    assert row["tau"] == pytest.approx(1.75) and row["per_position"] == [0.5, 0.25, 0.0]
    assert row["accepted_share"] == pytest.approx(0.25)
    assert parse_spec_counters("")["accepted_per_pos"] == [] and acceptance(0, 0, 0)["tau"] is None


def test_the_labs_counts_are_vllms_a_draft_is_a_step_that_drafted():
    class Step:
        def __init__(self, drafted, n):
            self.drafted, self.num_accepted = [0] * drafted, n

    class Res:
        steps = [Step(3, 3), Step(3, 0), Step(0, 0), Step(2, 1)]  # a step that drafted nothing is no draft
    assert lab_counts([Res()], 3) == {"drafts": 3, "draft_tokens": 8, "accepted": 4, "accepted_per_pos": [2, 1, 1]}


@pytest.fixture(scope="module")
def measured():
    return run_engine_acceptance(num_prompts=3, max_new_tokens=48)


@pytest.mark.slow
@pytest.mark.parametrize("draft", ["token", "eagle3"])
@pytest.mark.parametrize("engine", ["vllm", "llamacpp"])
def test_each_draft_accepts_in_each_engine_what_it_accepts_in_the_lab(measured, draft, engine):
    rows = measured["drafts"][draft]["engines"]
    lab, other = rows["lab"], rows[engine]
    print(format_engine_acceptance(measured))
    assert lab["same_as_lab_autoregressive"] == lab["of"] == 3  # the lab is lossless
    # greedy tokens: equal, or parted at a near-tie of the float32 target (a rounding difference)
    for diff in other["first_differences"]:
        assert diff is None or abs(diff["logit_gap"]) < 0.05, diff
    assert other["same_as_lab_autoregressive"] >= 2, other
    assert other["drafts"] > 10 and lab["tau"] > 1.1, (lab, other)  # the draft does accept: not 1 against 1
    assert other["tau"] == pytest.approx(lab["tau"], rel=0.10), (draft, engine, lab["tau"], other["tau"])
    if engine == "vllm":  # position by position, from vLLM's own counters
        assert len(other["per_position"]) == measured["drafts"][draft]["k"]
        assert other["per_position"][0] == pytest.approx(lab["per_position"][0], abs=0.08)
