"""Plotly figures for the chapters: pure functions of results, no measuring and no models.

Each function takes numbers (or a result object the library returned) and gives
back a go.Figure; calling it twice on the same input gives the same figure. The
core never imports this module (the layers: docs/design.md).

`show(fig)` is how a chapter displays a figure: interactive in JupyterLab, and a PNG of it
stored in the same output, so that a chapter read where no JavaScript runs (GitHub, nbviewer)
still shows its figures (static_figures.py, re-exported here).
"""
import math

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..analysis.roofline import attainable_flops, expected_speedup
from .static_figures import browser_path, figure_bundle, png, show  # noqa: F401 (re-exported)
from .trace import show_piece

COLORS = {"contiguous": "#d62728", "paged": "#1f77b4"}
GOOD, BAD, NEUTRAL = "#2ca02c", "#d62728", "#7f7f7f"
WHITE, BLUE = "#f7f7f7", "#08519c"
PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf"]


def _log_range(lo, hi, n=60):
    a, b = math.log10(lo), math.log10(hi)
    return [10 ** (a + (b - a) * i / (n - 1)) for i in range(n)]


# --------------------------------------------------------------------------- chapter 01


def roofline_figure(machines, points=(), title="Roofline") -> go.Figure:
    """Log-log roofline. machines: {name: (peak_flops, bandwidth)} drawn as min(peak, I x bw);
    points: dicts with label, intensity (FLOP/byte) and flops (FLOP/s achieved)."""
    fig = go.Figure()
    lo = min([0.1] + [p["intensity"] / 2 for p in points])
    hi = max([1e4] + [p["intensity"] * 2 for p in points])
    xs = _log_range(lo, hi)
    for i, (name, (peak, bw)) in enumerate(machines.items()):
        fig.add_trace(go.Scatter(x=xs, y=[attainable_flops(x, peak, bw) for x in xs], mode="lines", name=name,
                                 line=dict(color=PALETTE[i % len(PALETTE)], dash="solid" if i == 0 else "dash")))
    for p in points:
        fig.add_trace(go.Scatter(x=[p["intensity"]], y=[p["flops"]], mode="markers+text", name=p["label"],
                                 text=[p["label"]], textposition="top center", marker=dict(size=10),
                                 showlegend=False))
    fig.update_xaxes(type="log", title_text="arithmetic intensity (FLOP / byte)")
    fig.update_yaxes(type="log", title_text="attainable FLOP/s")
    fig.update_layout(title=title, height=480)
    return fig


def forward_cost_figure(tokens, seconds, predicted=None, title="Cost of one forward over T tokens") -> go.Figure:
    """Left: seconds per forward against T; right: seconds per token (= per forward / T).
    `predicted` (optional) is a roofline prediction of the per-forward seconds, drawn dashed."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("ms per forward", "ms per token"))
    ms = [s * 1e3 for s in seconds]
    fig.add_trace(go.Scatter(x=tokens, y=ms, mode="lines+markers", name="measured", line=dict(color=PALETTE[0])),
                  row=1, col=1)
    fig.add_trace(go.Scatter(x=tokens, y=[m / t for m, t in zip(ms, tokens)], mode="lines+markers",
                             name="measured, per token", line=dict(color=PALETTE[0]), showlegend=False), row=1, col=2)
    if predicted is not None:
        pm = [s * 1e3 for s in predicted]
        fig.add_trace(go.Scatter(x=tokens, y=pm, mode="lines", name="roofline prediction",
                                 line=dict(color=NEUTRAL, dash="dash")), row=1, col=1)
        fig.add_trace(go.Scatter(x=tokens, y=[m / t for m, t in zip(pm, tokens)], mode="lines",
                                 line=dict(color=NEUTRAL, dash="dash"), showlegend=False), row=1, col=2)
    fig.update_xaxes(type="log", title_text="tokens per forward T")
    fig.update_yaxes(rangemode="tozero")
    fig.update_layout(title=title, height=420)
    return fig


# --------------------------------------------------------------------------- chapter 02


def distribution_figure(probs, counts_by_name, pvalues=None, labels=None) -> go.Figure:
    """One row per sampler: its observed frequency of each outcome (bars) against the exact
    probability (black markers). probs: {outcome: p}; counts_by_name: {name: {outcome: count}};
    pvalues: {name: chi-square p-value} for the row titles; labels: {outcome: text} for the x axis."""
    outcomes = sorted(probs, key=lambda x: (-probs[x], x))
    xs = [labels[x] if labels else " ".join(map(str, x)) for x in outcomes]
    names = list(counts_by_name)
    titles = [f"{n}: chi-square p = {pvalues[n]:.2g}" if pvalues else n for n in names]
    fig = make_subplots(rows=len(names), cols=1, shared_xaxes=True, subplot_titles=titles, vertical_spacing=0.08)
    for i, name in enumerate(names, start=1):
        counts = counts_by_name[name]
        n = sum(counts.values())
        ok = pvalues is None or pvalues[name] > 1e-3
        fig.add_trace(go.Bar(x=xs, y=[counts.get(x, 0) / n for x in outcomes], name=name,
                             marker_color=GOOD if ok else BAD, showlegend=False), row=i, col=1)
        fig.add_trace(go.Scatter(x=xs, y=[probs[x] for x in outcomes], mode="markers", name="exact",
                                 marker=dict(color="black", symbol="line-ew-open", size=14, line=dict(width=2)),
                                 showlegend=i == 1), row=i, col=1)
        fig.update_yaxes(title_text="frequency", row=i, col=1)
    fig.update_xaxes(title_text="generated sequence", tickangle=-60, row=len(names), col=1)
    fig.update_layout(title="Empirical frequency (bars) against the target's exact probability (markers)",
                      height=260 * len(names) + 120, bargap=0.15)
    return fig


def acceptance_figure(p, q, labels=None) -> go.Figure:
    """The acceptance rule at one position, over a small vocabulary. Stacked bars: min(p, q), the
    mass a drafted token is accepted through (shaded), and on top the residual max(0, p - q),
    the mass the correction supplies; together they are p. q is drawn as open markers.
    p, q: probabilities (lists or 1-D tensors of the same length); labels: one per token."""
    p, q = [float(x) for x in p], [float(x) for x in q]
    if len(p) != len(q) or not p:
        raise ValueError(f"p and q must be non-empty and of one length, got {len(p)} and {len(q)}")
    xs = list(labels) if labels is not None else [str(i) for i in range(len(p))]
    accepted = [min(a, b) for a, b in zip(p, q)]
    residual = [max(0.0, a - b) for a, b in zip(p, q)]
    beta = sum(accepted)
    fig = go.Figure()
    fig.add_trace(go.Bar(x=xs, y=accepted, name="min(p, q): accepted", marker_color=GOOD, opacity=0.75))
    fig.add_trace(go.Bar(x=xs, y=residual, base=accepted, name="max(0, p - q): the residual",
                         marker=dict(color="white", line=dict(color=BAD, width=2), pattern_shape="/",
                                     pattern_fgcolor=BAD)))
    fig.add_trace(go.Scatter(x=xs, y=p, mode="markers", name="p, the target",
                             marker=dict(color="black", symbol="line-ew-open", size=22, line=dict(width=3))))
    fig.add_trace(go.Scatter(x=xs, y=q, mode="markers", name="q, the draft",
                             marker=dict(color=PALETTE[0], symbol="diamond-open", size=11, line=dict(width=2))))
    fig.update_layout(barmode="overlay", height=420, yaxis_title="probability", xaxis_title="token",
                      title=f"Accepted mass sum min(p, q) = {beta:.3f}; the residual holds the other {1 - beta:.3f}",
                      legend=dict(orientation="h", y=-0.2))
    return fig


def pvalue_histogram_figure(pvalues_by_name, bins=10, threshold=1e-3, colors=None) -> go.Figure:
    """Histograms of chi-square p-values, one per sampler ({name: [p-value per run]}), on [0, 1]
    in `bins` equal bins, as a share of each sampler's runs. A sampler distributed as the target
    gives uniform p-values: every bin near 1 / bins (dashed). The samplers' bars stand side by side
    in each bin, so that none hides another. `threshold` is marked.
    colors: {name: colour} for some samplers (e.g. GOOD, BAD); the others take PALETTE's."""
    if isinstance(bins, bool) or not isinstance(bins, int) or bins < 2:
        raise ValueError(f"bins must be an int >= 2, got {bins!r}")
    fig = go.Figure()
    for i, (name, values) in enumerate(pvalues_by_name.items()):
        fig.add_trace(go.Histogram(x=list(values), name=f"{name} ({len(values)} runs)", histnorm="probability",
                                   xbins=dict(start=0.0, end=1.0, size=1.0 / bins),
                                   marker_color=(colors or {}).get(name, PALETTE[i % len(PALETTE)])))
    fig.add_hline(y=1.0 / bins, line=dict(color="black", dash="dash"), annotation_text="uniform",
                  annotation_position="top right")
    fig.add_vline(x=threshold, line=dict(color=BAD, dash="dot"))
    fig.update_xaxes(title_text="chi-square p-value", range=[0, 1])
    fig.update_yaxes(title_text="share of runs")
    fig.update_layout(barmode="group", bargroupgap=0.05, height=400, legend=dict(orientation="h", y=-0.25),
                      title="What passing looks like: p-values of many runs, each run a fresh set of seeds")
    return fig


# Speedups and their colours: white at break-even, then blues that darken by speedup (not by the share
# of the range), so that 1.5x looks the same in every heatmap and a gain of 1.2x is already visible.
SPEEDUP_STOPS = [(1.0, WHITE), (1.1, "#c6dbef"), (1.25, "#9ecae1"), (1.5, "#6baed6"), (2.0, "#4292c6"),
                 (3.0, "#2171b5"), (5.0, BLUE)]


def _speedup_scale(lo, hi):
    """(colour scale, zmin, zmax) for speedups in [lo, hi]: SPEEDUP_STOPS at their own speedups, red at
    lo when lo < 1. The range runs from min(lo, 1) to at least the last stop, so the stops never move."""
    zmin, zmax = min(lo, 1.0), max(hi, SPEEDUP_STOPS[-1][0])
    stops = ([(zmin, BAD)] if zmin < 1.0 else []) + SPEEDUP_STOPS + [(zmax, BLUE)]
    return [[(x - zmin) / (zmax - zmin), colour] for x, colour in stops if x <= zmax], zmin, zmax


def speedup_heatmap(alphas, ks, c) -> go.Figure:
    """Expected speedup (arXiv 2211.17192, Theorem 3.8) over alpha (x) and K (y) for one c,
    with the best K for each alpha marked and the break-even contour at 1."""
    z = [[expected_speedup(a, k, c) for a in alphas] for k in ks]
    best = [max(ks, key=lambda k: expected_speedup(a, k, c)) for a in alphas]
    scale, zmin, zmax = _speedup_scale(min(map(min, z)), max(map(max, z)))
    fig = go.Figure(go.Heatmap(x=alphas, y=ks, z=z, colorscale=scale, zmin=zmin, zmax=zmax,
                               colorbar=dict(title="speedup"),
                               hovertemplate="alpha %{x:.2f}, K %{y}: %{z:.2f}x<extra></extra>"))
    fig.add_trace(go.Contour(x=alphas, y=ks, z=z, contours=dict(start=1, end=1, coloring="none",
                                                                   showlabels=True),
                             line=dict(color="black", width=2, dash="dot"), showscale=False, name="speedup = 1",
                             hoverinfo="skip"))
    fig.add_trace(go.Scatter(x=alphas, y=best, mode="lines+markers", name="best K",
                             line=dict(color="black"), marker=dict(size=5)))
    fig.update_layout(title=f"Expected speedup over alpha and K, c = {c}", height=480,
                      xaxis_title="acceptance rate alpha", yaxis_title="draft length K",
                      legend=dict(orientation="h", x=0, y=1.02, yanchor="bottom"))
    return fig


# --------------------------------------------------------------------------- chapter 04


def cache_drift_figure(steps_by_name, missing_by_name) -> go.Figure:
    """Top: draft tokens accepted per step; bottom: committed tokens the draft has neither cached
    nor pending after each step (pitfalls.draft_lag). steps_by_name / missing_by_name: {name: [int per step]}."""
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.1,
                        subplot_titles=("draft tokens accepted per step",
                                        "committed tokens neither cached nor pending (draft_lag)"))
    for i, name in enumerate(steps_by_name):
        color = PALETTE[i % len(PALETTE)]
        acc = steps_by_name[name]
        fig.add_trace(go.Scatter(x=list(range(len(acc))), y=acc, mode="lines+markers", name=name,
                                 line=dict(color=color), legendgroup=name), row=1, col=1)
        miss = missing_by_name[name]
        fig.add_trace(go.Scatter(x=list(range(len(miss))), y=miss, mode="lines+markers", name=name,
                                 line=dict(color=color), legendgroup=name, showlegend=False), row=2, col=1)
    fig.update_yaxes(title_text="accepted", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="tokens", rangemode="tozero", row=2, col=1)
    fig.update_xaxes(title_text="step", row=2, col=1)
    fig.update_layout(title="The draft's cache after rollback: a correct rollback against an off-by-one", height=560)
    return fig


# --------------------------------------------------------------------------- chapter 05


def mask_figure(mask, L, labels=None) -> go.Figure:
    """The additive mask (T, L+T) as a picture: allowed (0) light, blocked (-inf) dark.
    L cached positions on the left, then the T new ones; labels name the T new tokens."""
    T, S = mask.shape[-2], mask.shape[-1]
    m = mask.reshape(T, S)
    z = [[1 if float(m[i, j]) == 0 else 0 for j in range(S)] for i in range(T)]
    cols = [f"cache {j}" for j in range(L)] + (list(labels) if labels else [f"new {j}" for j in range(T)])
    rows = list(labels) if labels else [f"new {i}" for i in range(T)]
    fig = go.Figure(go.Heatmap(z=z, x=cols, y=rows, colorscale=[[0, "#222222"], [1, "#9ecae1"]], showscale=False,
                               xgap=2, ygap=2, hovertemplate="query %{y} -> key %{x}<extra></extra>"))
    fig.add_vline(x=L - 0.5, line=dict(color=BAD, width=2))
    fig.update_yaxes(autorange="reversed", title_text="query (new token)")
    fig.update_xaxes(title_text="key: cached positions | new positions", tickangle=-45)
    fig.update_layout(title=f"Verification mask: L = {L} cached, T = {T} new (light = attend, dark = -inf)",
                      height=160 + 40 * T)
    return fig


def logit_difference_figure(positions, diffs_by_name) -> go.Figure:
    """Max |logit difference| against K+1 single-token passes, per position, log scale.
    diffs_by_name: {name: [float per position]}; zeros are drawn at the float32 floor."""
    fig = go.Figure()
    for i, (name, diffs) in enumerate(diffs_by_name.items()):
        fig.add_trace(go.Bar(x=positions, y=[max(d, 1e-8) for d in diffs], name=name,
                             marker_color=[GOOD, BAD, NEUTRAL][i % 3]))
    fig.update_yaxes(type="log", title_text="max |logit difference|")
    fig.update_xaxes(title_text="position in the verification pass")
    fig.update_layout(title="One K+1 pass against K+1 single-token passes", barmode="group", height=420)
    return fig


# --------------------------------------------------------------------------- chapter 06


def verify_cost_figure(ks, seconds_by_name, syncs_by_name) -> go.Figure:
    """Left: microseconds per verification against K; right: host syncs per verification.
    seconds_by_name / syncs_by_name: {name: [value per K]}."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("time per verification (us)", "host syncs per verification"))
    for i, name in enumerate(seconds_by_name):
        color = PALETTE[i % len(PALETTE)]
        fig.add_trace(go.Scatter(x=ks, y=[s * 1e6 for s in seconds_by_name[name]], mode="lines+markers", name=name,
                                 line=dict(color=color), legendgroup=name), row=1, col=1)
        fig.add_trace(go.Scatter(x=ks, y=syncs_by_name[name], mode="lines+markers", name=name,
                                 line=dict(color=color), legendgroup=name, showlegend=False), row=1, col=2)
    fig.update_xaxes(title_text="draft length K")
    fig.update_yaxes(rangemode="tozero")
    fig.update_layout(title="Reference loop against the vectorised verifier", height=420)
    return fig


# --------------------------------------------------------------------------- chapter 13


def fragmentation_figure(result) -> go.Figure:
    """Top: KV slots reserved (solid) and used (dotted) per engine step, for both
    designs. Bottom: requests running at once. The gap between a design's two top
    lines is memory it holds but does not use. `result` is paged.simulate_fragmentation's."""
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=("KV memory: reserved vs used", "Concurrent requests"))
    for trace in (result.contiguous, result.paged):
        name, color = trace.design, COLORS[trace.design]
        steps = list(range(len(trace.reserved)))
        fig.add_trace(go.Scatter(x=steps, y=trace.reserved, name=f"{name}: reserved",
                                 line=dict(color=color), legendgroup=name), row=1, col=1)
        fig.add_trace(go.Scatter(x=steps, y=trace.used, name=f"{name}: used",
                                 line=dict(color=color, dash="dot"), legendgroup=name), row=1, col=1)
        fig.add_trace(go.Scatter(x=steps, y=trace.running,
                                 name=f"{name}: running (mean {trace.mean_concurrent:.0f} when memory-bound)",
                                 line=dict(color=color, width=1), legendgroup=name), row=2, col=1)
    memory = result.params["memory_tokens"]
    fig.add_hline(y=memory, line=dict(color="gray", dash="dash"), row=1, col=1,
                  annotation_text=f"memory: {memory} token slots", annotation_position="top left")
    c, p = result.contiguous, result.paged
    fig.update_layout(
        title=(f"Contiguous vs paged KV cache (P={result.params['block_size']}, K={result.params['k']}): "
               f"utilisation {c.utilisation:.0%} vs {p.utilisation:.0%}, "
               f"concurrency {c.mean_concurrent:.0f} vs {p.mean_concurrent:.0f}"),
        height=600, hovermode="x unified", legend=dict(groupclick="toggleitem"))
    fig.update_yaxes(title_text="KV token slots", row=1, col=1)
    fig.update_yaxes(title_text="requests", row=2, col=1)
    fig.update_xaxes(title_text="engine step", row=2, col=1)
    return fig


# --------------------------------------------------------------------------- chapters 07, 09 and 11

TRACE_COLORS = {"accepted": GOOD, "rejected": BAD, "discarded": "#c7c7c7", "correction": PALETTE[0],
                "bonus": "#e6a800"}


def _short(piece, n=8):
    text = show_piece(piece)
    return text if len(text) <= n else text[:n - 1] + "~"


def step_trace_figure(rows, title="One speculative run, step by step") -> go.Figure:
    """A grid with one row per step (trace.trace_rows rows): drafts d_1..d_K in columns 1..K coloured
    by their fate (accepted, rejected, discarded unverified), then the step's next token (correction
    or bonus) in a last column. One heatmap; the other traces only label the colours."""
    names = list(TRACE_COLORS)
    kmax = max([r["k"] for r in rows] + [1])
    z = [[None] * (kmax + 1) for _ in rows]  # code of the cell's fate, None where nothing was drafted
    text = [[""] * (kmax + 1) for _ in rows]
    hover = [[""] * (kmax + 1) for _ in rows]
    for j, r in enumerate(rows):
        fates = (["accepted"] * len(r["accepted"]) + ["rejected"] * len(r["rejected"])
                 + ["discarded"] * len(r["discarded"]))
        pieces = r["accepted_text"] + r["rejected_text"] + r["discarded_text"]
        kind = "bonus" if r["kind"] == "bonus" else "correction"  # a plain step's token is the target's too
        for i, (fate, piece) in [*enumerate(zip(fates, pieces)), (kmax, (kind, r["next_text"]))]:
            z[j][i], text[j][i], hover[j][i] = names.index(fate), _short(piece), f"{fate}: {piece!r}"
    scale = []
    for i, name in enumerate(names):  # value i fills the band [i, i+1) / len(names)
        scale += [[i / len(names), TRACE_COLORS[name]], [(i + 1) / len(names), TRACE_COLORS[name]]]
    fig = go.Figure(go.Heatmap(z=z, x=[f"d{i}" for i in range(1, kmax + 1)] + ["next"], y=[r["step"] for r in rows],
                               text=text, texttemplate="%{text}", textfont=dict(size=10), customdata=hover,
                               colorscale=scale, zmin=-0.5, zmax=len(names) - 0.5, showscale=False, xgap=3,
                               ygap=3, hovertemplate="step %{y}, %{x}: %{customdata}<extra></extra>"))
    for name in names:
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=name,
                                 marker=dict(symbol="square", size=12, color=TRACE_COLORS[name])))
    fig.update_xaxes(side="top")  # the columns: draft slots d1..dK, then the token the target chose
    fig.update_yaxes(autorange="reversed", title_text="step", dtick=1)
    fig.update_layout(title=title, height=160 + 24 * len(rows), plot_bgcolor="white",
                      legend=dict(orientation="h", y=-0.02, yanchor="top", x=0))
    return fig


def k_sweep_figure(ks, tokens_per_step, speedup, predicted_tokens_per_step=None, predicted_speedups=None,
                   title="Sweep over the draft length K") -> go.Figure:
    """Left: mean tokens per step against K (measured markers; a prediction dashed; the K+1
    ceiling dotted). Right: speedup over autoregressive decoding against K, measured, with any
    predictions given as {label: [value per K]}, and break-even at 1."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("tokens per step", "speedup over autoregressive"))
    fig.add_trace(go.Scatter(x=ks, y=[k + 1 for k in ks], mode="lines", name="ceiling K+1",
                             line=dict(color=NEUTRAL, dash="dot")), row=1, col=1)
    fig.add_trace(go.Scatter(x=ks, y=tokens_per_step, mode="lines+markers", name="measured",
                             line=dict(color=PALETTE[0]), legendgroup="measured"), row=1, col=1)
    if predicted_tokens_per_step is not None:
        fig.add_trace(go.Scatter(x=ks, y=predicted_tokens_per_step, mode="lines", name="predicted from alpha",
                                 line=dict(color=PALETTE[1], dash="dash")), row=1, col=1)
    fig.add_trace(go.Scatter(x=ks, y=speedup, mode="lines+markers", name="measured speedup",
                             line=dict(color=PALETTE[4])), row=1, col=2)   # its own colour: not tokens per step
    for i, (label, values) in enumerate((predicted_speedups or {}).items()):
        fig.add_trace(go.Scatter(x=ks, y=values, mode="lines+markers", name=label, marker=dict(symbol="x"),
                                 line=dict(color=PALETTE[(i + 1) % len(PALETTE)], dash="dash")), row=1, col=2)
    fig.add_hline(y=1.0, line=dict(color="black", width=1), row=1, col=2)
    fig.update_xaxes(title_text="draft length K", dtick=1)
    fig.update_yaxes(rangemode="tozero")
    fig.update_layout(title=title, height=420)
    return fig


def agreement_figure(agreements, speedups_by_label, shipped=None, goal=2.0,
                     title="What a draft that agrees more often would buy") -> go.Figure:
    """Speedup over the decode loop against the draft's greedy agreement, one line per draft cost
    ({label: [speedup per agreement]}, as scripts/draft_ceiling.py's agreement_table gives them),
    the goal dashed, and the shipped draft as (agreement, speedup) when given."""
    fig = go.Figure()
    for i, (label, values) in enumerate(speedups_by_label.items()):
        fig.add_trace(go.Scatter(x=list(agreements), y=list(values), mode="lines+markers", name=label,
                                 line=dict(color=PALETTE[i % len(PALETTE)])))
    if shipped is not None:
        fig.add_trace(go.Scatter(x=[shipped[0]], y=[shipped[1]], mode="markers", name="the shipped draft",
                                 marker=dict(color="black", size=11, symbol="star")))
    fig.add_hline(y=goal, line=dict(color=NEUTRAL, dash="dash"), annotation_text=f"{goal:g}x",
                  annotation_position="top left")
    fig.update_xaxes(title_text="greedy agreement with the target (alpha at temperature 0)")
    fig.update_yaxes(title_text="speedup over the decode loop", rangemode="tozero")
    fig.update_layout(title=title, height=420)
    return fig


def training_curve_figure(curves, title="Held-out acceptance during distillation") -> go.Figure:
    """Held-out greedy agreement (alpha at temperature 0) against training tokens seen.
    curves: {name: [(tokens, alpha), ...]}, as train_draft returns and trace.card_curve parses."""
    fig = go.Figure()
    for i, (name, curve) in enumerate(curves.items()):
        fig.add_trace(go.Scatter(x=[t for t, _ in curve], y=[a for _, a in curve], mode="lines+markers", name=name,
                                 line=dict(color=PALETTE[i % len(PALETTE)])))
    fig.update_xaxes(title_text="training tokens seen", rangemode="tozero")
    fig.update_yaxes(title_text="held-out alpha (greedy agreement)", range=[0, 1])
    fig.update_layout(title=title, height=400)
    return fig


def bench_figure(doc, temperature_index=0) -> go.Figure:
    """A bench.run_bench document at one temperature. Left: tokens/s per system (this engine
    blue, transformers grey). Middle: speedup over this engine's autoregressive decode against K:
    measured, Theorem 3.8 of arXiv 2211.17192, and the same with the measured verification cost.
    Right: the cost of one target forward over K+1 tokens relative to one token (1 in the theorem)."""
    r = doc["results"][temperature_index]
    sy = r["systems"]
    fig = make_subplots(rows=1, cols=3, column_widths=[0.4, 0.32, 0.28],
                        subplot_titles=("tokens/s", "speedup over autoregressive",
                                        "verifying K+1 tokens / one token"))
    own = [not n.startswith("hf_") for n in sy]
    fig.add_trace(go.Bar(x=[s["label"] for s in sy.values()], y=[s["tokens_per_second"] for s in sy.values()],
                         marker_color=[PALETTE[0] if o else NEUTRAL for o in own], showlegend=False,
                         text=[f"{s['tokens_per_second']:.1f}" for s in sy.values()], textposition="outside",
                         cliponaxis=False), row=1, col=1)
    fixed = [s for s in sy.values() if isinstance(s.get("k"), int)]
    ks = [s["k"] for s in fixed]
    for name, key, color, dash in (("measured", "measured_speedup", PALETTE[0], "solid"),
                                   ("Theorem 3.8", "predicted_speedup", PALETTE[1], "dash"),
                                   ("with measured verify cost", "predicted_speedup_with_verify_cost", PALETTE[2],
                                    "dash")):
        fig.add_trace(go.Scatter(x=ks, y=[s.get(key) for s in fixed], mode="lines+markers", name=name,
                                 line=dict(color=color, dash=dash)), row=1, col=2)
    fig.add_hline(y=1.0, line=dict(color="black", width=1), row=1, col=2)
    verify = {int(k): v for k, v in doc["costs"]["verify_cost"].items()}  # JSON turns int keys to str
    vk = sorted(verify)
    fig.add_trace(go.Scatter(x=vk, y=[verify[k] for k in vk], mode="lines+markers", name="measured verify cost",
                             line=dict(color=BAD)), row=1, col=3)
    fig.add_hline(y=1.0, line=dict(color=NEUTRAL, dash="dot"), row=1, col=3)
    fig.update_xaxes(tickangle=-35, row=1, col=1)
    fig.update_xaxes(title_text="K", dtick=1, row=1, col=2)
    fig.update_xaxes(title_text="K", dtick=1, row=1, col=3)
    fig.update_yaxes(rangemode="tozero")
    top = max(s["tokens_per_second"] for s in sy.values())
    fig.update_yaxes(range=[0, 1.15 * top], row=1, col=1)  # room for the bars' labels
    fig.update_layout(title=f"Benchmark at temperature {r['temperature']:g}: alpha = {r['alpha']:.3f}, "
                            f"c = {doc['costs']['c']:.3f}", height=480,
                      legend=dict(orientation="h", y=-0.35, x=0.4))
    return fig


def adaptive_k_figure(k_by_name, committed_by_name, requests=None, reference=(),
                      title="Draft length per step on a changing workload") -> go.Figure:
    """Top: the K each step drafted (0: the drafter proposed nothing); bottom: the tokens
    each step committed. Both against the output position where the step started, so
    runs that took different numbers of steps over the same text line up.
    k_by_name / committed_by_name: {name: [int per step]}, steps of consecutive requests
    concatenated; requests: {request name: output position where it starts}, drawn as
    dashed lines; names in `reference` (e.g. fixed K) are drawn thin and dotted."""
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=("K drafted per step", "tokens committed per step"))
    for i, name in enumerate(k_by_name):
        committed = committed_by_name[name]
        x = [sum(committed[:j]) for j in range(len(committed))]  # output position at each step's start
        ref = name in reference
        line = dict(color=PALETTE[i % len(PALETTE)], width=1 if ref else 2.5, dash="dot" if ref else "solid")
        fig.add_trace(go.Scatter(x=x, y=k_by_name[name], mode="lines", line_shape="hv", line=line, name=name,
                                 legendgroup=name), row=1, col=1)
        fig.add_trace(go.Scatter(x=x, y=committed, mode="markers", name=name, legendgroup=name, showlegend=False,
                                 marker=dict(color=line["color"], size=4 if ref else 7)), row=2, col=1)
    for label, start in (requests or {}).items():
        fig.add_vline(x=start, line=dict(color=NEUTRAL, dash="dash"))
        fig.add_annotation(x=start, y=1.0, xref="x", yref="y domain", text=f" {label}", showarrow=False,
                           xanchor="left", yanchor="top", font=dict(color=NEUTRAL))  # inside the top panel
    fig.update_yaxes(title_text="K", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="tokens", rangemode="tozero", row=2, col=1)
    fig.update_xaxes(title_text="output position (tokens generated before the step, all requests)", row=2, col=1)
    fig.update_layout(title=title, height=560, legend=dict(groupclick="togglegroup"))
    return fig
