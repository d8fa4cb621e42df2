"""lab.metrics.ServerExporter: the batch's metrics, scraped from a server's run on tiny models."""
import pytest

import specdec_lab as sl
from specdec_lab.serve import Server

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from specdec_lab.lab.metrics import ServerExporter  # noqa: E402

BATCH_FAMILIES = {
    "specdec_num_requests_running": "gauge", "specdec_num_requests_waiting": "gauge",
    "specdec_batch_size": "histogram", "specdec_steps_speculation_off": "counter",
    "specdec_num_preemptions": "counter", "specdec_requests_finished": "counter",
    "specdec_time_to_first_token_seconds": "histogram", "specdec_time_per_output_token_seconds": "histogram",
    "specdec_e2e_request_latency_seconds": "histogram", "specdec_request_generation_tokens": "histogram",
    "specdec_request_draft_tokens": "histogram", "specdec_request_accepted_tokens": "histogram",
    "specdec_tokens_generated": "counter", "specdec_tokens_drafted": "counter", "specdec_steps": "counter",
}


def _values(text):
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out, {fam.name: fam.type for fam in text_string_to_metric_families(text)}


def _run(k, num_blocks=None, cancel=False):
    target, draft = sl.tiny_model(0, eos_token_ids=()), sl.tiny_model(1, n_layers=1)
    exporter = ServerExporter()
    server = Server(target, draft, max_batch=3, block_size=4, max_seq_len=128, k=k, num_blocks=num_blocks,
                    on_batch=exporter.on_batch)
    hs = [server.submit([1 + i, 2, 3, 4], max_new_tokens=10 + i, temperature=0.8, seed=i) for i in range(5)]
    if cancel:
        server.step()
        hs[0].cancel()
    server.run_until_idle()
    return server, hs, exporter


def test_every_batch_metric_is_registered_and_counts_the_run():
    server, hs, exporter = _run(k=3)
    values, types = _values(exporter.exposition())
    for name, kind in BATCH_FAMILIES.items():
        assert types.get(name) == kind, f"{name} is missing or not a {kind}"
    total = sum(len(h.tokens) for h in hs)
    assert values[("specdec_tokens_generated_total", ())] == total
    assert values[("specdec_steps_total", ())] == server.steps == values[("specdec_batch_size_count", ())]
    drafted = sum(r.k for h in hs for r in h.seq.steps)
    assert values[("specdec_tokens_drafted_total", ())] == drafted == values[("specdec_request_draft_tokens_sum", ())]
    assert values[("specdec_requests_finished_total", (("finished_reason", "length"),))] == 5
    assert values[("specdec_time_to_first_token_seconds_count", ())] == 5
    assert values[("specdec_num_requests_running", ())] == 0 == values[("specdec_num_requests_waiting", ())]
    assert values[("specdec_batch_size_bucket", (("le", "2.0"),))] < server.steps, "most steps ran 3 rows"


def test_plain_steps_count_as_speculation_off_and_preemptions_and_cancels_are_counted():
    server, hs, exporter = _run(k=0, num_blocks=10, cancel=True)
    values, _ = _values(exporter.exposition())
    assert values[("specdec_steps_speculation_off_total", ())] == server.steps
    assert values[("specdec_num_preemptions_total", ())] == server.preemptions > 0
    assert values[("specdec_requests_finished_total", (("finished_reason", "cancelled"),))] == 1
    assert server.engine.target_kv.used_blocks == 0
