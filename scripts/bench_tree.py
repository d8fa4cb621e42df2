"""Token trees against the chain, side by side in one run on the default pair (docs/benchmarks.md).

    OMP_NUM_THREADS=1 python scripts/bench_tree.py [--prompts 8] [--max-new-tokens 64] [--out docs/tree_vs_chain.json]

Systems, all with the shipped draft and one torch thread: the chain engine (K=2, 3 and 4, the CPU's
fused verification), the same chain through the tree engine ((1, 1, 1, 1): the tree's masked, eager
verification), a static tree (4, 2, 1) (top children, and at 0.7 also children drawn without replacement with
Sequoia's rule), a dynamic tree (EAGLE-2, depth 4, top 4, 12 nodes), and
tree="auto" (its shape chosen at the start from acceptance and costs measured here). Each runs every
hand-written held-out prompt at temperature 0 and 0.7, prompt by prompt in rotating order after a
warm-up. Reported per system: tokens per step, tokens/s over whole calls, and the ratio of tokens/s
to the chain's with a paired bootstrap interval over the prompts. A table, then one JSON document.
"""
import argparse
import json
import random
import time
from pathlib import Path

import torch

import specdec_lab as sl
from specdec_lab.lab.static_figures import png
from specdec_lab.train.handwritten import HANDWRITTEN_PROMPTS
from specdec_lab.tree.draft import DynamicTree
from specdec_lab.tree.engine import TreeEngine

AUTO_PROMPTS = ["Explain how a bicycle stays upright.", "Write a short poem about the sea.",
                "What are the main causes of inflation?", "Give me three tips for learning to cook."]


def bootstrap_ratio(a, b, reps=2000, seed=0):
    """Mean of a / mean of b, with a 95% paired bootstrap interval over the prompts."""
    rng = random.Random(seed)
    n, ratios = len(a), []
    for _ in range(reps):
        idx = [rng.randrange(n) for _ in range(n)]
        ratios.append(sum(a[i] for i in idx) / sum(b[i] for i in idx))
    ratios.sort()
    return sum(a) / sum(b), ratios[int(0.025 * reps)], ratios[int(0.975 * reps)]


def figure(doc, names):
    """Tokens per step and tokens/s against the chain K = 4 by system and temperature, and the forward
    costs by row count that tree='auto' measured."""
    from plotly.subplots import make_subplots
    import plotly.graph_objects as go
    fig = make_subplots(rows=1, cols=3, subplot_titles=("tokens per step", "tokens/s vs chain K=4",
                                                        "forward cost by rows (ms)"))
    for (t, result), colour in zip(doc["results"].items(), ("#636efa", "#00cc96", "#ab63fa")):
        table = result["table"]
        names_t = [n for n in names if n in table]
        fig.add_trace(go.Bar(x=names_t, y=[table[n]["tokens_per_step"] for n in names_t], name=f"temp. {t}",
                             marker_color=colour), 1, 1)
        lo = [table[n]["ratio_to_chain"] - table[n]["ratio_interval"][0] for n in names_t]
        hi = [table[n]["ratio_interval"][1] - table[n]["ratio_to_chain"] for n in names_t]
        fig.add_trace(go.Bar(x=names_t, y=[table[n]["ratio_to_chain"] for n in names_t], name=f"temp. {t}",
                             marker_color=colour, error_y=dict(type="data", array=hi, arrayminus=lo),
                             showlegend=False), 1, 2)
    costs = doc["auto"]["costs"]
    for key, label in (("target_chain", "target, chain mask (fused)"), ("target_tree", "target, tree mask (eager)")):
        fig.add_trace(go.Scatter(x=costs["rows"], y=[1e3 * s for s in costs[key]], name=label, mode="lines+markers"),
                      1, 3)
    fig.update_layout(title="Token trees against chains on this CPU (docs/tree_vs_chain.json)", height=450, width=1300)
    return fig


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 0.7])
    ap.add_argument("--out", default="docs/tree_vs_chain.json", help="writes OUT and, with --png, OUT's .png")
    ap.add_argument("--png", action="store_true", help="draw the figure (needs Chromium, as the chapters do)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    pair = sl.load_default_pair()
    prompts = HANDWRITTEN_PROMPTS[:args.prompts]
    t0 = time.perf_counter()
    auto = TreeEngine(pair.target, pair.draft, tree="auto", auto_prompts=AUTO_PROMPTS)
    auto_seconds = time.perf_counter() - t0
    systems = {
        "chain K=4": sl.SpeculativeEngine(pair.target, pair.draft, k=4),
        "chain K=2": sl.SpeculativeEngine(pair.target, pair.draft, k=2),
        "chain K=3": sl.SpeculativeEngine(pair.target, pair.draft, k=3),
        "chain (1,1,1,1) via tree": TreeEngine(pair.target, pair.draft, tree=(1, 1, 1, 1)),
        "static (4,2,1)": TreeEngine(pair.target, pair.draft, tree=(4, 2, 1), rule="deterministic"),
        "static (4,2,1) Sequoia": TreeEngine(pair.target, pair.draft, tree=(4, 2, 1), rule="sampled"),
        "dynamic d4 k4 n12": TreeEngine(pair.target, pair.draft, tree=DynamicTree(4, 4, 12)),
        "auto": auto,
    }
    sampling_only = {"static (4,2,1) Sequoia"}  # at temperature 0 every rule is the greedy one
    for engine in systems.values():  # warm-up
        engine.generate("Hello!", max_new_tokens=8)
    results = {}
    for temperature in args.temperatures:
        names = [n for n in systems if temperature > 0 or n not in sampling_only]
        runs = {name: [] for name in names}
        for i, prompt in enumerate(prompts):
            order = names[i % len(names):] + names[:i % len(names)]  # rotate who goes first
            for name in order:
                t1 = time.perf_counter()
                res = systems[name].generate(prompt, max_new_tokens=args.max_new_tokens, temperature=temperature,
                                             seed=i)
                wall = time.perf_counter() - t1
                runs[name].append({"tokens": len(res.tokens), "steps": res.stats.steps, "wall": wall,
                                   "decode_seconds": res.stats.seconds, "tokens_out": res.tokens})
        table = {}
        chain_tps = [r["tokens"] / r["wall"] for r in runs["chain K=4"]]
        for name in names:
            tps = [r["tokens"] / r["wall"] for r in runs[name]]
            ratio, lo, hi = bootstrap_ratio(tps, chain_tps)
            table[name] = {"tokens_per_step": sum(r["tokens"] for r in runs[name]) / sum(r["steps"] for r in runs[name]),
                           "tokens_per_second": sum(r["tokens"] for r in runs[name]) / sum(r["wall"] for r in runs[name]),
                           "ratio_to_chain": ratio, "ratio_interval": [lo, hi]}
        if temperature == 0:
            ref = [r["tokens_out"] for r in runs["chain K=4"]]
            for name in names:
                table[name]["greedy_equal_to_chain"] = sum(r["tokens_out"] == t for r, t in zip(runs[name], ref))
        results[str(temperature)] = {"table": table, "runs": {n: [{k: v for k, v in r.items() if k != "tokens_out"}
                                                               for r in rs] for n, rs in runs.items()}}
        print(f"\ntemperature {temperature}, {len(prompts)} held-out prompts, {args.max_new_tokens} new tokens")
        print(f"{'system':28s} {'tok/step':>8s} {'tok/s':>7s} {'vs chain':>9s}  95% interval")
        for name in names:
            row = table[name]
            print(f"{name:28s} {row['tokens_per_step']:8.2f} {row['tokens_per_second']:7.2f} "
                  f"{row['ratio_to_chain']:9.3f}  [{row['ratio_interval'][0]:.3f}, {row['ratio_interval'][1]:.3f}]")
    names = list(systems)
    plan = auto.plan
    doc = {"machine": "this CPU, one torch thread", "prompts": len(prompts), "max_new_tokens": args.max_new_tokens,
           "auto": {"shape": list(plan.shape), "chain": plan.chain, "expected_tokens_per_step": plan.expected_tokens,
                    "predicted_seconds_per_step": plan.seconds, "measure_seconds": auto_seconds,
                    "acceptance_by_rank": auto.acceptance, "costs": vars(auto.costs)},
           "results": results}
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    if args.png:
        Path(args.out).with_suffix(".png").write_bytes(png(figure(doc, names), width=1300))
    print(json.dumps({k: v for k, v in doc.items() if k != "results"}
                     | {"tables": {t: r["table"] for t, r in results.items()}}))


if __name__ == "__main__":
    main()
