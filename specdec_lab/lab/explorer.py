"""Chapter 02's explorers: p and q at one position, and the acceptance rate, the draft cost and the largest K,
on sliders.

    AcceptanceExplorer(p, q, labels).show()   # drag p and q: the accepted mass and the residual move

    explorer = SpeedupExplorer(verify_cost, measured, alpha=0.454, c=0.026)
    explorer.show()      # live sliders in a running kernel; a picture of the starting values elsewhere

Predicted curves over K: Theorem 3.8's, which prices the verification forward at one forward, the same
formula with one machine's v_K (`verify_cost`, K -> one-row forwards, named `label`), and one curve for each
further pricing in `others` (name -> v_K by K). Beside them, dots for a stored run's measured speedups
(`measured`: K -> ratio over plain decoding, named `measured_label`; or name -> K -> ratio for several).
"""
import ipywidgets as W
import plotly.graph_objects as go
from IPython.display import display

from ..analysis.roofline import expected_speedup
from .static_figures import figure_bundle
from .viz import BAD, NEUTRAL, PALETTE, acceptance_figure

K_MAX = 12


def speedup_curves(alpha, c, verify_cost, k_max=K_MAX, label="this machine", others=None) -> dict:
    """Predicted speedup at K = 1..k_max: 'theorem' (verification = one forward) and `label`
    (verification = verify_cost[K] one-row forwards), then one curve per entry of `others` (name -> v_K by K)
    over the K from 1 up that it prices, at most k_max."""
    if not 0 <= alpha < 1 or c < 0:
        raise ValueError(f"alpha must be in [0, 1) and c >= 0, got alpha={alpha}, c={c}")
    missing = [k for k in range(1, k_max + 1) if k not in verify_cost]
    if missing:
        raise ValueError(f"verify_cost must price every K from 1 to {k_max}; missing {missing}")
    ks = range(1, k_max + 1)
    curves = {"theorem": [expected_speedup(alpha, k, c) for k in ks],
              label: [expected_speedup(alpha, k, c, verify_cost[k]) for k in ks]}
    for name, cost in (others or {}).items():
        if name in curves or 1 not in cost:
            raise ValueError(f"each of `others` needs its own name and a v_K from K = 1; got {name!r}")
        priced = [k for k in ks if all(j in cost for j in range(1, k + 1))]
        curves[name] = [expected_speedup(alpha, k, c, cost[k]) for k in priced]
    return curves


def measured_series(measured, label="measured (stored run)") -> dict:
    """`measured` as name -> K -> ratio: one K -> ratio mapping is one series named `label`."""
    if not measured:
        return {}
    return measured if isinstance(next(iter(measured.values())), dict) else {label: measured}


# the predicted curves' colours, red left out: it marks break-even
CURVE_COLORS = [PALETTE[i] for i in (0, 1, 2, 4, 5, 6, 7)]
# the measured series' markers, in order: the first filled black, the next ones hollow
MEASURED_MARKERS = [dict(size=9, color="black"), dict(size=9, color=NEUTRAL, symbol="circle-open", line=dict(width=2)),
                    dict(size=9, color=NEUTRAL, symbol="diamond-open", line=dict(width=2))]


def speedup_figure(alpha, c, verify_cost, measured=None, k_max=K_MAX, label="this machine", others=None,
                   measured_label="measured (stored run)") -> go.Figure:
    """The predicted curves over K (speedup_curves) with each one's best K marked, and the measured dots."""
    fig = go.Figure()
    curves = speedup_curves(alpha, c, verify_cost, k_max, label, others)
    for i, (name, ys) in enumerate(curves.items()):
        ks, color = list(range(1, len(ys) + 1)), CURVE_COLORS[i % len(CURVE_COLORS)]
        best = max(ks, key=lambda k: ys[k - 1])
        fig.add_trace(go.Scatter(x=ks, y=ys, mode="lines+markers", name=f"predicted, {name} (best K {best})",
                                 line=dict(color=color)))
        fig.add_trace(go.Scatter(x=[best], y=[ys[best - 1]], mode="markers", showlegend=False,
                                 marker=dict(size=14, color=color, symbol="star")))
    for i, (name, points) in enumerate(measured_series(measured, measured_label).items()):
        points = {k: x for k, x in points.items() if k <= k_max}
        fig.add_trace(go.Scatter(x=list(points), y=list(points.values()), mode="markers", name=name,
                                 marker=MEASURED_MARKERS[i % len(MEASURED_MARKERS)]))
    fig.add_hline(y=1.0, line=dict(color=BAD, dash="dot"))
    fig.update_layout(title=f"Predicted speedup over plain decoding at alpha = {alpha:.3f}, c = {c:.3f}",
                      xaxis=dict(title="K, drafted tokens per step", dtick=1, gridcolor="#eeeeee"),
                      yaxis=dict(title="speedup", gridcolor="#eeeeee", zerolinecolor=NEUTRAL),
                      height=380, plot_bgcolor="white", legend=dict(orientation="h", y=-0.25))
    return fig


class _LiveFigure:
    """Sliders over a plotly figure: `current_figure()` from the sliders' values, redrawn when one moves;
    shown live in a running kernel and as a stored picture where none runs. Subclasses set `sliders` and
    `current_figure`, then call `_build(controls)`."""

    def _build(self, controls):
        self.figure = go.FigureWidget(self.current_figure())
        for slider in self.sliders:
            slider.observe(lambda _: self.redraw(), names="value")
        self.widget = W.VBox([controls, self.figure])

    def redraw(self):
        fresh = self.current_figure()
        with self.figure.batch_update():
            self.figure.data = []
            self.figure.add_traces(list(fresh.data))
            self.figure.layout = fresh.layout

    def show(self):
        """Display `display_bundle()`."""
        display(self.display_bundle(), raw=True)

    def display_bundle(self) -> dict:
        """The live sliders' view, which a running kernel draws, and beside it a picture of the figure as it
        stands, which a saved notebook shows where no kernel runs."""
        bundle = self.widget._repr_mimebundle_()
        static = figure_bundle(self.current_figure())
        bundle["image/png"], bundle["text/plain"] = static["image/png"], static["text/plain"]
        return bundle


class SpeedupExplorer(_LiveFigure):
    """Sliders for alpha, c and the largest K over `speedup_figure`, redrawn as they move."""

    def __init__(self, verify_cost, measured=None, alpha=0.45, c=0.026, label="this machine", others=None,
                 measured_label="measured (stored run)"):
        self.verify_cost, self.label, self.others = verify_cost, label, others
        self.measured = measured_series(measured, measured_label)
        style = {"description_width": "initial"}
        self.alpha = W.FloatSlider(alpha, min=0.0, max=0.95, step=0.001, readout_format=".3f",
                                   description="alpha", style=style)
        self.c = W.FloatSlider(c, min=0.0, max=0.5, step=0.002, readout_format=".3f", description="c", style=style)
        self.k_max = W.IntSlider(8, min=2, max=K_MAX, description="largest K", style=style)
        self.sliders = (self.alpha, self.c, self.k_max)
        self._build(W.HBox(list(self.sliders)))

    def current_figure(self) -> go.Figure:
        return speedup_figure(self.alpha.value, self.c.value, self.verify_cost, self.measured, self.k_max.value,
                              self.label, self.others)


class AcceptanceExplorer(_LiveFigure):
    """A slider for each token's weight in p and in q (each normalised to sum to 1) over
    viz.acceptance_figure: the accepted mass min(p, q) and the residual, redrawn as they move."""

    def __init__(self, p, q, labels=None):
        p, q = [float(x) for x in p], [float(x) for x in q]
        if len(p) != len(q) or not 2 <= len(p) <= 8 or min(p + q) < 0:
            raise ValueError(f"p and q must be 2 to 8 non-negative weights each, of one length; got {len(p)} "
                             f"and {len(q)}")
        self.labels = list(labels) if labels is not None else [f"x{i}" for i in range(len(p))]
        style = {"description_width": "initial"}
        top = max(p + q)
        self.p_weights = [W.FloatSlider(x, min=0.0, max=top, step=top / 1000, description=f"p({name})", style=style,
                                        readout_format=".3f") for x, name in zip(p, self.labels)]
        self.q_weights = [W.FloatSlider(x, min=0.0, max=top, step=top / 1000, description=f"q({name})", style=style,
                                        readout_format=".3f") for x, name in zip(q, self.labels)]
        self.sliders = (*self.p_weights, *self.q_weights)
        self._build(W.HBox([W.VBox(self.p_weights), W.VBox(self.q_weights)]))

    def distributions(self):
        """(p, q) as the sliders stand, each normalised; all weights at zero read as uniform."""
        def norm(sliders):
            w = [s.value for s in sliders]
            total = sum(w)
            return [x / total for x in w] if total > 0 else [1 / len(w)] * len(w)
        return norm(self.p_weights), norm(self.q_weights)

    def current_figure(self) -> go.Figure:
        return acceptance_figure(*self.distributions(), labels=self.labels)
