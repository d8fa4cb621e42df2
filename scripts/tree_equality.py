"""Greedy token trees against greedy decoding on the default pair, prompt by prompt (docs/benchmarks.md).

    OMP_NUM_THREADS=1 python scripts/tree_equality.py [--max-new-tokens 48] [--out docs/tree_equality.json]

Every benchmark and hand-written prompt, float32, temperature 0: the target's own autoregressive
decode, then the tree engine with a static tree (4, 2, 1) and a dynamic tree (EAGLE-2: depth 4,
top 4, 12 nodes), each over a contiguous and a paged cache. An answer that differs from the
autoregressive one is stored with the target's logit gap at the first difference (a near-tie is
float32 rounding of a different computation order; anything else is a bug). Each prompt's result
is appended to a checkpoint file as it is made, so an interrupted run resumes where it stopped.
"""
import argparse
import json
from pathlib import Path

from tqdm.auto import tqdm

import specdec_lab as sl
from specdec_lab.bench.run import first_difference
from specdec_lab.core.text import encode_prompt
from specdec_lab.train.handwritten import HANDWRITTEN_PROMPTS
from specdec_lab.train.prompts import BENCH_PROMPTS
from specdec_lab.tree.draft import DynamicTree
from specdec_lab.tree.engine import TreeEngine

TREES = {"static (4, 2, 1)": (4, 2, 1), "dynamic (4, 4, 12)": DynamicTree(4, 4, 12)}
CACHES = ("contiguous", "paged")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--prompts", type=int, help="only the first N prompts (default: all)")
    ap.add_argument("--out", type=Path, default=Path("docs/tree_equality.json"))
    ap.add_argument("--checkpoint", type=Path, default=Path("tree_equality.jsonl"))
    args = ap.parse_args()
    prompts = (BENCH_PROMPTS + HANDWRITTEN_PROMPTS)[:args.prompts]
    pair = sl.load_default_pair()
    target, n = pair.target, args.max_new_tokens
    engines = {(t, c): TreeEngine(target, pair.draft, tree=tree, cache=c) for t, tree in TREES.items() for c in CACHES}
    done = {}
    if args.checkpoint.exists():
        for line in args.checkpoint.read_text().splitlines():
            row = json.loads(line)
            if row["max_new_tokens"] == n:
                done[row["prompt"]] = row
    with args.checkpoint.open("a") as log:
        for prompt in tqdm([p for p in prompts if p not in done], desc="prompts"):
            ids = encode_prompt(target.tokenizer, prompt)
            reference = sl.autoregressive_generate(target, ids, max_new_tokens=n).tokens
            row = {"prompt": prompt, "max_new_tokens": n, "systems": {}}
            for (t, c), engine in engines.items():
                res = engine.generate(ids, max_new_tokens=n)
                row["systems"][f"{t}, {c}"] = {
                    "identical": res.tokens == reference, "tokens_per_step": res.stats.mean_tokens_per_step,
                    "first_difference": first_difference(target, ids, reference, res.tokens)}
            log.write(json.dumps(row) + "\n")
            log.flush()
            done[prompt] = row
    rows = [done[p] for p in prompts]
    systems = list(rows[0]["systems"])
    doc = {"prompts": len(rows), "max_new_tokens": n, "dtype": "float32",
           "identical": {s: sum(r["systems"][s]["identical"] for r in rows) for s in systems},
           "tokens_per_step": {s: sum(r["systems"][s]["tokens_per_step"] for r in rows) / len(rows) for s in systems},
           "differences": {s: [dict(prompt=r["prompt"], **(r["systems"][s]["first_difference"] or {})) for r in rows
                               if not r["systems"][s]["identical"]] for s in systems}}
    for s in systems:
        print(f"{s}: {doc['identical'][s]} of {len(rows)} identical, {doc['tokens_per_step'][s]:.2f} tokens/step")
    args.out.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
