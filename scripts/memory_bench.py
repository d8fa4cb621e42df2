"""Resident memory of the default pair, an engine and a server, each stage in a fresh process (docs/memory.json).

    python scripts/memory_bench.py [--out docs/memory.json]

A stage's figure is the process's resident set (VmRSS) and its peak (VmHWM) after that stage, in a
process that ran the stages before it: importing torch and the package, `load_default_pair()`, one
`SpeculativeEngine` answering one prompt (the CPU fast path builds its weight copies on first use),
and a `Server(max_batch=8)` answering eight prompts at once. Beside them, the bytes of the weights
themselves, so that each figure reads as a multiple of them, the server's KV pools (what a server should
add to an engine), and what the mapping of the target's weights file (io/weights.py) keeps resident:
the fast path reads each weight once to build its panels and hands its pages back.
"""
import argparse
import json
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STAGES = ["import", "pair", "engine", "server"]
MEASURE = """
import json, sys
def status():
    fields = dict(l.split(":", 1) for l in open("/proc/self/status"))
    return {k: int(fields[k].split()[0]) * 1024 for k in ("VmRSS", "VmHWM")}
stage = sys.argv[1]
import torch
import specdec_lab as sl
out = {}
if stage != "import":
    pair = sl.load_default_pair()
    out["weights_bytes"] = sum(p.numel() * p.element_size() for m in (pair.target, pair.draft) for p in m.parameters())
if stage == "engine":
    sl.SpeculativeEngine(pair.target, pair.draft, k=4).generate("Why is the sky blue?", max_new_tokens=32)
if stage == "server":
    from specdec_lab.core.text import encode_prompt
    from specdec_lab.serve import Server
    from specdec_lab.train.prompts import BENCH_PROMPTS
    server = Server(pair.target, pair.draft, max_batch=8, k=4)
    for p in BENCH_PROMPTS[:8]:
        server.submit(encode_prompt(pair.tokenizer, p), max_new_tokens=32)
    server.run_until_idle()
    out["pool_bytes"] = sum(t.numel() * t.element_size() for kv in (server.engine.target_kv, server.engine.draft_kv)
                            for t in (kv.k, kv.v))
smaps = open("/proc/self/smaps").read().split("\\n")
out["mapped_resident_bytes"] = sum(int(next(m for m in smaps[i:] if m.startswith("Rss:")).split()[1]) * 1024
                                   for i, l in enumerate(smaps) if l.endswith("/lab/layout.pt"))
print(json.dumps({**out, **status()}))
"""


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="docs/memory.json", help="where to store the document")
    args = p.parse_args()
    stages = {}
    for stage in STAGES:
        proc = subprocess.run([sys.executable, "-c", MEASURE, stage], capture_output=True, text=True, timeout=900,
                              env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT),
                                   "HOME": str(Path.home())})
        if proc.returncode:
            raise RuntimeError(proc.stderr[-2000:])
        stages[stage] = json.loads(proc.stdout.strip().splitlines()[-1])
        s = stages[stage]
        print(f"{stage:8s} resident {s['VmRSS'] / 1e6:7.0f} MB, peak {s['VmHWM'] / 1e6:7.0f} MB "
              f"(the weights file's mapping: {s['mapped_resident_bytes'] / 1e6:.0f} MB resident)"
              + (f"; the KV pools {s['pool_bytes'] / 1e6:.0f} MB" if "pool_bytes" in s else ""), flush=True)
    weights = stages["pair"]["weights_bytes"]
    doc = {"measured_at": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "command": "python scripts/memory_bench.py", "weights_bytes": weights,
           "pool_bytes": stages["server"]["pool_bytes"],
           "stages": {k: {"resident_bytes": v["VmRSS"], "peak_bytes": v["VmHWM"],
                          "mapped_resident_bytes": v["mapped_resident_bytes"]} for k, v in stages.items()}}
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    engine = stages["engine"]["VmHWM"]
    added = stages["server"]["VmRSS"] - stages["engine"]["VmRSS"]
    print(f"the pair's weights: {weights / 1e6:.0f} MB; the pair and one engine peaked at {engine / 1e6:.0f} MB "
          f"({engine / weights:.2f}x the weights); the server added {added / 1e6:.0f} MB "
          f"to an engine, its KV pools {stages['server']['pool_bytes'] / 1e6:.0f} MB; stored {args.out}")


if __name__ == "__main__":
    main()
