"""Side-by-side probes: the contiguous against the paged cache, where a decode token's time goes
(eager against the fused forward), each kernel's weight read rate, and the adaptive-K policies."""
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile

from ..analysis.roofline import bytes_per_token
from ..analysis.timing import BandwidthProbe, Clock, best_seconds
from ..api import SpeculativeEngine
from ..core.kv_cache import KVCache
from ..core.model import Linear
from ..core.text import encode_prompt
from ..cpu import build as kernels
from ..cpu.accelerate import eager
from ..cpu.linear import HAVE_PACKING, FastLinear, panel_weight
from ..policies.adaptive import CostAwareController, ThresholdController
from ..train.acceptance import measure_step_costs
from ..train.prompts import BENCH_PROMPTS


@torch.no_grad()
def compare_caches(target, draft, prompts, k=4, max_new_tokens=64, block_size=16, reps=2) -> dict:
    """The same speculative decode on the contiguous and the paged cache, interleaved per prompt:
    target tokens per second on each (target forward seconds only) and whether the outputs agree."""
    engines = {kind: SpeculativeEngine(target, draft, k=k, cache=kind, block_size=block_size)
               for kind in ("contiguous", "paged")}
    rates, same = {kind: [] for kind in engines}, True
    for _ in range(reps):
        for prompt in prompts:
            outs = {}
            for kind, engine in engines.items():
                res = engine.generate(prompt, max_new_tokens=max_new_tokens)
                rates[kind].append(res.stats.new_tokens / res.stats.target_seconds)
                outs[kind] = res.tokens
            same &= outs["contiguous"] == outs["paged"]
    med = {kind: statistics.median(v) for kind, v in rates.items()}
    return {"k": k, "block_size": block_size, "prompts": len(prompts), "max_new_tokens": max_new_tokens,
            "tokens_per_second": med, "contiguous_over_paged": med["contiguous"] / med["paged"],
            "same_outputs": same}


@torch.inference_mode()
def profile_decode(target, context=100, steps=30, bandwidth=None) -> dict:
    """Where one autoregressive decode token's time goes: torch.profiler over `steps` one-token
    forwards at `context` cached positions of the plain PyTorch forward (cpu.eager: the profiler
    cannot see inside the kernel library's calls), split into matrix products (aten::mm, addmm)
    and everything else, and the rate at which the products stream the weights against the
    machine's read bandwidth. Then both forwards are timed without the profiler, interleaved, best
    of `steps` each: eager_seconds, and fused_seconds for the accelerated model (cpu.accelerate; None
    where the one-call forward does not apply here)."""
    device = target.device
    cache = KVCache.for_model(target.cfg, context + 8, dtype=target.dtype, device=device)
    target(torch.randint(0, target.cfg.vocab_size, (1, context), device=device), cache=cache)
    tok = torch.zeros(1, 1, dtype=torch.long, device=device)

    def one_token():
        target(tok, cache=cache, last_only=True)
        cache.rollback(context)

    fused_applies = target.runner is not None and target.runner.logits(tok, None, cache, None, True) is not None
    if fused_applies:
        cache.rollback(context)
    with eager(target):
        for _ in range(3):  # warm-up
            one_token()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(steps):
                one_token()
    eager_times, fused_times = [], []
    for _ in range(steps):  # interleaved, so that both see the same machine
        with eager(target):
            eager_times.append(best_seconds(one_token, 1, device))
        if fused_applies:
            fused_times.append(best_seconds(one_token, 1, device))
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events) / steps / 1e6  # seconds per token
    products = sum(e.self_cpu_time_total for e in events if e.key in ("aten::mm", "aten::addmm")) / steps / 1e6
    weight_bytes = bytes_per_token(target.cfg, 0, target.dtype.itemsize)
    bandwidth = bandwidth or BandwidthProbe(device, reps=5)()
    return {"context": context, "steps": steps, "seconds_per_token": total, "product_seconds": products,
            "other_seconds": total - products, "product_share": products / total if total else 0.0,
            "weight_bytes": weight_bytes, "product_bytes_per_s": weight_bytes / products if products else 0.0,
            "bandwidth_bytes_per_s": bandwidth,
            "product_fraction_of_bandwidth": weight_bytes / products / bandwidth if products else 0.0,
            "eager_seconds": min(eager_times), "fused_seconds": min(fused_times) if fused_times else None}


def format_profile(doc) -> str:
    text = (f"eager decode token at {doc['context']} cached positions ({doc['steps']} steps under torch.profiler): "
            f"{doc['seconds_per_token'] * 1e3:.1f} ms; matrix products {doc['product_seconds'] * 1e3:.1f} ms "
            f"({doc['product_share']:.0%}), everything else {doc['other_seconds'] * 1e3:.1f} ms\n"
            f"the products stream {doc['weight_bytes'] / 1e6:.0f} MB of weights at "
            f"{doc['product_bytes_per_s'] / 1e9:.1f} GB/s = {doc['product_fraction_of_bandwidth']:.0%} of the "
            f"measured read bandwidth ({doc['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s)\n"
            f"without the profiler, best of {doc['steps']}: eager forward {doc['eager_seconds'] * 1e3:.1f} ms")
    if doc["fused_seconds"] is not None:
        text += (f", fused forward (one call) {doc['fused_seconds'] * 1e3:.1f} ms = "
                 f"{doc['weight_bytes'] / doc['fused_seconds'] / 1e9:.1f} GB/s of weights "
                 f"({doc['eager_seconds'] / doc['fused_seconds']:.2f}x faster)")
    return text


@torch.inference_mode()
def compare_kernels(target, rows=(1, 5), reps=5) -> dict:
    """Each kind of the target's matrix products (all layers' matrices of that kind in turn, so
    they stream from memory as in a forward) through each float32 CPU kernel there is: PyTorch's
    `x @ W`, oneDNN's prepacked product (cpu.linear.FastLinear's for several rows) and the panel
    kernel. GB/s of weight read, best of `reps`, the kernels interleaved within each repetition."""
    groups = {}
    for name, mod in target.named_modules():
        if isinstance(mod, Linear) and mod.weight.dtype == torch.float32:
            groups.setdefault(name.split(".")[-1], []).append(FastLinear(mod))
    systems = {"torch": lambda m, x: x @ m.weight}
    if HAVE_PACKING:
        systems["onednn"] = lambda m, x: m.packed_product(x)
    if kernels.available():
        systems["panel"] = lambda m, x: kernels.matmul(x, panel_weight(m), m.weight.shape[1])
    out = {}
    for kind, mods in groups.items():
        K, N = mods[0].weight.shape
        nbytes = sum(m.weight.numel() * 4 for m in mods)
        for r in rows:
            x = torch.randn(r, K)
            best = {s: float("inf") for s in systems}
            for _ in range(reps + 1):  # the first round builds the packed copies and warms up
                for s, f in systems.items():
                    t0 = time.perf_counter()
                    for m in mods:
                        f(m, x)
                    best[s] = min(best[s], time.perf_counter() - t0)
            out[f"{kind} {K}x{N}, {r} row{'s' if r > 1 else ''}"] = {
                "matrices": len(mods), "bytes": nbytes, "rows": r,
                "gb_per_s": {s: nbytes / t / 1e9 for s, t in best.items()}}
    return {"threads": torch.get_num_threads(), "reps": reps, "products": out}


def format_kernels(doc) -> str:
    systems = list(next(iter(doc["products"].values()))["gb_per_s"])
    lines = [f"weight read rate, GB/s (best of {doc['reps']}, {doc['threads']} thread(s))",
             f"{'product':32s} " + " ".join(f"{s:>8s}" for s in systems)]
    for name, p in doc["products"].items():
        lines.append(f"{name:32s} " + " ".join(f"{p['gb_per_s'][s]:8.1f}" for s in systems))
    return "\n".join(lines)


# A workload whose acceptance changes: chat answers and code, alternating.
POLICY_WORKLOAD = (BENCH_PROMPTS[0], BENCH_PROMPTS[6], BENCH_PROMPTS[1], BENCH_PROMPTS[7])


def compare_policies(target, draft, prompts=POLICY_WORKLOAD, ks=(1, 2, 3, 4, 8), temperature=1.0,
                     max_new_tokens=64, reps=3, verify_cost=None, log=None) -> dict:
    """Fixed K against the adaptive controllers on one workload served in order by one engine per
    policy (a controller's estimates carry from request to request). Repetitions interleave the
    policies, rotating who goes first; tokens/s is the median over repetitions of the workload's
    generated tokens over its wall time. Request i runs with seed i under every policy."""
    if verify_cost is None:
        ctx = int(statistics.mean(len(encode_prompt(target.tokenizer, p)) for p in prompts) + max_new_tokens / 2)
        costs = measure_step_costs(target, None, range(min(ks), max(ks) + 1), ctx, reps=10)  # every K it may pick
        verify_cost = {k: costs.verify_cost(k) for k in costs.verify}
    policies = {f"K={k}": (k, None) for k in ks}
    k_start = min(max(ks), 4)
    policies["cost-aware"] = (k_start, CostAwareController(k_min=min(ks), k_max=max(ks), k_start=k_start,
                                                           verify_cost=verify_cost))
    policies["threshold"] = (max(ks), ThresholdController(k_min=min(ks), k_max=max(ks)))
    engines = {}
    for name, (k, ctl) in policies.items():
        engines[name] = SpeculativeEngine(target, draft, k=k)
        engines[name].controller = ctl
    clock = Clock(target.device)
    for engine in engines.values():  # warm-up, untimed
        engine.generate(prompts[0], max_new_tokens=8, temperature=temperature, seed=0)
    rates, per_step, mean_k = ({n: [] for n in policies} for _ in range(3))
    names = list(policies)
    for rep in range(reps):
        for name in names[rep % len(names):] + names[:rep % len(names)]:
            engine, t0, tokens, steps, drafted = engines[name], clock(), 0, 0, 0
            for i, prompt in enumerate(prompts):
                res = engine.generate(prompt, max_new_tokens=max_new_tokens, temperature=temperature, seed=i)
                tokens, steps, drafted = tokens + res.stats.new_tokens, steps + res.stats.steps, drafted + res.stats.drafted
            rates[name].append(tokens / (clock() - t0))
            per_step[name].append(tokens / steps)
            mean_k[name].append(drafted / steps)
        if log:
            log(f"policies: repetition {rep + 1}/{reps} done")
    med = {n: statistics.median(v) for n, v in rates.items()}
    fixed = {n: v for n, v in med.items() if n.startswith("K=")}
    best = max(fixed, key=fixed.get)
    return {"temperature": temperature, "max_new_tokens": max_new_tokens, "reps": reps, "prompts": list(prompts),
            "verify_cost": verify_cost, "tokens_per_second": med,
            "tokens_per_step": {n: statistics.median(v) for n, v in per_step.items()},
            "mean_k": {n: statistics.median(v) for n, v in mean_k.items()},
            "best_fixed": best, "cost_aware_vs_best_fixed": med["cost-aware"] / fixed[best],
            "cost_aware_vs_k_max": med["cost-aware"] / med[f"K={max(ks)}"],
            "threshold_vs_best_fixed": med["threshold"] / fixed[best]}


def format_policies(doc) -> str:
    lines = [f"workload: {len(doc['prompts'])} requests in order, temperature {doc['temperature']:g}, "
             f"{doc['max_new_tokens']} new tokens each; median of {doc['reps']} interleaved repetitions",
             f"{'policy':12s} {'tokens/s':>9s} {'tok/step':>9s} {'mean K':>7s}"]
    for n, v in doc["tokens_per_second"].items():
        lines.append(f"{n:12s} {v:9.2f} {doc['tokens_per_step'][n]:9.2f} {doc['mean_k'][n]:7.2f}")
    lines.append(f"cost-aware / best fixed ({doc['best_fixed']}) = {doc['cost_aware_vs_best_fixed']:.3f}; "
                 f"cost-aware / K={max(int(n[2:]) for n in doc['tokens_per_second'] if n.startswith('K='))} = "
                 f"{doc['cost_aware_vs_k_max']:.2f}; threshold / best fixed = {doc['threshold_vs_best_fixed']:.3f}")
    return "\n".join(lines)
