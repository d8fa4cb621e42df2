"""`bench --serve`: batched speculative decoding under load, every system side by side in one run.

Systems (all greedy, one Server each, the same prompts):
  plain     plain batched decoding: no draft, K = 0
  fixed_K   speculation at a fixed K for every row, for each K in `fixed_ks`
  schedule  K by batch size from a table (serve.KSchedule; vLLM's per-batch-size ranges)
  goodput   K per step from the measured step costs and a running alpha (serve.GoodputPolicy)

Closed loop: B clients, each submitting its next request when the last one ends, until
`requests_per_client` x B requests are done; throughput is generated tokens over the wall time,
latency is each request's submit-to-end time. Systems run in rotating order at each B, `reps`
times, and each system's fastest run is kept (on a shared machine noise only adds time); every
run's tokens/s is stored too, and the spread between a system's runs is the noise its ratios are
read against (`noise`: the largest relative spread of any system at that B). Ratios of the
median runs (`median_over_plain`) sit beside those of the fastest: one lucky or unlucky run moves
a fastest-run ratio, and the median of three is robust to it.
Open loop: a seeded Poisson stream of `open_requests` requests at each rate (requests per
second of this machine's wall clock), with and without speculation; latency is from arrival.
The step costs the goodput policy uses are measured first (serve.measure_step_costs), and the
target forward's cost by row count beside them. The roofline's prediction of the batch size
where fixed-K speculation stops paying (analysis.roofline.batch_speedup, with this machine's
measured bandwidth and FLOP/s and the measured alpha) is set against the measured one.
"""
import math
import random
import statistics
import time
from dataclasses import dataclass

import torch

from ..analysis.roofline import batch_speedup
from ..core.engine import autoregressive_generate
from ..analysis.timing import measure_matmul_flops, measure_memory_bandwidth
from ..core.text import encode_prompt
from ..serve import BatchEngine, GoodputPolicy, KSchedule, Server, measure_step_costs
from ..serve.engine import make_sequence
from ..serve.forward import hidden
from .run import first_difference



def systems(cfg) -> tuple:
    """The closed loop's systems, in the order they are run and reported."""
    return ("plain", *(f"fixed_{k}" for k in cfg.fixed_ks), "schedule", "goodput")


@dataclass
class ServeBenchConfig:
    batch_sizes: tuple = (1, 2, 4, 8, 16)
    k: int = 4  # the goodput policy's largest K, and the fixed K the roofline's crossover is predicted for
    fixed_ks: tuple = (1, 2, 4)  # a fixed-K system for each
    schedule: tuple = ((1, 2, 4), (3, 4, 2), (5, 8, 1))  # (start_bs, end_bs, K); K = 0 beyond 8 rows
    requests_per_client: int = 2
    max_new_tokens: int = 32
    rates: tuple = (0.5, 1.0, 2.0)  # open loop, requests per second
    open_requests: int = 12
    open_max_batch: int = 8
    reps: int = 3  # closed-loop runs per system and batch size; the fastest is kept (noise only adds time)
    cost_ks: tuple = (0, 1, 2, 3, 4)
    cost_reps: int = 3  # timed rounds of the step costs; the fastest is kept
    context: int = 64  # prompt length of the cost measurements
    seed: int = 0


QUICK_SERVE = dict(batch_sizes=(1, 2), requests_per_client=1, max_new_tokens=8, rates=(2.0,), open_requests=3,
                   open_max_batch=2, cost_ks=(0, 1, 2), k=2, fixed_ks=(1, 2), schedule=((1, 1, 2),), reps=1,
                   cost_reps=1)


def _server(target, draft, system, max_batch, costs, cfg):
    if system == "plain":
        return Server(target, None, max_batch=max_batch, k=0, max_seq_len=1024)
    if system.startswith("fixed_"):
        k = int(system.removeprefix("fixed_"))
    elif system == "schedule":
        k = KSchedule(cfg.schedule)
    else:
        k = GoodputPolicy(costs, k_max=cfg.k)
    return Server(target, draft, max_batch=max_batch, k=k, max_seq_len=1024)


def _quantile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, math.ceil(q * len(xs)) - 1))] if xs else float("nan")


def _summary(handles, seconds, server, latencies):
    tokens = sum(len(h.tokens) for h in handles)
    steps = [r for h in handles for r in h.seq.steps]
    drafted = sum(r.k for r in steps)
    accepted = sum(r.num_accepted for r in steps)
    rejections = sum(r.num_accepted < r.k for r in steps if r.k)
    return {"tokens": tokens, "seconds": seconds, "tokens_per_second": tokens / seconds,
            "latency_mean": sum(latencies) / len(latencies), "latency_p50": _quantile(latencies, 0.5),
            "latency_p99": _quantile(latencies, 0.99), "latencies": [round(x, 4) for x in latencies],
            "steps": server.steps, "preemptions": server.preemptions,
            "mean_k": drafted / len(steps) if steps else 0.0, "accepted": accepted, "drafted": drafted,
            "alpha_mle": accepted / (accepted + rejections) if accepted + rejections else None}


def closed_loop(server, prompts, clients, requests_per_client, max_new_tokens):
    """`clients` requests in flight; each ending one is replaced until all are submitted."""
    queue = list(prompts)
    total = clients * requests_per_client
    handles, t0 = [], time.perf_counter()
    for _ in range(clients):
        handles.append(server.submit(queue[len(handles) % len(queue)], max_new_tokens=max_new_tokens))
    while not server.idle:
        server.step()
        for _ in range(sum(h.done for h in handles) - (len(handles) - clients)):
            if len(handles) < total:
                handles.append(server.submit(queue[len(handles) % len(queue)], max_new_tokens=max_new_tokens))
    seconds = time.perf_counter() - t0
    return _summary(handles, seconds, server, [h.finish_time - h.submit_time for h in handles])


def open_loop(server, prompts, rate, n, max_new_tokens, seed):
    """A seeded Poisson stream of n requests at `rate` per second; latency from each arrival."""
    rnd = random.Random(seed)
    arrivals, t = [], 0.0
    for _ in range(n):
        t += rnd.expovariate(rate)
        arrivals.append(t)
    handles, t0 = [], time.perf_counter()
    while len(handles) < n or not server.idle:
        now = time.perf_counter() - t0
        while len(handles) < n and arrivals[len(handles)] <= now:
            h = server.submit(prompts[len(handles) % len(prompts)], max_new_tokens=max_new_tokens)
            h.submit_time = t0 + arrivals[len(handles)]  # latency counts from the arrival, not the submit
            handles.append(h)
        if server.idle:
            time.sleep(max(0.0, arrivals[len(handles)] - (time.perf_counter() - t0)))
        else:
            server.step()
    seconds = time.perf_counter() - t0
    return _summary(handles, seconds, server, [h.finish_time - h.submit_time for h in handles])


@torch.inference_mode()
def target_forward_costs(target, batch_sizes, tokens, context=64, reps=3, seed=0):
    """{(B, T): seconds}: the fastest of `reps` target forwards (logits included) over B rows of T
    new tokens after `context` cached ones, through the batched paged cache."""
    engine = BatchEngine(target, None, num_blocks=4 * max(batch_sizes) * (context // 16 + 2), max_seq_len=1024)
    g = torch.Generator().manual_seed(seed)
    V, out = target.cfg.vocab_size, {}
    for B in batch_sizes:
        seqs = [make_sequence(torch.randint(0, V, (context,), generator=g).tolist(), 2, device=target.device)
                for _ in range(B)]
        engine.prefill(seqs)
        ids = [s.seq_id for s in seqs]
        for T in tokens:
            x = torch.randint(0, V, (B, T), generator=g).to(target.device)
            for rep in range(reps + 1):
                t0 = time.perf_counter()
                target.head(hidden(target, engine.target_kv.view(ids, [T] * B), x)).float().sum().item()  # sync: the clock
                if rep:
                    out[(B, T)] = min(out.get((B, T), float("inf")), time.perf_counter() - t0)
                for s in ids:
                    engine.target_kv.rollback(s, context - 1)
        engine.release(seqs)
    return out


def run_serve_bench(target, draft, prompt_texts, cfg=ServeBenchConfig(), log=print) -> dict:
    prompts = [encode_prompt(getattr(target, "tokenizer", None), p) for p in prompt_texts]
    engine = BatchEngine(target, draft, num_blocks=max(cfg.batch_sizes) * 8, max_seq_len=1024)
    log("measuring step costs ...")
    costs = measure_step_costs(engine, cfg.batch_sizes, cfg.cost_ks, context=cfg.context, reps=cfg.cost_reps,
                               seed=cfg.seed)
    forward = target_forward_costs(target, cfg.batch_sizes, (1, cfg.k + 1), context=cfg.context)
    names = systems(cfg)
    closed = {s: {} for s in names}
    runs = {s: {B: [] for B in cfg.batch_sizes} for s in names}
    for i, B in enumerate(cfg.batch_sizes):
        for rep in range(cfg.reps):  # each rep in a rotated order; the best run of each system is kept
            shift = (i + rep) % len(names)
            for system in names[shift:] + names[:shift]:
                log(f"closed loop: batch {B}, {system}, rep {rep + 1} ...")
                server = _server(target, draft, system, B, costs, cfg)
                run = closed_loop(server, prompts, B, cfg.requests_per_client, cfg.max_new_tokens)
                if system == "goodput":
                    run["k_choices"] = sorted(set(k for _, k in server.k_history))
                runs[system][B].append(run["tokens_per_second"])
                best = closed[system].get(B)
                if best is None or run["tokens_per_second"] > best["tokens_per_second"]:
                    closed[system][B] = run
    opened = {s: {} for s in ("plain", "goodput")}
    for rate in cfg.rates:
        for system in opened:
            log(f"open loop: {rate} requests/s, {system} ...")
            server = _server(target, draft, system, cfg.open_max_batch, costs, cfg)
            opened[system][rate] = open_loop(server, prompts, rate, cfg.open_requests, cfg.max_new_tokens, cfg.seed)
    return _document(target, draft, cfg, costs, forward, closed, runs, opened)


def medians(runs: dict) -> dict:
    """From {system: {B: [tokens/s of each run]}}: each system's median run over plain's at every B,
    the best fixed K by that ratio, and the goodput policy's ratio to it."""
    ratio = {s: {B: statistics.median(r[B]) / statistics.median(runs["plain"][B]) for B in r} for s, r in runs.items()}
    fixed = [s for s in runs if s.startswith("fixed_")]
    best = {B: max(fixed, key=lambda s: ratio[s][B]) for B in runs["plain"]}
    return {"median_over_plain": ratio, "best_fixed_median": best,
            "goodput_vs_best_fixed_median": {B: ratio["goodput"][B] / ratio[best[B]][B] for B in best}}


def _document(target, draft, cfg, costs, forward, closed, runs, opened):
    names, sizes = systems(cfg), cfg.batch_sizes
    ratio = {s: {B: closed[s][B]["tokens_per_second"] / closed["plain"][B]["tokens_per_second"] for B in sizes}
             for s in names}
    fixed = [s for s in names if s.startswith("fixed_")]
    crossover = {s: next((B for B in sizes if ratio[s][B] < 1.0), None) for s in fixed}
    best_fixed = {B: max(fixed, key=lambda s: ratio[s][B]) for B in sizes}
    # The noise at B: the largest spread between one system's runs there, relative to its best run.
    noise = {B: max((max(r[B]) - min(r[B])) / max(r[B]) for r in runs.values()) for B in sizes}
    alpha = closed[f"fixed_{cfg.k}"][sizes[0]]["alpha_mle"] or 0.5
    bandwidth, flops = measure_memory_bandwidth(), measure_matmul_flops()
    bpp = target.dtype.itemsize
    predicted = {B: batch_speedup(alpha, cfg.k, B, target.cfg, draft.cfg, flops, bandwidth, cfg.context, bpp)
                 for B in cfg.batch_sizes}
    return {
        "config": {**cfg.__dict__, "threads": torch.get_num_threads(), "dtype": str(target.dtype)},
        "step_costs": {f"{B},{k}": s for (B, k), s in costs.items()},
        "target_forward_seconds": {f"{B},{T}": s for (B, T), s in forward.items()},
        "closed_loop": {s: {str(B): r for B, r in closed[s].items()} for s in names},
        "closed_loop_runs": {s: {str(B): r for B, r in runs[s].items()} for s in names},
        "noise": {str(B): v for B, v in noise.items()},
        "throughput_over_plain": {s: {str(B): r for B, r in ratio[s].items()} for s in names},
        "crossover_batch_measured": crossover[f"fixed_{cfg.k}"],
        "crossover_by_system": crossover,
        "best_fixed": {str(B): s for B, s in best_fixed.items()},
        "goodput_vs_best_fixed": {str(B): ratio["goodput"][B] / ratio[best_fixed[B]][B] for B in sizes},
        **medians({s: {str(B): r for B, r in runs[s].items()} for s in names}),
        "roofline": {"alpha": alpha, "bandwidth_bytes_per_s": bandwidth, "matmul_flops": flops,
                     "predicted_speedup_fixed_k": {str(B): v for B, v in predicted.items()},
                     "crossover_batch_predicted": next((B for B in cfg.batch_sizes if predicted[B] < 1.0), None)},
        "open_loop": {s: {str(r): v for r, v in opened[s].items()} for s in opened},
    }


def _crossover(batch) -> str:
    """Where speculation stops paying, in words; None (no batch size measured where it stopped) included."""
    return "pays at every batch size measured" if batch is None else f"stops paying at batch {batch}"


def format_serve(doc) -> str:
    cfg = doc["config"]
    names = list(doc["closed_loop"])
    lines = [f"closed loop, greedy, {cfg['max_new_tokens']} new tokens, {cfg['threads']} thread(s): "
             f"tokens/s (over plain), mean latency s; noise: the largest spread between a system's runs"]
    lines.append(f"{'batch':>5} " + " ".join(f"{s:>22}" for s in names) + "  goodput/best fixed  noise")
    for B in map(str, cfg["batch_sizes"]):
        cells = []
        for s in names:
            r = doc["closed_loop"][s][B]
            cells.append(f"{r['tokens_per_second']:7.1f} ({doc['throughput_over_plain'][s][B]:4.2f}) "
                         f"{r['latency_mean']:6.2f}")
        lines.append(f"{B:>5} " + " ".join(f"{c:>22}" for c in cells) +
                     f"  {doc['goodput_vs_best_fixed'][B]:5.2f} ({doc['best_fixed'][B]})  {doc['noise'][B]:.0%}")
    lines.append("the same from each system's median run: " + "; ".join(
        f"batch {B}: " + ", ".join(f"{s} {doc['median_over_plain'][s][B]:.2f}" for s in names[1:]) for B in
        map(str, cfg["batch_sizes"])))
    roof = doc["roofline"]
    lines.append(f"fixed K = {cfg['k']}, measured: {_crossover(doc['crossover_batch_measured'])}; the roofline "
                 f"predicts: {_crossover(roof['crossover_batch_predicted'])} (alpha {roof['alpha']:.2f}, "
                 f"{roof['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s, {roof['matmul_flops'] / 1e9:.1f} GFLOP/s)")
    lines.append("step cost ms by batch (rows) and K: " + ", ".join(
        f"{key}: {1e3 * v:.0f}" for key, v in doc["step_costs"].items()))
    lines.append("target forward ms by batch and tokens per row: " + ", ".join(
        f"{key}: {1e3 * v:.0f}" for key, v in doc["target_forward_seconds"].items()))
    if cfg["rates"]:
        lines.append(f"open loop ({cfg['open_requests']} Poisson requests, max batch {cfg['open_max_batch']}): "
                     "rate -> p50 / p99 latency s, tokens/s")
    for rate in map(str, cfg["rates"]):
        cells = [f"{s} {doc['open_loop'][s][rate]['latency_p50']:.2f} / {doc['open_loop'][s][rate]['latency_p99']:.2f}"
                 f", {doc['open_loop'][s][rate]['tokens_per_second']:.1f}" for s in doc["open_loop"]]
        lines.append(f"  {rate:>5}/s: " + "; ".join(cells))
    return "\n".join(lines)


@torch.inference_mode()
def greedy_equality(target, draft, prompt_texts, max_batch=8, max_new_tokens=48, k=4, log=print) -> dict:
    """Every prompt through one Server (greedy, K = k), a third of them arriving while earlier ones
    run and leave, against its batch-1 autoregressive decode: the share of identical answers and,
    where one differs, the target's logit gap at the first difference (bench.run.first_difference)."""
    prompts = [encode_prompt(getattr(target, "tokenizer", None), p) for p in prompt_texts]
    server = Server(target, draft, max_batch=max_batch, k=k, max_seq_len=1024)
    handles = []
    for i, x in enumerate(prompts):
        handles.append(server.submit(x, max_new_tokens=max_new_tokens))
        if i % 3 == 2:
            server.step()  # arrivals midway
    server.run_until_idle()
    log(f"{server.steps} batched steps; the batch-1 references ...")
    differences = []
    for x, h in zip(prompts, handles):
        reference = autoregressive_generate(target, x, max_new_tokens=max_new_tokens).tokens
        if h.result().tokens != reference:
            differences.append(first_difference(target, x, reference, h.result().tokens))
    return {"prompts": len(prompts), "identical": len(prompts) - len(differences), "max_batch": max_batch,
            "max_new_tokens": max_new_tokens, "k": k, "differences": differences}
