"""How many torch threads to decode with, alone and beside a busy process (docs/threads.json).

    python scripts/threads_bench.py [--tokens 48] [--rounds 3] [--out docs/threads.json]

On a machine of two cores, two OpenMP threads run fast while both cores are free and collapse when
another process takes one: a thread that loses its core holds up the other at every barrier, and an
OpenMP thread waiting at a barrier spins on its core before it sleeps. This measures the default
pair's plain decode and the default engine (K = 4), greedy, in a fresh process per configuration
(OpenMP reads its settings once, at start): 1 and 2 threads, OpenMP's default wait policy and
OMP_WAIT_POLICY=PASSIVE (a waiting thread sleeps at once), and the library's own default (neither
set, specdec_lab imported first), each alone and beside a busy process (one thread of float32 matrix
products, as another user's job would be). Configurations run in rotating
order, `--rounds` times; the figure is the median tokens/s of a configuration's rounds.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "Why is the sky blue?"
# (threads, wait policy); "library": neither set, and specdec_lab imported before torch, as a user's program
# or the command line does (the package sets its own default wait policy then: specdec_lab/__init__.py)
CONFIGS = [(threads, policy) for threads in (1, 2) for policy in ("default", "passive")] + [("library", "library")]
BUSY = "import torch\ntorch.set_num_threads(1)\na = torch.randn(1024, 1024)\nwhile True:\n    a @ a\n"
MEASURE = """
import json, sys
if sys.argv[3] == "library":
    import specdec_lab as sl
import torch
import specdec_lab as sl
tokens = int(sys.argv[1])
pair = sl.load_default_pair()
engine = sl.SpeculativeEngine(pair.target, pair.draft, k=4)
out = {"threads": torch.get_num_threads()}
for name, run in (("plain", lambda: sl.autoregressive_generate(pair.target, sys.argv[2], max_new_tokens=tokens)),
                  ("speculative", lambda: engine.generate(sys.argv[2], max_new_tokens=tokens))):
    run()  # warm-up
    s = run().stats
    out[name] = s.new_tokens / s.seconds
print(json.dumps(out))
"""


def measure(threads, policy, tokens):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for name in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY"):
        env.pop(name, None)
    if threads != "library":
        env["OMP_NUM_THREADS"] = str(threads)
    if policy == "passive":
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    proc = subprocess.run([sys.executable, "-c", MEASURE, str(tokens), PROMPT, policy], env=env,
                          capture_output=True, text=True, timeout=900)
    if proc.returncode:
        raise RuntimeError(proc.stderr[-2000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, default=48, help="new tokens per call (default %(default)s)")
    p.add_argument("--rounds", type=int, default=3, help="rounds of every configuration (default %(default)s)")
    p.add_argument("--out", default="docs/threads.json", help="where to store the document")
    args = p.parse_args()
    runs = {f"{t}_{pol}_{load}": [] for t, pol in CONFIGS for load in ("alone", "busy")}
    for r in range(args.rounds):
        order = CONFIGS[r % len(CONFIGS):] + CONFIGS[:r % len(CONFIGS)]
        for load in ("alone", "busy"):
            busy = subprocess.Popen([sys.executable, "-c", BUSY]) if load == "busy" else None
            try:
                time.sleep(1 if busy else 0)
                for threads, policy in order:
                    m = measure(threads, policy, args.tokens)
                    runs[f"{threads}_{policy}_{load}"].append(m)
                    print(f"round {r + 1}, threads {threads}, wait policy {policy}, {load}: {m['threads']} "
                          f"thread(s), plain "
                          f"{m['plain']:.1f} tokens/s, speculative {m['speculative']:.1f}", flush=True)
            finally:
                if busy:
                    busy.kill()
                    busy.wait()
    median = {name: {kind: statistics.median(m[kind] for m in ms) for kind in ("plain", "speculative")}
              for name, ms in runs.items()}
    doc = {"measured_at": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "command": f"python scripts/threads_bench.py --tokens {args.tokens} --rounds {args.rounds}",
           "cores": os.cpu_count(), "prompt": PROMPT, "tokens": args.tokens,
           "busy_process": "one thread of 1024 x 1024 float32 matrix products in a loop",
           "median_tokens_per_second": median, "runs": runs}
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    for name, m in median.items():
        print(f"{name:22s} plain {m['plain']:6.1f}  speculative {m['speculative']:6.1f} tokens/s")
    print(f"stored {args.out}")


if __name__ == "__main__":
    main()
