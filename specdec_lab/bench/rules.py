"""Token-by-token, block and exact-match verification side by side: accepted drafts per step and tokens/s.

    python -m specdec_lab.bench.rules --out docs/verification_rules.json
    python scripts/verification_rules_figure.py docs/verification_rules.json --out docs/verification_rules.png

The same pair, prompts, seeds and K under each rule (SpeculativeEngine's verifier: "device" is
token by token, arXiv 2211.17192; "block", arXiv 2403.10444; "match", exact match, with the draft
sampling from q, and "match_argmax", exact match with the draft proposing its top token as
llama.cpp's server does), the order of the rules rotating from prompt to prompt so a noisy minute
hits all alike. The prompts are the hand-written held-out ones (train/handwritten.py), which no
draft was trained on. Two figures per (temperature, K, rule):

- expected: accepted drafts per step computed from p and q along the target's own answers, with
  no sampling (verification/expect.py: the model behind Leviathan et al.'s alpha, each drafted
  position seeing the distributions of the answer's position, averaged over every start);
- measured: accepted drafts per step, tokens per step and tokens/s of real runs (`samples` answers
  per prompt when sampling), and per (temperature, K) the ratios of accepted drafts per step of
  each rule over token-by-token's, with 95% bootstrap intervals over the prompts.

The mean acceptance length tau is accepted drafts per step plus one. Prints a table, then one
JSON document as its last line; `--out` stores it, and `figure(doc)` draws it.
"""
import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch

from ..api import SpeculativeEngine, autoregressive_generate, load_default_pair
from ..core.sampling import logits_to_probs
from ..core.text import encode_prompt
from ..train.handwritten import HANDWRITTEN_PROMPTS
from ..verification.expect import expected_accepted
from .report import emit

# name -> SpeculativeEngine's (verifier, propose)
RULES = {"token": ("device", "sample"), "block": ("block", "sample"), "match": ("match", "sample"),
         "match_argmax": ("match", "argmax")}
SAMPLE_STRIDE = 1000  # sample s of prompt i runs with seed + i + SAMPLE_STRIDE * s


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


def measure_rules(target, draft, prompts, temperatures=(0.0, 0.7, 1.0), ks=(2, 4, 8), max_new_tokens=48, seed=0,
                  samples=1, log=None, checkpoint=None) -> dict:
    """Real runs of every rule; `samples` answers per prompt at temperatures above 0 (one at 0).
    `checkpoint` (a Checkpoint) keeps each finished (temperature, K) and skips it when run again."""
    log = log or (lambda s: None)
    checkpoint = checkpoint or Checkpoint(None)
    engines = {(name, k): SpeculativeEngine(target, draft, k=k, verifier=rule, propose=propose)
               for name, (rule, propose) in RULES.items() for k in ks}
    for e in engines.values():  # warm-up: the first call of each engine is not timed
        e.generate(prompts[0], 8, temperature=1.0, seed=seed)
    names = list(RULES)
    for T in temperatures:
        for k in ks:
            if checkpoint.has("measured", T, k):
                log(f"T={T:g} K={k}: in the checkpoint")
                continue
            per = {name: {"accepted": [], "steps": [], "tokens": [], "seconds": []} for name in RULES}
            for i, prompt in enumerate(prompts):
                for name in names:
                    for key in per[name]:
                        per[name][key].append(0)
                for s in range(samples if T > 0 else 1):
                    turn = (i + s) % len(names)
                    for name in names[turn:] + names[:turn]:
                        t0 = time.perf_counter()
                        st = engines[(name, k)].generate(prompt, max_new_tokens, temperature=T,
                                                         seed=seed + i + SAMPLE_STRIDE * s).stats
                        seconds = time.perf_counter() - t0
                        for key, v in (("accepted", st.accepted), ("steps", st.steps), ("tokens", st.new_tokens),
                                       ("seconds", seconds)):
                            per[name][key][-1] += v
                log(f"T={T:g} K={k}: prompt {i + 1}/{len(prompts)}")
            rows, ratios = [], []
            for name, r in per.items():
                rows.append({"temperature": T, "k": k, "rule": name,
                             "accepted_per_step": sum(r["accepted"]) / sum(r["steps"]),
                             "tokens_per_step": sum(r["tokens"]) / sum(r["steps"]),
                             "tokens_per_second": sum(r["tokens"]) / sum(r["seconds"]),
                             "per_prompt": r})
            every = range(len(prompts))
            for name in names[1:]:
                ratios.append({"temperature": T, "k": k, "rule": name,
                               "over_token": over(per[name], per["token"], every),
                               "ci95": list(bootstrap(per[name], per["token"]))})
            checkpoint.add("measured", T, k, {"rows": rows, "ratios": ratios})
    done = [checkpoint.get("measured", T, k) for T in temperatures for k in ks]
    return {"prompts": len(prompts), "max_new_tokens": max_new_tokens, "seed": seed, "samples": samples,
            "threads": torch.get_num_threads(), "rows": [r for d in done for r in d["rows"]],
            "ratios": [r for d in done for r in d["ratios"]]}


class Checkpoint:
    """Finished parts of a run in a JSON file, written after each part, so that a run stopped midway
    (a killed process, a full machine) resumes where it stopped. path None keeps them in memory."""

    def __init__(self, path):
        self.path = path
        self.parts = json.loads(Path(path).read_text()) if path and Path(path).exists() else {}

    @staticmethod
    def _key(kind, T, k):
        return f"{kind} T={T:g} K={k}"

    def has(self, kind, T, k=0):
        return self._key(kind, T, k) in self.parts

    def get(self, kind, T, k=0):
        return self.parts[self._key(kind, T, k)]

    def add(self, kind, T, k, value):
        self.parts[self._key(kind, T, k)] = value
        if self.path:
            tmp = Path(f"{self.path}.tmp")
            tmp.write_text(json.dumps(self.parts))
            tmp.replace(self.path)


@torch.inference_mode()
def expected_rules(target, draft, prompts, temperatures=(0.0, 0.7, 1.0), ks=(2, 4, 8), max_new_tokens=48, seed=0,
                   log=None, checkpoint=None) -> list:
    """Expected accepted drafts per step of each rule along the target's own answers, no sampling:
    one answer per prompt and temperature (seed + i), p and q of each answer position from one
    forward of each model over prompt + answer, every start with max(ks) positions after it."""
    log = log or (lambda s: None)
    checkpoint = checkpoint or Checkpoint(None)
    kmax, out = max(ks), []
    for T in temperatures:
        if checkpoint.has("expected", T):
            out += checkpoint.get("expected", T)
            continue
        sums, starts = {rule: {k: 0.0 for k in ks} for rule in RULES}, 0
        for i, prompt in enumerate(prompts):
            ids = encode_prompt(getattr(target, "tokenizer", None), prompt)
            new = autoregressive_generate(target, ids, max_new_tokens, temperature=T, seed=seed + i).tokens
            seq = torch.tensor([ids + new], device=target.device)  # (1, P+N)
            first = len(ids) - 1  # the position that predicts new[0]
            p = logits_to_probs(target(seq)[0, first:first + len(new)], T).double().cpu()  # (N, V)
            q = logits_to_probs(draft(seq)[0, first:first + len(new)], T).double().cpu()
            for t in range(len(new) - kmax + 1):
                e = expected_accepted(p[t:t + kmax], q[t:t + kmax], ks)
                for rule in RULES:
                    for k in ks:
                        sums[rule][k] += e[rule][k]
                starts += 1
            log(f"expected, T={T:g}: prompt {i + 1}/{len(prompts)}")
        part = [{"temperature": T, "k": k, "rule": rule, "expected_accepted_per_step": sums[rule][k] / starts,
                 "starts": starts} for k in ks for rule in RULES]
        checkpoint.add("expected", T, 0, part)
        out += part
    return out


def format_table(doc) -> str:
    expected = {(r["temperature"], r["k"], r["rule"]): r["expected_accepted_per_step"] for r in doc.get("expected", [])}
    lines = [f"verification rules side by side: {doc['prompts']} held-out prompts x {doc['max_new_tokens']} tokens, "
             f"{doc['samples']} sample(s) per prompt when sampling, {doc['threads']} thread(s)",
             f"{'T':>4s} {'K':>2s} {'rule':12s} {'expected':>8s} {'accepted/step':>13s} {'tokens/step':>11s} "
             f"{'tokens/s':>9s}"]
    for r in doc["rows"]:
        e = expected.get((r["temperature"], r["k"], r["rule"]))
        lines.append(f"{r['temperature']:4g} {r['k']:2d} {r['rule']:12s} {'' if e is None else f'{e:8.3f}':>8s} "
                     f"{r['accepted_per_step']:13.3f} {r['tokens_per_step']:11.3f} {r['tokens_per_second']:9.2f}")
    lines.append("measured accepted drafts per step over token-by-token's (95% interval over prompts):")
    for r in doc["ratios"]:
        lo, hi = r["ci95"]
        lines.append(f"  T={r['temperature']:g} K={r['k']} {r['rule']:12s} {r['over_token']:.3f} ({lo:.3f}-{hi:.3f})")
    return "\n".join(lines)


def figure(doc):
    """Accepted drafts per step against K, a panel per temperature: expected (lines) and measured (markers)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots
    temps = sorted({r["temperature"] for r in doc["rows"]})
    fig = make_subplots(rows=1, cols=len(temps), shared_yaxes=True,
                        subplot_titles=[f"temperature {T:g}" for T in temps])
    colors = {"token": "#1f77b4", "block": "#2ca02c", "match": "#d62728", "match_argmax": "#ff7f0e"}
    for c, T in enumerate(temps, 1):
        for rule in RULES:
            ex = [r for r in doc.get("expected", []) if r["temperature"] == T and r["rule"] == rule]
            me = [r for r in doc["rows"] if r["temperature"] == T and r["rule"] == rule]
            fig.add_trace(go.Scatter(x=[r["k"] for r in ex], y=[r["expected_accepted_per_step"] for r in ex],
                                     mode="lines", line=dict(color=colors[rule]), name=f"{rule}, expected",
                                     legendgroup=rule, showlegend=c == 1), row=1, col=c)
            fig.add_trace(go.Scatter(x=[r["k"] for r in me], y=[r["accepted_per_step"] for r in me],
                                     mode="markers", marker=dict(color=colors[rule], size=9), name=f"{rule}, measured",
                                     legendgroup=rule, showlegend=c == 1), row=1, col=c)
        fig.update_xaxes(title_text="K", row=1, col=c)
    fig.update_yaxes(title_text="accepted drafts per step", row=1, col=1)
    fig.update_layout(height=420, title="The acceptance rule: expected from p and q (lines) and measured (markers)")
    return fig


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
    p.add_argument("--temperatures", default="0,0.7,1.0", help="comma list (default %(default)s)")
    p.add_argument("--ks", default="2,4,8", help="draft lengths, comma list (default %(default)s)")
    p.add_argument("--samples", type=int, default=2, help="answers per prompt when sampling (default %(default)s)")
    p.add_argument("--num-prompts", type=int, default=12, help="held-out prompts (default %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=48, help="tokens per answer (default %(default)s)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default %(default)s)")
    p.add_argument("--json", action="store_true", help="print only the JSON document")
    p.add_argument("--out", default="", help="where to store the document (default: nowhere)")
    p.add_argument("--no-expected", action="store_true", help="skip the expected figures (measured runs only)")
    p.add_argument("--expected-only", action="store_true", help="only the expected figures (no measured runs)")
    p.add_argument("--checkpoint", default="", help="a JSON file that keeps each finished part; a rerun with "
                   "the same file resumes (default: none)")
    args = p.parse_args(argv)
    temperatures, ks = _floats(args.temperatures, "--temperatures"), _floats(args.ks, "--ks", int)
    if min(args.num_prompts, args.max_new_tokens, args.threads, args.samples) < 1:
        raise SystemExit("error: --num-prompts, --max-new-tokens, --threads and --samples must be >= 1")
    torch.set_num_threads(args.threads)
    target, draft = load() if load else (lambda pair: (pair.target, pair.draft))(load_default_pair())
    prompts, log = HANDWRITTEN_PROMPTS[:args.num_prompts], (lambda s: print(s, file=sys.stderr, flush=True))
    checkpoint = Checkpoint(args.checkpoint or None)
    if args.expected_only:
        doc = {"prompts": len(prompts), "max_new_tokens": args.max_new_tokens, "seed": 0, "samples": args.samples,
               "threads": torch.get_num_threads(), "rows": [], "ratios": []}
    else:
        doc = measure_rules(target, draft, prompts, temperatures, ks, args.max_new_tokens, samples=args.samples,
                            log=log, checkpoint=checkpoint)
    if not args.no_expected:
        doc["expected"] = expected_rules(target, draft, prompts, temperatures, ks, args.max_new_tokens, log=log,
                                         checkpoint=checkpoint)
    return emit(doc, format_table(doc), out, args.out, args.json)


if __name__ == "__main__":
    main()
