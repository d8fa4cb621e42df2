"""lab/serve_figures.py (chapter 13): the arithmetic is right, each figure draws what it is given, is pure,
and refuses bad input."""
import json
from pathlib import Path

import plotly.graph_objects as go
import pytest

from specdec_lab.lab import serve_figures

STORED = json.loads((Path(__file__).resolve().parents[1] / "docs" / "serve_load.json").read_text())


def _pure(make):
    fig = make()
    assert isinstance(fig, go.Figure)
    assert fig.to_json() == make().to_json(), "the same input must give the same figure"
    return fig


def test_pairs_reads_the_stored_key_form_and_tuples():
    assert serve_figures.pairs("t", {"1,0": 0.5, "16,4": 2}) == {(1, 0): 0.5, (16, 4): 2.0}
    assert serve_figures.pairs("t", {(2, 1): 0.25}) == {(2, 1): 0.25}


@pytest.mark.parametrize("bad, match", [({}, "t must be a non-empty dict"), ({"1;0": 1.0}, "key '1;0'"),
                                        ({"1,0,2": 1.0}, "key '1,0,2'"), ({"1,0": 0.0}, "positive number"),
                                        ({"1,0": "fast"}, "positive number")])
def test_pairs_refuses_what_is_not_a_cost_table(bad, match):
    with pytest.raises(ValueError, match=match):
        serve_figures.pairs("t", bad)


def test_over_plain_is_tokens_per_step_times_the_plain_step_over_the_k_step():
    costs = {(1, 0): 1.0, (1, 1): 1.5, (1, 2): 2.0, (2, 0): 1.0, (2, 1): 3.0}
    out = serve_figures.over_plain(costs, 0.5)
    assert out[1] == pytest.approx({1: 1.5 / 1.5, 2: 1.5 / 3.0})  # K = 1 commits 1 + alpha tokens
    assert out[2] == pytest.approx({1: 1.75 / 2.0})  # K = 2: 1 + a + a^2; not measured at 2 rows
    assert serve_figures.over_plain(costs, 1.0)[2][1] == pytest.approx(3 / 2.0), "alpha 1 accepts every draft"


def test_over_plain_on_the_stored_run_agrees_with_the_policys_arithmetic():
    from specdec_lab.serve import GoodputPolicy
    costs = serve_figures.pairs("step_costs", STORED["step_costs"])
    out = serve_figures.over_plain(STORED["step_costs"], 0.4)
    policy = GoodputPolicy(costs, k_max=4, alpha=0.4)
    checked = 0
    for k in (1, 2, 3, 4):
        for b in (1, 2, 4, 8, 16):
            if policy.cost(b, k) == costs[(b, k)]:  # the policy prices K no lower than a smaller K; here it agrees
                assert out[k][b] == pytest.approx(policy.goodput(b, k) / policy.goodput(b, 0), rel=1e-12)
                checked += 1
    assert checked >= 15, checked


@pytest.mark.parametrize("costs, alpha, match", [({(1, 1): 1.0}, 0.5, "K = 0"), ({(1, 0): 1.0}, 1.5, "alpha"),
                                                 ({(1, 0): 1.0}, "0.5", "alpha")])
def test_over_plain_refuses_a_table_without_plain_steps_or_a_bad_alpha(costs, alpha, match):
    with pytest.raises(ValueError, match=match):
        serve_figures.over_plain(costs, alpha)


def test_acceptance_figure_leaves_blank_where_a_row_was_not_in_the_batch():
    rows = [("a", {1: (4, 2), 2: (4, 0)}), ("b", {2: (3, 3), 3: (0, 0)})]
    fig = _pure(lambda: serve_figures.acceptance_figure(rows, 4))
    heat = fig.data[0]
    assert list(heat.x) == [1, 2, 3] and list(heat.y) == ["a", "b"]
    assert [list(r) for r in heat.z] == [[2, 0, None], [None, 3, 0]]
    assert [list(r) for r in heat.text] == [["2/4", "0/4", ""], ["", "3/3", "0/0"]]
    assert heat.zmax == 4


def test_acceptance_figure_refuses_no_rows_or_a_bad_k():
    with pytest.raises(ValueError, match="rows must hold"):
        serve_figures.acceptance_figure([], 4)
    with pytest.raises(ValueError, match="k must be an int >= 1"):
        serve_figures.acceptance_figure([("a", {1: (1, 0)})], 0)


def test_cost_figure_draws_measured_forwards_by_rows_the_roofline_and_each_k():
    forward = {"1,1": 0.03, "2,1": 0.03, "1,5": 0.04, "2,5": 0.05}
    roofline = {1: 0.02, 2: 0.02, 5: 0.02, 10: 0.03}
    predicted = {1: {1: 1.5, 2: 1.2}, 4: {1: 1.3, 2: 0.9}}
    fig = _pure(lambda: serve_figures.cost_figure(forward, roofline, predicted, 0.5))
    by_name = {t.name: t for t in fig.data}
    assert list(by_name["measured, 5 token(s) a row"].x) == [5, 10]  # B x T rows
    assert list(by_name["measured, 1 token(s) a row"].y) == pytest.approx([30, 30])  # ms
    assert list(by_name["roofline"].y) == pytest.approx([20, 20, 20, 30])
    assert list(by_name["K = 4"].y) == [1.3, 0.9]


def test_crossover_figure_draws_median_runs_over_plains_with_bars_to_every_run():
    fig = _pure(lambda: serve_figures.crossover_figure(STORED["closed_loop_runs"],
                                                       STORED["roofline"]["predicted_speedup_fixed_k"], 4))
    by_name = {t.name: t for t in fig.data}
    sizes = STORED["config"]["batch_sizes"]
    for system, ratios in STORED["median_over_plain"].items():  # the figure's points are the stored medians
        assert list(by_name[system].y) == pytest.approx([ratios[str(b)] for b in sizes])
    runs, plain = STORED["closed_loop_runs"]["fixed_4"]["1"], STORED["closed_loop_runs"]["plain"]["1"]
    top = by_name["fixed_4"].y[0] + by_name["fixed_4"].error_y.array[0]
    assert top == pytest.approx(max(runs) / sorted(plain)[1]), "the bar reaches the fastest run"
    assert by_name["roofline, fixed K = 4 (predicted)"].line.dash == "dash"


def test_crossover_figure_refuses_runs_without_plain():
    with pytest.raises(ValueError, match="holding 'plain'"):
        serve_figures.crossover_figure({"goodput": {"1": [1.0]}})


def test_latency_figure_draws_p50_and_p99_for_each_system():
    fig = _pure(lambda: serve_figures.latency_figure(STORED["open_loop"]))
    names = [t.name for t in fig.data]
    assert names == [f"{s} {q}" for s in STORED["open_loop"] for q in ("p50", "p99")]
    assert list(fig.data[1].y) == [STORED["open_loop"]["plain"][str(r)]["latency_p99"]
                                   for r in STORED["config"]["rates"]]
    with pytest.raises(ValueError, match="open_loop must hold"):
        serve_figures.latency_figure({})


def test_speedup_by_batch_figure_dashes_the_predictions_only():
    fig = _pure(lambda: serve_figures.speedup_by_batch_figure({"model": {1: 1.5, 64: 0.9}, "measured": {1: 1.2}},
                                                              predicted={"model"}))
    assert [(t.name, t.line.dash) for t in fig.data] == [("model (roofline)", "dash"), ("measured", "solid")]
    with pytest.raises(ValueError, match="curves must hold"):
        serve_figures.speedup_by_batch_figure({})
