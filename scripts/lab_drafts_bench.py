"""The lab's drafts side by side in one sitting: plain decoding, the shipped token draft at K = 2, the
feature draft at K = 3 and the EAGLE-3 draft at K = 2 and K = 3, each over the lab's plain decode
(docs/benchmarks.md, sections 36 and 44).

    OMP_NUM_THREADS=1 python scripts/lab_drafts_bench.py [--prompts 24] [--max-new-tokens 64] [--passes 3]
                                                          [--out docs/three_drafts.json]

The 24 benchmark prompts in the chat template, greedy, one thread. Each pass times every call whole
(prefill included), prompt by prompt with the systems' order rotating, after one warm-up call each.
Stored per system, over all passes: S, the ratio of tokens/s over the plain decode's with a 95% paired
bootstrap interval over the prompts; S_loop, the same for the decode loops alone; each pass's S, for the
noise between passes; tokens per step; the share of steps whose drafted token i was accepted; c, a
drafted token's seconds over a plain-decode token's; target/step, a verification's seconds in plain
tokens; and how many answers equal the plain decode's. The CPU, the commit and the date go in too.

An earlier version (section 36, docs/lab_drafts.json) ran three of these systems, one pass, and stored
neither c, the CPU nor the date.
"""
import argparse
import json
import time
from datetime import datetime, timezone

import torch

import specdec_lab as sl
from specdec_lab.api import SpeculativeEngine, load_eagle3_draft, load_feature_draft
from specdec_lab.bench.machine import cpu_name
from specdec_lab.bench.record import commit
from specdec_lab.bench.run import ratio_interval
from specdec_lab.core.engine import autoregressive_generate
from specdec_lab.core.text import encode_prompt
from specdec_lab.train.prompts import BENCH_PROMPTS

FIELDS = ("tokens", "seconds", "loop_seconds", "draft_seconds", "target_seconds", "drafted", "steps", "drafts")


def timed(run, x):
    """One whole call: its result and its wall seconds."""
    t0 = time.perf_counter()
    result = run(x)
    return result, time.perf_counter() - t0


def tally(result, seconds) -> dict:
    s = result.stats
    return {"tokens": len(result.tokens), "seconds": seconds, "loop_seconds": s.seconds,
            "draft_seconds": s.draft_seconds, "target_seconds": s.target_seconds, "drafted": s.drafted,
            "steps": s.steps, "drafts": s.drafts, "accepted_per_position": list(s.accepted_per_position)}


def summary(runs: dict, name: str, passes: int) -> dict:
    """One system's figures over every pass, against the plain decode's on the same prompts."""
    mine, base = runs[name], runs["autoregressive"]
    per_prompt = {f: [sum(c[f] for c in calls) for calls in mine["calls"]] for f in FIELDS}
    base_pp = {f: [sum(c[f] for c in calls) for calls in base["calls"]] for f in FIELDS}
    tot, btot = {f: sum(v) for f, v in per_prompt.items()}, {f: sum(v) for f, v in base_pp.items()}
    plain_token = btot["loop_seconds"] / btot["tokens"]  # seconds per plain-decode token, prefill excluded
    ratio = (tot["tokens"] / tot["seconds"]) / (btot["tokens"] / btot["seconds"])
    interval = ratio_interval(per_prompt["tokens"], per_prompt["seconds"], base_pp["tokens"], base_pp["seconds"])
    by_pass = []
    for p in range(passes):
        t, b = [calls[p] for calls in mine["calls"]], [calls[p] for calls in base["calls"]]
        by_pass.append(round((sum(c["tokens"] for c in t) / sum(c["seconds"] for c in t))
                             / (sum(c["tokens"] for c in b) / sum(c["seconds"] for c in b)), 3))
    positions = [0] * max((len(c["accepted_per_position"]) for calls in mine["calls"] for c in calls), default=0)
    for calls in mine["calls"]:
        for c in calls:
            for i, n in enumerate(c["accepted_per_position"]):
                positions[i] += n
    out = {"k": mine["k"], "over_autoregressive": round(ratio, 3),
           "interval": [round(v, 3) for v in (interval or (ratio, ratio))], "by_pass": by_pass,
           "loop_over_autoregressive": round((tot["tokens"] / tot["loop_seconds"]) / (1 / plain_token), 3),
           "tokens_per_step": round(tot["tokens"] / tot["steps"], 3),
           "same_as_autoregressive": sum(a == b for a, b in zip(mine["answers"], base["answers"]))}
    if tot["drafted"]:
        out.update({"accepted_by_position": [round(n / tot["drafts"], 3) for n in positions],
                    "c": round(tot["draft_seconds"] / tot["drafted"] / plain_token, 4),
                    "target_per_step": round(tot["target_seconds"] / tot["steps"] / plain_token, 3),
                    "drafted_per_step": round(tot["drafted"] / tot["steps"], 3)})
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=24)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--out", default="docs/three_drafts.json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    pair = sl.load_default_pair()
    feature, eagle3 = load_feature_draft(pair.target), load_eagle3_draft(pair.target)
    n = args.max_new_tokens
    drafts = {"token": (pair.draft, 2), "feature": (feature, 3), "eagle3 K=2": (eagle3, 2), "eagle3": (eagle3, 3)}
    systems = {"autoregressive": (lambda x: autoregressive_generate(pair.target, x, max_new_tokens=n), 0)}
    for name, (draft, k) in drafts.items():
        engine = SpeculativeEngine(pair.target, draft, k=k, max_seq_len=1024)
        systems[name] = ((lambda e: lambda x: e.generate(x, max_new_tokens=n))(engine), k)
    ids = [encode_prompt(pair.tokenizer, p) for p in BENCH_PROMPTS[:args.prompts]]
    for run, _ in systems.values():
        run(ids[0])  # warm-up: panels, buffers
    names = list(systems)
    runs = {name: {"k": k, "calls": [[] for _ in ids], "answers": []} for name, (_, k) in systems.items()}
    started = time.perf_counter()
    for p in range(args.passes):
        for i, x in enumerate(ids):
            turn = (i + p) % len(names)
            for name in names[turn:] + names[:turn]:
                result, seconds = timed(systems[name][0], x)
                runs[name]["calls"][i].append(tally(result, seconds))
                if p == 0:
                    runs[name]["answers"].append(result.tokens)
            print(f"pass {p + 1}/{args.passes}, prompt {i + 1}/{len(ids)} "
                  f"({time.perf_counter() - started:.0f} s)", flush=True)
    doc = {"measured_at": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "commit": commit(),
           "cpu": cpu_name(), "threads": 1, "forward_kind": pair.target.forward_kind, "prompts": len(ids),
           "max_new_tokens": n, "passes": args.passes,
           "systems": {name: summary(runs, name, args.passes) for name in names}}
    for name, s in doc["systems"].items():
        print(f"{name:15s} S {s['over_autoregressive']:.3f}x ({s['interval'][0]:.3f}-{s['interval'][1]:.3f}), "
              f"by pass {s['by_pass']}, S_loop {s['loop_over_autoregressive']:.3f}x, "
              f"{s['tokens_per_step']:.2f} tokens/step, c {s.get('c', 0):.3f}, "
              f"target/step {s.get('target_per_step', 1):.2f}, {s['same_as_autoregressive']}/{len(ids)} equal")
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
