"""The live demo: an ipywidgets panel that runs speculative decoding and shows every step.

    panel = DemoPanel(sl.load_default_pair())      # or DemoPanel(target, draft)
    panel.widget                                    # display it: controls, token strip, chart, figures
    panel.k.value = 6; panel.run()                  # what the Run button does, driven from Python

The panel streams: the engine's `on_step(record, tokens_so_far)` hook redraws the
token strip, the per-step chart and the running figures after each step. The
hook runs in the kernel thread, and every widget value it sets is sent to the
browser at once, so the front end shows the run as it happens.

Token fates, one CSS class each in the strip (the words of metrics.StepRecord):
  sdl-accepted    d_1..d_n, the draft tokens the target accepted (n = num_accepted)
  sdl-rejected    d_(n+1), struck through where it was proposed; the rest of
                  that draft is discarded (its hover lists it)
  sdl-correction  next_token when n < k: drawn from norm(max(0, p - q))
  sdl-bonus       next_token when n == k > 0: drawn from p_(k+1), for free
  sdl-target      next_token of a plain step (k == 0, nothing drafted)
Hovering a token shows p(d), q(d), the uniform u of its test (none when greedy)
and the step number.

Timing: tokens/s divides the tokens by the decode seconds the engine measured
(draft + target phases of every step), so the time spent redrawing the panel is
not charged to speculative decoding; the autoregressive run (ticked by default)
is timed the same way, on the same prompt and settings, right after it. Before
either is timed for the first time, each engine generates WARMUP_TOKENS untimed
tokens: a first call pays for allocating caches and touching every weight, and
charging that to one engine would bias the speedup.
"""
import html
import math
import time

import ipywidgets as W
import plotly.graph_objects as go
import torch
from IPython.display import display

from ..api import LookupThenModelDrafter, SpeculativeEngine, autoregressive_generate, load_pair
from ..core.records import RunStats
from ..drafters import NGramDrafter
from ..io.pair import ModelPair
from ..policies.adaptive import CostAwareController

FATES = ("accepted", "rejected", "correction", "bonus", "target")
FATE_LABELS = {"accepted": "accepted draft token", "rejected": "rejected draft token",
               "correction": "correction token", "bonus": "bonus token", "target": "target token (no draft)"}
DRAFTERS = [("model draft", "model"), ("n-gram (prompt lookup)", "ngram"),
            ("model draft, adaptive K (slider = largest K)", "adaptive"),
            ("prompt lookup, else the draft (stops when unsure)", "lookup")]
STOP_BELOW = 0.2  # the "lookup" drafter's draft stops after a token it gives less than this
LOAD_ERRORS = (ValueError, OSError, RuntimeError, ImportError)  # FileNotFoundError is an OSError
RUN_ERRORS = (ValueError, RuntimeError)  # bad input; CUDA out of memory is a RuntimeError
WARMUP_TOKENS = 8  # untimed tokens each engine generates before its first timed run
DEFAULT_K = 2  # chapter 11: at temperature 0, K = 2 or 3 beat longer drafts with the shipped draft

STYLE = """<style>
.sdl-strip { font-family: var(--jp-code-font-family, monospace); font-size: 13px; line-height: 1.9;
             white-space: pre-wrap; word-break: break-word; max-height: 260px; overflow-y: auto; }
.sdl-tok { color: #111; border-radius: 3px; padding: 1px 0; margin: 0 1px; cursor: help; }
.sdl-accepted { background: #b9efb5; }
.sdl-rejected { background: #f6c1c1; color: #8a1c1c; text-decoration: line-through; }
.sdl-correction { background: #a9d2ff; }
.sdl-bonus { background: #ffd98a; }
.sdl-target { background: #e2e2e2; }
.sdl-figures { display: flex; flex-wrap: wrap; gap: 10px; }
.sdl-figure { min-width: 104px; padding: 4px 8px; border: 1px solid #ccc; border-radius: 4px; }
.sdl-value { font-size: 20px; font-weight: 600; }
.sdl-label { font-size: 11px; color: #666; }
.sdl-error { color: #8a1c1c; background: #fde8e8; border: 1px solid #f0b4b4; border-radius: 4px; padding: 6px; }
</style>"""


def token_fates(rec) -> list:
    """One StepRecord -> [(fate, token, info)] in output order, info = {step, p, q, u, discarded}.

    Only committed tokens appear (the engine cuts at EOS and max_new_tokens), plus
    the rejected draft token, placed where it was proposed: just before the
    correction that replaced it.
    """
    n, k = rec.num_accepted, rec.k
    committed = rec.committed or rec.drafted[:n] + [rec.next_token]

    def info(i):
        return {"step": rec.step, "p": rec.p_draft[i], "q": rec.q_draft[i],
                "u": rec.uniforms[i] if rec.uniforms else None, "discarded": []}

    out = [("accepted", committed[i], info(i)) for i in range(min(n, len(committed)))]
    if len(committed) > n:  # the step's next token made it into the output
        plain = {"step": rec.step, "p": None, "q": None, "u": None, "discarded": []}
        if k == 0:
            out.append(("target", rec.next_token, plain))
        elif n < k:
            out.append(("rejected", rec.drafted[n], info(n) | {"discarded": rec.drafted[n + 1:]}))
            out.append(("correction", rec.next_token, plain))
        else:
            out.append(("bonus", rec.next_token, plain))
    return out


def _fmt(x):
    return "-" if x is None else f"{x:.3g}"


def _hover(fate, info, greedy, decode) -> str:
    lines = [f"step {info['step']}: {FATE_LABELS[fate]}"]
    if info["p"] is not None:
        u = "- (greedy: accept while argmax p = d)" if greedy else _fmt(info["u"])
        lines.append(f"p(d) = {_fmt(info['p'])}   q(d) = {_fmt(info['q'])}   u = {u}")
    if fate == "rejected":
        lines.append("rejected: u >= min(1, p(d) / q(d))" if not greedy else "rejected: argmax p != d")
        if info["discarded"]:
            lines.append("discarded after it: " + " ".join(repr(decode(t)) for t in info["discarded"]))
    elif fate == "correction":
        lines.append("drawn from norm(max(0, p - q)) at the rejected position")
    elif fate == "bonus":
        lines.append("all drafts accepted: drawn from p at position K+1, no extra forward")
    return "\n".join(lines)


def token_span(fate, token, info, greedy, decode) -> str:
    """One token of the strip as HTML; its text and hover are escaped."""
    text = decode(token).replace("\n", "\u21b5\n") or "\u2205"
    title = html.escape(_hover(fate, info, greedy, decode), quote=True)
    return (f'<span class="sdl-tok sdl-{fate}" data-step="{info["step"]}" data-token="{token}" '
            f'title="{title}">{html.escape(text)}</span>')


def step_chart() -> go.FigureWidget:
    """Per-step stacked bars, K high in all: accepted (green) under drafted but not accepted (light red,
    as the strip's rejected tokens)."""
    fig = go.FigureWidget(layout=go.Layout(
        barmode="stack", height=240, margin=dict(l=40, r=10, t=30, b=35),
        title=dict(text="accepted out of K, per step", font=dict(size=13)),
        xaxis=dict(title="step", dtick=1), yaxis=dict(title="draft tokens", rangemode="tozero", dtick=1),
        legend=dict(orientation="h", x=1, xanchor="right", y=1.15)))
    fig.add_bar(x=[], y=[], name="accepted", marker_color="#3aa845")
    fig.add_bar(x=[], y=[], name="rejected or discarded", marker_color="#f6c1c1")
    return fig


def update_chart(fig, steps):
    """Redraw the chart from StepRecords: bar heights num_accepted and k - num_accepted."""
    x = [r.step for r in steps]
    with fig.batch_update():
        fig.data[0].x, fig.data[0].y = x, [r.num_accepted for r in steps]
        fig.data[1].x, fig.data[1].y = x, [r.k - r.num_accepted for r in steps]
        fig.layout.xaxis.dtick = max(1, math.ceil(len(steps) / 25))  # whole steps, at most ~25 ticks


def figures_html(figs: dict, run: int, state: str, k: int) -> str:
    """The running figures as cards; data attributes let a browser test read the state."""
    rows = [("tokens_per_second", "speculative tokens/s"), ("baseline_tokens_per_second", "autoregressive tokens/s"),
            ("speedup", "speedup (speculative / autoregressive)"), ("mean_tokens_per_step", "tokens per step"),
            ("accepted_share", "accepted share (accepted / drafted)"), ("new_tokens", "tokens"), ("steps", "steps")]
    cards = []
    for key, label in rows:
        v = figs.get(key)
        text = "-" if v is None else f"{v:.2f}x" if key == "speedup" else str(v) if isinstance(v, int) else f"{v:.2f}"
        cards.append(f'<div class="sdl-figure" data-figure="{key}"><div class="sdl-value">{text}</div>'
                     f'<div class="sdl-label">{label}</div></div>')
    return (f'{STYLE}<div class="sdl-figures" data-run="{run}" data-state="{state}" data-k="{k}">'
            + "".join(cards) + "</div>")


def legend_html() -> str:
    spans = "".join(f'<span class="sdl-tok sdl-{f}">{FATE_LABELS[f]}</span> ' for f in FATES)
    return f'{STYLE}<div class="sdl-strip">{spans}</div>'


class DemoPanel:
    """The demo panel. `DemoPanel(pair)` with a ModelPair, or `DemoPanel(target, draft)`.

    Controls (widgets, set `.value`): prompt, k, temperature, top_p, max_new_tokens,
    seed, drafter ("model" | "ngram" | "adaptive" | "lookup"), pair, baseline (time the target
    alone too; on by default), run_button, and
    hub_target, hub_draft, load_button for hub pairs (CUDA only).
    Displays: strip, chart (a plotly FigureWidget), figures, status, error.
    After run(): result, baseline_result, figure_values (the numbers on the cards);
    `warmed` maps each engine warmed so far, (pair, drafter) or (pair, "autoregressive"),
    to the untimed tokens it generated before its first timed run.
    `pair_loader` loads a hub pair (default specdec_lab.load_pair); `hub_enabled`
    defaults to CUDA being available and the panel's device being CUDA.
    """

    def __init__(self, pair_or_target, draft=None, device=None, hub_enabled=None, pair_loader=None,
                 max_seq_len=1024, redraw_seconds=0.05):
        if isinstance(pair_or_target, ModelPair):
            pair = pair_or_target
        elif draft is not None and hasattr(pair_or_target, "cfg"):
            pair = ModelPair(pair_or_target, draft, getattr(pair_or_target, "tokenizer", None))
        else:
            raise ValueError("pair_or_target must be a ModelPair, or a target model given with draft=")
        self.device = str(device or pair.target.device)
        self.hub_enabled = (torch.cuda.is_available() and self.device.startswith("cuda")
                            if hub_enabled is None else hub_enabled)
        pair_loader = pair_loader or load_pair
        self.pair_loader, self.max_seq_len, self.redraw_seconds = pair_loader, max_seq_len, redraw_seconds
        self.pairs = {"default": pair}
        self._engines, self._decoded, self.warmed = {}, {}, {}
        self._steps, self._spans, self._tokenizer = [], [], pair.tokenizer  # what the strip shows
        self.result = self.baseline_result = None
        self.figure_values, self.runs = {}, 0
        self._build()

    # -- layout -------------------------------------------------------------------------
    def _build(self):
        wide, style = W.Layout(width="100%"), {"description_width": "initial"}
        self.prompt = W.Textarea(value="Why is the sky blue?", description="prompt", layout=W.Layout(
            width="100%", height="60px"), style=style)
        self.k = W.IntSlider(DEFAULT_K, min=1, max=8, description="K", style=style)
        self.temperature = W.FloatSlider(0.0, min=0.0, max=1.5, step=0.05, description="temperature", style=style)
        self.top_p = W.FloatSlider(1.0, min=0.05, max=1.0, step=0.05, description="top-p", style=style)
        self.max_new_tokens = W.IntSlider(64, min=1, max=256, description="max new tokens", style=style)
        self.seed = W.IntText(0, description="seed", style=style, layout=W.Layout(width="130px"))
        self.drafter = W.Dropdown(options=DRAFTERS, value="model", description="drafter", style=style)
        self.pair = W.Dropdown(options=[("default pair", "default")], value="default", description="pair",
                               style=style)
        self.baseline = W.Checkbox(True, description="time the target alone too (autoregressive)", indent=False)
        self.run_button = W.Button(description="Run", button_style="primary", icon="play")
        self.run_button.on_click(lambda _: self.run())
        hub = dict(style=style, disabled=not self.hub_enabled, layout=W.Layout(width="380px"))
        self.hub_target = W.Text(placeholder="HuggingFaceTB/SmolLM2-1.7B-Instruct", description="hub target", **hub)
        self.hub_draft = W.Text(placeholder="HuggingFaceTB/SmolLM2-135M-Instruct", description="hub draft", **hub)
        self.load_button = W.Button(description="Load pair", icon="download", disabled=not self.hub_enabled,
                                    layout=W.Layout(width="120px"))
        self.load_button.on_click(lambda _: self.load_hub_pair())
        hub_note = ("Two Llama-family models that share a tokenizer, by hub id or local folder."
                    if self.hub_enabled else "Hub pairs load on CUDA only: this kernel has no GPU, so only "
                    "the default pair is offered.")
        self.error = W.HTML("")
        self.status = W.HTML("Press Run.")
        self.figures = W.HTML(figures_html({}, 0, "idle", self.k.value))
        self.strip = W.HTML(f'{STYLE}<div class="sdl-strip"></div>', layout=wide)
        self.chart = step_chart()
        for w, name in ((self.k, "sdl-k"), (self.run_button, "sdl-run"), (self.strip, "sdl-strip-widget"),
                        (self.chart, "sdl-chart")):
            w.add_class(name)
        self.widget = W.VBox([
            W.HTML("<b>Speculative decoding, step by step</b>"), self.prompt,
            W.HBox([self.k, self.temperature, self.top_p, self.max_new_tokens]),
            W.HBox([self.drafter, self.pair, self.seed, self.baseline, self.run_button]),
            W.HBox([self.hub_target, self.hub_draft, self.load_button]), W.HTML(f"<i>{hub_note}</i>"),
            self.error, self.status, self.figures, W.HTML(legend_html()), self.strip, self.chart])
        self.widget.add_class("sdl-panel")

    # -- actions --------------------------------------------------------------------------
    def run(self):
        """Generate with the current settings, streaming every step; returns the GenerationResult or None."""
        self.runs += 1
        self.error.value = ""
        self.run_button.disabled = True
        try:
            return self._run()
        except RUN_ERRORS as e:
            self._show_error(e)
            self.status.value = "Stopped: see the message above."
            self.figures.value = figures_html(self.figure_values, self.runs, "error", self.k.value)
            return None
        finally:
            self.run_button.disabled = False

    def load_hub_pair(self):
        """Load the pair named in hub_target / hub_draft and select it; errors go to the panel."""
        self.error.value = ""
        if not self.hub_enabled:
            self._show_error(f"Hub pairs load on CUDA only, and this panel runs on {self.device}; "
                             "use the default pair.")
            return None
        names = self.hub_target.value.strip(), self.hub_draft.value.strip()
        if not all(names):
            self._show_error("Name both a target and a draft (hub ids or local folders).")
            return None
        self.status.value = f"Loading {html.escape(names[0])} with {html.escape(names[1])}..."
        try:
            pair = self.pair_loader(*names, device=self.device)
        except LOAD_ERRORS as e:
            self._show_error(e)
            self.status.value = "The pair did not load."
            return None
        key = " + ".join(names)
        if key not in self.pairs:
            self.pair.options = [*self.pair.options, (key, key)]
        self.pairs[key] = pair
        self.pair.value = key
        self.status.value = f"Loaded {html.escape(key)}."
        return pair

    # -- the run ----------------------------------------------------------------------------
    def _engine(self, pair_key, kind):
        key = (pair_key, kind if kind in ("ngram", "lookup") else "model")
        if key not in self._engines:
            pair = self.pairs[pair_key]
            limit = min([self.max_seq_len] + [m.cfg.max_seq_len for m in (pair.target, pair.draft)])
            if kind == "ngram":
                draft = NGramDrafter(device=pair.target.device)
            elif kind == "lookup":
                draft = LookupThenModelDrafter(pair.draft, limit, stop_below=STOP_BELOW)
            else:
                draft = pair.draft
            self._engines[key] = SpeculativeEngine(pair.target, draft, k=4, max_seq_len=limit,
                                                   tokenizer=pair.tokenizer)
        return self._engines[key]

    def _warm_up(self, pair_key, kind, engine):
        """Run each engine once, untimed, before its first timed run (its key goes into `warmed`)."""
        pair, kw = self.pairs[pair_key], dict(self._settings(), max_new_tokens=WARMUP_TOKENS)
        if (pair_key, kind) not in self.warmed:
            self.status.value = "Warming up the speculative engine (untimed)..."
            engine.controller = None
            self.warmed[(pair_key, kind)] = len(engine.generate(self.prompt.value, k=self.k.value, **kw).tokens)
        if self.baseline.value and (pair_key, "autoregressive") not in self.warmed:
            self.status.value = "Warming up the autoregressive target (untimed)..."
            res = autoregressive_generate(pair.target, self.prompt.value, tokenizer=pair.tokenizer, **kw)
            self.warmed[(pair_key, "autoregressive")] = len(res.tokens)

    def _settings(self):
        return dict(max_new_tokens=self.max_new_tokens.value, temperature=self.temperature.value,
                    top_p=self.top_p.value, seed=self.seed.value)

    def _run(self):
        pair = self.pairs[self.pair.value]
        engine = self._engine(self.pair.value, self.drafter.value)
        self._warm_up(self.pair.value, self.drafter.value, engine)
        engine.controller = CostAwareController(k_max=self.k.value, k_start=min(4, self.k.value)) \
            if self.drafter.value == "adaptive" else None
        self._reset_view(pair.tokenizer)
        k = None if engine.controller is not None else self.k.value  # a K passed to generate overrides a controller
        res = engine.generate(self.prompt.value, k=k, on_step=self._on_step, **self._settings())
        self._redraw("done" if not self.baseline.value else "baseline")
        self.result, self.baseline_result = res, None
        if self.baseline.value:
            self.status.value = "Running the autoregressive baseline (the target alone, one token per step)..."
            self.baseline_result = autoregressive_generate(pair.target, self.prompt.value,
                                                           tokenizer=pair.tokenizer, **self._settings())
            self._redraw("done")
        self.status.value = (f"Run {self.runs} done: {res.stats.new_tokens} tokens in {res.stats.steps} steps "
                             f"(hover a token for p(d), q(d), u and its step).")
        return res

    def _reset_view(self, tokenizer):
        self._tokenizer, self._steps, self._spans = tokenizer, [], []
        self._greedy = self.temperature.value == 0
        self._last_redraw = 0.0
        self.baseline_result = None
        self._redraw("running")

    def _on_step(self, rec, tokens_so_far):
        self._steps.append(rec)
        self._spans += [token_span(f, t, i, self._greedy, self._decode) for f, t, i in token_fates(rec)]
        if time.perf_counter() - self._last_redraw >= self.redraw_seconds:
            self._redraw("running")

    def _redraw(self, state):
        steps = self._steps
        self.strip.value = f'{STYLE}<div class="sdl-strip">{"".join(self._spans)}</div>'
        update_chart(self.chart, steps)
        self.figure_values = self._figures()
        self.figures.value = figures_html(self.figure_values, self.runs, state, self.k.value)
        if state == "running":
            self.status.value = f"Run {self.runs}: step {len(steps)}, {self.figure_values['new_tokens']} tokens..."
        self._last_redraw = time.perf_counter()

    def _figures(self) -> dict:
        stats = RunStats()
        for r in self._steps:
            stats.add_step(r, len(r.committed))
        seconds = stats.draft_seconds + stats.target_seconds  # decode time, redraws excluded
        tps = stats.new_tokens / seconds if seconds > 0 else None
        figs = {"tokens_per_second": tps, "mean_tokens_per_step": stats.mean_tokens_per_step if stats.steps else None,
                "accepted_share": stats.accepted_share if stats.drafted else None,
                "new_tokens": stats.new_tokens, "steps": stats.steps,
                "baseline_tokens_per_second": None, "speedup": None}
        base = self.baseline_result
        if base is not None:
            b_seconds = sum(r.target_seconds for r in base.steps)
            figs["baseline_tokens_per_second"] = len(base.tokens) / b_seconds if b_seconds > 0 else None
            if tps and figs["baseline_tokens_per_second"]:
                figs["speedup"] = tps / figs["baseline_tokens_per_second"]
        return figs

    def _decode(self, token) -> str:
        tok = self._tokenizer
        key = (id(tok), token)  # pairs may bring their own tokenizers
        if key not in self._decoded:
            self._decoded[key] = tok.decode([token]) if tok is not None else f"<{token}>"
        return self._decoded[key]

    def _show_error(self, e):
        text = str(e) if isinstance(e, (str, ValueError)) else f"{type(e).__name__}: {e}"
        self.error.value = f'{STYLE}<div class="sdl-error">{html.escape(text)}</div>'

    def show(self):
        """Display the panel (`display_bundle`): live widgets in a running kernel, a note and the legend
        where none runs."""
        display(self.display_bundle(), raw=True)

    def display_bundle(self) -> dict:
        """The panel's output: the widgets' view, which a running kernel draws, and beside it what a saved
        notebook shows where none runs (GitHub, nbviewer, JupyterLab after a page reload): a note and the
        legend as HTML, and a one-line text instead of the widgets' raw repr."""
        bundle = self.widget._repr_mimebundle_()
        bundle["text/plain"] = "The live demo panel: run this notebook's cells to use it."
        bundle["text/html"] = ("<p><i>The live demo panel appears here when this notebook runs in a kernel: "
                               "controls for K, temperature, top-p and the drafter, the cards, the token strip "
                               "and the per-step chart. The tokens' colours:</i></p>" + legend_html())
        return bundle

    def snapshot_html(self) -> str:
        """The cards and the token strip as they stand, as HTML that reads without a kernel."""
        return self.figures.value + self.strip.value

    def chart_snapshot(self) -> go.Figure:
        """The per-step chart as it stands, as a plain go.Figure (for viz.show's stored PNG)."""
        return go.Figure(self.chart.to_dict())

    def fate_counts(self) -> dict:
        """How many tokens of each fate the last run's strip shows."""
        counts = dict.fromkeys(FATES, 0)
        for rec in self._steps:
            for fate, _, _ in token_fates(rec):
                counts[fate] += 1
        return counts
