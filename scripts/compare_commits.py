"""Two commits of the engine side by side in one run: the bench's systems, alternating per prompt.

    git worktree add /tmp/old <commit>
    python scripts/compare_commits.py --old /tmp/old --new . [--prompts 24] [--max-new-tokens 64]

Each checkout runs in a process of its own (the two are the same package, `specdec_lab`), loads the
default pair and builds the benchmark's systems with its own code (`bench.make_systems`: K = 2,
early stop, lookup + stop, the self-draft at K = 4, 6, 7, 8 and behind lookup, the 4-bit decode
alone). On every prompt one checkout runs every system, then the other; which goes first alternates
from prompt to prompt, so a noisy minute of the machine hits both alike. Prints, per system and
temperature, tokens per second under each checkout, new / old with a 95% bootstrap interval over the
prompts, and at temperature 0 whether the two checkouts gave the same tokens; then one JSON line.

`--serve` compares the batched server instead: each job is a group of 4 prompts submitted at once to
a `Server` (max_batch=4) at K = 0 (plain batched decoding) and K = 2, run until idle.
"""
import argparse
import json
import os
import random
import subprocess
import sys
from pathlib import Path

WORKER = r'''
import json, sys, time, torch
torch.set_num_threads(1)
import specdec_lab as sl
from specdec_lab import bench
try:
    from specdec_lab.cpu import best_weights
except ImportError:
    from specdec_lab.self_draft import best_weights
try:
    from specdec_lab.train.prompts import BENCH_PROMPTS
except ImportError:
    from specdec_lab.prompts import BENCH_PROMPTS
try:
    from specdec_lab.core.text import encode_prompt
except ImportError:
    from specdec_lab.text import encode_prompt
pair = sl.load_default_pair()
systems = bench.make_systems(pair.target, pair.draft, ks=(2,), adaptive=False, refinements=True,
                             self_draft=sl.SelfDraft(pair.target, best_weights(pair.target)))
ids = [encode_prompt(pair.tokenizer, p) for p in BENCH_PROMPTS]
for s in systems:
    s.run(ids[0], 16, 0.0, 0)  # warm-up
print(json.dumps([s.name for s in systems]), flush=True)
for line in sys.stdin:
    job = json.loads(line)
    out, r = {}, job["rotate"] % len(systems)
    for s in systems[r:] + systems[:r]:
        t0 = time.perf_counter()
        tokens, _ = s.run(ids[job["prompt"]], job["max_new_tokens"], job["temperature"], job["seed"])
        out[s.name] = [tokens, time.perf_counter() - t0]
    print(json.dumps(out), flush=True)
'''


SERVE_WORKER = r'''
import json, sys, time, torch
torch.set_num_threads(1)
import specdec_lab as sl
from specdec_lab.core.text import encode_prompt
from specdec_lab.train.prompts import BENCH_PROMPTS
pair = sl.load_default_pair()
ids = [encode_prompt(pair.tokenizer, p) for p in BENCH_PROMPTS]
servers = {f"server B=4 K={k}": sl.Server(pair.target, pair.draft, max_batch=4, max_seq_len=512, k=k) for k in (0, 2)}


def run(server, prompts, n, temperature, seed):
    hs = [server.submit(p, max_new_tokens=n, temperature=temperature, seed=seed + j) for j, p in enumerate(prompts)]
    server.run_until_idle()
    return [t for h in hs for t in h.result().tokens]


for s in servers.values():
    run(s, ids[:4], 8, 0.0, 0)  # warm-up
print(json.dumps(list(servers)), flush=True)
for line in sys.stdin:
    job = json.loads(line)
    out, names = {}, list(servers)
    group = [ids[(4 * job["prompt"] + j) % len(ids)] for j in range(4)]
    r = job["rotate"] % len(names)
    for name in names[r:] + names[:r]:
        t0 = time.perf_counter()
        tokens = run(servers[name], group, job["max_new_tokens"], job["temperature"], job["seed"])
        out[name] = [tokens, time.perf_counter() - t0]
    print(json.dumps(out), flush=True)
'''


def start(checkout, worker=WORKER):
    env = {**os.environ, "PYTHONPATH": str(Path(checkout).resolve()), "OMP_NUM_THREADS": "1"}
    p = subprocess.Popen([sys.executable, "-c", worker], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                         env=env, cwd="/")
    names = json.loads(p.stdout.readline())
    return p, names


def ask(p, job):
    p.stdin.write(json.dumps(job) + "\n")
    p.stdin.flush()
    return json.loads(p.stdout.readline())


def interval(new, old, resamples=2000, seed=0):
    """95% bootstrap interval of (sum of new tokens / new seconds) / (the same for old), over prompts."""
    rng, n, ratios = random.Random(seed), len(new), []
    for _ in range(resamples):
        pick = [rng.randrange(n) for _ in range(n)]
        tn, sn = sum(new[i][0] for i in pick), sum(new[i][1] for i in pick)
        to, so = sum(old[i][0] for i in pick), sum(old[i][1] for i in pick)
        ratios.append((tn / sn) / (to / so))
    ratios.sort()
    return ratios[int(0.025 * resamples)], ratios[int(0.975 * resamples) - 1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", required=True)
    ap.add_argument("--new", required=True)
    ap.add_argument("--prompts", type=int, default=24)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--temperatures", default="0,0.7")
    ap.add_argument("--serve", action="store_true", help="compare the batched server (4 requests at a time)")
    args = ap.parse_args()
    worker = SERVE_WORKER if args.serve else WORKER
    workers = {"old": start(args.old, worker), "new": start(args.new, worker)}
    names = workers["old"][1]
    if names != workers["new"][1]:
        raise SystemExit(f"the two checkouts build different systems: {names} / {workers['new'][1]}")
    doc = {"prompts": args.prompts, "max_new_tokens": args.max_new_tokens, "results": []}
    for temperature in (float(t) for t in args.temperatures.split(",")):
        runs = {v: {n: [] for n in names} for v in workers}  # version -> system -> [(tokens, seconds, ids)]
        for i in range(args.prompts):
            job = {"prompt": i, "temperature": temperature, "seed": i, "max_new_tokens": args.max_new_tokens,
                   "rotate": i}
            for v in (("old", "new") if i % 2 == 0 else ("new", "old")):
                for name, (tokens, seconds) in ask(workers[v][0], job).items():
                    runs[v][name].append((len(tokens), seconds, tokens))
            print(f"T={temperature:g} prompt {i + 1}/{args.prompts}", file=sys.stderr, flush=True)
        rows = {}
        for n in names:
            old, new = runs["old"][n], runs["new"][n]
            rate = {v: sum(r[0] for r in runs[v][n]) / sum(r[1] for r in runs[v][n]) for v in runs}
            rows[n] = {"old_tokens_per_second": rate["old"], "new_tokens_per_second": rate["new"],
                       "new_over_old": rate["new"] / rate["old"], "ci95": interval(new, old),
                       "same_tokens": sum(a[2] == b[2] for a, b in zip(old, new)) / len(old)}
        doc["results"].append({"temperature": temperature, "systems": rows})
        print(f"temperature {temperature:g}: tokens/s, old and new checkout side by side ({args.prompts} prompts)")
        print(f"{'system':20s} {'old':>8s} {'new':>8s} {'new/old':>8s} {'95% interval':>15s} {'same tokens':>12s}")
        for n, r in rows.items():
            lo, hi = r["ci95"]
            print(f"{n:20s} {r['old_tokens_per_second']:8.2f} {r['new_tokens_per_second']:8.2f} "
                  f"{r['new_over_old']:8.3f} {lo:7.3f}-{hi:.3f} {r['same_tokens']:12.2f}")
    for p, _ in workers.values():
        p.stdin.close()
        p.wait()
    print(json.dumps(doc))


if __name__ == "__main__":
    main()
