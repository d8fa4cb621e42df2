"""The default engine against plain decoding on every kind of prompt, a long one included
(docs/default_k.json, docs/benchmarks.md section 38).

    OMP_NUM_THREADS=1 python scripts/default_k_bench.py [--per-kind 2] [--rounds 2] [--max-new-tokens 64]

Three systems on the default pair, greedy: autoregressive decoding (`autoregressive_generate`), the
default engine (`SpeculativeEngine(target, draft)`, K chosen from 0 to 4 each step) and a fixed
K = 4 (the default before). The prompts: the first `--per-kind` hand-written held-out prompts of each
kind (explanations, poems, e-mails, code, SQL, translations, list edits, summaries of a given
paragraph, ...), and one long prompt, a request to summarise about 1,800 tokens of text (every
benchmark and hand-written prompt, in order). Each call is timed whole, prefill included, the
systems in an order rotated from round to round; a prompt's figure is each system's fastest round.
A kind's ratio is its prompts' total tokens over total seconds, over autoregressive decoding's.
First it measures what the default's fixed costs stand for (policies.adaptive.CPU_VERIFY_COST and c):
the target's forward over T = 1..9 rows after a 200-token prefix, and the draft's one-row forward,
each over the target's one-row forward (medians of 7 rounds).
"""
import argparse
import json
import statistics
import time
from pathlib import Path

import torch

import specdec_lab as sl
from specdec_lab.core.text import encode_prompt
from specdec_lab.train.handwritten import HANDWRITTEN
from specdec_lab.train.prompts import BENCH_PROMPTS

SYSTEMS = ("autoregressive", "default", "K = 4")


@torch.inference_mode()
def forward_costs(target, draft, rows=(1, 2, 3, 4, 5, 6, 8, 9), prefix=200, rounds=7) -> dict:
    """{"rows": {T: the target's forward over T rows / over one row}, "c": the draft's one-row forward /
    the target's}, each after `prefix` positions, medians of `rounds`."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 1000, (1, prefix), generator=g)
    seconds = {}
    for model, name in ((target, "target"), (draft, "draft")):
        cache = model.new_cache(prefix + 16)
        for _ in range(rounds):
            for t in (rows if name == "target" else (1,)):
                cache.reset()
                model(ids, cache=cache)
                t0 = time.perf_counter()
                model(torch.randint(0, 1000, (1, t), generator=g), cache=cache)
                seconds.setdefault((name, t), []).append(time.perf_counter() - t0)
    med = {key: statistics.median(v) for key, v in seconds.items()}
    one = med[("target", 1)]
    return {"rows": {t: med[("target", t)] / one for t in rows}, "c": med[("draft", 1)] / one,
            "one_row_ms": one * 1e3}


def long_prompt() -> str:
    text = "\n".join(BENCH_PROMPTS + [p for _, p in HANDWRITTEN])
    return f"Here is a list of requests people sent to an assistant:\n\n{text}\n\nSummarize what people asked for, in five sentences."


def prompts(per_kind) -> list:
    seen, out = {}, []
    for kind, p in HANDWRITTEN:
        if seen.get(kind, 0) < per_kind:
            seen[kind] = seen.get(kind, 0) + 1
            out.append((kind, p))
    return out + [("long summary", long_prompt())]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--per-kind", type=int, default=2, help="hand-written prompts of each kind (default %(default)s)")
    p.add_argument("--rounds", type=int, default=2, help="rounds of every system on every prompt (default %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=64, help="tokens per answer (default %(default)s)")
    p.add_argument("--out", default="docs/default_k.json", help="where to store the document (default %(default)s)")
    args = p.parse_args()
    torch.set_num_threads(1)
    pair = sl.load_default_pair()
    tok = pair.tokenizer
    engines = {"default": sl.SpeculativeEngine(pair.target, pair.draft),
               "K = 4": sl.SpeculativeEngine(pair.target, pair.draft, k=4)}

    def run(system, ids):
        if system == "autoregressive":
            return sl.autoregressive_generate(pair.target, ids, max_new_tokens=args.max_new_tokens)
        return engines[system].generate(ids, max_new_tokens=args.max_new_tokens)

    costs = forward_costs(pair.target, pair.draft)
    print("forward over T rows / one row: " + ", ".join(f"{t}: {x:.3f}" for t, x in costs["rows"].items())
          + f"; the draft's one row / the target's: {costs['c']:.3f}", flush=True)
    work = [(kind, text, encode_prompt(tok, text)) for kind, text in prompts(args.per_kind)]
    for system in SYSTEMS:  # warm-up, untimed
        run(system, work[0][2])
    rows, t_start = [], time.perf_counter()
    for i, (kind, text, ids) in enumerate(work):
        best, last = {}, {}
        for r in range(args.rounds):
            order = SYSTEMS[(i + r) % 3:] + SYSTEMS[:(i + r) % 3]
            for system in order:
                t0 = time.perf_counter()
                res = run(system, ids)
                seconds = time.perf_counter() - t0
                best[system] = min(best.get(system, seconds), seconds)
                last[system] = res
        same = all(last[s].tokens == last["autoregressive"].tokens for s in SYSTEMS)
        ks = [st.k for st in last["default"].steps]
        rows.append({"kind": kind, "prompt_tokens": len(ids), "tokens": len(last["autoregressive"].tokens),
                     "seconds": best, "same_as_autoregressive": same, "default_mean_k": sum(ks) / len(ks),
                     "default_k_zero_share": ks.count(0) / len(ks),
                     "accepted_share_k4": last["K = 4"].stats.accepted_share})
        over = {s: best["autoregressive"] / best[s] for s in SYSTEMS[1:]}
        print(f"{kind:13s} {len(ids):5d} prompt tokens: default {over['default']:.2f}x (mean K "
              f"{rows[-1]['default_mean_k']:.1f}), K = 4 {over['K = 4']:.2f}x, accepted share at K = 4 "
              f"{rows[-1]['accepted_share_k4']:.2f}{'' if same else ', OUTPUTS DIFFER'}", flush=True)
    kinds = {}
    for row in rows:
        kinds.setdefault(row["kind"], []).append(row)
    by_kind = {}
    for kind, rs in kinds.items():
        tokens = sum(r["tokens"] for r in rs)
        rate = {s: tokens / sum(r["seconds"][s] for r in rs) for s in SYSTEMS}
        by_kind[kind] = {"prompts": len(rs), "default_over_ar": rate["default"] / rate["autoregressive"],
                         "k4_over_ar": rate["K = 4"] / rate["autoregressive"],
                         "default_mean_k": sum(r["default_mean_k"] for r in rs) / len(rs)}
    doc = {"date": time.strftime("%Y-%m-%d", time.gmtime()),
           "command": f"OMP_NUM_THREADS=1 python scripts/default_k_bench.py --per-kind {args.per_kind} "
                      f"--rounds {args.rounds} --max-new-tokens {args.max_new_tokens}",
           "threads": 1, "max_new_tokens": args.max_new_tokens, "rounds": args.rounds,
           "seconds": round(time.perf_counter() - t_start), "forward_costs": costs, "by_kind": by_kind, "prompts": rows,
           "all_same_as_autoregressive": all(r["same_as_autoregressive"] for r in rows)}
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(f"\n{'kind':13s} default  K = 4  mean K")
    for kind, k in by_kind.items():
        print(f"{kind:13s} {k['default_over_ar']:.2f}x   {k['k4_over_ar']:.2f}x  {k['default_mean_k']:.1f}")
    print(f"stored {args.out}")


if __name__ == "__main__":
    main()
