"""Plotly figures for chapter 13 (serving many requests), and the arithmetic they draw: pure functions
of numbers, no models, no measuring.

Like viz.py, each figure function takes what the library or a stored run returned and gives back a
go.Figure; the same input gives the same figure. Display them with viz.show (a PNG beside each).
Stored runs key their tables by strings ("B,K" -> seconds, "B" -> ratio); `pairs` reads the former.
"""
import statistics

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..serve.policy import expected_tokens
from .viz import BLUE, NEUTRAL, PALETTE, WHITE

LOG_TICKS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000]  # labels on the log axes (plotly's own crowd them)


def pairs(name, table) -> dict:
    """{"B,K": seconds} (a stored run's key form) or {(B, K): seconds} -> {(B, K): seconds}."""
    if not isinstance(table, dict) or not table:
        raise ValueError(f"{name} must be a non-empty dict of (batch, k) -> seconds, got {table!r}")
    out = {}
    for key, seconds in table.items():
        try:
            b, k = map(int, key.split(",")) if isinstance(key, str) else key
        except (TypeError, ValueError):
            raise ValueError(f"{name}: key {key!r} is not 'B,K' or a (B, K) pair of ints") from None
        if not (isinstance(seconds, (int, float)) and seconds > 0):
            raise ValueError(f"{name}[{key!r}] must be a positive number of seconds, got {seconds!r}")
        out[(b, k)] = float(seconds)
    return out


def over_plain(step_costs, alpha) -> dict:
    """{K: {B: x}}: what fixed K should give over plain batched decoding at each batch size B, from step
    costs ({(B, K) or "B,K": seconds}, with K = 0 at every B) and an acceptance rate: a row commits
    (1 - alpha^(K+1)) / (1 - alpha) tokens in a step costing cost(B, K), against one in cost(B, 0)."""
    costs = pairs("step_costs", step_costs)
    if not (isinstance(alpha, (int, float)) and 0.0 <= alpha <= 1.0):
        raise ValueError(f"alpha must be a number in [0, 1], got {alpha!r}")
    sizes = sorted({b for b, _ in costs})
    missing = [b for b in sizes if (b, 0) not in costs]
    if missing:
        raise ValueError(f"step_costs must hold K = 0 (plain decoding) at every batch size; missing at {missing}")
    ks = sorted({k for _, k in costs if k > 0})
    return {k: {b: expected_tokens(alpha, k) * costs[(b, 0)] / costs[(b, k)] for b in sizes if (b, k) in costs}
            for k in ks}


def acceptance_figure(rows, k) -> go.Figure:
    """Rows x server steps: the drafts each request had accepted at each step of the batch (blank where
    it was not in the batch), written n/k in the cell. rows: [(label, {step: (k, n)})]; k: the
    server's K, the colour scale's top."""
    if not rows:
        raise ValueError("rows must hold at least one (label, {step: (k, accepted)}), got none")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be an int >= 1 (the server's K), got {k!r}")
    steps = sorted({s for _, by_step in rows for s in by_step})
    z = [[by_step[s][1] if s in by_step else None for s in steps] for _, by_step in rows]
    text = [[f"{by_step[s][1]}/{by_step[s][0]}" if s in by_step else "" for s in steps] for _, by_step in rows]
    labels = [label for label, _ in rows]
    fig = go.Figure(go.Heatmap(z=z, x=steps, y=labels, text=text, texttemplate="%{text}", textfont=dict(size=9),
                               colorscale=[[0, WHITE], [1, BLUE]], zmin=0, zmax=k, xgap=2, ygap=2,
                               colorbar=dict(title="accepted"),
                               hovertemplate="%{y}, step %{x}: %{text} accepted<extra></extra>"))
    fig.update_xaxes(title_text="server step (one batched forward of the target)", dtick=1)
    fig.update_yaxes(autorange="reversed")
    fig.update_layout(title=f"Drafts accepted per row and step (n/k; K = {k}; blank: not in the batch)",
                      height=140 + 34 * len(rows), plot_bgcolor="#dddddd")
    return fig


def cost_figure(forward, roofline_forward, predicted, alpha) -> go.Figure:
    """Left: ms of one target forward against the rows it computes (B rows of T tokens each: B x T),
    measured (forward: {(B, T) or "B,T": seconds}) beside the roofline's ({rows: seconds}, dashed).
    Right: what each fixed K should give over plain decoding by batch size, from the step costs
    (predicted: over_plain's {K: {B: x}}), at acceptance alpha."""
    measured = pairs("forward", forward)
    fig = make_subplots(rows=1, cols=2, subplot_titles=("target forward: ms by rows (B x T)",
                                                        f"step costs' prediction over plain (alpha {alpha:.2f})"))
    for i, t in enumerate(sorted({t for _, t in measured})):
        pts = sorted((b * t, s) for (b, tt), s in measured.items() if tt == t)
        fig.add_trace(go.Scatter(x=[r for r, _ in pts], y=[1e3 * s for _, s in pts], mode="markers",
                                 marker=dict(size=9, color=PALETTE[i]), name=f"measured, {t} token(s) a row"),
                      row=1, col=1)
    xs = sorted(roofline_forward)
    fig.add_trace(go.Scatter(x=xs, y=[1e3 * roofline_forward[r] for r in xs], mode="lines", name="roofline",
                             line=dict(color=NEUTRAL, dash="dash")), row=1, col=1)
    for i, (k, by_b) in enumerate(sorted(predicted.items())):
        bs = sorted(by_b)
        fig.add_trace(go.Scatter(x=bs, y=[by_b[b] for b in bs], mode="lines+markers", name=f"K = {k}",
                                 line=dict(color=PALETTE[(i + 2) % len(PALETTE)])), row=1, col=2)
    fig.add_hline(y=1.0, line=dict(color=NEUTRAL, dash="dot"), row=1, col=2)
    fig.update_xaxes(type="log", tickvals=LOG_TICKS, title_text="rows in the forward", row=1, col=1)
    fig.update_yaxes(type="log", tickvals=LOG_TICKS, title_text="ms", row=1, col=1)
    batches = sorted({b for by_b in predicted.values() for b in by_b})
    fig.update_xaxes(type="log", tickvals=batches, title_text="batch size B", row=1, col=2)
    fig.update_yaxes(title_text="x plain batched decoding", row=1, col=2)
    fig.update_layout(title="Why verification stops being free", height=440, legend=dict(orientation="h", y=-0.25))
    return fig


def crossover_figure(runs, roofline=None, roofline_k=None) -> go.Figure:
    """Closed loop: each system's median run over plain's median run by batch size, the bars spanning
    its slowest and fastest runs (runs: {system: {"B": [tokens/s of each run]}} with "plain"), and the
    roofline's prediction for fixed K = roofline_k ({"B": x}, dashed) where given."""
    if not isinstance(runs, dict) or "plain" not in runs:
        raise ValueError(f"runs must be a dict of system -> {{batch: [tokens/s]}} holding 'plain', got "
                         f"{sorted(runs) if isinstance(runs, dict) else runs!r}")
    sizes = sorted(runs["plain"], key=int)
    plain = {b: statistics.median(runs["plain"][b]) for b in sizes}
    fig = go.Figure()
    for i, (system, by_b) in enumerate(runs.items()):
        y = [statistics.median(by_b[b]) / plain[b] for b in sizes]
        lo = [y[j] - min(by_b[b]) / plain[b] for j, b in enumerate(sizes)]
        hi = [max(by_b[b]) / plain[b] - y[j] for j, b in enumerate(sizes)]
        fig.add_trace(go.Scatter(x=[int(b) for b in sizes], y=y, mode="lines+markers", name=system,
                                 line=dict(color=PALETTE[i % len(PALETTE)]),
                                 error_y=dict(type="data", array=hi, arrayminus=lo, thickness=1)))
    if roofline:
        bs = sorted(roofline, key=int)
        fig.add_trace(go.Scatter(x=[int(b) for b in bs], y=[roofline[b] for b in bs], mode="lines",
                                 name=f"roofline, fixed K = {roofline_k} (predicted)",
                                 line=dict(color=NEUTRAL, dash="dash")))
    fig.add_hline(y=1.0, line=dict(color=NEUTRAL, dash="dot"))
    fig.update_xaxes(type="log", tickvals=[int(b) for b in sizes], title_text="batch size (requests in flight)")
    fig.update_yaxes(title_text="tokens/s over plain batched decoding")
    fig.update_layout(title="Closed loop: median run over plain's (bars: every run)", height=450)
    return fig


def latency_figure(open_loop) -> go.Figure:
    """Open loop: p50 (solid) and p99 (dotted) seconds from arrival to the last token against the request
    rate, one colour per system. open_loop: {system: {"rate": {"latency_p50", "latency_p99"}}}."""
    if not open_loop:
        raise ValueError("open_loop must hold at least one system's runs, got none")
    fig = go.Figure()
    for i, (system, by_rate) in enumerate(open_loop.items()):
        rates = sorted(by_rate, key=float)
        for q, dash in (("latency_p50", "solid"), ("latency_p99", "dot")):
            fig.add_trace(go.Scatter(x=[float(r) for r in rates], y=[by_rate[r][q] for r in rates],
                                     mode="lines+markers", name=f"{system} {q.removeprefix('latency_')}",
                                     line=dict(color=PALETTE[i % len(PALETTE)], dash=dash)))
    fig.update_xaxes(title_text="requests per second (Poisson arrivals)")
    fig.update_yaxes(rangemode="tozero", title_text="seconds from arrival to the last token")
    fig.update_layout(title="Open loop: latency against load", height=420)
    return fig


def speedup_by_batch_figure(curves, predicted=(), title="Speculation over plain batched decoding") -> go.Figure:
    """Lines of speedup over plain batched decoding by batch size: curves {name: {B: x}}; the names
    in `predicted` are drawn dashed (a model's prediction, not a measurement)."""
    if not curves:
        raise ValueError("curves must hold at least one {batch: speedup} curve, got none")
    fig = go.Figure()
    for i, (name, by_b) in enumerate(curves.items()):
        bs = sorted(by_b, key=int)
        fig.add_trace(go.Scatter(x=[int(b) for b in bs], y=[by_b[b] for b in bs], mode="lines",
                                 name=name + (" (roofline)" if name in predicted else ""),
                                 line=dict(color=PALETTE[i % len(PALETTE)],
                                           dash="dash" if name in predicted else "solid")))
    fig.add_hline(y=1.0, line=dict(color=NEUTRAL, dash="dot"))
    fig.update_xaxes(type="log", tickvals=[2 ** i for i in range(11)], title_text="batch size B")
    fig.update_yaxes(title_text="x plain batched decoding")
    fig.update_layout(title=title, height=430, legend=dict(orientation="h", y=-0.2))
    return fig
