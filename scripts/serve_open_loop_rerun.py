"""The serving bench's open loop again, with a latency per request (docs/benchmarks.md, section 24).

    OMP_NUM_THREADS=1 python scripts/serve_open_loop_rerun.py [--rate 0.5] [--runs 3] [--out docs/serve_open_loop_rerun.json]

`bench --serve` keeps one open-loop run per rate and, for it, the median and the slowest of 12
requests. This reruns that loop as the bench does it (the default pair, one thread, the bench's
step costs for the goodput policy, 12 seeded Poisson arrivals of the first bench prompts, 32
tokens, at most 8 at once), plain batched decoding and the goodput policy in turn, `--runs`
times, and stores every request's latency and mean K, so that a slow request can be told from a
slow run.
"""
import argparse
import json
import statistics
from pathlib import Path

import torch

import specdec_lab as sl
from specdec_lab.bench.serve import ServeBenchConfig, open_loop
from specdec_lab.core.text import encode_prompt
from specdec_lab.serve import BatchEngine, GoodputPolicy, Server, measure_step_costs
from specdec_lab.train.prompts import BENCH_PROMPTS


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rate", type=float, default=0.5, help="requests per second (default %(default)s)")
    p.add_argument("--runs", type=int, default=3, help="runs of each system, alternating (default %(default)s)")
    p.add_argument("--out", default="docs/serve_open_loop_rerun.json", help="where to store the document")
    args = p.parse_args()
    torch.set_num_threads(1)
    cfg = ServeBenchConfig()
    pair = sl.load_default_pair()
    prompts = [encode_prompt(pair.target.tokenizer, text) for text in BENCH_PROMPTS]
    engine = BatchEngine(pair.target, pair.draft, num_blocks=max(cfg.batch_sizes) * 8, max_seq_len=1024)
    costs = measure_step_costs(engine, cfg.batch_sizes, cfg.cost_ks, context=cfg.context, reps=cfg.cost_reps,
                               seed=cfg.seed)
    servers = {"plain": lambda: Server(pair.target, None, max_batch=cfg.open_max_batch, k=0, max_seq_len=1024),
               "goodput": lambda: Server(pair.target, pair.draft, max_batch=cfg.open_max_batch,
                                         k=GoodputPolicy(costs, k_max=cfg.k), max_seq_len=1024)}
    runs = {name: [] for name in servers}
    for i in range(args.runs):
        for name, make in servers.items():
            r = open_loop(make(), prompts, args.rate, cfg.open_requests, cfg.max_new_tokens, cfg.seed)
            runs[name].append({"latency_p50": r["latency_p50"], "slowest": r["latency_p99"],
                               "latencies": r["latencies"], "mean_k": r["mean_k"]})
            print(f"run {i + 1}, {name:8s}: median {r['latency_p50']:.2f} s, slowest {r['latency_p99']:.2f} s")
    doc = {"command": f"python scripts/serve_open_loop_rerun.py --rate {args.rate:g} --runs {args.runs}",
           "config": {"rate": args.rate, "requests": cfg.open_requests, "max_new_tokens": cfg.max_new_tokens,
                      "max_batch": cfg.open_max_batch, "k_max": cfg.k, "seed": cfg.seed, "threads": 1},
           "runs": runs,
           "median_of_medians": {name: statistics.median(r["latency_p50"] for r in rs) for name, rs in runs.items()}}
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(f"stored {args.out}")


if __name__ == "__main__":
    main()
