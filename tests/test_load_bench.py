"""bench --load against the lab's own service (tiny models, a real uvicorn server): every figure is
measured, and tau read from /metrics equals what the server's own counters say."""
import socket
import threading
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

import specdec_lab as sl
from specdec_lab.__main__ import main
from specdec_lab.bench.load import LoadConfig, format_load, run_load
from specdec_lab.serve import Server
from specdec_lab.service import Service, http_server


@pytest.fixture(scope="module")
def url():
    target = sl.tiny_model(0, eos_token_ids=())  # no EOS: every answer is max_tokens long
    server = Server(target, sl.tiny_model(1, n_layers=1), max_batch=4, block_size=4, max_seq_len=128, k=3)
    service = Service(server, "tiny")
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    http = http_server(service, log_level="warning", grace_seconds=5)
    thread = threading.Thread(target=http.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not http.started:
        time.sleep(0.01)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}", server
    http.should_exit = True
    thread.join(timeout=30)


def test_open_and_closed_loop_measure_every_figure_and_tau_from_the_servers_counters(url):
    base, server = url
    prompts = [[1, 2, 3], [7, 8], [9, 10, 11, 12], [3], [20, 21, 22]]
    cfg = LoadConfig(base_url=base, prompts=prompts, endpoint="completions", max_tokens=8, rates=(40.0,),
                     concurrencies=(1, 3), requests=6)
    doc = run_load(cfg)
    assert doc["model"] == "tiny" and set(doc["open_loop"]) == {"40"} and set(doc["closed_loop"]) == {"1", "3"}
    phases = [*doc["open_loop"].values(), *doc["closed_loop"].values()]
    for r in phases:
        assert r["ok"] == r["requests"] == 6 and not r["errors"]
        assert r["output_tokens"] == 6 * 8, "usage's completion_tokens, per request"
        assert 0 < r["ttft"]["p50"] <= r["ttft"]["p99"] <= r["e2e"]["p99"]
        assert 0 < r["tpot"]["p50"] and r["output_tokens_per_second"] > 0
        acc = r["acceptance"]
        assert acc["drafts"] > 0 and acc["tau"] == 1 + acc["accepted"] / acc["drafts"]
        assert 0 <= acc["per_position"][0] <= 1 if acc["per_position"] else acc["accepted"] == 0
    scrape = httpx.get(base + "/metrics").text
    total = next(s.value for f in text_string_to_metric_families(scrape) for s in f.samples
                 if s.name == "vllm:spec_decode_num_drafts_total")
    assert sum(r["acceptance"]["drafts"] for r in phases) == total, "each phase counts its own steps, all of them"
    text = format_load(doc)
    assert "40 req/s" in text and "3 clients" in text


def test_a_server_that_refuses_counts_errors_not_latencies(url):
    base, _ = url
    cfg = LoadConfig(base_url=base, prompts=[[1, 200]], endpoint="completions", max_tokens=4, rates=(),
                     concurrencies=(2,), requests=3)
    r = run_load(cfg)["closed_loop"]["2"]
    assert r["ok"] == 0 and r["requests"] == 3 and "HTTP 400" in r["errors"][0] and r["ttft"]["p50"] is None


def test_bad_load_options_are_one_line_errors(capsys):
    assert main(["bench", "--load"]) == 2
    assert "--base-url" in capsys.readouterr().err
    with pytest.raises(ValueError, match="base_url"):
        run_load(LoadConfig(base_url="localhost:8000", prompts=["hi"]))
    with pytest.raises(ValueError, match="rates"):
        run_load(LoadConfig(base_url="http://x", prompts=["hi"], rates=(0,)))
