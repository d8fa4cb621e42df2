"""Chapter 15's checks: the panel's run, the side-by-side comparison, the stored figures the chapter
quotes, and every chapter's system giving the target's own greedy answers."""
import json
import re
from pathlib import Path

import gguf

from ...analysis.roofline import HARDWARE, critical_batch_size
from ...io import assets

DOCS = Path(__file__).resolve().parents[3] / "docs"


def _systems(name):
    return json.loads((DOCS / name).read_text())["results"][0]["systems"]


def run_claims(res, reference):
    """What a greedy speculative run must satisfy against the target's own greedy run `reference`:
    the same tokens, each step committing its accepted drafts plus one token, and counts that add up."""
    s = res.stats
    assert res.tokens == reference.tokens, "greedy speculative decoding must give the target's own tokens"
    assert s.new_tokens == len(res.tokens) <= s.accepted + s.steps, "a step commits accepted drafts + one token"
    assert s.accepted == sum(r.num_accepted for r in res.steps) <= s.drafted == sum(r.k for r in res.steps)


def panel_shows(panel, result):
    """The panel draws what the engine did: one bar per step, the strip less its rejections is the
    output, the cards' figures are the run's, and the engine ran untimed before it was timed."""
    figs = panel.figure_values
    assert list(panel.chart.data[0].y) == [r.num_accepted for r in result.steps], "one green bar per step"
    shown = re.findall(r'class="sdl-tok sdl-(\w+)" data-step="\d+" data-token="(\d+)"', panel.strip.value)
    assert [int(t) for fate, t in shown if fate != "rejected"] == result.tokens, "the strip, less rejections, is the output"
    assert figs["accepted_share"] == result.stats.accepted / result.stats.drafted
    assert abs(figs["speedup"] - figs["tokens_per_second"] / figs["baseline_tokens_per_second"]) < 1e-12
    assert panel.warmed[("default", "model")] > 0, "the engine ran untimed before it was timed"


def comparison(compare, verdicts):
    """The live side-by-side run: every choice lossless, each interval around its ratio, and the
    self-draft (where it ran) committing the most tokens per step and never measured below another."""
    for name, c in compare.items():
        assert c["same_as_ar"], f"{name}: every choice must give the target's greedy output"
        assert c["ci"][0] <= c["speedup"] <= c["ci"][1], f"{name}: the interval must contain the measured ratio"
    if "spec_self_k6" in compare:
        others = [name for name in compare if name != "spec_self_k6"]
        assert all(compare["spec_self_k6"]["tokens_per_step"] > compare[n]["tokens_per_step"] for n in others), \
            "the self-draft commits the most tokens per step"
        for (a, b), verdict in verdicts.items():
            if "spec_self_k6" in (a, b):
                assert verdict != ("faster" if b == "spec_self_k6" else "slower"), f"live, the self-draft never below {a}"


def stored_figures(profile):
    """The stored runs as "What to try" reads them, the self-draft's origin and figures, and the GPU
    prediction's inputs."""
    fast = _systems("bench_fast_memory.json")
    ci = {name: s["vs_ar_ci95"] for name, s in fast.items()}
    assert ci["spec_self_k6"][0] > max(ci[n][1] for n in ("spec_k2", "spec_stop", "spec_lookup")), \
        "stored: the self-draft's interval over autoregressive lies above the distilled draft's"
    full = {name: s["vs_ar_ci95"] for name, s in _systems("bench_full.json").items()}
    assert full["spec_k8"][1] < min(full["spec_k2"][0], full["spec_k3"][0]), "K = 8 below K = 2 and 3, intervals apart"
    assert all(full["spec_k6"][1] > full[k][0] and full["spec_lookup"][0] < full[k][1] for k in ("spec_k2", "spec_k3"))
    tensors = gguf.GGUFReader(str(assets.ensure_gguf())).tensors  # the target's file, as it ships
    expansion = 4 * sum(int(t.n_elements) for t in tensors) / sum(int(t.n_bytes) for t in tensors)
    assert f"{expansion:.1f}" == "5.6", "float32 reads 5.6x the file's bytes"
    self_k6 = fast["spec_self_k6"]
    assert [f"{self_k6[k]:.2f}" for k in ("mean_tokens_per_step", "alpha", "c")] == ["6.39", "1.00", "0.25"], self_k6
    assert round(critical_batch_size(HARDWARE["H200"].peak_flops, HARDWARE["H200"].bandwidth)) == 206
    assert profile["forward"]["ridge_rows"] == 3, "the prose's ridge for this CPU's forward"
    assert f"{fast['int4_decode']['vs_ar']:.2f}" == "3.05", "the 4-bit kernel, as quoted"


def every_system(finale, reference):
    """Every chapter's system gives the target's greedy answers, and commits at least a token a step."""
    for name, (tokens, per_step) in finale.items():
        assert tokens == reference, f"{name}: greedy output must be the target's own"
        assert per_step >= 1.0, f"{name}: a step commits at least one token"
