"""The fragmentation figure: a pure function of `paged.simulate_fragmentation`'s result.

(To be merged into viz.py; it imports plotly, which the core never does.)
"""
import plotly.graph_objects as go
from plotly.subplots import make_subplots

COLORS = {"contiguous": "#d62728", "paged": "#1f77b4"}


def fragmentation_figure(result) -> go.Figure:
    """Top: KV slots reserved (solid) and used (dotted) per engine step, for both
    designs. Bottom: requests running at once. The gap between a design's two top
    lines is memory it holds but does not use."""
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
