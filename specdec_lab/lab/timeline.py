"""A speculative run and plain decoding on one time axis: chapter 07's picture of where the time goes.

    fig = timeline_figure(res.steps[:8], ar_seconds)   # StepRecords, and one plain token's seconds

The upper lane replays the run from its StepRecords: each step's draft forwards, then its one
verification forward, labelled with the tokens the step committed. The lower lane is plain decoding
over the same span, one target forward of `ar_seconds` per token. Both lanes use measured times, so
the picture shows what the speedup is made of: how many tokens a verification commits against how
much longer it takes than one plain forward.
"""
import plotly.graph_objects as go

from .viz import BLUE, PALETTE

DRAFT, VERIFY, PLAIN = "#9ecae1", PALETTE[1], "#bdbdbd"
LANES = ("plain decoding", "speculative")


def _bar(fig, lane, starts, widths, color, name, text, hover):  # one bar per (start, width), in milliseconds
    fig.add_trace(go.Bar(y=[lane] * len(starts), x=widths, base=starts, orientation="h", name=name,
                         marker=dict(color=color, line=dict(color="white", width=1)), text=text,
                         textposition="inside", insidetextanchor="middle", customdata=hover,
                         hovertemplate="%{customdata}<extra></extra>"))


def timeline_figure(steps, ar_seconds, title="The same stretch of time, two ways to decode") -> go.Figure:
    """Draft and verification bars for each step in `steps` (milliseconds from the first step's start),
    and plain decoding's forwards of `ar_seconds` each over the same span. A step with nothing drafted
    shows its verification bar only."""
    if not steps or ar_seconds <= 0:
        raise ValueError(f"timeline_figure needs at least one step and ar_seconds > 0, got {len(steps)} steps "
                         f"and ar_seconds={ar_seconds}")
    fig = go.Figure()
    t, drafts, verifies = 0.0, [], []
    for s in steps:
        drafts.append((t, s.draft_seconds, s))
        verifies.append((t + s.draft_seconds, s.target_seconds, s))
        t += s.draft_seconds + s.target_seconds
    span, spec_tokens = t, sum(len(s.committed) for s in steps)
    ms = 1e3
    _bar(fig, LANES[1], [a * ms for a, _, _ in drafts], [w * ms for _, w, _ in drafts], DRAFT, "draft forwards",
         None,
         [f"step {s.step}: {s.k} draft forwards, {w * ms:.1f} ms" for _, w, s in drafts])
    _bar(fig, LANES[1], [a * ms for a, _, _ in verifies], [w * ms for _, w, _ in verifies], VERIFY,
         "one verification forward", [f"+{len(s.committed)}" for _, _, s in verifies],
         [f"step {s.step}: verified {s.k + 1} rows in {w * ms:.1f} ms, committed {len(s.committed)} "
          f"({s.num_accepted} accepted + 1)" for _, w, s in verifies])
    n_plain = int(span // ar_seconds)
    starts = [i * ar_seconds * ms for i in range(n_plain)]
    _bar(fig, LANES[0], starts, [ar_seconds * ms] * n_plain, PLAIN, "plain forward (one token each)",
         ["+1"] * n_plain, [f"token {i + 1}: one forward, {ar_seconds * ms:.1f} ms" for i in range(n_plain)])
    fig.add_vline(x=span * ms, line=dict(color=BLUE, dash="dot"))
    for lane, tokens in ((LANES[1], f"{spec_tokens} tokens"), (LANES[0], f"{span / ar_seconds:.1f} tokens")):
        fig.add_annotation(x=span * ms, y=lane, text=f"<b>{tokens}</b>", xanchor="left", showarrow=False,
                           xshift=6, font=dict(color=BLUE))
    fig.update_layout(title=title, barmode="overlay", height=280, plot_bgcolor="white", bargap=0.35,
                      margin=dict(r=110), legend=dict(orientation="h", y=1.0, yanchor="bottom", x=1, xanchor="right"),
                      xaxis=dict(title="milliseconds", range=[0, span * ms * 1.12], gridcolor="#eeeeee"),
                      yaxis=dict(categoryorder="array", categoryarray=list(LANES)))
    return fig
