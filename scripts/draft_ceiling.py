"""How far the shipped draft's agreement can carry greedy speculative decoding.

Greedy verification accepts a drafted token exactly when it is the target's own next token,
so along the target's greedy answer everything about a drafter is known in advance: at each
position, the rank of the target's token among the draft's choices (teacher-forced, the draft
seeing the true prefix, which is what it sees while its tokens keep being accepted) and the
probability the draft gave its first choice (what the early stop reads). This script replays
drafting policies along those answers and prices each step with the stored benchmark's costs:

    step cost = v(T) + c * (draft forwards), in units of one autoregressive forward,

where v(T) is the measured cost of a target forward over T tokens (docs/bench_full.json) and
T counts the last committed token and every proposed token. A proposal may be a tree: a set of
token paths verified in one forward (SpecInfer, arXiv 2305.09781); what it accepts is the
longest path that agrees with the answer, then the target adds one token of its own.

The figures are for the decode loop (prefill and per-step bookkeeping are left out), so they
sit above the measured whole-call speedups; they are for comparing policies with each other.

    python scripts/draft_ceiling.py            # about a minute on 2 cores
    python scripts/draft_ceiling.py docs/bench_slow_memory.json   # priced with another stored run
"""
import bisect
import json
import sys
from collections import Counter
from pathlib import Path

import torch

from specdec_lab.bench import STOP_BELOW, STOP_K
from specdec_lab.drafters import ngram_lookup_reference
from specdec_lab import autoregressive_generate
from specdec_lab import load_default_pair
from specdec_lab.train.prompts import BENCH_PROMPTS

ROOT = Path(__file__).resolve().parents[1]
TOP = 4  # draft choices kept per position
MISS = TOP  # the rank given to a token outside them


@torch.no_grad()
def collect(max_new_tokens=64, prompts=BENCH_PROMPTS, pair=None):
    """Per prompt: the prompt ids, the target's greedy answer, and at each answer position the
    draft's top-TOP token ids and probabilities with the answer token's rank among them."""
    pair = pair or load_default_pair()
    runs = []
    for i, prompt in enumerate(prompts):
        res = autoregressive_generate(pair.target, prompt, max_new_tokens=max_new_tokens)
        ids, answer = list(res.prompt_ids), list(res.tokens)
        logits = pair.draft(torch.tensor([ids + answer]))[0, len(ids) - 1:len(ids) - 1 + len(answer)]
        top = torch.softmax(logits.float(), -1).topk(TOP, -1)  # (N, TOP)
        choices = top.indices.tolist()
        ranks = [c.index(t) if t in c else MISS for c, t in zip(choices, answer)]
        runs.append(dict(prompt=ids, answer=answer, choices=choices, conf=top.values[:, 0].tolist(), ranks=ranks))
        print(f"prompt {i + 1}/{len(prompts)}: {len(answer)} tokens", flush=True)
    return runs


# ----------------------------------------------------------------------------- proposals
# Each returns (paths, draft_forwards) for the step that starts at answer position j.

def draft_chain(run, j, k=STOP_K, stop_below=STOP_BELOW, alternatives=0, alt_depth=1):
    """The draft's greedy chain, stopping after a token it gave less than stop_below. Past the
    first wrong token the chain's tokens cannot be accepted, so they are placeholders (-1).
    `alternatives`: the draft's next choices as extra leaves at the first `alt_depth` depths."""
    answer, choices, conf = run["answer"], run["choices"], run["conf"]
    path, paths, wrong = [], [], False
    for i in range(min(k, len(answer) - j)):
        if not wrong and i < alt_depth:
            paths += [path + [choices[j + i][a]] for a in range(1, 1 + alternatives)]
        token = -1 if wrong else choices[j + i][0]
        path.append(token)
        wrong = wrong or token != answer[j + i]
        if stop_below is not None and conf[j + i] < stop_below:
            break
    return paths + [path], len(path)


def lookup_then_draft(run, j, k=STOP_K, stop_below=STOP_BELOW, together=False, **tree):
    """Prompt lookup (drafters.LookupThenModelDrafter's n-grams of 2-4 tokens) where it matches,
    the draft's chain elsewhere; `together` verifies both in one tree instead."""
    copied = ngram_lookup_reference(run["prompt"] + run["answer"][:j], k, max_ngram=4, min_ngram=2)
    if copied and not together:
        return [copied], 0
    paths, forwards = draft_chain(run, j, k, stop_below, **tree)
    return paths + ([copied] if copied else []), forwards


# ----------------------------------------------------------------------------- replay

def replay(runs, propose, c, verify_cost):
    """Tokens per unit of autoregressive time along the answers: the decode-loop speedup."""
    tokens = cost = 0.0
    for run in runs:
        answer, j = run["answer"], 0
        while j < len(answer):
            paths, forwards = propose(run, j)
            nodes = {tuple(p[:i]) for p in paths for i in range(1, len(p) + 1)}  # the tree's tokens
            accepted = max(next((i for i, t in enumerate(p) if j + i >= len(answer) or t != answer[j + i]), len(p))
                           for p in paths)
            step = min(accepted + 1, len(answer) - j)  # the target's own token ends every step
            # Tokens accepted from a copied proposal reach the draft's cache later, one forward each.
            catch_up = step if forwards == 0 else 0
            tokens += step
            cost += verify_cost(len(nodes) + 1) + c * (forwards + catch_up)
            j += step
    return tokens / cost


def verify_costs(costs):
    """v(T), the cost of a target forward over T tokens in one-token forwards, from a bench
    document's "costs": the measured K = T - 1 where there is one, else a straight line through the
    two nearest measured points (past the last, its slope continues)."""
    v = {1: 1.0} | {int(k) + 1: x for k, x in costs["verify_cost"].items()}  # by tokens in the forward
    known = sorted(v)

    def measured(T):
        if T in v:
            return v[T]
        i = min(bisect.bisect(known, T), len(known) - 1)  # the segment around T, or the last one
        lo, hi = known[i - 1], known[i]
        return v[lo] + (v[hi] - v[lo]) * (T - lo) / (hi - lo)
    return measured


def improved(runs, agreement, seed=0):
    """The runs as a better draft would see them: every position the shipped draft got right, plus
    randomly chosen others until `agreement` of all positions are right. At a new hit the answer's
    token becomes the first choice, with a confidence drawn from the shipped draft's own hits (1 if
    it has none)."""
    g = torch.Generator().manual_seed(seed)
    positions = [(r, j) for r, run in enumerate(runs) for j, rank in enumerate(run["ranks"]) if rank != 0]
    hit_conf = [run["conf"][j] for run in runs for j, rank in enumerate(run["ranks"]) if rank == 0] or [1.0]
    total = sum(len(run["ranks"]) for run in runs)
    flip = max(0, round(agreement * total) - (total - len(positions)))
    out = [dict(run, choices=list(run["choices"]), conf=list(run["conf"]), ranks=list(run["ranks"])) for run in runs]
    for i in torch.randperm(len(positions), generator=g)[:flip].tolist():
        r, j = positions[i]
        run, token = out[r], out[r]["answer"][j]
        run["choices"][j] = ([token] + [t for t in run["choices"][j] if t != token])[:TOP]
        run["conf"][j] = hit_conf[int(torch.randint(len(hit_conf), (1,), generator=g))]
        run["ranks"][j] = 0
    return out


AGREEMENTS = (0.50, 0.55, 0.60, 0.65, 0.70, 0.75, 0.80)
COST_MULTIPLES = (1, 2, 4)


def agreement_table(runs, c, measured, agreements=AGREEMENTS, multiples=COST_MULTIPLES):
    """{multiple: [lookup + stop's speedup over the decode loop at each agreement]} for a better draft
    (`improved`) costing c * multiple, with v(T) = measured(T)."""
    better = [improved(runs, a) for a in agreements]
    return {m: [replay(b, lookup_then_draft, m * c, measured) for b in better] for m in multiples}


def main(costs_from=ROOT / "docs" / "bench_full.json"):
    stored = json.loads(Path(costs_from).read_text())["costs"]
    print(f"costs from {costs_from}")
    c, measured = stored["c"], verify_costs(stored)
    runs = collect()
    ranks = Counter(r for run in runs for r in run["ranks"])
    total = sum(ranks.values())
    print(f"\n{total} answer positions; the target's token was the draft's")
    for r in range(TOP):
        print(f"  choice {r + 1}: {ranks[r] / total:6.1%}")
    print(f"  none of its top {TOP}: {ranks[MISS] / total:6.1%}")
    print(f"\ncosts: c = {c:.3f}, v(T) for T = 2..9: " + " ".join(f"{measured(T):.2f}" for T in range(2, 10)))

    policies = {
        "draft chain, stop": lambda run, j: draft_chain(run, j),
        "draft chain, K=3, no stop": lambda run, j: draft_chain(run, j, 3, None),
        "lookup + stop (shipped)": lambda run, j: lookup_then_draft(run, j),
        "  + 2nd choice at depth 1": lambda run, j: lookup_then_draft(run, j, alternatives=1),
        "  + 2nd choice at depths 1-2": lambda run, j: lookup_then_draft(run, j, alternatives=1, alt_depth=2),
        "  + 2nd and 3rd at depth 1": lambda run, j: lookup_then_draft(run, j, alternatives=2),
        "lookup and draft in one tree": lambda run, j: lookup_then_draft(run, j, together=True),
    }
    print(f"\n{'policy':32s} {'measured costs':>15s} {'v = 1':>7s} {'v = 1, c = 0':>13s}")
    for name, propose in policies.items():
        figures = [replay(runs, propose, c, measured), replay(runs, propose, c, lambda T: 1.0),
                   replay(runs, propose, 0.0, lambda T: 1.0)]
        print(f"{name:32s} {figures[0]:14.3f}x {figures[1]:6.3f}x {figures[2]:12.3f}x")
    free = replay(runs, lambda run, j: lookup_then_draft(run, j, k=8, stop_below=None), 0.0, lambda T: 1.0)
    print(f"\nlookup + draft at K = 8 with no stop, free verification and a free draft: {free:.3f}x")

    shipped = ranks[0] / total
    print(f"\nA draft that agrees more often: right wherever the shipped one is (agreement {shipped:.3f}), and at a")
    print("random share of the rest (seeded), with the confidence of one of its own right guesses there.")
    print("Lookup + stop, the measured v(T), and c as measured or a draft 2x / 4x as costly:")
    table = agreement_table(runs, c, measured)
    print(f"{'agreement':>10s} " + " ".join(f"{f'{m}c' if m > 1 else 'c':>8s}" for m in COST_MULTIPLES))
    for i, agreement in enumerate(AGREEMENTS):
        print(f"{agreement:10.2f} " + " ".join(f"{table[m][i]:7.3f}x" for m in COST_MULTIPLES))


if __name__ == "__main__":
    main(*sys.argv[1:2])
