"""viz.py: every figure function returns a go.Figure with the expected traces, and is pure."""
import plotly.graph_objects as go
import pytest

from specdec_lab import viz
from specdec_lab.masks import verification_mask


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
    from specdec_lab.roofline import best_k, expected_speedup
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


def test_fragmentation_figure_lives_in_viz_and_the_old_import_still_works():
    from specdec_lab.paged import simulate_fragmentation
    from specdec_lab.viz_paged import fragmentation_figure
    assert fragmentation_figure is viz.fragmentation_figure
    result = simulate_fragmentation(num_requests=12, memory_tokens=4096, seed=0)
    fig = _pure(lambda: viz.fragmentation_figure(result))
    assert {t.name.split(":")[0] for t in fig.data} == {"contiguous", "paged"}


def test_speedup_heatmap_puts_white_at_break_even():
    heat = viz.speedup_heatmap([0.0, 0.5, 0.9], [1, 4, 8], 0.2).data[0]
    (start, low), (mid, white), (end, high) = heat.colorscale
    assert low == viz.BAD and white == viz.WHITE and high == viz.BLUE
    assert heat.zmin + mid * (heat.zmax - heat.zmin) == pytest.approx(1.0)
    only_gains = viz.speedup_heatmap([0.8, 0.9], [1, 2], 0.0).data[0]
    assert only_gains.colorscale[0][1] == viz.WHITE
