"""The held-out curves of the draft training runs, from their checkpoints, as one JSON and one PNG.

    python scripts/draft_curves.py --eagle3 phase1=/path/train_x/ckpt.pt --eagle3 phase2=/path/train_y/ckpt.pt \
        --token token=/path/log.txt --out docs/draft_curves

The EAGLE-3-style runs' curves are the checkpoints' held-out agreement by depth (train/eagle3.py);
the token draft's is distill's log (held-out greedy agreement, its own measure: full vocabulary,
greedy answers only). Steps of a later phase continue the earlier one's count.
"""
import argparse
import json
from pathlib import Path

import plotly.graph_objects as go
import torch

from specdec_lab.lab.static_figures import png


def named(text):
    name, _, path = text.partition("=")
    if not name or not path:
        raise argparse.ArgumentTypeError(f"expected NAME=PATH, got {text!r}")
    return name, Path(path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--eagle3", type=named, action="append", default=[], help="NAME=ckpt.pt of an EAGLE-3-style run")
    ap.add_argument("--token", type=named, action="append", default=[], help="NAME=log.txt of a distill run")
    ap.add_argument("--out", required=True, help="writes OUT.json and OUT.png")
    args = ap.parse_args()
    runs, offset = {}, 0
    for name, path in args.eagle3:  # phases in order: each continues the step count of the one before
        curve = torch.load(path, weights_only=False)["curve"]
        runs[name] = {"kind": "eagle3", "steps": [offset + s for s, _ in curve],
                      "depths": [list(a) for _, a in curve]}
        offset += curve[-1][0]
    for name, path in args.token:
        rows = [line.split() for line in Path(path).read_text().splitlines() if line.startswith("step ")]
        runs[name] = {"kind": "token", "steps": [int(r[1]) for r in rows],
                      "held_out_alpha": [float(r[r.index("held_out_alpha") + 1]) for r in rows]}
    Path(args.out + ".json").write_text(json.dumps(runs, indent=1) + "\n")
    fig, colors = go.Figure(), ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"]
    for i, (name, r) in enumerate(runs.items()):  # a colour per run, a dash per depth
        color = colors[i % len(colors)]
        if r["kind"] == "eagle3":
            for d in range(len(r["depths"][0])):
                fig.add_scatter(x=r["steps"], y=[a[d] for a in r["depths"]], mode="lines+markers",
                                name=f"{name}, depth {d + 1}",
                                line=dict(color=color, dash=["solid", "dash", "dot"][d % 3]))
        else:
            fig.add_scatter(x=r["steps"], y=r["held_out_alpha"], mode="lines+markers", line=dict(color=color),
                            name=f"{name} (greedy answers)")
    fig.update_layout(title="Held-out agreement while training", xaxis_title="optimizer step",
                      yaxis_title="agreement with the target's top token", template="plotly_white", height=450)
    Path(args.out + ".png").write_bytes(png(fig))
    print(f"wrote {args.out}.json and {args.out}.png")


if __name__ == "__main__":
    main()
