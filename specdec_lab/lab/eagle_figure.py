"""Chapter 10's picture: which of the target's states feed an EAGLE-3 draft, and what it feeds back.

    viz.show(eagle3_flow_figure(n_layers=30, hidden_layers=(1, 14, 26)))

The target's stack on the left, bottom to top; the draft on the right. Taps after the three layers the
draft reads go into `fc`, which fuses them into g; the next token's embedding joins g in the draft's one
decoder layer; the layer's output h goes through the norm to the target's own head, which gives the
drafted token. An arrow on the right carries h and the drafted token into the next entry, where h stands in
for g (the draft's states, not the target's, once it drafts past the last true token). The feature draft
(EAGLE) reads one state instead, the target's final state after its norm.
"""
import plotly.graph_objects as go

from .viz import BLUE, NEUTRAL, PALETTE

TARGET, DRAFT, TAP = "#deebf7", "#fdd0a2", PALETTE[1]


def _box(fig, x0, x1, y0, y1, text, color):
    fig.add_shape(type="rect", x0=x0, x1=x1, y0=y0, y1=y1, fillcolor=color, line=dict(color=NEUTRAL, width=1))
    fig.add_annotation(x=(x0 + x1) / 2, y=(y0 + y1) / 2, text=text, showarrow=False, font=dict(size=11))


def _arrow(fig, start, end, color=BLUE, text=""):  # from start to end, in the axes' coordinates
    fig.add_annotation(x=end[0], y=end[1], ax=start[0], ay=start[1], xref="x", yref="y", axref="x", ayref="y",
                       showarrow=True, arrowhead=3, arrowwidth=2, arrowcolor=color, text="")
    if text:
        fig.add_annotation(x=(start[0] + end[0]) / 2, y=(start[1] + end[1]) / 2, text=text, showarrow=False,
                           font=dict(size=11, color=color), bgcolor="white")


def eagle3_flow_figure(n_layers, hidden_layers, head_tokens=8192,
                       title="EAGLE-3: the states a drafted token reads (layers counted from 0)") -> go.Figure:
    """The data flow of one EAGLE-3 entry for a target of `n_layers` layers whose residual stream is read
    after each layer in `hidden_layers` (three ascending indices, counting from 0, as the model's `hidden`
    and the draft's config.json count them)."""
    low, mid, high = hidden_layers
    if not 0 <= low < mid < high < n_layers - 1:
        raise ValueError(f"hidden_layers must be three ascending layer indices below n_layers - 1 = "
                         f"{n_layers - 1}, got {hidden_layers}")
    fig = go.Figure()
    first = f"layer {low}" if low == 0 else f"layers 0 to {low}"
    stack = [("the target's embedding", None), (first, low), (f"layers {low + 1} to {mid}", mid),
             (f"layers {mid + 1} to {high}", high), (f"layers {high + 1} to {n_layers - 1}", None),
             ("final norm and head", None)]
    for i, (text, tap) in enumerate(stack):
        y0 = 0.3 + 1.45 * i
        _box(fig, 0.2, 3.4, y0, y0 + 1.0, text, TARGET)
        if tap is not None:  # the residual stream after this box's last layer goes to fc
            _arrow(fig, (3.4, y0 + 0.95), (5.2, 4.15), TAP)
    _box(fig, 5.2, 8.3, 3.7, 4.6, "fc fuses the three states: g", DRAFT)
    _box(fig, 5.2, 9.6, 0.3, 1.3, "the next token, through the target's embedding", DRAFT)
    _box(fig, 5.2, 9.6, 5.6, 6.7, "one layer over [embed_norm(e), state_norm(g)]", DRAFT)
    _box(fig, 5.2, 9.6, 7.7, 8.7, f"norm, the target's head ({head_tokens:,} tokens): d", DRAFT)
    _arrow(fig, (6.75, 4.6), (6.75, 5.6), text="g")
    _arrow(fig, (9.0, 1.3), (9.0, 5.6), text="e")
    _arrow(fig, (7.4, 6.7), (7.4, 7.7), text="h")
    _arrow(fig, (9.6, 6.15), (10.3, 6.15), text="h")
    fig.add_annotation(x=10.4, y=6.15, text="next entry:<br>h in place of g,<br>d as its token", showarrow=False,
                       xanchor="left", font=dict(size=11, color=BLUE))
    fig.add_annotation(x=4.3, y=8.2, text=f"taps after layers<br>{low}, {mid} and {high}", showarrow=False,
                       font=dict(size=11, color=TAP))
    fig.update_xaxes(visible=False, range=[0, 12])
    fig.update_yaxes(visible=False, range=[0, 9.2])
    fig.update_layout(title=title, height=420, plot_bgcolor="white", margin=dict(l=10, r=10, t=50, b=10),
                      showlegend=False)
    return fig
