"""The figure of `bench --load --servers`' JSON document: for each server, plain and speculative,
end-to-end latency p50 against the open-loop request rate, and output tokens/s against the
closed-loop concurrency.

    python -m specdec_lab bench --load --servers --json | tail -n 1 > docs/serve_http_load.json
    python scripts/load_servers_figure.py docs/serve_http_load.json --out docs/serve_http_load.png
"""
import argparse
import json
from pathlib import Path

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from specdec_lab.lab.static_figures import png

COLORS = {"lab": "#1f77b4", "llamacpp": "#ff7f0e", "vllm": "#2ca02c"}


def figure(doc) -> go.Figure:
    fig = make_subplots(rows=1, cols=3, subplot_titles=(
        "open loop: e2e latency p50 (s)", "open loop: TPOT p50 (ms)", "closed loop: output tokens/s"))
    for name, d in doc["results"].items():
        server, mode = name.rsplit("_", 1)
        style = dict(color=COLORS.get(server), dash="solid" if mode == "speculative" else "dot")
        rates = sorted(d["open_loop"], key=float)
        clients = sorted(d["closed_loop"], key=int)
        common = dict(mode="lines+markers", line=style, legendgroup=name)
        fig.add_trace(go.Scatter(x=[float(r) for r in rates], y=[d["open_loop"][r]["e2e"]["p50"] for r in rates],
                                 name=f"{server}, {mode}", **common), row=1, col=1)
        fig.add_trace(go.Scatter(x=[float(r) for r in rates],
                                 y=[d["open_loop"][r]["tpot"]["p50"] * 1e3 for r in rates], showlegend=False,
                                 **common), row=1, col=2)
        fig.add_trace(go.Scatter(x=[int(c) for c in clients],
                                 y=[d["closed_loop"][c]["output_tokens_per_second"] for c in clients],
                                 showlegend=False, **common), row=1, col=3)
    fig.update_xaxes(title_text="requests per second", row=1, col=1)
    fig.update_xaxes(title_text="requests per second", row=1, col=2)
    fig.update_xaxes(title_text="clients", row=1, col=3)
    fig.update_layout(height=420, title="Three servers under one load, one thread each "
                                        "(dotted: plain, solid: the exported draft at K = 2)")
    return fig


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("doc", help="the JSON document of bench --load --servers")
    ap.add_argument("--out", default="docs/serve_http_load.png")
    args = ap.parse_args()
    doc = json.loads(Path(args.doc).read_text())
    Path(args.out).write_bytes(png(figure(doc), width=1200, height=420))
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
