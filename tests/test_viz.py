"""viz.py: every figure function returns a go.Figure with the expected traces, and is pure."""
import plotly.graph_objects as go
import pytest

from specdec_lab.lab import viz
from specdec_lab.core.masks import verification_mask


def _pure(make):
    fig = make()
    assert isinstance(fig, go.Figure)
    assert fig.to_json() == make().to_json(), "the same input must give the same figure"
    return fig


def test_roofline_figure_draws_one_roof_per_machine_and_one_marker_per_point():
    machines = {"gpu": (1e15, 3e12), "cpu": (1e11, 2e10)}
    points = [{"label": "decode", "intensity": 1.0, "flops": 3e12}, {"label": "prefill", "intensity": 2e3, "flops": 9e14}]
    fig = _pure(lambda: viz.roofline_figure(machines, points))
    assert [t.name for t in fig.data] == ["gpu", "cpu", "decode", "prefill"]
    roof = fig.data[0]
    assert max(roof.y) == 1e15 and min(roof.y) == pytest.approx(min(roof.x) * 3e12), "min(peak, I x bandwidth)"
    assert fig.layout.xaxis.type == "log" and fig.layout.yaxis.type == "log"


def test_forward_cost_figure_has_per_forward_and_per_token_panels():
    fig = _pure(lambda: viz.forward_cost_figure([1, 2, 4], [0.01, 0.012, 0.016], predicted=[0.01, 0.01, 0.01]))
    assert len(fig.data) == 4
    assert list(fig.data[1].y) == pytest.approx([10.0, 6.0, 4.0]), "per token = per forward / T, in ms"
    assert len(_pure(lambda: viz.forward_cost_figure([1, 2], [0.01, 0.02])).data) == 2


def test_distribution_figure_has_bars_and_exact_markers_per_sampler():
    probs = {(0,): 0.5, (1,): 0.3, (2,): 0.2}
    counts = {"good": {(0,): 50, (1,): 30, (2,): 20}, "bad": {(0,): 90, (1,): 10}}
    fig = _pure(lambda: viz.distribution_figure(probs, counts, {"good": 0.9, "bad": 1e-9}))
    bars = [t for t in fig.data if isinstance(t, go.Bar)]
    assert [b.name for b in bars] == ["good", "bad"]
    assert list(bars[1].y) == [0.9, 0.1, 0.0]
    assert bars[0].marker.color == viz.GOOD and bars[1].marker.color == viz.BAD, "a failed test is drawn red"
    assert sum(1 for t in fig.data if t.name == "exact") == 2
    assert "p = 1e-09" in fig.layout.annotations[1].text


def test_speedup_heatmap_holds_theorem_3_8_and_the_best_k():
    from specdec_lab.analysis.roofline import best_k, expected_speedup
    alphas, ks = [0.2, 0.5, 0.8], [1, 2, 3, 4]
    fig = _pure(lambda: viz.speedup_heatmap(alphas, ks, 0.1))
    heat, contour, best = fig.data
    assert isinstance(heat, go.Heatmap) and isinstance(contour, go.Contour)
    assert heat.z[2][1] == pytest.approx(expected_speedup(0.5, 3, 0.1))
    assert list(best.y) == [best_k(a, 0.1, k_max=4) for a in alphas]


def test_cache_drift_figure_has_two_traces_per_run():
    fig = _pure(lambda: viz.cache_drift_figure({"ok": [4, 4], "seed": [4, 0]}, {"ok": [0, 0], "seed": [1, 2]}))
    assert [t.name for t in fig.data] == ["ok", "ok", "seed", "seed"]
    assert list(fig.data[3].y) == [1, 2]
    titles = [a.text for a in fig.layout.annotations]
    assert titles == ["draft tokens accepted per step", "committed tokens neither cached nor pending (draft_lag)"], \
        "the lower panel is pitfalls.draft_lag: a pending token counts as read"


def test_mask_figure_shows_allowed_and_blocked_cells():
    fig = _pure(lambda: viz.mask_figure(verification_mask(2, 3), L=2, labels=["c", "d1", "d2"]))
    z = fig.data[0].z
    assert [list(row) for row in z] == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]
    assert list(fig.data[0].x)[:2] == ["cache 0", "cache 1"] and list(fig.data[0].y) == ["c", "d1", "d2"]


def test_logit_difference_figure_has_one_bar_trace_per_variant_on_a_log_axis():
    fig = _pure(lambda: viz.logit_difference_figure(["c", "d1"], {"masked": [1e-5, 0.0], "unmasked": [3.0, 2.0]}))
    assert [t.name for t in fig.data] == ["masked", "unmasked"]
    assert min(fig.data[0].y) > 0, "zeros are drawn at a floor, not lost on the log axis"
    assert fig.layout.yaxis.type == "log"


def test_verify_cost_figure_has_time_and_sync_panels():
    fig = _pure(lambda: viz.verify_cost_figure([1, 4], {"loop": [1e-4, 2e-4], "vec": [2e-4, 2e-4]},
                                                {"loop": [5, 17], "vec": [0, 0]}))
    assert [t.name for t in fig.data] == ["loop", "loop", "vec", "vec"]
    assert list(fig.data[0].y) == pytest.approx([100.0, 200.0]), "seconds are drawn as microseconds"
    assert list(fig.data[3].y) == [0, 0]


def test_fragmentation_figure_draws_both_designs():
    from specdec_lab.lab.fragmentation import simulate_fragmentation
    result = simulate_fragmentation(num_requests=12, memory_tokens=4096, seed=0)
    fig = _pure(lambda: viz.fragmentation_figure(result))
    assert {t.name.split(":")[0] for t in fig.data} == {"contiguous", "paged"}


def test_speedup_heatmap_puts_white_at_break_even_and_each_blue_at_its_own_speedup():
    def colour_at(heat, speedup):
        return {round(heat.zmin + f * (heat.zmax - heat.zmin), 6): colour for f, colour in heat.colorscale}[speedup]

    heat = viz.speedup_heatmap([0.0, 0.5, 0.9], [1, 4, 8], 0.2).data[0]
    assert heat.colorscale[0][1] == viz.BAD and heat.colorscale[-1][1] == viz.BLUE, "red below 1, blue at the top"
    assert colour_at(heat, 1.0) == viz.WHITE, "white at break-even"
    narrow = viz.speedup_heatmap([0.3, 0.5], [1, 2], 0.05).data[0]
    wide = viz.speedup_heatmap([0.5, 0.95], [1, 8], 0.0).data[0]
    assert colour_at(narrow, 1.5) == colour_at(wide, 1.5), "1.5x takes one colour whatever the range"
    assert [f for f, _ in wide.colorscale] == sorted(f for f, _ in wide.colorscale)
    only_gains = viz.speedup_heatmap([0.8, 0.9], [1, 2], 0.0).data[0]
    assert only_gains.colorscale[0][1] == viz.WHITE and only_gains.zmin == 1.0


# ----------------------------------------------------------------------------- chapters 07, 09 and 11


def _trace_rows():
    import specdec_lab as sl
    from specdec_lab.lab.trace import trace_rows
    target, draft = sl.tiny_model(0), sl.tiny_model(1, n_layers=1)
    res = sl.SpeculativeEngine(target, draft, k=3).generate([1, 2, 3], max_new_tokens=12)
    return trace_rows(res.steps, None, res.prompt_ids)


def test_step_trace_figure_places_every_draft_and_one_next_token_per_step():
    rows = _trace_rows()
    fig = _pure(lambda: viz.step_trace_figure(rows))
    heat, *legend = fig.data
    names = [t.name for t in legend]
    assert names == ["accepted", "rejected", "discarded", "correction", "bonus"]
    cells = [names[v] for row in heat.z for v in row if v is not None]
    assert sum(cells.count(n) for n in ("accepted", "rejected", "discarded")) == sum(len(r["drafted"]) for r in rows)
    assert cells.count("accepted") == sum(r["num_accepted"] for r in rows)
    assert [names[row[-1]] for row in heat.z] == ["bonus" if r["kind"] == "bonus" else "correction" for r in rows], \
        "the last column holds each step's next token"
    assert list(heat.y) == [r["step"] for r in rows]


def test_k_sweep_figure_draws_measured_predictions_and_the_k_plus_1_ceiling():
    fig = _pure(lambda: viz.k_sweep_figure([1, 2, 4], [1.5, 1.9, 2.4], [1.1, 1.2, 1.0],
                                           predicted_tokens_per_step=[1.6, 2.0, 2.5],
                                           predicted_speedups={"Theorem 3.8": [1.3, 1.5, 1.6]}))
    names = [t.name for t in fig.data]
    assert names == ["ceiling K+1", "measured", "predicted from alpha", "measured speedup", "Theorem 3.8"]
    assert fig.data[1].line.color != fig.data[3].line.color, "tokens per step and speedup in two colours"
    assert list(fig.data[0].y) == [2, 3, 5]
    assert len(_pure(lambda: viz.k_sweep_figure([1, 2], [1.0, 1.0], [0.9, 0.8])).data) == 3


def test_training_curve_figure_has_one_line_per_curve_on_a_0_to_1_axis():
    fig = _pure(lambda: viz.training_curve_figure({"live": [(10, 0.1), (20, 0.4)], "card": [(5, 0.2)]}))
    assert [t.name for t in fig.data] == ["live", "card"]
    assert list(fig.data[0].x) == [10, 20] and list(fig.data[0].y) == [0.1, 0.4]
    assert tuple(fig.layout.yaxis.range) == (0, 1)


def _bench_doc():
    def spec(k, meas):
        return {"label": f"speculative, K={k}", "k": k, "tokens_per_second": 10.0 * meas, "measured_speedup": meas,
                "predicted_speedup": 1.5, "predicted_speedup_with_verify_cost": 0.8}
    systems = {"ar": {"label": "this engine, autoregressive", "k": None, "tokens_per_second": 10.0},
               "spec_k1": spec(1, 0.9), "spec_k2": spec(2, 0.7),
               "hf_generate": {"label": "transformers generate", "k": None, "tokens_per_second": 7.0}}
    return {"results": [{"temperature": 0.0, "alpha": 0.5, "systems": systems}],
            "costs": {"c": 0.05, "verify_cost": {"1": 1.7, "2": 2.0}}}


def test_bench_figure_shows_systems_predictions_and_the_verify_cost():
    import json
    doc = _bench_doc()
    fig = _pure(lambda: viz.bench_figure(doc))
    bars, measured, theorem, with_v, verify = fig.data
    assert list(bars.y) == [10.0, 9.0, 7.0, 7.0]
    assert bars.marker.color[-1] == viz.NEUTRAL, "transformers' systems are drawn grey"
    assert list(measured.x) == [1, 2] and list(measured.y) == [0.9, 0.7]
    assert list(with_v.y) == [0.8, 0.8] and list(verify.y) == [1.7, 2.0]
    doc["costs"]["verify_cost"] = {1: 1.7, 2: 2.0}  # a live document has int keys, a loaded one str keys
    assert viz.bench_figure(json.loads(json.dumps(doc))).to_json() == viz.bench_figure(doc).to_json()


def test_adaptive_k_figure_aligns_steps_on_output_position_and_marks_requests():
    ks = {"K=4": [4, 4, 0, 4], "cost-aware": [4, 2, 0, 8, 8]}
    committed = {"K=4": [1, 5, 1, 3], "cost-aware": [1, 3, 1, 2, 3]}
    fig = _pure(lambda: viz.adaptive_k_figure(ks, committed, requests={"chat": 0, "copy": 7}, reference=("K=4",)))
    assert [t.name for t in fig.data] == ["K=4", "K=4", "cost-aware", "cost-aware"]
    assert list(fig.data[0].x) == [0, 1, 6, 7], "x is the output position where each step started"
    assert list(fig.data[2].y) == [4, 2, 0, 8, 8] and list(fig.data[3].y) == [1, 3, 1, 2, 3]
    assert fig.data[0].line.dash == "dot" and fig.data[2].line.dash == "solid", "fixed K is drawn as a reference"
    assert [a.text.strip() for a in fig.layout.annotations if a.text.strip() in ("chat", "copy")] == ["chat", "copy"]
    assert len(fig.layout.shapes) == 4, "a dashed line at each request start, in both panels"


def test_agreement_figure_draws_a_line_per_cost_the_goal_and_the_shipped_draft():
    agreements = [0.5, 0.6, 0.7]
    fig = _pure(lambda: viz.agreement_figure(agreements, {"c": [1.6, 1.9, 2.2], "2c": [1.5, 1.8, 2.0]},
                                             shipped=(0.45, 1.59)))
    assert [t.name for t in fig.data] == ["c", "2c", "the shipped draft"]
    assert list(fig.data[0].x) == agreements and list(fig.data[1].y) == [1.5, 1.8, 2.0]
    assert fig.data[2].x == (0.45,) and fig.data[2].y == (1.59,)
    assert [shape.y0 for shape in fig.layout.shapes] == [2.0]
    assert len(_pure(lambda: viz.agreement_figure(agreements, {"c": [1, 2, 3]}, goal=1.5)).data) == 1


# --------------------------------------------------------------------------- static figures (real kaleido, real browser)


def _png_size(data):
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")  # the IHDR chunk


def test_png_draws_the_figure_at_the_asked_size_and_a_different_figure_differently():
    bars = go.Figure(go.Bar(x=["a", "b"], y=[3, 4]), layout=dict(title="bars", height=300))
    line = go.Figure(go.Scatter(x=[1, 2, 3], y=[3, 1, 2]), layout=dict(title="line", height=300))
    first = viz.png(bars, width=640)
    assert _png_size(first) == (640, 300), "width asked, height the figure's own"
    assert _png_size(viz.png(bars, width=400, height=200, scale=2)) == (800, 400), "layout pixels times scale"
    assert viz.png(line, width=640) != first, "a different figure must give a different picture"


def test_figure_bundle_stores_plotly_json_a_png_and_a_stable_text():
    import base64
    fig = viz.cache_drift_figure({"ok": [4, 4]}, {"ok": [0, 0]})
    bundle = viz.figure_bundle(fig, width=500)
    assert set(bundle) == {"application/vnd.plotly.v1+json", "image/png", "text/plain"}
    assert _png_size(base64.b64decode(bundle["image/png"]))[0] == 500
    assert bundle["application/vnd.plotly.v1+json"]["data"][0]["y"] == [4, 4]
    assert bundle["text/plain"] == f"<figure: {fig.layout.title.text or 'untitled'}>", "nbval compares this text"


@pytest.mark.parametrize("kwargs, name", [({"width": 0}, "width"), ({"height": -5}, "height"),
                                          ({"scale": "big"}, "scale")])
def test_png_rejects_bad_sizes_naming_the_parameter(kwargs, name):
    with pytest.raises(ValueError, match=name):
        viz.png(go.Figure(), **kwargs)


def test_png_rejects_what_is_not_a_figure():
    with pytest.raises(ValueError, match="fig must be a plotly go.Figure, got dict"):
        viz.png({"data": []})


def test_browser_path_names_a_missing_browser(monkeypatch, tmp_path):
    monkeypatch.setenv("BROWSER_PATH", str(tmp_path / "no-such-browser"))
    with pytest.raises(RuntimeError, match="BROWSER_PATH=.*no-such-browser.*is not an executable"):
        viz.browser_path()


def test_browser_path_says_how_to_get_a_browser_when_none_is_on_path(monkeypatch, tmp_path):
    monkeypatch.delenv("BROWSER_PATH", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(RuntimeError, match="none of chromium, .* is on PATH: install one"):
        viz.browser_path()


def test_acceptance_figure_stacks_the_residual_on_min_p_q_to_make_p():
    p, q = [0.5, 0.3, 0.2], [0.2, 0.2, 0.6]
    fig = _pure(lambda: viz.acceptance_figure(p, q, labels=["a", "b", "c"]))
    accepted, residual = fig.data[0], fig.data[1]
    assert list(accepted.y) == pytest.approx([0.2, 0.2, 0.2]) and list(residual.base) == list(accepted.y)
    assert [a + r for a, r in zip(accepted.y, residual.y)] == pytest.approx(p), "min(p, q) + max(0, p - q) = p"
    assert "0.600" in fig.layout.title.text, "the accepted mass is sum min(p, q)"
    with pytest.raises(ValueError, match="one length"):
        viz.acceptance_figure([0.5, 0.5], [1.0])


def test_pvalue_histogram_figure_has_one_histogram_per_sampler_on_equal_bins():
    fig = _pure(lambda: viz.pvalue_histogram_figure({"good": [0.1, 0.5, 0.9], "bad": [0.0, 0.0]}, bins=5))
    assert [t.name for t in fig.data] == ["good (3 runs)", "bad (2 runs)"]
    assert fig.data[0].xbins.size == pytest.approx(0.2)
    coloured = viz.pvalue_histogram_figure({"good": [0.5], "bad": [0.0]}, colors={"bad": viz.BAD})
    assert coloured.data[1].marker.color == viz.BAD and coloured.data[0].marker.color == viz.PALETTE[0]
    with pytest.raises(ValueError, match="bins must be an int >= 2, got 1"):
        viz.pvalue_histogram_figure({"x": [0.5]}, bins=1)
