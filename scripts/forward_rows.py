"""What one forward of the default target costs by its number of rows T, on the path the engine runs.

    OMP_NUM_THREADS=1 python scripts/forward_rows.py --out docs/forward_rows.json

The forward is the target of `load_default_pair()` with its defaults: on the CPU, the fast twin
(`accelerate=None`: the library's fused float32 kernels), called as the engine's verification calls
it, logits for every row. Each forward runs over T new rows after 64 cached positions and the cache
is rolled back after it (analysis.timing.forward_rows_rounds). The row counts are interleaved: each
round times every T once, in a shuffled order, so that noise on a shared machine hits them alike,
and each T's figure is the median over the rounds.

The file holds rows, ms_median, ratio_to_one_row (each median over the median at T = 1), threads,
the forward that ran and the date. ridge_rows is the largest T whose ratio to one row is at most
1.25 (RIDGE_RATIO): every T measured beyond it costs more than 1.25 forwards over one row. Up to
there extra rows ride on the one weight read almost free; past it the forward's cost grows with T.
A single row count below it may stand above 1.25 (on this machine T = 4 does, in every run: the
kernels' code for four rows, not noise) without moving it.
"""
import argparse
import datetime
import json
import statistics
from pathlib import Path

import torch

import specdec_lab as sl
from specdec_lab.analysis import timing

ROWS = [1, 2, 3, 4, 5, 6, 8, 9, 12, 17, 24, 33]
CONTEXT = 64
RIDGE_RATIO = 1.25


def ridge_rows(rows, ratios, limit=RIDGE_RATIO):
    """The largest T whose ratio to one row is at most limit."""
    return max(T for T, r in zip(rows, ratios) if r <= limit)


def measure(target, rows=ROWS, context=CONTEXT, rounds=31):
    """The file's figures (without threads, forward and date) from `rounds` interleaved rounds."""
    per_round = timing.forward_rows_rounds(target, rows, context=context, rounds=rounds)
    ms = [statistics.median(r[i] for r in per_round) * 1e3 for i in range(len(rows))]
    ratios = [m / ms[rows.index(1)] for m in ms]
    return {"rows": list(rows), "ms_median": [round(m, 2) for m in ms],
            "ratio_to_one_row": [round(r, 3) for r in ratios], "ridge_rows": ridge_rows(rows, ratios)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=31, help="interleaved rounds (default 31)")
    ap.add_argument("--out", default="docs/forward_rows.json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    target = sl.load_default_pair().target
    result = measure(target, rounds=args.rounds)
    result.update(threads=torch.get_num_threads(), forward="load_pair default (CPU fast path: accelerate=None, "
                  "fused float32 kernels), logits for every row", date=datetime.date.today().isoformat())
    for T, m, r in zip(result["rows"], result["ms_median"], result["ratio_to_one_row"]):
        print(f"T = {T:3d}: {m:7.1f} ms, {r:5.2f}x one row")
    print(f"ridge_rows (last T at <= {RIDGE_RATIO}x one row): {result['ridge_rows']}")
    lines = [f" {json.dumps(k)}: {json.dumps(v)}" for k, v in result.items()]
    Path(args.out).write_text("{\n" + ",\n".join(lines) + "\n}\n")


if __name__ == "__main__":
    main()
