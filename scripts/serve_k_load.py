"""`serve`'s K policies under closed-loop load, each against plain batched decoding of the same run
(docs/benchmarks.md, section 37).

    python scripts/serve_k_load.py [--runs 3] [--out docs/serve_k_load.json]

For each run, and each of `--k 0` (plain batched decoding), the default (`--k goodput`) and a fixed
`--k 4`, in an order rotated from run to run: `python -m specdec_lab serve` starts in a child
process with one torch thread, `bench --load`'s client sends 16 greedy chat requests of 64 tokens
with 1, 4 and 8 clients, and the server stops. The document keeps every run's output tokens/s and
each system's ratio over plain decoding in the same run; the noise of a ratio is the spread of
those per-run ratios. The figure: each system's per-run ratios and their median, by clients.
"""
import argparse
import json
import statistics
import time
from pathlib import Path

import plotly.graph_objects as go

from specdec_lab.bench.load import LoadConfig, run_load
from specdec_lab.bench.load_servers import LabServer
from specdec_lab.lab.static_figures import png
from specdec_lab.train.prompts import BENCH_PROMPTS

SYSTEMS = ("0", "goodput", "4")
LABELS = {"0": "--k 0 (plain)", "goodput": "default (--k goodput)", "4": "--k 4"}
COLORS = {"goodput": "#1f77b4", "4": "#ff7f0e"}


def measure(runs, clients, requests, max_tokens, log=print) -> dict:
    tps = {s: {str(c): [] for c in clients} for s in SYSTEMS}
    for i in range(runs):
        order = SYSTEMS[i % len(SYSTEMS):] + SYSTEMS[:i % len(SYSTEMS)]
        for k in order:
            with LabServer(k, threads=1) as lab:
                cfg = LoadConfig(base_url=lab.base_url, prompts=list(BENCH_PROMPTS), max_tokens=max_tokens,
                                 rates=(), concurrencies=tuple(clients), requests=requests)
                doc = run_load(cfg)
            for c in clients:
                phase = doc["closed_loop"][str(c)]
                if phase["ok"] != requests:
                    raise RuntimeError(f"--k {k}, {c} clients: {phase['ok']} of {requests} requests completed: "
                                       f"{phase['errors'][:3]}")
                tps[k][str(c)].append(phase["output_tokens_per_second"])
            log(f"run {i + 1}, --k {k:8s}: " + ", ".join(f"{c} clients {tps[k][str(c)][-1]:.1f} tokens/s"
                                                          for c in clients))
    over = {k: {c: [a / b for a, b in zip(tps[k][c], tps["0"][c])] for c in tps[k]} for k in SYSTEMS[1:]}
    summary = {k: {c: {"median": statistics.median(r), "min": min(r), "max": max(r)} for c, r in over[k].items()}
               for k in over}
    plain_spread = {c: max(v) / min(v) - 1 for c, v in tps["0"].items()}
    return {"tokens_per_second": tps, "over_plain": over, "over_plain_summary": summary,
            "plain_run_spread": plain_spread}


def figure(doc) -> go.Figure:
    fig = go.Figure()
    fig.add_hline(y=1.0, line_dash="dot", annotation_text="plain batched decoding (--k 0), same run")
    for k, by_c in doc["over_plain"].items():
        clients = sorted(by_c, key=int)
        for j, c in enumerate(clients):
            fig.add_trace(go.Scatter(x=[int(c)] * len(by_c[c]), y=by_c[c], mode="markers", opacity=0.45,
                                     marker=dict(color=COLORS[k], size=7), showlegend=False, legendgroup=k))
        fig.add_trace(go.Scatter(x=[int(c) for c in clients],
                                 y=[doc["over_plain_summary"][k][c]["median"] for c in clients],
                                 mode="lines+markers", name=LABELS[k], line=dict(color=COLORS[k]), legendgroup=k))
    fig.update_xaxes(title_text="concurrent clients", type="log", tickvals=[1, 2, 4, 8])
    fig.update_yaxes(title_text="output tokens/s over --k 0")
    fig.update_layout(height=420, width=720, title=f"serve's K under load: runs (dots), median (lines), "
                                                   f"{doc['config']['runs']} runs, one thread")
    return fig


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=3, help="runs of each system (default %(default)s)")
    p.add_argument("--clients", default="1,4,8", help="closed-loop client counts (default %(default)s)")
    p.add_argument("--requests", type=int, default=16, help="requests per client count (default %(default)s)")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens per answer (default %(default)s)")
    p.add_argument("--out", default="docs/serve_k_load.json", help="where to store the document (default "
                   "%(default)s; the figure goes beside it as .png)")
    args = p.parse_args()
    clients = tuple(int(c) for c in args.clients.split(","))
    t0 = time.perf_counter()
    doc = measure(args.runs, clients, args.requests, args.max_tokens)
    doc = {"date": time.strftime("%Y-%m-%d", time.gmtime()),
           "command": f"python scripts/serve_k_load.py --runs {args.runs} --clients {args.clients} "
                      f"--requests {args.requests} --max-tokens {args.max_tokens}",
           "config": {"runs": args.runs, "clients": list(clients), "requests": args.requests,
                      "max_tokens": args.max_tokens, "threads": 1, "endpoint": "chat", "temperature": 0.0},
           "seconds": round(time.perf_counter() - t0), **doc}
    out = Path(args.out)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    out.with_suffix(".png").write_bytes(png(figure(doc), width=720))
    for k, by_c in doc["over_plain_summary"].items():
        print(f"{LABELS[k]:24s}" + "  ".join(f"{c} clients {s['median']:.2f}x ({s['min']:.2f}-{s['max']:.2f})"
                                              for c, s in by_c.items()))
    print(f"stored {out} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
