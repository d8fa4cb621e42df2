"""The lab's three decodes of section 32, side by side again: plain, the shipped draft at K = 2 and the
EAGLE-3 draft at K = 3, each over the lab's plain decode (docs/benchmarks.md, section 36).

    OMP_NUM_THREADS=1 python scripts/lab_drafts_bench.py [--prompts 24] [--max-new-tokens 64] [--out docs/lab_drafts.json]

The 24 benchmark prompts in the chat template, greedy, one thread, calls timed whole (prefill included),
prompt by prompt with the systems' order rotating, after one warm-up call each; ratios of tokens/s
over the plain decode with 95% paired bootstrap intervals over the prompts, and how many answers
equal the plain decode's. Section 32 ran the same three inside `bench --peer`, where EAGLE-3's target
still took the eager forward for its layer states.
"""
import argparse
import json
import time

import torch

import specdec_lab as sl
from specdec_lab.api import SpeculativeEngine, load_eagle3_draft
from specdec_lab.bench.run import ratio_interval
from specdec_lab.core.engine import autoregressive_generate
from specdec_lab.core.text import encode_prompt
from specdec_lab.train.prompts import BENCH_PROMPTS


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=24)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--out", default="docs/lab_drafts.json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    pair = sl.load_default_pair()
    n = args.max_new_tokens
    engines = {"shipped draft, K = 2": SpeculativeEngine(pair.target, pair.draft, k=2, max_seq_len=1024),
               "EAGLE-3 draft, K = 3": SpeculativeEngine(pair.target, load_eagle3_draft(pair.target), k=3,
                                                         max_seq_len=1024)}
    systems = {"autoregressive": lambda x: autoregressive_generate(pair.target, x, max_new_tokens=n)}
    systems.update({name: (lambda e: lambda x: e.generate(x, max_new_tokens=n))(e) for name, e in engines.items()})
    ids = [encode_prompt(pair.tokenizer, p) for p in BENCH_PROMPTS[:args.prompts]]
    for run in systems.values():
        run(ids[0])  # warm-up: panels, buffers
    names = list(systems)
    runs = {name: {"tokens": [], "seconds": [], "answers": [], "steps": 0} for name in names}
    for i, x in enumerate(ids):
        for name in names[i % len(names):] + names[:i % len(names)]:
            t0 = time.perf_counter()
            result = systems[name](x)
            seconds = time.perf_counter() - t0
            r = runs[name]
            r["tokens"].append(len(result.tokens))
            r["seconds"].append(seconds)
            r["answers"].append(result.tokens)
            r["steps"] += len(result.steps) if result.steps else len(result.tokens)
        print(f"prompt {i + 1}/{len(ids)}", flush=True)
    base = runs["autoregressive"]
    doc = {"prompts": len(ids), "max_new_tokens": n, "threads": 1, "forward_kind": pair.target.forward_kind,
           "systems": {}}
    for name in names:
        r = runs[name]
        ratio = (sum(r["tokens"]) / sum(r["seconds"])) / (sum(base["tokens"]) / sum(base["seconds"]))
        interval = ratio_interval(r["tokens"], r["seconds"], base["tokens"], base["seconds"]) or (ratio, ratio)
        doc["systems"][name] = {"over_autoregressive": round(ratio, 3), "interval": [round(v, 3) for v in interval],
                                "tokens_per_step": round(sum(r["tokens"]) / r["steps"], 2),
                                "same_as_autoregressive": sum(a == b for a, b in zip(r["answers"], base["answers"]))}
        print(f"{name:24s} {ratio:.3f}x ({interval[0]:.3f}-{interval[1]:.3f})  "
              f"{doc['systems'][name]['tokens_per_step']:.2f} tokens/step  "
              f"{doc['systems'][name]['same_as_autoregressive']}/{len(ids)} answers equal")
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
