"""The figure of `bench --serve`'s JSON document: throughput over plain batched decoding against
batch size for each system (each system's median run over plain's median run; the bars span its
slowest and fastest runs), and open-loop p50 / p99 latency against request rate.

    python -m specdec_lab bench --serve --threads 1 | tail -n 1 > docs/serve_load.json
    python scripts/bench_serve_figure.py docs/serve_load.json --out docs/serve_load.png
"""
import argparse
import json
import statistics
from pathlib import Path

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from specdec_lab.lab.static_figures import png


def figure(doc) -> go.Figure:
    fig = make_subplots(rows=1, cols=2, subplot_titles=(
        "closed loop: tokens/s over plain (median run; bars: all runs)", "open loop: latency against request rate"))
    sizes = [int(b) for b in doc["config"]["batch_sizes"]]
    runs = doc["closed_loop_runs"]
    for system, ratios in doc["median_over_plain"].items():
        plain = [statistics.median(runs["plain"][str(b)]) for b in sizes]
        y = [ratios[str(b)] for b in sizes]
        lo = [y[i] - min(runs[system][str(b)]) / plain[i] for i, b in enumerate(sizes)]
        hi = [max(runs[system][str(b)]) / plain[i] - y[i] for i, b in enumerate(sizes)]
        fig.add_trace(go.Scatter(x=sizes, y=y, mode="lines+markers", name=system,
                                 error_y=dict(type="data", array=hi, arrayminus=lo, thickness=1)), row=1, col=1)
    rates = doc["config"]["rates"]
    for system, rows in doc["open_loop"].items():
        for q, dash in (("latency_p50", "solid"), ("latency_p99", "dot")):
            fig.add_trace(go.Scatter(x=rates, y=[rows[str(r)][q] for r in rates], mode="lines+markers",
                                     line=dict(dash=dash), name=f"{system} {q[8:]}"), row=1, col=2)
    fig.add_hline(y=1.0, line=dict(color="gray", dash="dash"), row=1, col=1)
    fig.update_xaxes(title_text="batch size (requests in flight)", type="log", tickvals=sizes, row=1, col=1)
    fig.update_xaxes(title_text="requests per second (Poisson)", row=1, col=2)
    fig.update_yaxes(title_text="throughput / plain", row=1, col=1)
    fig.update_yaxes(title_text="seconds from arrival to end", row=1, col=2)
    fig.update_layout(title="Speculation under load (bench --serve)", height=450)
    return fig


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("doc", type=Path, help="the JSON document bench --serve printed last")
    ap.add_argument("--out", type=Path, required=True, help="the PNG to write")
    args = ap.parse_args()
    args.out.write_bytes(png(figure(json.loads(args.doc.read_text())), width=1100))


if __name__ == "__main__":
    main()
