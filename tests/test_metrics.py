"""metrics.py: run statistics, the Prometheus exporter over real HTTP, and host-sync accounting."""
import subprocess
import sys
import urllib.request

import pytest

from specdec_lab.analysis.syncs import count_host_syncs
import torch

from specdec_lab import SpeculativeEngine
from specdec_lab.lab.metrics import LATENCY_BUCKETS, PrometheusExporter, serve_metrics
from specdec_lab.analysis.moving import MovingRatio
from specdec_lab.core.records import RunStats, StepRecord
from specdec_lab.io.pair import tiny_model

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402



EXPECTED_FAMILIES = {  # family name -> type, as the parser reports them
    "specdec_tokens_generated": "counter",
    "specdec_tokens_drafted": "counter",
    "specdec_tokens_accepted": "counter",
    "specdec_drafts": "counter",
    "specdec_steps": "counter",
    "specdec_accepted_tokens_per_position": "counter",
    "specdec_host_syncs": "counter",
    "specdec_draft_latency_seconds": "histogram",
    "specdec_target_latency_seconds": "histogram",
    "specdec_accepted_share_ema": "gauge",
    "specdec_draft_k": "gauge",
}


def noisy_pair(noise=0.02):
    """A tiny target and a draft that is the target plus noise: acceptance neither 0 nor 1."""
    target = tiny_model(seed=0, eos_token_ids=())
    draft = tiny_model(seed=0, eos_token_ids=())
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=g) * noise)
    return target, draft


def record(k, n, draft_s=0.01, target_s=0.1, syncs=1, committed=None):
    drafted = list(range(10, 10 + k))
    committed = committed if committed is not None else drafted[:n] + [7]
    return StepRecord(0, k, drafted, n, 7, [], [], [], draft_s, target_s, syncs, committed)


def scrape(url):
    with urllib.request.urlopen(url, timeout=10) as resp:
        assert resp.status == 200
        return resp.read().decode()


def samples(text):
    """{(sample name, frozenset(labels)): value} from a Prometheus text exposition."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def test_importing_the_core_does_not_load_prometheus_client():
    code = ("import sys, specdec_lab.core.records, specdec_lab.core.engine, specdec_lab.policies.adaptive, specdec_lab.drafters, specdec_lab.api; "
            "assert 'prometheus_client' not in sys.modules, 'the core must not import prometheus_client'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_every_metric_is_registered_and_exposed_before_any_step():
    text = PrometheusExporter().exposition()
    families = {f.name: f.type for f in text_string_to_metric_families(text)}
    for name, kind in EXPECTED_FAMILIES.items():
        assert families.get(name) == kind, f"{name} missing from the exposition (registered? the seed forgot one)"


def test_two_exporters_do_not_clash_because_each_has_its_own_registry():
    a, b = PrometheusExporter(), PrometheusExporter()
    a.on_step(record(4, 2))
    assert samples(b.exposition())[("specdec_tokens_drafted_total", frozenset())] == 0


def test_on_step_counts_committed_tokens_not_accepted_plus_one():
    exp = PrometheusExporter()
    exp.on_step(record(4, 4, committed=[10, 11]))  # cut by max_new_tokens: 2 tokens, not 5
    got = samples(exp.exposition())
    assert got[("specdec_tokens_generated_total", frozenset())] == 2
    assert got[("specdec_tokens_accepted_total", frozenset())] == 4


def test_plain_steps_count_as_steps_but_not_drafts():
    exp = PrometheusExporter()
    exp.on_step(record(0, 0))
    exp.on_step(record(3, 1))
    got = samples(exp.exposition())
    assert got[("specdec_steps_total", frozenset())] == 2
    assert got[("specdec_drafts_total", frozenset())] == 1
    assert got[("specdec_draft_latency_seconds_count", frozenset())] == 1
    assert got[("specdec_target_latency_seconds_count", frozenset())] == 2
    assert got[("specdec_draft_k", frozenset())] == 3


def test_latency_buckets_span_100_microseconds_to_10_seconds():
    assert LATENCY_BUCKETS[0] == pytest.approx(1e-4) and LATENCY_BUCKETS[-1] == pytest.approx(10.0)
    assert list(LATENCY_BUCKETS) == sorted(LATENCY_BUCKETS)
    exp = PrometheusExporter()
    exp.on_step(record(2, 1, draft_s=2e-4, target_s=3.0))
    got = samples(exp.exposition())
    assert got[("specdec_draft_latency_seconds_bucket", frozenset({("le", "0.00025")}))] == 1
    assert got[("specdec_draft_latency_seconds_bucket", frozenset({("le", "0.0001")}))] == 0
    assert got[("specdec_target_latency_seconds_bucket", frozenset({("le", "5.0")}))] == 1
    assert got[("specdec_target_latency_seconds_bucket", frozenset({("le", "2.5")}))] == 0


def test_moving_ratio_with_decay_one_is_the_cumulative_ratio():
    m = MovingRatio(1.0)
    assert m.value is None
    for a, b in [(1, 4), (4, 4), (0, 2)]:
        m.update(a, b)
    assert m.value == pytest.approx(5 / 10)


def test_moving_ratio_weights_recent_updates_more():
    m = MovingRatio(0.5)
    m.update(0, 4)
    m.update(4, 4)
    assert m.value == pytest.approx((0.5 * 0 + 4) / (0.5 * 4 + 4))


@pytest.mark.parametrize("decay", [0.0, 1.5, -1, True, "0.9"])
def test_moving_ratio_rejects_a_bad_decay(decay):
    with pytest.raises(ValueError, match="decay"):
        MovingRatio(decay)


def test_acceptance_gauge_is_the_moving_ratio_of_accepted_over_drafted():
    exp = PrometheusExporter(ema_decay=0.8)
    ref = MovingRatio(0.8)
    for k, n in [(4, 0), (4, 4), (2, 1), (0, 0), (3, 3)]:
        exp.on_step(record(k, n))
        if k:
            ref.update(n, k)
    assert samples(exp.exposition())[("specdec_accepted_share_ema", frozenset())] == pytest.approx(ref.value)


def test_run_stats_count_drafts_as_steps_with_k_above_zero():
    stats = RunStats()
    for k, n in [(4, 2), (0, 0), (4, 4)]:
        stats.add_step(record(k, n), n + 1)
    assert (stats.steps, stats.drafts, stats.drafted, stats.accepted) == (3, 2, 8, 6)
    assert stats.accepted_per_position == [2, 2, 1, 1]
    assert stats.as_dict()["drafts"] == 2


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_http_scrape_equals_the_engines_run_stats(temperature):
    target, draft = noisy_pair()
    engine = SpeculativeEngine(target, draft, k=4, max_seq_len=128)
    exporter = PrometheusExporter()
    server = serve_metrics(exporter, port=0)  # 0: the OS picks a free port
    try:
        assert server.host == "127.0.0.1", "metrics must bind loopback unless asked otherwise"
        res = engine.generate([1, 2, 3], max_new_tokens=40, temperature=temperature, seed=0,
                              on_step=exporter.on_step)
        got = samples(scrape(server.url))
    finally:
        server.shutdown()
    st = res.stats
    assert 0 < st.accepted < st.drafted, "the pair should accept some drafts and reject others"
    assert got[("specdec_tokens_generated_total", frozenset())] == st.new_tokens == len(res.tokens)
    assert got[("specdec_tokens_drafted_total", frozenset())] == st.drafted
    assert got[("specdec_tokens_accepted_total", frozenset())] == st.accepted
    assert got[("specdec_drafts_total", frozenset())] == st.drafts == sum(r.k > 0 for r in res.steps)
    assert got[("specdec_steps_total", frozenset())] == st.steps
    assert got[("specdec_host_syncs_total", frozenset())] == st.syncs
    per_pos = {int(dict(lbl)["position"]): v for (name, lbl), v in got.items()
               if name == "specdec_accepted_tokens_per_position_total"}
    want = {i: c for i, c in enumerate(st.accepted_per_position) if c > 0}
    assert per_pos == want
    drafting = [r.draft_seconds for r in res.steps if r.k > 0]  # plain steps draft nothing
    assert got[("specdec_draft_latency_seconds_count", frozenset())] == len(drafting)
    assert got[("specdec_draft_latency_seconds_sum", frozenset())] == pytest.approx(sum(drafting))
    assert got[("specdec_target_latency_seconds_sum", frozenset())] == pytest.approx(st.target_seconds)
    assert got[("specdec_target_latency_seconds_count", frozenset())] == st.steps


def test_metrics_server_stops_serving_after_shutdown():
    exporter = PrometheusExporter()
    with serve_metrics(exporter.registry, port=0) as server:
        text = scrape(server.url)
        assert "specdec_steps_total" in text and "_created" not in text, "no _created series beside each counter"
    assert "specdec_steps_total" in exporter.exposition() and "_created" not in exporter.exposition()
    with pytest.raises(OSError):
        scrape(server.url)


@pytest.mark.parametrize("port", [-1, 70000, "9400", True])
def test_serve_metrics_rejects_a_bad_port(port):
    with pytest.raises(ValueError, match="port"):
        serve_metrics(PrometheusExporter(), port=port)


def test_serve_metrics_rejects_something_that_is_not_a_registry():
    with pytest.raises(ValueError, match="exporter_or_registry"):
        serve_metrics(object(), port=0)


# Host-sync accounting. The engine reports StepRecord.syncs; here the syncs are also *measured*
# from outside (analysis.syncs.count_host_syncs: reads to the host and copies to the device).


def _decode_syncs(engine, temperature):
    seen = []
    with count_host_syncs() as syncs:
        res = engine.generate([1, 2, 3], max_new_tokens=24, temperature=temperature, seed=0,
                              on_step=lambda rec, out: seen.append(syncs.count))
    measured = [b - a for a, b in zip(seen, seen[1:])]  # steps 1.. (step 0 also holds the prefill)
    return res, measured


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_device_verifier_syncs_exactly_once_per_step(temperature):
    target, draft = noisy_pair()
    engine = SpeculativeEngine(target, draft, k=4, max_seq_len=128)
    res, measured = _decode_syncs(engine, temperature)
    assert all(r.syncs == 1 for r in res.steps)
    assert res.stats.syncs == res.stats.steps and res.stats.syncs_per_step == 1.0
    assert measured and all(m == 1 for m in measured), f"measured syncs per step {measured}: a hidden .item()?"


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_reference_verifier_syncs_more_and_stats_show_it(temperature):
    target, draft = noisy_pair()
    device = SpeculativeEngine(target, draft, k=4, max_seq_len=128).generate(
        [1, 2, 3], max_new_tokens=24, temperature=temperature, seed=0)
    engine = SpeculativeEngine(target, draft, k=4, max_seq_len=128, verifier="reference")
    res, measured = _decode_syncs(engine, temperature)
    assert res.tokens == device.tokens, "the reference loop and the vectorised verifier must agree"
    assert all(r.syncs >= 2 for r in res.steps if r.k > 0)
    assert res.stats.syncs > res.stats.steps and res.stats.syncs_per_step >= 2
    # Counted where they happen, the recorded syncs are the measured ones, step by step.
    assert measured == [r.syncs for r in res.steps[1:]]
