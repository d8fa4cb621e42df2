"""bench --load: any OpenAI-compatible server under load, measured from outside as its clients see it.

    doc = run_load(LoadConfig(base_url="http://127.0.0.1:8000"))
    print(format_load(doc))

The same prompts go, streamed, to the server at `base_url` in two shapes of load:
  open loop   Poisson arrivals at each rate (requests per second): requests arrive whether or not the
              earlier ones are done, as real traffic does, so queueing shows in the latencies;
  closed loop a fixed number of clients, each sending its next request when its last one ended.
Per phase: TTFT (first streamed token), TPOT (time per output token after the first), end-to-end latency
(p50 and p99 of each), output tokens per second over the phase's wall time, and, where the server's
/metrics has vLLM's speculative-decoding counters (the lab's service and vLLM do; llama-server does not),
the mean acceptance length tau = 1 + accepted / drafts and the acceptance rate per drafted position,
from the counters' change over the phase. The client is asyncio and httpx, one connection per request
in flight. Starting the servers themselves is left to the caller.
"""
import asyncio
import json
import math
import random
import time
from dataclasses import asdict, dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families

ACCEPTED, DRAFTS = "vllm:spec_decode_num_accepted_tokens", "vllm:spec_decode_num_drafts"
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"


@dataclass
class LoadConfig:
    base_url: str
    prompts: list = field(default_factory=list)  # strings (chat turns), or token-id lists with endpoint completions
    model: str | None = None  # None: the first of GET /v1/models
    endpoint: str = "chat"  # chat: /v1/chat/completions; completions: /v1/completions
    max_tokens: int = 64
    rates: tuple = (0.5, 1.0, 2.0)  # open loop, requests per second
    concurrencies: tuple = (1, 2, 4, 8)  # closed loop, clients
    requests: int = 16  # per rate and per concurrency
    temperature: float = 0.0
    seed: int = 0
    api_key: str | None = None
    timeout: float = 600.0  # seconds for one request

    def check(self):
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got {self.base_url!r}")
        if self.endpoint not in ("chat", "completions"):
            raise ValueError(f"endpoint must be chat or completions, got {self.endpoint!r}")
        if not self.prompts:
            raise ValueError("prompts must not be empty")
        for name, v in (("max_tokens", self.max_tokens), ("requests", self.requests)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an int >= 1, got {v!r}")
        if any(not (isinstance(r, (int, float)) and math.isfinite(r) and r > 0) for r in self.rates):
            raise ValueError(f"rates must be positive numbers, got {self.rates!r}")
        if any(isinstance(c, bool) or not isinstance(c, int) or c < 1 for c in self.concurrencies):
            raise ValueError(f"concurrencies must be ints >= 1, got {self.concurrencies!r}")


@dataclass
class Sample:
    """One request as its client saw it (perf_counter seconds)."""
    start: float
    first: float | None = None
    end: float | None = None
    tokens: int = 0
    error: str | None = None
    timings: dict | None = None  # llama-server's own timings of the request (draft_n, draft_n_accepted, ...)


def run_load(cfg: LoadConfig, log=lambda text: None) -> dict:
    cfg.check()
    return asyncio.run(_run(cfg, log))


async def _run(cfg, log):
    headers = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}
    # a fresh connection per request: llama-server closes idle kept-alive connections, and a request sent on
    # one that was just closed fails with "Server disconnected" (2 of 8 did, in one phase, before this)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=cfg.base_url.rstrip("/"), headers=headers, limits=limits,
                                 timeout=cfg.timeout) as http:
        model = cfg.model or (await http.get("/v1/models")).raise_for_status().json()["data"][0]["id"]
        doc = {"base_url": cfg.base_url, "model": model, "config": {k: v for k, v in asdict(cfg).items()
                                                                   if k not in ("api_key", "prompts")},
               "num_prompts": len(cfg.prompts), "open_loop": {}, "closed_loop": {}}
        for rate in cfg.rates:
            log(f"open loop at {rate:g} requests/s: {cfg.requests} requests ...")
            doc["open_loop"][f"{rate:g}"] = await _phase(http, cfg, model, _open_loop(rate, cfg))
        for c in cfg.concurrencies:
            log(f"closed loop with {c} client(s): {cfg.requests} requests ...")
            doc["closed_loop"][str(c)] = await _phase(http, cfg, model, _closed_loop(c, cfg))
    return doc


async def _phase(http, cfg, model, drive) -> dict:
    before = await _spec_counters(http)
    t0 = time.perf_counter()
    samples = await drive(lambda i: _one(http, cfg, model, i))
    seconds = time.perf_counter() - t0
    after = await _spec_counters(http)
    return summarize(samples, seconds) | {"acceptance": _acceptance(before, after) or _timed_acceptance(samples)}


def _open_loop(rate, cfg):
    async def drive(send):
        rng = random.Random(cfg.seed)
        tasks, at = [], 0.0
        t0 = time.perf_counter()
        for i in range(cfg.requests):
            await asyncio.sleep(max(0.0, t0 + at - time.perf_counter()))
            tasks.append(asyncio.create_task(send(i)))
            at += rng.expovariate(rate)
        return await asyncio.gather(*tasks)
    return drive


def _closed_loop(clients, cfg):
    async def drive(send):
        order = iter(range(cfg.requests))
        samples = []

        async def client():
            for i in order:  # one shared iterator: each request is sent once, by whichever client is free
                samples.append(await send(i))
        await asyncio.gather(*(client() for _ in range(clients)))
        return samples
    return drive


async def _one(http, cfg, model, i) -> Sample:
    prompt = cfg.prompts[i % len(cfg.prompts)]
    body = {"model": model, "max_tokens": cfg.max_tokens, "temperature": cfg.temperature, "stream": True,
            "stream_options": {"include_usage": True}, "seed": cfg.seed + i}
    if cfg.endpoint == "chat":
        path, body["messages"] = "/v1/chat/completions", [{"role": "user", "content": prompt}]
    else:
        path, body["prompt"] = "/v1/completions", prompt
    s = Sample(time.perf_counter())
    chunks = 0
    try:
        async with http.stream("POST", path, json=body) as r:
            if r.status_code != 200:
                s.error = f"HTTP {r.status_code}: {(await r.aread()).decode(errors='replace')[:200]}"
                return s
            async for line in r.aiter_lines():
                got, usage = _parse_event(line)
                if got and s.first is None:
                    s.first = time.perf_counter()
                chunks += got
                if usage is not None:
                    s.tokens = usage
                if line.startswith("data: {") and '"timings"' in line:
                    s.timings = json.loads(line[6:]).get("timings")
    except (httpx.HTTPError, ValueError) as err:
        s.error = f"{type(err).__name__}: {err}"
    s.end = time.perf_counter()
    s.tokens = s.tokens or chunks  # a server that sends no usage: one token per content chunk, a lower bound
    return s


def _parse_event(line):
    """(1 if the event carries output, else 0; usage's completion_tokens or None) of one SSE line."""
    if not line.startswith("data: ") or line == "data: [DONE]":
        return 0, None
    doc = json.loads(line[6:])
    if "error" in doc:
        raise ValueError(f"error event: {doc['error']}")
    usage = (doc.get("usage") or {}).get("completion_tokens")
    for c in doc.get("choices") or []:
        if (c.get("delta") or {}).get("content") or c.get("text") or c.get("token_ids"):
            return 1, usage
    return 0, usage


def summarize(samples, seconds) -> dict:
    ok = [s for s in samples if s.error is None and s.first is not None]
    ttft = [s.first - s.start for s in ok]
    tpot = [(s.end - s.first) / (s.tokens - 1) for s in ok if s.tokens > 1]
    e2e = [s.end - s.start for s in ok]
    tokens = sum(s.tokens for s in ok)
    return {"requests": len(samples), "ok": len(ok), "errors": sorted({s.error for s in samples if s.error})[:5],
            "seconds": seconds, "output_tokens": tokens, "output_tokens_per_second": tokens / seconds,
            "ttft": _quantiles(ttft), "tpot": _quantiles(tpot), "e2e": _quantiles(e2e)}


def _quantiles(xs) -> dict:
    xs = sorted(xs)

    def q(p):  # nearest rank
        return xs[min(len(xs) - 1, max(0, math.ceil(p * len(xs)) - 1))] if xs else None
    return {"mean": sum(xs) / len(xs) if xs else None, "p50": q(0.5), "p99": q(0.99)}


async def _spec_counters(http) -> dict | None:
    """{name or (name, position): value} of vLLM's speculative counters at /metrics; None without them."""
    try:
        r = await http.get("/metrics")
    except httpx.HTTPError:
        return None
    if r.status_code != 200:
        return None
    out = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            base = s.name.removesuffix("_total")
            if base in (ACCEPTED, DRAFTS):
                out[base] = out.get(base, 0.0) + s.value
            elif base == PER_POS:
                key = (base, int(s.labels["position"]))
                out[key] = out.get(key, 0.0) + s.value
    return out if DRAFTS in out else None


def _acceptance(before, after) -> dict | None:
    if before is None or after is None:
        return None
    drafts = after[DRAFTS] - before.get(DRAFTS, 0.0)
    if drafts <= 0:
        return {"drafts": 0, "tau": None, "per_position": []}
    accepted = after.get(ACCEPTED, 0.0) - before.get(ACCEPTED, 0.0)
    positions = sorted(k[1] for k in after if isinstance(k, tuple))
    per_pos = [(after[(PER_POS, i)] - before.get((PER_POS, i), 0.0)) / drafts for i in positions]
    return {"drafts": drafts, "accepted": accepted, "tau": 1 + accepted / drafts, "per_position": per_pos}


def _timed_acceptance(samples) -> dict | None:
    """tau from llama-server's per-request timings, where the server has no vLLM counters: each step is
    one target forward that commits its accepted drafts and one token, so tau = predicted / steps."""
    timed = [s.timings for s in samples if s.error is None and s.timings and "draft_n" in s.timings]
    if not timed:
        return None
    predicted = sum(t["predicted_n"] for t in timed)
    accepted = sum(t.get("draft_n_accepted", 0) for t in timed)
    drafted = sum(t["draft_n"] for t in timed)
    return {"source": "llama-server timings", "drafted": drafted, "accepted": accepted,
            "tau": predicted / (predicted - accepted) if predicted > accepted else None, "per_position": []}


def format_load(doc) -> str:
    lines = [f"bench --load: {doc['model']} at {doc['base_url']}, {doc['config']['max_tokens']} tokens a request",
             f"{'load':>16} {'ok':>5} {'TTFT p50/p99 s':>16} {'TPOT p50/p99 ms':>17} {'e2e p50/p99 s':>15} "
             f"{'tok/s':>8} {'tau':>5}"]
    for kind, unit in (("open_loop", "req/s"), ("closed_loop", "clients")):
        for key, r in doc[kind].items():
            tau = (r["acceptance"] or {}).get("tau")
            lines.append(f"{key + ' ' + unit:>16} {r['ok']:>2}/{r['requests']:<2} {_pair(r['ttft']):>16} "
                         f"{_pair(r['tpot'], 1000):>17} {_pair(r['e2e']):>15} {r['output_tokens_per_second']:8.1f} "
                         f"{'-' if tau is None else f'{tau:.2f}':>5}")
    return "\n".join(lines)


def _pair(q, scale=1.0) -> str:
    if q["p50"] is None:
        return "-"
    return f"{q['p50'] * scale:.3g}/{q['p99'] * scale:.3g}"


# -- the command line: bench --load ----------------------------------------------------

def add_load_arguments(b):
    """bench --load's options, on bench's parser (--rates, --max-new-tokens, --num-prompts and --json are bench's)."""
    b.add_argument("--load", action="store_true",
                   help="only an OpenAI-compatible server at --base-url under load (bench/load.py): Poisson "
                        "arrivals at --rates (default 0.5,1,2) and a closed loop at --concurrencies; TTFT, TPOT, "
                        "e2e p50/p99, tokens/s and, from its /metrics, tau; --max-new-tokens (default 64)")
    b.add_argument("--base-url", help="--load: the server, e.g. http://127.0.0.1:8000 (no default: required unless "
                   "--servers)")
    b.add_argument("--servers", action="store_true",
                   help="--load: start the lab's serve, llama-server and vLLM's server themselves, each plain and "
                        "with the exported draft at K = 2, one thread each, and load each in turn "
                        "(bench/load_servers.py; `make peers` sets the peers up); then vllm bench serve against "
                        "the lab's service")
    b.add_argument("--concurrencies", help="--load: closed-loop clients, a comma list (default 1,2,4,8)")
    b.add_argument("--load-requests", type=int, help="--load: requests per rate and per concurrency "
                   "(default 16; --servers 8)")
    b.add_argument("--api-key", help="--load: sent as Authorization: Bearer KEY (default: none)")


def load_main(args, prompts, log):
    """bench --load from bench's parsed options: the table (unless --json), then one JSON line."""
    if not args.base_url:
        raise ValueError("bench --load needs --base-url, the server's address (e.g. http://127.0.0.1:8000), "
                         "or --servers")
    rates = _floats("--rates", args.rates) if args.rates is not None else LoadConfig.rates
    clients = (tuple(int(c) for c in _floats("--concurrencies", args.concurrencies)) if args.concurrencies
               else LoadConfig.concurrencies)
    cfg = LoadConfig(base_url=args.base_url, prompts=list(prompts[:args.prompts or len(prompts)]),
                     max_tokens=args.max_new_tokens or 64, rates=rates, concurrencies=clients,
                     requests=args.load_requests or 16, api_key=args.api_key)
    doc = run_load(cfg, log=log)
    if not args.json:
        print(format_load(doc))
    print(json.dumps(doc))


def _floats(name, text) -> tuple:
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"{name} must be a comma list of numbers, got {text!r}") from None
