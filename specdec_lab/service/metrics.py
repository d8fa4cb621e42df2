"""/metrics under vLLM's names, so a dashboard or query written for vLLM reads this server unchanged.

Fed on the engine thread: `on_batch` is the Server's hook after each step (the speculative counters),
`on_tokens` hears each step's new tokens of a request (inter-token latency), `on_done` each request once
when it ended. The two request gauges and the cache's usage are read when scraped. Every series carries
vLLM's labels, `model_name` and `engine`. docs/metrics.md lists them.
"""
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client import CONTENT_TYPE_LATEST  # noqa: F401  the scrape's media type, for app.py

from ..analysis.exposition import exposition

# vLLM's own buckets for these histograms, so their quantiles compare bucket for bucket.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
               80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
               960.0, 1920.0, 7680.0)
REASONS = {"eos": "stop", "length": "length", "cancelled": "abort", "failed": "error"}  # vLLM's finished_reason


class ServiceMetrics:
    def __init__(self, server, model_name, registry=None):
        self.registry = registry if registry is not None else CollectorRegistry()
        self.labels = {"model_name": model_name, "engine": "0"}
        r, names = self.registry, list(self.labels)

        def counter(name, text, extra=()):
            return Counter(name, text, names + list(extra), registry=r)

        def histogram(name, text, buckets):
            return Histogram(name, text, names, buckets=buckets, registry=r).labels(**self.labels)

        self.drafts = counter("vllm:spec_decode_num_drafts", "Rows of a step that drafted (k > 0)").labels(
            **self.labels)
        self.draft_tokens = counter("vllm:spec_decode_num_draft_tokens", "Draft tokens verified").labels(**self.labels)
        self.accepted = counter("vllm:spec_decode_num_accepted_tokens", "Draft tokens accepted").labels(**self.labels)
        self.per_pos = counter("vllm:spec_decode_num_accepted_tokens_per_pos", "Drafts whose token at this 0-based "
                               "position was accepted", ["position"])
        self.prompt_tokens = counter("vllm:prompt_tokens", "Prompt tokens of the requests that ended").labels(
            **self.labels)
        self.generation_tokens = counter("vllm:generation_tokens", "Tokens generated").labels(**self.labels)
        self.finished = counter("vllm:request_success", "Requests that ended, by reason (stop, length, abort for a "
                                "cancel or a disconnect, error for a failed request)", ["finished_reason"])
        self.ttft = histogram("vllm:time_to_first_token_seconds", "From submit to the first generated token",
                              TTFT_BUCKETS)
        self.itl = histogram("vllm:inter_token_latency_seconds", "Between two steps that gave a request new tokens "
                             "(a speculative step gives several at once)", ITL_BUCKETS)
        self.e2e = histogram("vllm:e2e_request_latency_seconds", "From submit to the request's end", E2E_BUCKETS)
        self._gauges(server, names)
        self._last = {}  # request id -> time of its latest tokens
        server.on_batch = _chain(self.on_batch, server.on_batch)

    def _gauges(self, server, names):
        # Read at scrape time from another thread: len() of the Server's queues is one atomic read, and a
        # figure one step old is what any scrape sees anyway.
        kv = server.engine.target_kv
        for name, text, fn in (("vllm:num_requests_running", "Requests in the batch", lambda: len(server.running)),
                               ("vllm:num_requests_waiting", "Requests waiting for admission (preempted included)",
                                lambda: len(server.waiting)),
                               ("vllm:kv_cache_usage_perc", "Share of the target's KV blocks in use (0 to 1)",
                                lambda: kv.used_blocks / kv.num_blocks)):
            Gauge(name, text, names, registry=self.registry).labels(**self.labels).set_function(fn)

    def on_batch(self, server, record):
        for row in record.rows:
            self.generation_tokens.inc(len(row.committed))
            if row.k > 0:
                self.drafts.inc()
                self.draft_tokens.inc(row.k)
                self.accepted.inc(row.num_accepted)
                for i in range(row.num_accepted):
                    self.per_pos.labels(**self.labels, position=str(i)).inc()

    def on_tokens(self, handle):
        now = time.perf_counter()
        last = self._last.get(handle.id)
        if last is not None:
            self.itl.observe(now - last)
        self._last[handle.id] = now

    def on_done(self, handle, reason=None):
        """`reason` overrides the handle's for a cancelled request: "stop" when it met a stop string."""
        self._last.pop(handle.id, None)
        reason = reason if reason is not None and handle.status == "cancelled" else REASONS[handle.finish_reason]
        self.finished.labels(**self.labels, finished_reason=reason).inc()
        self.prompt_tokens.inc(len(handle.seq.prompt))
        if handle.finish_time is not None:
            self.e2e.observe(handle.finish_time - handle.submit_time)
        if handle.first_token_time is not None:
            self.ttft.observe(handle.first_token_time - handle.submit_time)

    def exposition(self) -> bytes:
        return exposition(self.registry)  # without the _created series


def _chain(first, then):
    if then is None:
        return first

    def both(server, record):
        first(server, record)
        then(server, record)
    return both
