"""Step and run statistics, and a Prometheus exporter of them.

A StepRecord is what one speculative step did; RunStats sums a run. These are
what the notebooks plot, the live demo draws and the Prometheus exporter counts.

The top of this module is plain Python with no dependencies: the core (engine,
verify, ...) imports it. `prometheus_client` is imported only inside
`PrometheusExporter` and `serve_metrics`, so the core never loads it (DESIGN.md
section 2). The exporter plugs into the engine's streaming hook:

    exporter = PrometheusExporter()
    server = serve_metrics(exporter, port=9400)     # loopback only, by default
    engine.generate(prompt, on_step=exporter.on_step)
    server.shutdown()

Metric names, help texts and their vLLM counterparts: docs/metrics.md.
"""
from dataclasses import dataclass, field


@dataclass
class StepRecord:
    step: int
    k: int  # tokens drafted this step (0 means a plain target step)
    drafted: list  # the drafted ids d_1..d_k
    num_accepted: int
    next_token: int  # the correction (a rejection) or bonus (all accepted) token
    p_draft: list  # p_i(d_i), the target's probability of each drafted token
    q_draft: list  # q_i(d_i), the draft's probability of each drafted token
    uniforms: list  # u_i drawn for each acceptance test (empty when greedy)
    draft_seconds: float
    target_seconds: float
    syncs: int  # host synchronisations this step
    committed: list = field(default_factory=list)  # tokens this step added to the output

    @property
    def bonus(self) -> bool:
        return self.k > 0 and self.num_accepted == self.k


@dataclass
class RunStats:
    new_tokens: int = 0
    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    seconds: float = 0.0  # wall time of the decode loop, prefill excluded
    prefill_seconds: float = 0.0
    draft_seconds: float = 0.0
    target_seconds: float = 0.0
    syncs: int = 0
    accepted_per_position: list = field(default_factory=list)  # [i] = drafts whose token i was accepted
    drafts: int = 0  # steps that drafted at least one token (k > 0); vLLM's num_drafts

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def mean_tokens_per_step(self) -> float:
        return self.new_tokens / self.steps if self.steps else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def syncs_per_step(self) -> float:
        return self.syncs / self.steps if self.steps else 0.0

    def add_step(self, rec: StepRecord, new_tokens: int):
        self.steps += 1
        self.drafts += int(rec.k > 0)
        self.new_tokens += new_tokens
        self.drafted += rec.k
        self.accepted += rec.num_accepted
        self.draft_seconds += rec.draft_seconds
        self.target_seconds += rec.target_seconds
        self.syncs += rec.syncs
        while len(self.accepted_per_position) < rec.k:
            self.accepted_per_position.append(0)
        for i in range(rec.num_accepted):
            self.accepted_per_position[i] += 1

    def as_dict(self) -> dict:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        for k in ("tokens_per_second", "mean_tokens_per_step", "acceptance_rate", "syncs_per_step"):
            out[k] = getattr(self, k)
        return out


class MovingRatio:
    """An exponentially weighted ratio: decayed sum of numerators over decayed sum of denominators.

    After updates (a_1, b_1) .. (a_t, b_t): value = sum_i decay^(t-i) a_i / sum_i decay^(t-i) b_i.
    decay = 1 gives the plain cumulative ratio; smaller decays forget faster (an
    update's weight halves after log(0.5)/log(decay) further updates). Weighting by
    the denominator means a step that drafted 5 tokens counts five times a step
    that drafted 1, as the cumulative acceptance rate does.
    """

    def __init__(self, decay: float = 0.9):
        if isinstance(decay, bool) or not isinstance(decay, (int, float)) or not 0.0 < decay <= 1.0:
            raise ValueError(f"decay must be a number in (0, 1], got {decay!r}")
        self.decay = float(decay)
        self.num = 0.0
        self.den = 0.0

    def update(self, num: float, den: float):
        self.num = self.decay * self.num + num
        self.den = self.decay * self.den + den

    @property
    def value(self) -> float | None:
        """The ratio, or None before any denominator was seen."""
        return self.num / self.den if self.den > 0 else None


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
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
        self.registry = registry if registry is not None else CollectorRegistry()
        self.acceptance_ema = MovingRatio(ema_decay)
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
        self.acceptance_rate_ema = Gauge(f"{p}_acceptance_rate_ema", "Moving acceptance rate: exponentially "
                                         f"weighted accepted / drafted tokens, decay {ema_decay} per draft",
                                         registry=r)
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
        self.acceptance_ema.update(record.num_accepted, record.k)
        self.acceptance_rate_ema.set(self.acceptance_ema.value)

    def exposition(self) -> str:
        """The metrics in Prometheus' text format, as a scrape would return them."""
        from prometheus_client import generate_latest
        return generate_latest(self.registry).decode()


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
    from prometheus_client import start_http_server
    server, thread = start_http_server(port, addr=host, registry=registry)
    return MetricsServer(server, thread, host)
