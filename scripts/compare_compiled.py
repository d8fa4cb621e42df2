"""The default pair on the CPU two ways, side by side: the CPU fast path (load_pair's default:
cpu.accelerated twins) and static shapes with torch.compile (load_pair(..., compile=True)).
Greedy, on the benchmark prompts, prompt by prompt in turn, so that both see the same machine:
  - whether each way's greedy output equals the other's (and the autoregressive decode's);
  - tokens/s of the autoregressive decode and of speculative decoding at K for each way.

    python scripts/compare_compiled.py --prompts 24 --max-new-tokens 64 --k 4 --out docs/compare_compiled.json
"""
import argparse
import json
import time

import torch

from specdec_lab.api import SpeculativeEngine, autoregressive_generate, load_default_pair
from specdec_lab.core.text import encode_prompt
from specdec_lab.train.prompts import BENCH_PROMPTS


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=24)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--out")
    args = ap.parse_args()
    torch.set_num_threads(1)
    ways = {"fast": load_default_pair(), "compiled": load_default_pair(compile=True)}
    prompts = [encode_prompt(ways["fast"].tokenizer, p) for p in BENCH_PROMPTS[:args.prompts]]
    engines = {w: SpeculativeEngine(p.target, p.draft, k=args.k) for w, p in ways.items()}
    t0 = time.time()
    for w, p in ways.items():  # warm-up; the compiled way compiles its graphs here
        autoregressive_generate(p.target, prompts[0], max_new_tokens=8)
        engines[w].generate(prompts[0], max_new_tokens=8)
    print(f"warm-up (compiling included): {time.time() - t0:.0f} s", flush=True)
    runs = {f"{w}_{kind}": {"tokens": 0, "seconds": 0.0, "outputs": []} for w in ways for kind in ("ar", "spec")}
    for i, ids in enumerate(prompts):
        for w, p in ways.items():
            for kind, run in (("ar", lambda: autoregressive_generate(p.target, ids, max_new_tokens=args.max_new_tokens)),
                              ("spec", lambda: engines[w].generate(ids, max_new_tokens=args.max_new_tokens))):
                res = run()
                r = runs[f"{w}_{kind}"]
                r["tokens"] += len(res.tokens)
                r["seconds"] += res.stats.seconds
                r["outputs"].append(res.tokens)
        print(f"prompt {i + 1}/{len(prompts)}", flush=True)
    ref = runs["fast_ar"]["outputs"]
    doc = {"prompts": len(prompts), "max_new_tokens": args.max_new_tokens, "k": args.k, "threads": 1,
           "tokens_per_second": {n: r["tokens"] / r["seconds"] for n, r in runs.items()},
           "same_output_as_fast_ar": {n: sum(a == b for a, b in zip(r["outputs"], ref)) / len(ref)
                                      for n, r in runs.items()}}
    tps = doc["tokens_per_second"]
    doc["compiled_over_fast"] = {"ar": tps["compiled_ar"] / tps["fast_ar"], "spec": tps["compiled_spec"] / tps["fast_spec"]}
    doc["spec_over_ar"] = {"fast": tps["fast_spec"] / tps["fast_ar"], "compiled": tps["compiled_spec"] / tps["compiled_ar"]}
    print(json.dumps(doc, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
