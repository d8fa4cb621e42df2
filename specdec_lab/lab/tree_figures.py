"""Plotly figures for chapter 12 (token trees): pure functions of numbers, no models, no measuring.

Like viz.py, each function takes what the library or a stored run returned and gives back a
go.Figure; the same input gives the same figure. Display them with viz.show (a PNG beside each).
"""
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .viz import NEUTRAL, PALETTE

COST_SERIES = ("target_tree", "target_chain", "draft_tree", "draft_chain")  # a tree="auto" Costs, as stored
OTHER = ("#9467bd", "#8c564b", "#e377c2")  # other devices' curves: colours the CPU's series do not use
COST_NAMES = {"target_tree": "target, tree mask", "target_chain": "target, chain mask (oneDNN past 16 rows)",
              "draft_tree": "draft, tree mask", "draft_chain": "draft, chain mask"}


def check_acceptance(name, a):
    """a_1..a_R: probabilities by rank whose sum (the top-R coverage) is at most 1."""
    if not (isinstance(a, (list, tuple)) and a and all(isinstance(x, (int, float)) and 0.0 <= x <= 1.0 for x in a)
            and sum(a) <= 1.0 + 1e-6):
        raise ValueError(f"acceptance[{name!r}] must be a non-empty list of probabilities by rank summing to at "
                         f"most 1, got {a!r}")


def coverage_figure(acceptance_by_name) -> go.Figure:
    """Left: a_r, the target's probability of the draft's rank-r token, by rank (bars, one colour per
    measurement); right: the top-r coverage a_1 + .. + a_r, what a node with the draft's top r tokens
    as children accepts. acceptance_by_name: {name: [a_1, .., a_R]}."""
    if not acceptance_by_name:
        raise ValueError("acceptance_by_name must hold at least one measurement, got none")
    fig = make_subplots(rows=1, cols=2, subplot_titles=("a_r: the draft's rank-r token is the target's",
                                                        "top-r coverage: a_1 + .. + a_r"))
    for i, (name, a) in enumerate(acceptance_by_name.items()):
        check_acceptance(name, a)
        ranks = list(range(1, len(a) + 1))
        cover = [sum(a[:r]) for r in ranks]
        colour = PALETTE[i % len(PALETTE)]
        fig.add_trace(go.Bar(x=ranks, y=list(a), name=name, marker_color=colour), row=1, col=1)
        fig.add_trace(go.Scatter(x=ranks, y=cover, mode="lines+markers", name=name, line=dict(color=colour),
                                 showlegend=False), row=1, col=2)
    fig.update_xaxes(title_text="rank r among the draft's tokens", dtick=1)
    fig.update_yaxes(range=[0, 1], title_text="probability", row=1, col=1)
    fig.update_yaxes(range=[0, 1], title_text="coverage", row=1, col=2)
    fig.update_layout(title="How often the target's token is among the draft's top r", barmode="group", height=420,
                      legend=dict(orientation="h", y=-0.2))
    return fig


def masks_figure(panels, L) -> go.Figure:
    """Additive masks side by side, the L cached columns drawn as one (every row sees all of them).
    panels: [(title, mask (1, 1, N, L + N), N row labels)]; light = attend (0), dark = blocked (-inf)."""
    if not panels:
        raise ValueError("panels must hold at least one (title, mask, labels), got none")
    if isinstance(L, bool) or not isinstance(L, int) or L < 1:
        raise ValueError(f"L must be an int >= 1 (the cached positions), got {L!r}")
    fig = make_subplots(rows=1, cols=len(panels), subplot_titles=[t for t, _, _ in panels], horizontal_spacing=0.25)
    for col, (title, mask, labels) in enumerate(panels, start=1):
        N = mask.shape[-2]
        if tuple(mask.shape[-2:]) != (N, L + N) or len(labels) != N or len(set(labels)) != N:
            raise ValueError(f"panel {title!r}: mask must be (.., N, L + N) with L = {L} and N distinct labels, got "
                             f"mask {tuple(mask.shape)} and {len(labels)} labels ({len(set(labels))} distinct)")
        m = mask.reshape(N, L + N)
        cached = [1 if bool((m[i, :L] == 0).all()) else 0 for i in range(N)]  # (N,): every cached column seen
        z = [[cached[i]] + [1 if float(m[i, L + j]) == 0 else 0 for j in range(N)] for i in range(N)]
        fig.add_trace(go.Heatmap(z=z, x=[f"cache ({L})"] + list(labels), y=list(labels), showscale=False,
                                 colorscale=[[0, "#222222"], [1, "#9ecae1"]], zmin=0, zmax=1, xgap=2, ygap=2,
                                 hovertemplate="query %{y} -> key %{x}<extra></extra>"), row=1, col=col)
        fig.update_yaxes(autorange="reversed", row=1, col=col)
        fig.update_xaxes(tickangle=-45, row=1, col=col)
    rows = max(mask.shape[-2] for _, mask, _ in panels)
    fig.update_layout(title="Tree mask beside the chain's (light = attend, dark = -inf; rows: node, position)",
                      height=260 + 34 * rows)
    return fig


def check_costs(costs):
    rows = costs.get("rows") if isinstance(costs, dict) else None
    if not (rows and all(isinstance(costs.get(k), list) and len(costs[k]) == len(rows) for k in COST_SERIES)):
        raise ValueError(f"costs must be a dict with 'rows' and {', '.join(COST_SERIES)}, one number per row count, "
                         f"got {costs if not isinstance(costs, dict) else sorted(costs)!r}")


def cost_figure(costs, other_by_name=None, predicted=()) -> go.Figure:
    """Left: ms of one forward by row count on this CPU (costs: a stored tree='auto' Costs dict).
    Right: each target curve over its own one-row forward, with other devices' curves
    (other_by_name: {name: {rows: seconds}}); the names in `predicted` are drawn dashed."""
    check_costs(costs)
    rows = costs["rows"]
    fig = make_subplots(rows=1, cols=2, subplot_titles=("this CPU: ms per forward",
                                                        "cost over the one-row forward"))
    for i, key in enumerate(COST_SERIES):
        fig.add_trace(go.Scatter(x=rows, y=[1e3 * s for s in costs[key]], mode="lines+markers", name=COST_NAMES[key],
                                 line=dict(color=PALETTE[i], dash="solid" if key.startswith("target") else "dot")),
                      row=1, col=1)
    curves = {f"CPU {COST_NAMES[k]}": dict(zip(rows, costs[k])) for k in ("target_tree", "target_chain")}
    curves.update(other_by_name or {})
    for i, (name, by_rows) in enumerate(curves.items()):
        xs = sorted(by_rows, key=int)
        one = by_rows[xs[0]]
        colour = PALETTE[i] if i < 2 else OTHER[(i - 2) % len(OTHER)]
        fig.add_trace(go.Scatter(x=[int(x) for x in xs], y=[by_rows[x] / one for x in xs], mode="lines+markers",
                                 name=name + (" (predicted)" if name in predicted else ""), showlegend=i >= 2,
                                 line=dict(color=colour, dash="dash" if name in predicted else "solid")), row=1, col=2)
    fig.update_xaxes(title_text="rows in the forward (tree nodes, or K + 1)")
    fig.update_yaxes(rangemode="tozero", title_text="ms", row=1, col=1)
    fig.update_yaxes(rangemode="tozero", title_text="x one row", row=1, col=2)
    fig.update_layout(title="What verifying more rows costs", height=440, legend=dict(orientation="h", y=-0.25))
    return fig


def tree_vs_chain_figure(results, reference="chain K=4") -> go.Figure:
    """Each system's tokens per step (left) and its tokens/s over the reference's (right, with the 95%
    interval), one colour per temperature. results: {temperature: {"table": {system: {"tokens_per_step",
    "ratio_to_chain", "ratio_interval"}}}} (a stored tree_vs_chain document's "results")."""
    if not results:
        raise ValueError("results must hold at least one temperature's table, got none")
    fig = make_subplots(rows=1, cols=2, shared_yaxes=True, horizontal_spacing=0.04,
                        subplot_titles=("tokens per step", f"tokens/s over {reference}"))
    systems = []  # every system once, in first-seen order (some run at one temperature only)
    for i, (temperature, result) in enumerate(results.items()):
        table = result.get("table") if isinstance(result, dict) else None
        if not table or reference not in table:
            raise ValueError(f"results[{temperature!r}] must hold a 'table' with the reference {reference!r}")
        names = list(table)
        systems += [n for n in names if n not in systems]
        ratio = [table[n]["ratio_to_chain"] for n in names]
        colour = PALETTE[i % len(PALETTE)]
        fig.add_trace(go.Bar(y=names, x=[table[n]["tokens_per_step"] for n in names], orientation="h",
                             name=f"temperature {temperature}", marker_color=colour), row=1, col=1)
        fig.add_trace(go.Bar(y=names, x=ratio, orientation="h", marker_color=colour, showlegend=False,
                             error_x=dict(type="data", array=[table[n]["ratio_interval"][1] - r
                                                              for n, r in zip(names, ratio)],
                                          arrayminus=[r - table[n]["ratio_interval"][0] for n, r in zip(names, ratio)])),
                      row=1, col=2)
    fig.add_vline(x=1.0, line=dict(color=NEUTRAL, dash="dash"), row=1, col=2)
    fig.update_yaxes(categoryorder="array", categoryarray=systems, autorange="reversed")
    fig.update_layout(title="Trees commit more per step and run slower here (95% intervals over prompts)",
                      barmode="group", height=160 + 44 * len(systems), legend=dict(orientation="h", y=-0.12))
    return fig
