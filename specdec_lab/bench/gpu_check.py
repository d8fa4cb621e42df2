"""The prepared GPU check (scripts/gpu_check.sh): everything the engine claims on a GPU, measured
in one run that writes one JSON document and one log.

    python -m specdec_lab.bench.gpu_check --out gpu_check.json --log gpu_check.log
    python -m specdec_lab.bench.gpu_check --smoke ...   # tiny shapes on the CPU: CI runs this

Sections, each written to the JSON as soon as it is done (a run cut short keeps what it had),
each caught on its own (one failure does not hide the rest):
  environment  torch, the device, the measured HBM read bandwidth;
  synthetic    random-weight models of real shapes in bfloat16 (Llama-3.1-8B with a
               Llama-3.2-1B-shaped draft; SmolLM2-1.7B with a 135M-shaped draft), eager and
               compiled: the autoregressive decode's share of the bandwidth, c and v_K, host syncs
               per step (CUDA's own count and the engine's) for the contiguous cache, the paged
               cache, prompt lookup, the early stop and sampling, and Theorem 3.8's speedup at the
               measured c and v_K for alpha 0.6, 0.7 and 0.8;
  default_pair the default pair's real weights in float32: greedy speculative output equal to the
               autoregressive one, and speculative over autoregressive tokens/s at each K, eager
               and compiled, with alpha and c.
Compiling costs minutes on large models; `--budget` seconds bound the whole run, and a part that
would start after it is recorded as skipped.
"""
import argparse
import json
import platform
import sys
import time
import traceback

import torch

from ..analysis.roofline import bytes_per_token, expected_speedup
from ..analysis.syncs import count_cuda_syncs, count_host_syncs
from ..analysis.timing import BandwidthProbe
from ..api import LookupThenModelDrafter, SpeculativeEngine, autoregressive_generate, compiled_twin
from ..core.config import ModelConfig
from ..core.kv_cache import KVCache
from ..drafters import ModelDrafter
from ..train.acceptance import measure_step_costs
from .gpu import SYNTHETIC, random_model
from .run import teacher_forced_alpha

TINY = (ModelConfig(vocab_size=512, dim=128, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=32, intermediate_size=256,
                    max_seq_len=512, eos_token_ids=()),
        ModelConfig(vocab_size=512, dim=64, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=32, intermediate_size=128,
                    max_seq_len=512, eos_token_ids=()))

FULL = dict(presets=("llama3-8b", "smollm2-1.7b"), ks=tuple(range(1, 9)), compiled_ks=(4,), prompt_len=128,
            new_tokens=128, reps=20, pair_prompts=8, pair_tokens=64, pair_ks=tuple(range(1, 9)),
            pair_compiled_ks=(2, 4), alphas=(0.6, 0.7, 0.8))
SMOKE = dict(presets=("tiny",), ks=(1, 2), compiled_ks=(2,), prompt_len=16, new_tokens=16, reps=3, pair_prompts=2,
             pair_tokens=12, pair_ks=(1, 2), pair_compiled_ks=(2,), alphas=(0.6, 0.7, 0.8))


class Check:
    """The JSON document, the log and the time budget of one run."""

    def __init__(self, out, log, budget):
        self.out, self.log_file, self.deadline, self.doc = out, open(log, "w"), time.time() + budget, {}

    def log(self, text):
        line = f"[{time.strftime('%H:%M:%S')}] {text}"
        print(line, flush=True)
        self.log_file.write(line + "\n")
        self.log_file.flush()

    def time_left(self) -> float:
        return self.deadline - time.time()

    def section(self, name, fn, *args):
        """Run fn(*args) and store its result under `name`; an error is stored, logged and passed."""
        self.log(f"--- {name}")
        t0 = time.time()
        try:
            self.doc[name] = fn(*args)
        except Exception as e:  # noqa: BLE001: the check goes on to its other sections
            self.log(traceback.format_exc())
            self.doc[name] = {"error": f"{type(e).__name__}: {e}"}
        self.doc.setdefault("seconds", {})[name] = time.time() - t0
        self.save()

    def save(self):
        with open(self.out, "w") as f:
            json.dump(self.doc, f, indent=1)


def environment(device) -> dict:
    env = {"python": platform.python_version(), "torch": torch.__version__, "device": str(device)}
    if device.type == "cuda":
        env.update(device_name=torch.cuda.get_device_name(device), cuda=torch.version.cuda)
    env["read_bandwidth_bytes_per_s"] = BandwidthProbe(device, reps=5)()
    return env


def ar_cache(model):
    """One cache for every autoregressive run of a model: a compiled model then sees one shape."""
    return KVCache.for_model(model.cfg, min(2048, model.cfg.max_seq_len), dtype=model.dtype, device=model.device,
                             static=model.static_shapes)


def timed_generate(run):
    """(tokens, decode seconds) of one generation: the engine's own clock, which excludes the prompt."""
    res = run()
    return len(res.tokens), res.stats.seconds, res


def syncs_per_step(engine, ids, new_tokens, **kw) -> dict:
    """Host syncs per step as the engine counts them, as the external counter sees them (per step,
    after the first, which also holds the prompt's copies) and as CUDA reports them (None on the CPU)."""
    engine.generate(ids, max_new_tokens=4, **kw)  # warm-up
    seen = []
    with count_host_syncs() as counter:
        res = engine.generate(ids, max_new_tokens=new_tokens, on_step=lambda rec, out: seen.append(counter.count), **kw)
    per_step = [b - a for a, b in zip(seen, seen[1:])]
    res2, n = count_cuda_syncs(lambda: engine.generate(ids, max_new_tokens=new_tokens, **kw))
    return {"steps": res.stats.steps, "engine_counted": res.stats.syncs_per_step,
            "counted_per_step_max": max(per_step, default=None),
            "counted_per_step_mean": sum(per_step) / len(per_step) if per_step else None,
            "cuda_reported_per_step": None if n is None else n / max(res2.stats.steps, 1)}


def sync_table(target, draft, ids, new_tokens, k=4) -> dict:
    cap = len(ids) + new_tokens + 32
    return {
        "contiguous_greedy": syncs_per_step(SpeculativeEngine(target, draft, k=k), ids, new_tokens),
        "contiguous_sampling": syncs_per_step(SpeculativeEngine(target, draft, k=k), ids, new_tokens,
                                              temperature=1.0, seed=0),
        "paged_greedy": syncs_per_step(SpeculativeEngine(target, draft, k=k, cache="paged"), ids, new_tokens),
        "lookup_greedy": syncs_per_step(SpeculativeEngine(target, LookupThenModelDrafter(draft, cap), k=k),
                                        ids, new_tokens),
        "stop_below_greedy": syncs_per_step(SpeculativeEngine(target, ModelDrafter(draft, cap, stop_below=0.5), k=k),
                                            ids, new_tokens),
    }


def variant(check, target, draft, ids, p, label) -> dict:
    """c, v_K, the autoregressive decode's bandwidth share and the predicted speedups of one pair."""
    ks = p["ks"] if label == "eager" else p["compiled_ks"]
    check.log(f"{label}: step costs at K = {list(ks)}")
    costs = measure_step_costs(target, draft, ks, context=len(ids) + p["new_tokens"] // 2, reps=p["reps"])
    cache = ar_cache(target)
    autoregressive_generate(target, ids, max_new_tokens=8, cache=cache)  # warm-up (and compiles)
    n, seconds, _ = timed_generate(lambda: autoregressive_generate(target, ids, max_new_tokens=p["new_tokens"],
                                                                   cache=cache))
    tps = n / seconds
    per_token = bytes_per_token(target.cfg, len(ids) + (n - 1) / 2, target.dtype.itemsize)
    bandwidth = check.doc["environment"]["read_bandwidth_bytes_per_s"]
    v = {k: costs.verify_cost(k) for k in ks}
    check.log(f"{label}: AR {tps:.1f} tokens/s = {tps * per_token / bandwidth:.0%} of the read bandwidth; "
              f"c = {costs.c:.3f}; v_K = {', '.join(f'{k}: {x:.2f}' for k, x in v.items())}")
    return {"ar_tokens_per_second": tps, "bytes_per_token": per_token,
            "ar_fraction_of_bandwidth": tps * per_token / bandwidth,
            "target_forward_seconds": costs.target_forward, "draft_forward_seconds": costs.draft_forward,
            "c": costs.c, "verify_cost": v,
            "predicted_speedup": {f"{a:g}": {k: expected_speedup(a, k, costs.c, v[k]) for k in ks} for a in p["alphas"]}}


def synthetic(check, preset, device, dtype, p) -> dict:
    tcfg, dcfg = TINY if preset == "tiny" else SYNTHETIC[preset]
    check.log(f"{preset}: building random-weight models ({dtype}) on {device}")
    target, draft = random_model(tcfg, device, dtype, 0), random_model(dcfg, device, dtype, 1)
    ids = torch.randint(0, tcfg.vocab_size, (p["prompt_len"],), generator=torch.Generator().manual_seed(0)).tolist()
    out = {"target_params": tcfg.num_params, "draft_params": dcfg.num_params, "dtype": str(dtype).replace("torch.", "")}
    out["eager"] = variant(check, target, draft, ids, p, "eager")
    check.log(f"{preset}: host syncs per step")
    out["syncs"] = sync_table(target, draft, ids, min(p["new_tokens"], 32))
    check.save()
    if check.time_left() < 60:
        out["compiled"] = {"skipped": "time budget"}
        return out
    torch.compiler.reset()  # each section compiles its own graphs
    t, d = compiled_twin(target), compiled_twin(draft)
    out["compiled"] = variant(check, t, d, ids, p, "compiled")
    out["compiled"]["syncs"] = {"contiguous_greedy": syncs_per_step(SpeculativeEngine(t, d, k=p["compiled_ks"][0]),
                                                                    ids, min(p["new_tokens"], 32))}
    return out


def speed_at_ks(target, draft, prompts, new_tokens, ks) -> dict:
    """Speculative over autoregressive tokens/s at each K, the same prompts, warmed up first."""
    def rate(run):
        tokens = seconds = 0
        for ids in prompts:
            n, s, _ = timed_generate(lambda: run(ids))
            tokens, seconds = tokens + n, seconds + s
        return tokens / seconds
    cache = ar_cache(target)
    autoregressive_generate(target, prompts[0], max_new_tokens=8, cache=cache)
    ar = rate(lambda ids: autoregressive_generate(target, ids, max_new_tokens=new_tokens, cache=cache))
    out = {"ar_tokens_per_second": ar, "speculative": {}}
    for k in ks:
        engine = SpeculativeEngine(target, draft, k=k)
        engine.generate(prompts[0], max_new_tokens=8)  # warm-up (and compiles)
        tps = rate(lambda ids: engine.generate(ids, max_new_tokens=new_tokens))
        out["speculative"][k] = {"tokens_per_second": tps, "vs_ar": tps / ar}
    return out


def default_pair(check, device, p, smoke) -> dict:
    if smoke:  # tiny random stand-ins: the same code, no weights
        target, draft = random_model(TINY[0], device, torch.float32, 0), random_model(TINY[1], device, torch.float32, 1)
        prompts = [torch.randint(0, 512, (12,), generator=torch.Generator().manual_seed(i)).tolist()
                   for i in range(p["pair_prompts"])]
    else:
        from ..api import load_default_pair
        from ..core.text import encode_prompt
        from ..train.prompts import BENCH_PROMPTS
        pair = load_default_pair(device, dtype=torch.float32, accelerate=False)
        target, draft = pair.target, pair.draft
        prompts = [encode_prompt(target.tokenizer, q) for q in BENCH_PROMPTS[:p["pair_prompts"]]]
    n = p["pair_tokens"]
    ar = [autoregressive_generate(target, ids, max_new_tokens=n).tokens for ids in prompts]
    spec = [SpeculativeEngine(target, draft, k=4).generate(ids, max_new_tokens=n).tokens for ids in prompts]
    alpha, positions = teacher_forced_alpha(target, draft, list(zip(prompts, ar)), 0.0)
    costs = measure_step_costs(target, draft, (), context=len(prompts[0]) + n // 2, reps=p["reps"])
    out = {"dtype": "float32", "prompts": len(prompts), "new_tokens": n,
           "greedy_equal_to_autoregressive": sum(a == b for a, b in zip(ar, spec)) / len(ar),
           "alpha": alpha, "alpha_positions": positions, "c": costs.c}
    check.log(f"default pair: greedy equal {out['greedy_equal_to_autoregressive']:.0%}, alpha {alpha:.3f}, c {costs.c:.3f}")
    out["eager"] = speed_at_ks(target, draft, prompts, n, p["pair_ks"])
    check.log("eager: " + ", ".join(f"K={k} {v['vs_ar']:.2f}x" for k, v in out["eager"]["speculative"].items()))
    check.save()
    if check.time_left() < 60:
        out["compiled"] = {"skipped": "time budget"}
        return out
    torch.compiler.reset()
    t, d = compiled_twin(target), compiled_twin(draft)
    out["compiled"] = speed_at_ks(t, d, prompts, n, p["pair_compiled_ks"])
    out["compiled"]["c"] = measure_step_costs(t, d, (), context=len(prompts[0]) + n // 2, reps=p["reps"]).c
    check.log("compiled: " + ", ".join(f"K={k} {v['vs_ar']:.2f}x" for k, v in out["compiled"]["speculative"].items()))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m specdec_lab.bench.gpu_check", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on whatever device there is (CI runs this)")
    ap.add_argument("--device", help="default: cuda where available, else cpu")
    ap.add_argument("--out", default="gpu_check.json")
    ap.add_argument("--log", default="gpu_check.log")
    ap.add_argument("--budget", type=float, default=420.0, help="seconds for the whole run (default 420)")
    args = ap.parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type != "cuda" and not args.smoke:
        raise SystemExit(f"the full check needs CUDA; device {device} is not (use --smoke for tiny shapes)")
    p = SMOKE if args.smoke else FULL
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    check = Check(args.out, args.log, args.budget)
    check.doc["mode"] = "smoke" if args.smoke else "full"
    check.section("environment", environment, device)
    # In order of what the check must show: the large pair, the default pair, then the second preset.
    first, *rest = p["presets"]
    check.section(f"synthetic_{first}", synthetic, check, first, device, dtype, p)
    check.section("default_pair", default_pair, check, device, p, args.smoke)
    for preset in rest:
        if check.time_left() < 60:
            check.doc[f"synthetic_{preset}"] = {"skipped": "time budget"}
            continue
        check.section(f"synthetic_{preset}", synthetic, check, preset, device, dtype, p)
    errors = [name for name, v in check.doc.items() if isinstance(v, dict) and "error" in v]
    check.log(f"done; sections with errors: {errors or 'none'}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
