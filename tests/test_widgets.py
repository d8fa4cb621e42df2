"""The demo panel driven from Python, as the Run button drives it, without a browser.

Two drafts on the real SmolLM2 target cover the four fates: the target as its own
draft accepts everything (accepted and bonus tokens); a tiny random draft is
rejected at once (rejected and correction tokens).
"""
import json
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

import specdec_lab as sl
from specdec_lab.lab.widgets import DEFAULT_K, WARMUP_TOKENS, DemoPanel, token_fates, token_span

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny_draft():
    """A random 2-layer draft with SmolLM2's vocabulary: the target rejects nearly all it proposes."""
    return sl.tiny_model(0, vocab_size=49152, dim=32, n_heads=2, n_kv_heads=1, max_seq_len=2048)


def _run(panel, prompt="Why is the sky blue?", k=4, temperature=0.8, top_p=0.9, max_new_tokens=10, **values):
    panel.redraw_seconds = 0.0  # redraw after every step, so the streaming can be counted
    panel.prompt.value, panel.k.value, panel.temperature.value = prompt, k, temperature
    panel.top_p.value, panel.max_new_tokens.value = top_p, max_new_tokens
    for name, value in values.items():
        getattr(panel, name).value = value
    strips = []
    panel.strip.observe(lambda change: strips.append(change["new"]), names="value")
    panel.run_button.click()  # the button's handler, as a press in the browser calls it
    return panel.result, strips


def _classes_in_strip(html):
    return re.findall(r'class="sdl-tok sdl-(\w+)" data-step="(\d+)"', html)


def _expected_classes(steps):
    return [(fate, str(rec.step)) for rec in steps for fate, _, _ in token_fates(rec)]


def test_panel_streams_each_step_and_draws_what_the_engine_recorded(default_target):
    panel = DemoPanel(default_target, default_target)
    res, strips = _run(panel, k=3, baseline=True)
    assert res is not None, panel.error.value
    assert panel.error.value == ""
    steps = res.steps
    assert len(strips) == len(steps), "the strip must be redrawn from the on_step hook, once per step"
    for i, strip in enumerate(strips):
        assert f'data-step="{i}"' in strip and f'data-step="{i + 1}"' not in strip, "redraw i shows steps 0..i"
    assert list(panel.chart.data[0].y) == [r.num_accepted for r in steps], "green bars: accepted per step"
    assert list(panel.chart.data[1].y) == [r.k - r.num_accepted for r in steps], "grey bars: the rest of K"
    assert list(panel.chart.data[0].x) == list(panel.chart.data[1].x) == [r.step for r in steps]
    classes = _classes_in_strip(panel.strip.value)
    assert classes == _expected_classes(steps)
    fates = {f for f, _ in classes}
    assert "accepted" in fates and "bonus" in fates, "the target as its own draft accepts every token"
    shown = [int(t) for t in re.findall(r'data-token="(\d+)"', panel.strip.value)]
    assert shown == res.tokens, "with nothing rejected the strip is exactly the output"
    figs = panel.figure_values
    assert figs["new_tokens"] == len(res.tokens) and figs["steps"] == len(steps)
    assert figs["mean_tokens_per_step"] == pytest.approx(len(res.tokens) / len(steps))
    assert figs["accepted_share"] == pytest.approx(res.stats.accepted_share)
    assert figs["tokens_per_second"] > 0 and figs["baseline_tokens_per_second"] > 0
    assert figs["speedup"] == pytest.approx(figs["tokens_per_second"] / figs["baseline_tokens_per_second"])
    assert panel.baseline_result is not None and len(panel.baseline_result.tokens) == 10
    assert f'data-figure="speedup"><div class="sdl-value">{figs["speedup"]:.2f}x' in panel.figures.value
    assert 'data-state="done"' in panel.figures.value and 'data-k="3"' in panel.figures.value
    assert "p(d) = " in panel.strip.value and "u = " in panel.strip.value
    assert not panel.run_button.disabled, "the button must come back after a run"


def test_rejected_draft_tokens_are_struck_through_before_their_correction(default_target, tiny_draft):
    panel = DemoPanel(sl.ModelPair(default_target, tiny_draft, default_target.tokenizer))
    res, _ = _run(panel, k=2, max_new_tokens=6, baseline=False)
    assert res is not None, panel.error.value
    classes = _classes_in_strip(panel.strip.value)
    assert classes == _expected_classes(res.steps)
    assert ("rejected", "0") in classes and ("correction", "0") in classes
    assert classes.index(("rejected", "0")) + 1 == classes.index(("correction", "0")), \
        "the rejected token sits where it was proposed, right before the correction that replaced it"
    rec = res.steps[0]
    assert rec.num_accepted == 0
    assert "discarded after it" in panel.strip.value, "the rest of a rejected draft is listed in the hover"
    assert "rejected: u &gt;= min(1, p(d) / q(d))" in panel.strip.value
    assert list(panel.chart.data[0].y) == [r.num_accepted for r in res.steps]
    assert list(panel.chart.data[1].y) == [r.k - r.num_accepted for r in res.steps]
    assert panel.figure_values["accepted_share"] == pytest.approx(res.stats.accepted_share)
    assert panel.figure_values["speedup"] is None, "no baseline was run"
    snapshot = panel.chart_snapshot()
    assert list(snapshot.data[0].y) == [r.num_accepted for r in res.steps], "the snapshot is the chart's last state"


def test_a_run_warms_each_engine_once_then_times_both_on_the_same_settings(default_target):
    panel = DemoPanel(default_target, default_target)
    assert panel.k.value == DEFAULT_K and panel.baseline.value, "a press of Run times both engines by default"
    res, _ = _run(panel, k=2, temperature=0.0, max_new_tokens=6)
    assert res is not None, panel.error.value
    warmed = {("default", "model"): WARMUP_TOKENS, ("default", "autoregressive"): WARMUP_TOKENS}
    assert panel.warmed == warmed, "both engines generate untimed tokens before their first timed run"
    figs = panel.figure_values
    assert figs["tokens_per_second"] > 0 and figs["baseline_tokens_per_second"] > 0
    assert panel.baseline_result.tokens == res.tokens, "greedy: the target alone gives the same tokens"
    _run(panel, k=3, temperature=0.0, max_new_tokens=6)
    assert panel.warmed == warmed, "a warmed engine is not warmed again"
    _run(panel, k=3, temperature=0.0, max_new_tokens=6, drafter="ngram")
    assert panel.warmed[("default", "ngram")] == WARMUP_TOKENS and len(panel.warmed) == 3
    assert "autoregressive tokens/s" in panel.figures.value and "speculative tokens/s" in panel.figures.value


def test_greedy_hover_says_there_is_no_uniform(default_target):
    panel = DemoPanel(default_target, default_target)
    res, _ = _run(panel, temperature=0.0, max_new_tokens=6)
    assert res is not None, panel.error.value
    assert "u = - (greedy: accept while argmax p = d)" in panel.strip.value


def test_token_text_and_hover_are_escaped():
    info = {"step": 7, "p": 0.5, "q": 0.25, "u": 0.75, "discarded": [1]}
    span = token_span("rejected", 3, info, False, decode=lambda t: '<b>"&' if t == 3 else "</span>")
    assert '<b>' not in span and "&lt;b&gt;&quot;&amp;</span>" in span
    assert "&#x27;&lt;/span&gt;&#x27;" in span, "discarded tokens in the hover are escaped too"
    assert 'data-step="7"' in span and "p(d) = 0.5   q(d) = 0.25   u = 0.75" in span


def test_ngram_adaptive_and_lookup_drafters_run_from_the_dropdown(default_target):
    panel = DemoPanel(default_target, default_target)
    prompt = "Repeat exactly: one two three four five six, one two three four five six."
    res, _ = _run(panel, prompt=prompt, temperature=0.0, max_new_tokens=8, drafter="ngram")
    assert res is not None, panel.error.value
    assert _classes_in_strip(panel.strip.value) == _expected_classes(res.steps)
    res, _ = _run(panel, k=2, temperature=0.0, max_new_tokens=8, drafter="adaptive")
    assert res is not None, panel.error.value
    assert all(r.k <= 2 for r in res.steps), "adaptive K never drafts more than the slider allows"
    res, _ = _run(panel, prompt=prompt, k=5, temperature=0.0, max_new_tokens=12, drafter="lookup")
    assert res is not None, panel.error.value
    assert _classes_in_strip(panel.strip.value) == _expected_classes(res.steps)
    assert all(r.k <= 5 for r in res.steps) and any(r.k == 5 for r in res.steps), \
        "prompt lookup copies a repeated text with the slider's K"


def test_bad_input_shows_a_message_not_a_traceback(default_target):
    panel = DemoPanel(default_target, default_target)
    res, _ = _run(panel, prompt="   ")
    assert res is None
    assert "prompt must not be empty" in panel.error.value and "sdl-error" in panel.error.value
    assert 'data-state="error"' in panel.figures.value
    assert not panel.run_button.disabled


def test_hub_pairs_are_refused_without_cuda_and_load_errors_are_readable(default_target):
    panel = DemoPanel(default_target, default_target, hub_enabled=False)
    assert panel.load_button.disabled and panel.hub_target.disabled
    assert panel.load_hub_pair() is None and "CUDA" in panel.error.value

    def failing_loader(target, draft, device):
        raise OSError(f"{target} is not a local folder and is not a valid model identifier")

    panel = DemoPanel(default_target, default_target, hub_enabled=True, pair_loader=failing_loader)
    panel.hub_target.value, panel.hub_draft.value = "no/such-model", "no/such-draft"
    assert panel.load_hub_pair() is None
    assert "not a valid model identifier" in panel.error.value
    assert panel.pair.value == "default"

    pair = sl.ModelPair(default_target, default_target, default_target.tokenizer)
    panel = DemoPanel(default_target, default_target, hub_enabled=True, pair_loader=lambda t, d, device: pair)
    panel.hub_target.value, panel.hub_draft.value = "a/target", "a/draft"
    panel.load_button.click()
    assert panel.pair.value == "a/target + a/draft" and panel.error.value == ""
    assert panel.pairs[panel.pair.value] is pair


def test_panel_needs_a_pair_or_a_target_with_a_draft(default_target):
    with pytest.raises(ValueError, match="ModelPair"):
        DemoPanel(default_target)


def test_re_executing_a_chapter_stores_no_widget_state(tmp_path):
    """make setup installs scripts/jupyter_nbconvert_config.json, so `jupyter nbconvert --execute`
    leaves metadata.widgets out (the panel's chart alone would store about 5 MB of plotly)."""
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("import ipywidgets as W\nW.IntSlider(3)")])
    path = tmp_path / "widget.ipynb"
    nbformat.write(nb, path)
    jupyter = Path(sys.executable).parent / "jupyter"
    proc = subprocess.run([str(jupyter), "nbconvert", "--to", "notebook", "--execute", "--inplace", str(path)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    done = json.loads(path.read_text())
    assert done["cells"][0]["outputs"], "the cell ran and displayed its slider"
    assert "widgets" not in done["metadata"], \
        "widget state was stored: is .venv/etc/jupyter/jupyter_nbconvert_config.json installed (make setup)?"
