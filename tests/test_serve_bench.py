"""bench --serve on tiny models: the closed and open loops, the document and its table."""
import json

import pytest

import specdec_lab as sl
from specdec_lab.bench.serve import (QUICK_SERVE, ServeBenchConfig, closed_loop, format_serve, open_loop,
                                     run_serve_bench, systems)
from specdec_lab.serve import Server


def _pair():
    return sl.tiny_model(0, eos_token_ids=()), sl.tiny_model(1, n_layers=1)


def test_the_closed_loop_keeps_its_clients_busy_until_every_request_is_done():
    target, draft = _pair()
    server = Server(target, draft, max_batch=2, k=2, max_seq_len=128)
    seen = []
    server.on_batch = lambda s, rec: seen.append(rec.batch_size)
    r = closed_loop(server, [[1, 2, 3], [4, 5]], clients=2, requests_per_client=3, max_new_tokens=6)
    assert r["tokens"] == 6 * 6 and r["tokens_per_second"] > 0
    assert max(seen) == 2 and seen.count(2) > len(seen) // 2, "two requests in flight most of the time"


def test_the_open_loop_serves_a_seeded_poisson_stream():
    target, draft = _pair()
    r = open_loop(Server(target, draft, max_batch=4, k=2, max_seq_len=128), [[1, 2, 3]], rate=50.0, n=5,
                  max_new_tokens=5, seed=0)
    assert r["tokens"] == 25 and 0 < r["latency_p50"] <= r["latency_p99"] == pytest.approx(max(r["latencies"]), abs=1e-4)
    assert len(r["latencies"]) == 5, "one latency per request, in arrival order"


def test_the_serve_bench_document_has_every_system_at_every_batch_size():
    target, draft = _pair()
    cfg = ServeBenchConfig(**QUICK_SERVE)
    doc = json.loads(json.dumps(run_serve_bench(target, draft, [[1, 2, 3], [7, 8, 9, 10]], cfg, log=lambda s: None)))
    assert systems(cfg) == ("plain", "fixed_1", "fixed_2", "schedule", "goodput")
    for s in systems(cfg):
        assert set(doc["closed_loop"][s]) == {"1", "2"}
        assert all(len(doc["closed_loop_runs"][s][b]) == cfg.reps for b in ("1", "2"))
    assert doc["throughput_over_plain"]["plain"]["1"] == 1.0
    for b in ("1", "2"):  # the best fixed K is the fixed system of the highest ratio, and goodput is read against it
        best = doc["best_fixed"][b]
        assert doc["throughput_over_plain"][best][b] == max(doc["throughput_over_plain"][s][b] for s in ("fixed_1", "fixed_2"))
        assert abs(doc["goodput_vs_best_fixed"][b] * doc["throughput_over_plain"][best][b]
                   - doc["throughput_over_plain"]["goodput"][b]) < 1e-9
        assert 0.0 <= doc["noise"][b] < 1.0
    assert doc["crossover_batch_measured"] == doc["crossover_by_system"]["fixed_2"]
    assert doc["median_over_plain"]["plain"] == {"1": 1.0, "2": 1.0} and set(doc["best_fixed_median"]) == {"1", "2"}
    assert set(doc["step_costs"]) == {f"{b},{k}" for b in (1, 2) for k in (0, 1, 2)}
    assert all(v > 0 for v in doc["target_forward_seconds"].values())
    assert set(doc["open_loop"]["goodput"]) == {"2.0"}
    assert "closed loop" in format_serve(doc) and "open loop" in format_serve(doc)


def test_greedy_equality_counts_identical_answers_against_batch_1_decoding():
    from specdec_lab.bench.serve import greedy_equality
    target, draft = _pair()
    doc = greedy_equality(target, draft, [[1, 2, 3], [4, 5], [6, 7, 8, 9], [10]], max_batch=2, max_new_tokens=8,
                          log=lambda s: None)
    assert doc["prompts"] == 4 and doc["identical"] == 4 and doc["differences"] == []


def test_median_ratios_are_read_from_every_run():
    from specdec_lab.bench.serve import medians
    runs = {"plain": {"1": [10.0, 12.0, 30.0]}, "fixed_1": {"1": [11.0, 13.0, 14.0]}, "fixed_2": {"1": [9.0, 20.0, 21.0]},
            "goodput": {"1": [12.0, 18.0, 19.0]}}
    out = medians(runs)
    assert out["median_over_plain"]["fixed_1"]["1"] == 13.0 / 12.0 and out["median_over_plain"]["fixed_2"]["1"] == 20.0 / 12.0
    assert out["best_fixed_median"] == {"1": "fixed_2"}
    assert abs(out["goodput_vs_best_fixed_median"]["1"] - 18.0 / 20.0) < 1e-12
