"""The prepared GPU check (scripts/gpu_check.sh): what the engine claims on a GPU, measured in one
run that writes one JSON document and one log, and needs nothing downloaded or installed.

    python -m specdec_lab.bench.gpu_check --out gpu_check.json --log gpu_check.log
    python -m specdec_lab.bench.gpu_check --smoke ...   # tiny stand-ins on the CPU: CI runs this

Parts, in order of value. Each sub-step is written to the JSON (atomically) before the next one
starts, so a run killed at any point keeps what it measured; an error is stored in its own
sub-step, beside the figures of the others:
  environment      torch, the device, the measured read bandwidth;
  gpu_tests        tests/test_gpu.py on tiny models, under their own timeout;
  synthetic_<8B>   random bf16 weights of Llama-3.1-8B's shape with a Llama-3.2-1B-shaped draft:
                   eager (c and v_K, the autoregressive decode's share of the read bandwidth, host
                   syncs per step for the contiguous and paged caches, lookup, the early stop and
                   sampling; then the batched step's cost by rows and K, and a token tree's
                   verification by node count: gpu_load.py), then compiled (warm-up, compiled
                   tokens against eager ones with the logit gap at a first difference, c and v_K,
                   the decode, CUDA's sync count);
  shipped_draft    real weights the repository carries (the shipped draft, through the real
                   loader) in float32 and bfloat16: greedy speculative decoding equal to
                   autoregressive, eager and compiled, and bf16 against float32;
  default_pair     the default pair's real weights, only where the target is on the machine already;
  tree_verify      back to the 8B shape: the tree's verification compiled (a graph per node count);
  synthetic_<1.7B> SmolLM2-1.7B's shape with a 135M-shaped draft, as the first.

Compiled models (compiled/) compile three graphs per pair for the whole run: the target's T = 1
and T = K + 1 forwards and the draft's one row. They are compiled, and their CUDA graphs recorded,
in a warm-up of their own; every timed or counted window after it stores the graph count and
CUDA graph skips before and after. Clocks start after torch.cuda.synchronize(); decode rates and
syncs per step leave out the first step, which also waits on the prompt's copy and its prefill.
"""
import argparse
import json
import os
import platform
import subprocess
import sys
import time
import traceback
import warnings
from pathlib import Path

import torch

from ..analysis.roofline import bytes_per_token, expected_speedup
from ..analysis.syncs import count_host_syncs
from ..analysis.timing import BandwidthProbe
from ..api import LookupThenModelDrafter, SpeculativeEngine, autoregressive_generate
from ..compiled import compiled_twin, graph_counts
from ..core.config import ModelConfig
from ..drafters import ModelDrafter
from ..train.acceptance import measure_step_costs
from .gpu import SYNTHETIC, random_model
from .gpu_load import batched_steps, tree_verify, tree_verify_compiled
from .run import first_difference

ROOT = Path(__file__).resolve().parents[2]
TINY = {  # stand-ins of the presets' kinds: an untied target with a tied draft, as Llama-3.1-8B / 3.2-1B
    "tiny": (ModelConfig(vocab_size=512, dim=128, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=32,
                         intermediate_size=256, max_seq_len=512, tie_embeddings=False, eos_token_ids=()),
             ModelConfig(vocab_size=512, dim=64, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=32,
                         intermediate_size=128, max_seq_len=512, tie_embeddings=True, eos_token_ids=())),
    "tiny-tied": (ModelConfig(vocab_size=512, dim=96, n_layers=2, n_heads=4, n_kv_heads=4, head_dim=24,
                              intermediate_size=192, max_seq_len=512, tie_embeddings=True, eos_token_ids=()),
                  ModelConfig(vocab_size=512, dim=48, n_layers=2, n_heads=3, n_kv_heads=1, head_dim=16,
                              intermediate_size=96, max_seq_len=512, tie_embeddings=True, eos_token_ids=())),
}
FULL = dict(presets=("llama3-8b", "smollm2-1.7b"), ks=tuple(range(1, 9)), compiled_k=4, capacity=2048,
            prompt_len=128, new_tokens=128, reps=20, pair_prompts=8, pair_tokens=64, pair_ks=(2, 4, 6),
            alphas=(0.6, 0.7, 0.8), tests_timeout=150, batch_sizes=(1, 2, 4, 8, 16, 32, 64), batch_ks=(0, 2, 4),
            tree_nodes=(1, 2, 4, 8, 12, 16, 24, 32, 48, 64), tree_compiled=(8, 32, 64))
SMOKE = dict(presets=("tiny", "tiny-tied"), ks=(1, 2), compiled_k=2, capacity=256, prompt_len=16, new_tokens=16,
             reps=3, pair_prompts=2, pair_tokens=12, pair_ks=(2,), alphas=(0.6, 0.7, 0.8), tests_timeout=300,
             batch_sizes=(1, 2), batch_ks=(0, 2), tree_nodes=(1, 4, 8), tree_compiled=(4,))


class Check:
    """The JSON document, the log and the time budget of one run."""

    def __init__(self, out, log, budget):
        self.out, self.log_file, self.deadline, self.doc = Path(out), open(log, "w"), time.time() + budget, {}

    def log(self, text):
        line = f"[{time.strftime('%H:%M:%S')}] {text}"
        print(line, flush=True)
        self.log_file.write(line + "\n")
        self.log_file.flush()

    def time_left(self) -> float:
        return self.deadline - time.time()

    def step(self, part: dict, name: str, fn, *args, need: float = 0.0):
        """Store fn(*args) as part[name] and write the JSON; an error, or too little time left
        (`need` seconds), is stored there instead and the run goes on. Returns the result or None."""
        self.log(f"--- {name}")
        if self.time_left() < need:
            part[name] = {"skipped": f"time budget ({self.time_left():.0f} s left, {need:.0f} s needed)"}
            self.save()
            return None
        t0 = time.time()
        try:
            part[name] = fn(*args)
        except Exception as e:  # noqa: BLE001: the check goes on to its other steps
            self.log(traceback.format_exc())
            part[name] = {"error": f"{type(e).__name__}: {e}"}
        part.setdefault("seconds", {})[name] = round(time.time() - t0, 2)
        self.save()
        return None if isinstance(part[name], dict) and "error" in part[name] else part[name]

    def part(self, name) -> dict:
        """A part of the document that steps write into."""
        self.doc[name] = {}
        self.save()
        return self.doc[name]

    def save(self):
        tmp = self.out.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.doc, indent=1, default=str))
        os.replace(tmp, self.out)  # a kill mid-write leaves the previous document whole

    def errors(self) -> list:
        found = []

        def walk(v, path):
            if isinstance(v, dict):
                if "error" in v:
                    found.append(path)
                for k, x in v.items():
                    walk(x, f"{path}/{k}" if path else k)
        walk(self.doc, "")
        return found


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def window(device, fn):
    """(fn(), seconds, graphs): fn timed between two synchronisations, with torch's graph count
    and CUDA graph skips before and after (a difference means something compiled inside)."""
    before = graph_counts()
    sync(device)
    t0 = time.perf_counter()
    out = fn()
    sync(device)
    seconds = time.perf_counter() - t0
    after = graph_counts()
    return out, seconds, {f"{k}_before": v for k, v in before.items()} | {f"{k}_after": v for k, v in after.items()}


def decode_rate(res) -> float:
    """Tokens per second after the first step (which also waits on the prompt's prefill); each
    step ends in a host read, so the steps' own clocks are synchronised."""
    steps = res.steps[1:]
    seconds = sum(r.draft_seconds + r.target_seconds for r in steps)
    return sum(len(r.committed) for r in steps) / seconds if seconds > 0 else float("nan")


def cuda_syncs_per_step(engine, ids, new_tokens, **kw):
    """Host synchronisations per step as CUDA reports them (its sync debug mode warns at each),
    leaving out the first step, which also holds the prompt's copy. None without CUDA."""
    if engine.target.device.type != "cuda":
        return None
    marks = []
    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            engine.generate(ids, max_new_tokens=new_tokens, **kw,
                            on_step=lambda rec, out: marks.append(sum("synchroniz" in str(w.message) for w in caught)))
        finally:
            torch.cuda.set_sync_debug_mode(previous)
    per_step = [b - a for a, b in zip(marks, marks[1:])]
    return {"steps_counted": len(per_step), "max": max(per_step, default=None),
            "mean": sum(per_step) / len(per_step) if per_step else None, "first_step_left_out": True}


def host_syncs_per_step(engine, ids, new_tokens, **kw) -> dict:
    """Eager engines only (the counter is a TorchFunctionMode, which would recompile a compiled
    graph): the engine's own figure, the external count per step after the first, and CUDA's."""
    engine.generate(ids, max_new_tokens=4, **kw)  # warm-up
    seen = []
    with count_host_syncs() as counter:
        res = engine.generate(ids, max_new_tokens=new_tokens, on_step=lambda rec, out: seen.append(counter.count), **kw)
    per_step = [b - a for a, b in zip(seen, seen[1:])]
    return {"steps": res.stats.steps, "engine_counted": res.stats.syncs_per_step,
            "counted_per_step_max": max(per_step, default=None),
            "counted_per_step_mean": sum(per_step) / len(per_step) if per_step else None,
            "cuda": cuda_syncs_per_step(engine, ids, new_tokens, **kw)}


def sync_table(target, draft, ids, new_tokens, k) -> dict:
    cap = len(ids) + new_tokens + 32
    return {
        "contiguous_greedy": host_syncs_per_step(SpeculativeEngine(target, draft, k=k), ids, new_tokens),
        "contiguous_sampling": host_syncs_per_step(SpeculativeEngine(target, draft, k=k), ids, new_tokens,
                                                   temperature=1.0, seed=0),
        "paged_greedy": host_syncs_per_step(SpeculativeEngine(target, draft, k=k, cache="paged"), ids, new_tokens),
        "lookup_greedy": host_syncs_per_step(SpeculativeEngine(target, LookupThenModelDrafter(draft, cap), k=k),
                                             ids, new_tokens),
        "stop_below_greedy": host_syncs_per_step(SpeculativeEngine(target, ModelDrafter(draft, cap, stop_below=0.5),
                                                                   k=k), ids, new_tokens),
    }


def costs_report(check, costs, ks) -> dict:
    v = {k: costs.verify_cost(k) for k in ks}
    check.log(f"c = {costs.c:.3f}; v_K = {', '.join(f'{k}: {x:.2f}' for k, x in v.items())}")
    return {"context": costs.context, "target_forward_seconds": costs.target_forward,
            "draft_forward_seconds": costs.draft_forward, "c": costs.c, "verify_cost": v}


def decode_report(check, target, res, seconds, graphs, context_read) -> dict:
    """The autoregressive decode's rate and its share of the read bandwidth. context_read: the
    positions each step's attention reads (the length for a contiguous cache, the whole capacity
    for a static one)."""
    tps = decode_rate(res)
    per_token = bytes_per_token(target.cfg, context_read, target.dtype.itemsize)
    bandwidth = check.doc["environment"]["read_bandwidth_bytes_per_s"]
    check.log(f"AR {tps:.1f} tokens/s = {tps * per_token / bandwidth:.0%} of the read bandwidth")
    return {"tokens_per_second": tps, "bytes_per_token": per_token, "context_read": context_read,
            "fraction_of_bandwidth": tps * per_token / bandwidth, "window_seconds": seconds, "graphs": graphs}


def predicted(costs: dict, alphas) -> dict:
    return {f"{a:g}": {k: expected_speedup(a, k, costs["c"], v) for k, v in costs["verify_cost"].items()}
            for a in alphas}


def eager_steps(check, sec, target, draft, ids, p):
    device, n = target.device, p["new_tokens"]
    costs = check.step(sec, "costs", lambda: costs_report(check, measure_step_costs(
        target, draft, p["ks"], context=len(ids) + n // 2, reps=p["reps"]), p["ks"]))
    if costs:
        sec["predicted_speedup"] = predicted(costs, p["alphas"])

    def ar():
        autoregressive_generate(target, ids, max_new_tokens=8)  # warm-up
        res, seconds, graphs = window(device, lambda: autoregressive_generate(target, ids, max_new_tokens=n))
        sec["ar_tokens"] = res.tokens
        return decode_report(check, target, res, seconds, graphs, len(ids) + (n - 1) / 2)
    check.step(sec, "ar", ar)
    check.step(sec, "syncs", sync_table, target, draft, ids, min(n, 32), p["compiled_k"])
    check.step(sec, "batched_steps", lambda: batched_steps(target, draft, p["batch_sizes"], p["batch_ks"],
                                                           len(ids), p["reps"], p["alphas"]))
    check.step(sec, "tree_verify", lambda: tree_verify(target, p["tree_nodes"], len(ids), p["reps"]))


def compiled_steps(check, sec, target, draft, ids, p, eager_tokens, need):
    """Three graphs for the pair, compiled and recorded in `warm_up`; then the windows."""
    device, n, k = target.device, p["new_tokens"], p["compiled_k"]
    t = compiled_twin(target, rows=(1, k + 1), capacity=p["capacity"])
    d = compiled_twin(draft, rows=(1,), capacity=p["capacity"])
    engine = SpeculativeEngine(t, d, k=k, max_seq_len=p["capacity"])  # its caches: made once, for the run
    caches = {"target": engine.cache, "draft": engine.drafter.cache}

    def warm_up():
        before, t0 = graph_counts(), time.time()
        for _ in range(3):  # reduce-overhead records a CUDA graph at a shape's second or third call
            autoregressive_generate(t, ids, max_new_tokens=4, cache=engine.cache)  # target T = 1
            engine.generate(ids, max_new_tokens=3 * (k + 1))  # target T = K + 1, draft T = 1
        after = graph_counts()
        out = {"seconds": time.time() - t0, "graphs": after["graphs"] - before["graphs"],
               "cudagraph_skips": after["cudagraph_skips"] - before["cudagraph_skips"], "expected_graphs": 3}
        check.log(f"compiled {out['graphs']} graphs in {out['seconds']:.0f} s; CUDA graph skips {out['cudagraph_skips']}")
        return out
    if check.step(sec, "warm_up", warm_up, need=need) is None:
        return

    def tokens():
        res, seconds, graphs = window(device, lambda: autoregressive_generate(t, ids, max_new_tokens=n, cache=engine.cache))
        spec, _, spec_graphs = window(device, lambda: engine.generate(ids, max_new_tokens=n))
        out = {"ar_equal_to_eager": res.tokens == eager_tokens, "speculative_equal_to_eager": spec.tokens == eager_tokens,
               "graphs": graphs, "speculative_graphs": spec_graphs}
        for name, got in (("ar", res.tokens), ("speculative", spec.tokens)):
            if eager_tokens is not None and got != eager_tokens:
                out[f"{name}_first_difference"] = first_difference(target, ids, eager_tokens, got)
        return out
    check.step(sec, "tokens_vs_eager", tokens)

    def costs():
        out, seconds, graphs = window(device, lambda: costs_report(check, measure_step_costs(
            t, d, (k,), context=len(ids) + n // 2, reps=p["reps"], caches=caches), (k,)))
        return out | {"graphs": graphs, "cache_capacity": p["capacity"]}
    c = check.step(sec, "costs", costs)
    if c:
        sec["predicted_speedup"] = predicted(c, p["alphas"])

    def ar():
        res, seconds, graphs = window(device, lambda: autoregressive_generate(t, ids, max_new_tokens=n, cache=engine.cache))
        return decode_report(check, t, res, seconds, graphs, engine.cache.capacity)
    check.step(sec, "ar", ar)

    def speculative():
        res, seconds, graphs = window(device, lambda: engine.generate(ids, max_new_tokens=n))
        return {"tokens_per_second": decode_rate(res), "tokens_per_step": res.stats.mean_tokens_per_step,
                "graphs": graphs}
    check.step(sec, "speculative", speculative)

    def syncs():
        before = graph_counts()
        out = cuda_syncs_per_step(engine, ids, min(n, 32))
        return {"cuda": out, "engine_counted": engine.generate(ids, max_new_tokens=min(n, 32)).stats.syncs_per_step,
                "graphs_before": before["graphs"], "graphs_after": graph_counts()["graphs"]}
    check.step(sec, "syncs", syncs)


def synthetic(check, preset, device, dtype, p):
    tcfg, dcfg = TINY[preset] if preset in TINY else SYNTHETIC[preset]
    sec = check.part(f"synthetic_{preset}")
    sec.update(target_params=tcfg.num_params, draft_params=dcfg.num_params, dtype=str(dtype).replace("torch.", ""),
               tied=[tcfg.tie_embeddings, dcfg.tie_embeddings])
    check.log(f"{preset}: building random-weight models ({dtype}) on {device}")
    target, draft = random_model(tcfg, device, dtype, 0), random_model(dcfg, device, dtype, 1)
    ids = torch.randint(0, tcfg.vocab_size, (p["prompt_len"],), generator=torch.Generator().manual_seed(0)).tolist()
    eager = sec["eager"] = {}
    eager_steps(check, eager, target, draft, ids, p)
    compiled = sec["compiled"] = {}
    compiled_steps(check, compiled, target, draft, ids, p, eager.get("ar_tokens"), need=60)
    # The tree's compiled verification runs later (main): the real weights come first.
    return lambda: check.step(compiled, "tree_verify", lambda: tree_verify_compiled(
        target, p["tree_compiled"], len(ids), p["reps"]), need=90)


def shipped_draft(check, device, p):
    """Real weights the repository carries: the shipped draft through the real loader, as its own
    target in float32 and as its draft in bfloat16 (and in float32: a draft equal to the target)."""
    from ..io.pair import default_draft_dir
    from ..io.weights import load_model
    sec = check.part("shipped_draft")
    f32 = load_model(default_draft_dir(), device, torch.float32)[0]
    bf16 = load_model(default_draft_dir(), device, torch.bfloat16)[0]
    prompts = [torch.randint(0, f32.cfg.vocab_size, (24,), generator=torch.Generator().manual_seed(i)).tolist()
               for i in range(p["pair_prompts"])]
    n = p["pair_tokens"]

    def greedy():
        ar32 = [autoregressive_generate(f32, ids, max_new_tokens=n).tokens for ids in prompts]
        ar16 = [autoregressive_generate(bf16, ids, max_new_tokens=n).tokens for ids in prompts]
        spec = [SpeculativeEngine(f32, bf16, k=4).generate(ids, max_new_tokens=n) for ids in prompts]
        diffs = [first_difference(f32, ids, a, b) for ids, a, b in zip(prompts, ar32, ar16)]
        return {"speculative_equal_to_autoregressive": sum(s.tokens == a for s, a in zip(spec, ar32)) / len(ar32),
                "bf16_equal_to_float32": sum(a == b for a, b in zip(ar32, ar16)) / len(ar32),
                "bf16_first_differences": [x for x in diffs if x is not None],
                "tokens_per_step_bf16_draft": sum(s.stats.mean_tokens_per_step for s in spec) / len(spec),
                "ar_tokens": ar32}
    g = check.step(sec, "eager", greedy)

    def compiled():
        t = compiled_twin(f32, rows=(1, 5), capacity=p["capacity"])
        d = compiled_twin(bf16, rows=(1,), capacity=p["capacity"])
        engine = SpeculativeEngine(t, d, k=4, max_seq_len=p["capacity"])
        before = graph_counts()
        spec = [engine.generate(ids, max_new_tokens=n).tokens for ids in prompts]
        ar = [autoregressive_generate(t, ids, max_new_tokens=n, cache=engine.cache).tokens for ids in prompts]
        after = graph_counts()
        want = g["ar_tokens"] if g else ar
        return {"speculative_equal_to_eager_ar": sum(a == b for a, b in zip(spec, want)) / len(want),
                "ar_equal_to_eager_ar": sum(a == b for a, b in zip(ar, want)) / len(want),
                "graphs": after["graphs"] - before["graphs"],
                "cudagraph_skips": after["cudagraph_skips"] - before["cudagraph_skips"]}
    check.step(sec, "compiled", compiled, need=60)


def default_pair(check, device, p, smoke):
    from ..io.assets import cached_default_target
    sec = check.part("default_pair")
    if smoke:
        sec["skipped"] = "smoke mode"
        return check.save()
    if cached_default_target() is None:
        sec["skipped"] = "the default target is not on this machine (nothing is fetched here)"
        return check.save()
    from ..api import load_default_pair
    from ..core.text import encode_prompt
    from ..train.prompts import BENCH_PROMPTS
    pair = load_default_pair(device, dtype=torch.float32, accelerate=False)
    target, draft = pair.target, pair.draft
    prompts = [encode_prompt(target.tokenizer, q) for q in BENCH_PROMPTS[:p["pair_prompts"]]]
    n = p["pair_tokens"]

    def eager():
        ar = [autoregressive_generate(target, ids, max_new_tokens=n) for ids in prompts]
        out = {"ar_tokens_per_second": sum(map(decode_rate, ar)) / len(ar), "speculative": {}}
        for k in p["pair_ks"]:
            engine = SpeculativeEngine(target, draft, k=k)
            runs = [engine.generate(ids, max_new_tokens=n) for ids in prompts]
            tps = sum(map(decode_rate, runs)) / len(runs)
            out["speculative"][k] = {"tokens_per_second": tps, "vs_ar": tps / out["ar_tokens_per_second"],
                                     "greedy_equal": sum(r.tokens == a.tokens for r, a in zip(runs, ar)) / len(ar),
                                     "tokens_per_step": sum(r.stats.mean_tokens_per_step for r in runs) / len(runs)}
        return out
    check.step(sec, "eager", eager)


def gpu_tests(p) -> dict:
    """tests/test_gpu.py in a process of its own, under its own timeout (it needs only pytest)."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_gpu.py"]
    try:
        run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=p["tests_timeout"])
    except subprocess.TimeoutExpired as e:
        return {"error": f"timed out after {p['tests_timeout']} s", "tail": (e.stdout or b"")[-2000:]}
    tail = run.stdout.strip().splitlines()[-1:] or [run.stderr.strip()[-500:]]
    out = {"returncode": run.returncode, "summary": tail[0]}
    if run.returncode not in (0, 5):  # 5: nothing collected
        out["error"] = run.stdout[-3000:]
    return out


def environment(device) -> dict:
    env = {"python": platform.python_version(), "torch": torch.__version__, "device": str(device)}
    if device.type == "cuda":
        env.update(device_name=torch.cuda.get_device_name(device), cuda=torch.version.cuda)
    env["read_bandwidth_bytes_per_s"] = BandwidthProbe(device, reps=5)()
    return env


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m specdec_lab.bench.gpu_check", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="tiny stand-ins on whatever device there is (CI runs this)")
    ap.add_argument("--device", help="default: cuda where available, else cpu")
    ap.add_argument("--out", default="gpu_check.json")
    ap.add_argument("--log", default="gpu_check.log")
    ap.add_argument("--budget", type=float, default=480.0, help="seconds for the whole run (default 480)")
    args = ap.parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type != "cuda" and not args.smoke:
        raise SystemExit(f"the full check needs CUDA; device {device} is not (use --smoke for tiny shapes)")
    p = SMOKE if args.smoke else FULL
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    check = Check(args.out, args.log, args.budget)
    check.doc["mode"] = "smoke" if args.smoke else "full"
    check.step(check.doc, "environment", environment, device)
    check.step(check.doc, "gpu_tests", gpu_tests, p)
    first, *rest = p["presets"]
    with torch.inference_mode(False):
        tree_compiled = synthetic(check, first, device, dtype, p)
        shipped_draft(check, device, p)
        default_pair(check, device, p, args.smoke)
        tree_compiled()
        del tree_compiled  # and with it the first preset's models
        for preset in rest:
            if check.time_left() < 90:
                check.doc[f"synthetic_{preset}"] = {"skipped": "time budget"}
                check.save()
                continue
            torch.compiler.reset()  # the last preset's graphs are not needed again
            synthetic(check, preset, device, dtype, p)()
    errors = check.errors()
    check.log(f"done; steps with errors: {errors or 'none'}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
