"""A Prometheus exporter of the engine's steps, and a /metrics server for it.

The exporter plugs into the engine's streaming hook:

    exporter = PrometheusExporter()
    server = serve_metrics(exporter, port=9400)     # loopback only, by default
    engine.generate(prompt, on_step=exporter.on_step)
    server.shutdown()

Metric names, help texts and their vLLM counterparts: docs/metrics.md.
"""
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from ..analysis.exposition import WithoutCreated, exposition
from ..analysis.moving import MovingRatio
from ..core.records import StepRecord

# Latency buckets from 100 us (a small draft forward on a GPU) to 10 s (a large
# target on a CPU), in 1-2.5-5 steps: 16 buckets plus +Inf.
LATENCY_BUCKETS = (1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class PrometheusExporter:
    """Prometheus metrics of speculative decoding, fed one StepRecord at a time.

    exporter = PrometheusExporter(); engine.generate(..., on_step=exporter.on_step)

    Every metric is registered in `self.registry`, a CollectorRegistry of its own
    (not the process-wide default one), so two exporters never clash and tests
    see only these metrics. Counter names below omit the `_total` suffix that
    the exposition adds. `prefix` replaces "specdec" in every name.
    """

    def __init__(self, registry=None, prefix: str = "specdec", ema_decay: float = 0.9,
                 buckets: tuple = LATENCY_BUCKETS):
        self.registry = registry if registry is not None else CollectorRegistry()
        self.share_ratio = MovingRatio(ema_decay)
        r, p = self.registry, prefix
        self.tokens_generated = Counter(f"{p}_tokens_generated", "Tokens emitted to the output: accepted drafts "
                                        "plus each step's correction or bonus token, cut at max_new_tokens and EOS",
                                        registry=r)
        self.tokens_drafted = Counter(f"{p}_tokens_drafted", "Draft tokens proposed and verified by the target",
                                      registry=r)
        self.tokens_accepted = Counter(f"{p}_tokens_accepted", "Draft tokens the target accepted", registry=r)
        self.drafts = Counter(f"{p}_drafts", "Steps that verified at least one draft token (k > 0)", registry=r)
        self.steps = Counter(f"{p}_steps", "Decode steps, one target forward each, plain (k = 0) steps included",
                             registry=r)
        self.accepted_per_position = Counter(
            f"{p}_accepted_tokens_per_position", "Drafts whose token at this 0-based position was accepted",
            ["position"], registry=r)
        self.host_syncs = Counter(f"{p}_host_syncs", "Host synchronisations (device to host reads) in decode steps",
                                  registry=r)
        self.draft_latency = Histogram(f"{p}_draft_latency_seconds", "Wall time of the drafting phase of a step "
                                       "with k > 0", buckets=buckets, registry=r)
        self.target_latency = Histogram(f"{p}_target_latency_seconds", "Wall time of a step's target phase: "
                                        "the K+1 forward, verification, the one sync and the commit",
                                        buckets=buckets, registry=r)
        self.accepted_share_ema = Gauge(f"{p}_accepted_share_ema", "Moving accepted share: exponentially "
                                        f"weighted accepted / drafted tokens, decay {ema_decay} per draft "
                                        "(not alpha: it falls as K grows)", registry=r)
        self.draft_k = Gauge(f"{p}_draft_k", "Draft tokens proposed in the latest step (K after adaptive "
                             "control, the budget clamp and the drafter)", registry=r)

    def on_step(self, record: StepRecord, tokens_so_far=None):
        """The engine's streaming hook: on_step(record, tokens_so_far)."""
        self.steps.inc()
        self.tokens_generated.inc(len(record.committed))
        self.host_syncs.inc(record.syncs)
        self.target_latency.observe(record.target_seconds)
        self.draft_k.set(record.k)
        if record.k == 0:
            return
        self.drafts.inc()
        self.tokens_drafted.inc(record.k)
        self.tokens_accepted.inc(record.num_accepted)
        for i in range(record.num_accepted):
            self.accepted_per_position.labels(position=str(i)).inc()
        self.draft_latency.observe(record.draft_seconds)
        self.share_ratio.update(record.num_accepted, record.k)
        self.accepted_share_ema.set(self.share_ratio.value)

    def exposition(self) -> str:
        """The metrics in Prometheus' text format, as a scrape would return them."""
        return exposition(self.registry).decode()  # without the _created series


class MetricsServer:
    """A running /metrics HTTP server; `shutdown()` stops it (also on leaving a `with` block)."""

    def __init__(self, server, thread, host):
        self._server, self._thread = server, thread
        self.host, self.port = host, server.server_port

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def shutdown(self):
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shutdown()


def serve_metrics(exporter_or_registry, port: int, host: str = "127.0.0.1") -> MetricsServer:
    """Serve the metrics over HTTP at http://host:port/metrics in a daemon thread.

    Binds the loopback interface unless `host` says otherwise ("0.0.0.0" exposes
    the metrics to the network). port=0 picks a free port: read it from `.port`.
    """
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ValueError(f"port must be an int in [0, 65535], got {port!r}")
    if not isinstance(host, str) or not host:
        raise ValueError(f"host must be a non-empty string, got {host!r}")
    registry = getattr(exporter_or_registry, "registry", exporter_or_registry)
    if not hasattr(registry, "collect"):
        raise ValueError(f"exporter_or_registry must be a PrometheusExporter or a CollectorRegistry, "
                         f"got {type(exporter_or_registry).__name__}")
    server, thread = start_http_server(port, addr=host, registry=WithoutCreated(registry))
    return MetricsServer(server, thread, host)


# Rows per batched step: powers of two up to 128.
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
# Tokens per request: drafted, accepted, generated.
TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096)


class ServerExporter(PrometheusExporter):
    """The exporter for a serve.Server: every metric above, counted over the batch, and the
    batch's own (vLLM's names where vLLM has them; docs/metrics.md).

    exporter = ServerExporter(); server = Server(target, draft, on_batch=exporter.on_batch)

    Per step: one target forward, so `specdec_steps` counts batched steps and the latency
    histograms observe the step's shared phases; tokens drafted and accepted add up over the rows.
    Per request, when it ends: time to first token (from submit), time per output token
    (after the first), end-to-end latency, and its generated, drafted and accepted tokens."""

    def __init__(self, registry=None, prefix: str = "specdec", ema_decay: float = 0.9,
                 buckets: tuple = LATENCY_BUCKETS):
        super().__init__(registry, prefix, ema_decay, buckets)
        r, p = self.registry, prefix
        self.running = Gauge(f"{p}_num_requests_running", "Requests in the batch", registry=r)
        self.waiting = Gauge(f"{p}_num_requests_waiting", "Requests waiting for admission (preempted ones included)",
                             registry=r)
        self.batch_size = Histogram(f"{p}_batch_size", "Rows in each batched step", buckets=BATCH_BUCKETS, registry=r)
        self.speculation_off = Counter(f"{p}_steps_speculation_off", "Batched steps in which no row drafted (K = 0)",
                                       registry=r)
        self.preemptions = Counter(f"{p}_num_preemptions", "Requests preempted (recomputed) when the block pool "
                                   "ran out", registry=r)
        self.requests = Counter(f"{p}_requests_finished", "Requests that ended, by reason", ["finished_reason"],
                                registry=r)
        self.ttft = Histogram(f"{p}_time_to_first_token_seconds", "From submit to the first generated token",
                              buckets=buckets, registry=r)
        self.tpot = Histogram(f"{p}_time_per_output_token_seconds", "A request's time per output token after its "
                              "first", buckets=buckets, registry=r)
        self.e2e = Histogram(f"{p}_e2e_request_latency_seconds", "From submit to the request's end",
                             buckets=buckets, registry=r)
        self.request_generated = Histogram(f"{p}_request_generation_tokens", "Tokens a request generated",
                                           buckets=TOKEN_BUCKETS, registry=r)
        self.request_drafted = Histogram(f"{p}_request_draft_tokens", "Draft tokens verified for a request",
                                         buckets=TOKEN_BUCKETS, registry=r)
        self.request_accepted = Histogram(f"{p}_request_accepted_tokens", "Draft tokens accepted for a request",
                                          buckets=TOKEN_BUCKETS, registry=r)
        self._seen_preemptions = 0

    def on_batch(self, server, record):
        """The Server's hook: on_batch(server, BatchRecord), after each step."""
        self.steps.inc()
        self.host_syncs.inc(record.syncs)
        self.target_latency.observe(record.target_seconds)
        self.batch_size.observe(record.batch_size)
        self.draft_k.set(record.k_max)
        drafted = sum(r.k for r in record.rows)
        accepted = sum(r.num_accepted for r in record.rows)
        self.tokens_generated.inc(sum(len(r.committed) for r in record.rows))
        if drafted == 0:
            self.speculation_off.inc()
        else:
            self.draft_latency.observe(record.draft_seconds)
            self.tokens_drafted.inc(drafted)
            self.tokens_accepted.inc(accepted)
            self.share_ratio.update(accepted, drafted)
            self.accepted_share_ema.set(self.share_ratio.value)
        for r in record.rows:
            if r.k > 0:
                self.drafts.inc()
                for i in range(r.num_accepted):
                    self.accepted_per_position.labels(position=str(i)).inc()
        self.running.set(len(server.running))
        self.waiting.set(len(server.waiting))
        self.preemptions.inc(server.preemptions - self._seen_preemptions)
        self._seen_preemptions = server.preemptions
        for h in server.retired:  # the requests that ended since the last step: nothing grows
            self._finished(h)

    def _finished(self, h):
        self.requests.labels(finished_reason=h.finish_reason).inc()
        self.e2e.observe(h.finish_time - h.submit_time)
        out = h.seq.output
        if h.first_token_time is not None:
            self.ttft.observe(h.first_token_time - h.submit_time)
            if len(out) > 1:
                self.tpot.observe((h.finish_time - h.first_token_time) / (len(out) - 1))
        self.request_generated.observe(len(out))
        self.request_drafted.observe(h.seq.drafted)
        self.request_accepted.observe(h.seq.accepted)
