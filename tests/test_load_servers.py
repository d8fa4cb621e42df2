"""bench/load_servers.py: the three servers under one load, and vLLM's own load generator against the lab's."""
import pytest

from specdec_lab.bench.exports import engine_files
from specdec_lab.bench.load import Sample, _timed_acceptance
from specdec_lab.bench.load_servers import LabServer, format_servers, vllm_bench_serve


def test_tau_from_llama_servers_timings_is_tokens_over_target_forwards():
    """Each step is one target forward committing its accepted drafts and one more token."""
    a, b = Sample(0.0, 0.1, 1.0, 10), Sample(0.0, 0.1, 1.0, 10)
    a.timings = {"predicted_n": 10, "draft_n": 8, "draft_n_accepted": 4}
    b.timings = {"predicted_n": 10, "draft_n": 6, "draft_n_accepted": 2}
    failed = Sample(0.0, error="HTTP 500")
    failed.timings = {"predicted_n": 99, "draft_n": 99, "draft_n_accepted": 99}
    got = _timed_acceptance([a, b, failed])
    assert got["tau"] == pytest.approx(20 / (20 - 6)) and got["drafted"] == 14 and got["accepted"] == 6
    assert _timed_acceptance([Sample(0.0, 0.1, 1.0, 5)]) is None, "no timings, no tau"


def test_the_table_has_a_row_per_server_mode_and_load():
    phase = {"ttft": {"p50": 0.1, "p99": 0.2}, "tpot": {"p50": 0.02, "p99": 0.03}, "e2e": {"p50": 1.0, "p99": 2.0},
             "output_tokens_per_second": 30.0, "acceptance": {"tau": 1.5}}
    doc = {"results": {"lab_speculative": {"open_loop": {"0.5": phase}, "closed_loop": {"4": phase | {
        "acceptance": None}}}}}
    table = format_servers(doc)
    assert "| lab_speculative | rate 0.5/s | 100 / 200 | 20.0 | 1.00 / 2.00 | 30.0 | 1.50 |" in table
    assert "| lab_speculative | clients 4 |" in table and table.count("\n") == 3


@pytest.mark.slow
def test_vllms_own_load_generator_talks_to_the_labs_server():
    """`vllm bench serve` (random prompts, which sends ignore_eos) against `python -m specdec_lab serve`:
    every request succeeds, and it reads the lab's speculative-decoding counters as it reads vLLM's."""
    files = engine_files()
    with LabServer(k=2) as lab:
        out = vllm_bench_serve(lab.base_url, "smollm2-135m", files["target_dir"], num_prompts=4, rate=4.0,
                               input_len=16, output_len=8)
    assert out["returncode"] == 0, out["tail"]
    result = out["result"]
    assert "Successful requests:                     4" in result and "Failed requests:                         0" in result
    assert "Total generated tokens:                  32" in result, "ignore_eos: every answer is 8 tokens"
    assert "Acceptance length:" in result, "vLLM's bench read the lab's spec-decode counters"
