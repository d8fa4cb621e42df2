"""Token-by-token, block and exact-match verification side by side: accepted drafts per step and tokens/s.

    python -m specdec_lab.bench.rules [--temperatures 0.7,1.0] [--ks 2,4] [--num-prompts 12] [--json]

The same pair, prompts, seeds and K under each rule (SpeculativeEngine's verifier: "device" is
token by token, arXiv 2211.17192; "block", arXiv 2403.10444; "match", exact match), the order of
the rules rotating from prompt to prompt so a noisy minute hits all three alike. The prompts are
the hand-written held-out ones (train/handwritten.py), which no draft was trained on. Per
(temperature, K, rule): accepted drafts per step (the mean acceptance length tau is this plus one),
tokens per step and tokens/s; and per (temperature, K) the ratios block / token and match / token
of accepted drafts per step with 95% bootstrap intervals over the prompts. Prints a table, then
one JSON document as its last line; `--out` stores it.
"""
import argparse
import random
import sys
import time

import torch

from ..api import SpeculativeEngine, load_default_pair
from ..train.handwritten import HANDWRITTEN_PROMPTS
from .report import emit

RULES = {"token": "device", "block": "block", "match": "match"}  # name -> SpeculativeEngine's verifier


def over(rule, base, pick):
    """Accepted drafts per step under `rule` over the same under `base`, over the prompts in `pick`."""
    def rate(r):
        steps = sum(r["steps"][i] for i in pick)
        return sum(r["accepted"][i] for i in pick) / steps if steps else float("nan")
    b = rate(base)
    return rate(rule) / b if b else float("nan")


def bootstrap(rule, base, resamples=2000, seed=0):
    """95% interval of over(rule, base) with the prompts resampled."""
    rng, n = random.Random(seed), len(base["steps"])
    out = sorted(over(rule, base, [rng.randrange(n) for _ in range(n)]) for _ in range(resamples))
    return out[int(0.025 * resamples)], out[int(0.975 * resamples) - 1]


def measure_rules(target, draft, prompts, temperatures=(0.7, 1.0), ks=(2, 4), max_new_tokens=48, seed=0,
                  log=None) -> dict:
    log = log or (lambda s: None)
    engines = {(name, k): SpeculativeEngine(target, draft, k=k, verifier=rule) for name, rule in RULES.items()
               for k in ks}
    for e in engines.values():  # warm-up: the first call of each engine is not timed
        e.generate(prompts[0], 8, temperature=1.0, seed=seed)
    rows, ratios = [], []
    for T in temperatures:
        for k in ks:
            per = {name: {"accepted": [], "steps": [], "tokens": [], "seconds": []} for name in RULES}
            for i, prompt in enumerate(prompts):
                names = list(RULES)[i % 3:] + list(RULES)[:i % 3]
                for name in names:
                    t0 = time.perf_counter()
                    st = engines[(name, k)].generate(prompt, max_new_tokens, temperature=T, seed=seed + i).stats
                    seconds = time.perf_counter() - t0
                    for key, v in (("accepted", st.accepted), ("steps", st.steps), ("tokens", st.new_tokens),
                                   ("seconds", seconds)):
                        per[name][key].append(v)
                log(f"T={T:g} K={k}: prompt {i + 1}/{len(prompts)}")
            for name, r in per.items():
                rows.append({"temperature": T, "k": k, "rule": name,
                             "accepted_per_step": sum(r["accepted"]) / sum(r["steps"]),
                             "tokens_per_step": sum(r["tokens"]) / sum(r["steps"]),
                             "tokens_per_second": sum(r["tokens"]) / sum(r["seconds"]),
                             "per_prompt": r})
            every = range(len(prompts))
            for name in ("block", "match"):
                ratios.append({"temperature": T, "k": k, "rule": name,
                               "over_token": over(per[name], per["token"], every),
                               "ci95": bootstrap(per[name], per["token"])})
    return {"prompts": len(prompts), "max_new_tokens": max_new_tokens, "seed": seed,
            "threads": torch.get_num_threads(), "rows": rows, "ratios": ratios}


def format_table(doc) -> str:
    lines = [f"verification rules side by side: {doc['prompts']} held-out prompts x {doc['max_new_tokens']} tokens, "
             f"{doc['threads']} thread(s)",
             f"{'T':>4s} {'K':>2s} {'rule':6s} {'accepted/step':>13s} {'tokens/step':>11s} {'tokens/s':>9s}"]
    for r in doc["rows"]:
        lines.append(f"{r['temperature']:4g} {r['k']:2d} {r['rule']:6s} {r['accepted_per_step']:13.3f} "
                     f"{r['tokens_per_step']:11.3f} {r['tokens_per_second']:9.2f}")
    lines.append("accepted drafts per step over token-by-token's (95% interval over prompts):")
    for r in doc["ratios"]:
        lo, hi = r["ci95"]
        lines.append(f"  T={r['temperature']:g} K={r['k']} {r['rule']:6s} {r['over_token']:.3f} ({lo:.3f}-{hi:.3f})")
    return "\n".join(lines)


def _floats(text, name, kind=float):
    try:
        values = tuple(kind(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise SystemExit(f"error: {name} must be a comma list of numbers, got {text!r}") from None
    if not values:
        raise SystemExit(f"error: {name} must not be empty")
    return values


def main(argv=None, out=print, load=None) -> dict:
    p = argparse.ArgumentParser(prog="python -m specdec_lab.bench.rules", description=__doc__.split("\n")[0])
    p.add_argument("--temperatures", default="0.7,1.0", help="comma list (default %(default)s)")
    p.add_argument("--ks", default="2,4", help="draft lengths, comma list (default %(default)s)")
    p.add_argument("--num-prompts", type=int, default=12, help="held-out prompts (default %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=48, help="tokens per answer (default %(default)s)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default %(default)s)")
    p.add_argument("--json", action="store_true", help="print only the JSON document")
    p.add_argument("--out", default="", help="where to store the document (default: nowhere)")
    args = p.parse_args(argv)
    temperatures, ks = _floats(args.temperatures, "--temperatures"), _floats(args.ks, "--ks", int)
    if args.num_prompts < 1 or args.max_new_tokens < 1 or args.threads < 1:
        raise SystemExit("error: --num-prompts, --max-new-tokens and --threads must be >= 1")
    torch.set_num_threads(args.threads)
    target, draft = load() if load else (lambda pair: (pair.target, pair.draft))(load_default_pair())
    doc = measure_rules(target, draft, HANDWRITTEN_PROMPTS[:args.num_prompts], temperatures, ks, args.max_new_tokens,
                        log=lambda s: print(s, file=sys.stderr, flush=True))
    return emit(doc, format_table(doc), out, args.out, args.json)


if __name__ == "__main__":
    main()
