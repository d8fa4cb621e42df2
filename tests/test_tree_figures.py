"""lab/tree_figures.py (chapter 12): each figure draws what it is given, is pure, and refuses bad input."""
import json
from pathlib import Path

import plotly.graph_objects as go
import pytest
import torch

from specdec_lab.core.masks import verification_mask
from specdec_lab.lab import tree_figures
from specdec_lab.tree import Tree, static_parents, tree_mask

STORED = json.loads((Path(__file__).resolve().parents[1] / "docs" / "tree_vs_chain.json").read_text())


def _pure(make):
    fig = make()
    assert isinstance(fig, go.Figure)
    assert fig.to_json() == make().to_json(), "the same input must give the same figure"
    return fig


def test_coverage_figure_draws_each_rank_and_the_running_sum():
    fig = _pure(lambda: tree_figures.coverage_figure({"a": [0.5, 0.2, 0.1], "b": [0.3, 0.3]}))
    bars = [t for t in fig.data if t.type == "bar"]
    lines = [t for t in fig.data if t.type == "scatter"]
    assert [list(t.y) for t in bars] == [[0.5, 0.2, 0.1], [0.3, 0.3]]
    assert list(lines[0].y) == pytest.approx([0.5, 0.7, 0.8]) and list(lines[1].y) == pytest.approx([0.3, 0.6])


@pytest.mark.parametrize("bad", [[], [0.7, 0.6], [-0.1], "0.5"])
def test_coverage_figure_refuses_what_is_not_acceptance_by_rank(bad):
    with pytest.raises(ValueError, match="acceptance\\['x'\\] must be"):
        tree_figures.coverage_figure({"x": bad})


def test_masks_figure_collapses_the_cache_and_keeps_each_rows_ancestors():
    parents, depth = static_parents((2, 2))
    tree = Tree(torch.arange(7), parents, depth, 2)
    labels = [f"n{i}" for i in range(7)]
    fig = _pure(lambda: tree_figures.masks_figure([("tree", tree_mask(tree, 5), labels),
                                                   ("chain", verification_mask(5, 3), ["c", "d1", "d2"])], 5))
    tree_z, chain_z = fig.data[0].z, fig.data[1].z
    assert len(tree_z[0]) == 1 + 7, "the 5 cached columns are drawn as one"
    assert [list(row) for row in tree_z[3:5]] == [[1, 1, 1, 0, 1, 0, 0, 0], [1, 1, 1, 0, 0, 1, 0, 0]]
    assert [list(row) for row in chain_z] == [[1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]]


def test_masks_figure_refuses_a_mask_of_the_wrong_width_or_repeated_labels():
    with pytest.raises(ValueError, match="panel 'chain'"):
        tree_figures.masks_figure([("chain", verification_mask(4, 3), ["a", "b", "c"])], 5)
    with pytest.raises(ValueError, match="N distinct labels"):
        tree_figures.masks_figure([("chain", verification_mask(5, 3), ["a", "a", "c"])], 5)
    with pytest.raises(ValueError, match="L must be an int >= 1"):
        tree_figures.masks_figure([("chain", verification_mask(5, 3), ["a", "b", "c"])], 0)


def test_cost_figure_draws_the_stored_costs_and_each_curve_over_its_one_row_cost():
    costs = STORED["auto"]["costs"]
    gpu = {"gpu": {"1": 0.002, "8": 0.002, "32": 0.003}}
    fig = _pure(lambda: tree_figures.cost_figure(costs, gpu, predicted={"gpu"}))
    assert [t.name for t in fig.data[:4]] == [tree_figures.COST_NAMES[k] for k in tree_figures.COST_SERIES]
    assert list(fig.data[0].y) == pytest.approx([1e3 * s for s in costs["target_tree"]])
    relative = {t.name: t for t in fig.data[4:]}
    assert list(relative["gpu (predicted)"].y) == pytest.approx([1.0, 1.0, 1.5])
    assert relative["gpu (predicted)"].line.dash == "dash"
    tree = relative["CPU " + tree_figures.COST_NAMES["target_tree"]]
    assert tree.y[0] == 1.0 and max(tree.y) > 2.0, "on this CPU a tree of tens of nodes costs several forwards"


def test_cost_figure_refuses_costs_without_every_series():
    with pytest.raises(ValueError, match="costs must be a dict with 'rows'"):
        tree_figures.cost_figure({"rows": [1, 2], "target_tree": [0.1, 0.2]})


def test_tree_vs_chain_figure_draws_every_system_at_every_temperature():
    fig = _pure(lambda: tree_figures.tree_vs_chain_figure(STORED["results"]))
    assert len(fig.data) == 2 * len(STORED["results"])
    for temperature, (per_step, speed) in zip(STORED["results"], zip(fig.data[::2], fig.data[1::2])):
        table = STORED["results"][temperature]["table"]
        assert list(per_step.y) == list(table) == list(speed.y)
        assert list(speed.x) == [row["ratio_to_chain"] for row in table.values()]
    assert "static (4,2,1) Sequoia" in fig.layout.yaxis.categoryarray, "a system run at one temperature only"


def test_tree_vs_chain_figure_refuses_a_table_without_the_reference():
    with pytest.raises(ValueError, match="reference 'chain K=4'"):
        tree_figures.tree_vs_chain_figure({"0.0": {"table": {"tree": {}}}})
