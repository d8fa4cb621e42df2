"""One step of a token tree, drawn: the nodes the draft proposed, the path the target accepted and the
token it added after it.

    engine = sl.TreeEngine(target, draft, tree=DynamicTree(depth=4, top_k=4, budget=12))
    engine.keep_trees = True
    res = engine.generate(prompt, max_new_tokens=32)
    step = longest_path(engine.trees)
    viz.show(tree_step_figure(engine.trees[step], tokenizer, step))

Depth runs left to right; each node sits level with the middle of its children, and leaves are laid
out top to bottom in the order the draft kept them. Colours follow the step trace's (viz.TRACE_COLORS):
the accepted path; the children of its last node, which the target checked and declined (rejected);
the nodes off the path it never reached; and the next token, a bonus where the path ends in a leaf,
else a correction.
"""
import plotly.graph_objects as go

from .trace import show_piece
from .viz import NEUTRAL, TRACE_COLORS


def longest_path(trees) -> int:
    """The index of the first step whose accepted path is the longest."""
    if not trees:
        raise ValueError("no trees were kept: set engine.keep_trees = True before generate (a plan that chose "
                         "the chain keeps none)")
    return max(range(len(trees)), key=lambda i: (len(trees[i].path), -i))


def layout(parents) -> tuple:
    """(depth, row) of every node: leaves take rows 0, 1, 2, ... in node order, a parent the mean of its
    children's rows."""
    children = {i: [] for i in range(len(parents))}
    for i, p in enumerate(parents):
        if p >= 0:
            children[p].append(i)
    depth, row, next_leaf = [0] * len(parents), [0.0] * len(parents), [0]

    def place(i, d):
        depth[i] = d
        for c in children[i]:
            place(c, d + 1)
        if children[i]:
            row[i] = sum(row[c] for c in children[i]) / len(children[i])
        else:
            row[i], next_leaf[0] = next_leaf[0], next_leaf[0] + 1
    place(0, 0)
    return depth, row


def tree_step_figure(step, tokenizer, index=None) -> go.Figure:
    """The tree of one TreeStep, its accepted path and the target's next token (the module's picture)."""
    depth, row = layout(step.parents)
    on_path = set(step.path)
    kind = "correction" if any(p == step.path[-1] for p in step.parents) else "bonus"
    text = [show_piece(tokenizer.decode([t])) for t in step.tokens]
    fig = go.Figure()
    for i, p in enumerate(step.parents):
        if p >= 0:
            good = i in on_path
            fig.add_trace(go.Scatter(x=[depth[p], depth[i]], y=[row[p], row[i]], mode="lines", hoverinfo="skip",
                                     line=dict(color=TRACE_COLORS["accepted"] if good else "#d9d9d9",
                                               width=3 if good else 1), showlegend=False))
    last = step.path[-1]
    rejected = [i for i, p in enumerate(step.parents) if p == last]  # the target checked these and declined
    nxt = (depth[last] + 1, row[last] - (0.5 if rejected else 0))  # beside the rejected children, not on them
    fig.add_trace(go.Scatter(x=[depth[last], nxt[0]], y=[row[last], nxt[1]], mode="lines", hoverinfo="skip",
                             line=dict(color=TRACE_COLORS[kind], width=3, dash="dot"), showlegend=False))
    groups = [("root: the pending token x0", [0], NEUTRAL),
              ("accepted", [i for i in step.path[1:]], TRACE_COLORS["accepted"]),
              ("rejected: the children of the path's end", rejected, TRACE_COLORS["rejected"]),
              ("never reached", [i for i in range(1, len(step.tokens)) if i not in on_path and i not in rejected],
               TRACE_COLORS["discarded"])]
    for name, nodes, color in groups:
        fig.add_trace(go.Scatter(x=[depth[i] for i in nodes], y=[row[i] for i in nodes], mode="markers+text",
                                 text=[text[i] for i in nodes], textposition="middle right", name=name,
                                 marker=dict(size=14, color=color, line=dict(color="white", width=1))))
    fig.add_trace(go.Scatter(x=[nxt[0]], y=[nxt[1]], mode="markers+text", name=f"the target's next token ({kind})",
                             text=[show_piece(tokenizer.decode([step.next_token]))], textposition="middle right",
                             marker=dict(size=16, symbol="star", color=TRACE_COLORS[kind])))
    m, n = len(step.path) - 1, len(step.tokens) - 1
    title = (f"{'Step ' + str(index) + ': ' if index is not None else ''}{n} drafted nodes, {m} accepted, then a "
             f"{kind}: {m + 1} tokens from one forward over {n + 1} rows")
    fig.update_layout(title=title, height=170 + 44 * (max(row) + 1), template="plotly_white",
                      xaxis=dict(title="depth (tokens after x0)", dtick=1, range=[-0.4, max(depth) + 1.6]),
                      yaxis=dict(visible=False, autorange="reversed"), legend=dict(orientation="h", y=-0.25))
    return fig
