"""Drawing one step of a token tree (lab/tree_draw.py) and the trees TreeEngine keeps for it
(`keep_trees`): each kept tree matches its step's record, is read in the step's one host read, and is
drawn with its accepted path, the children the target declined and its next token."""
import pytest
import torch

import specdec_lab as sl
from specdec_lab.analysis.syncs import count_host_syncs
from specdec_lab.lab.tree_draw import layout, longest_path, tree_step_figure
from specdec_lab.lab.viz import TRACE_COLORS
from specdec_lab.tree.draft import DynamicTree
from specdec_lab.tree.engine import TreeEngine, TreeStep


class Ids:
    """A tokenizer stand-in for the drawing: token i decodes to "t<i>"."""

    def decode(self, ids):
        return "".join(f"t{i}" for i in ids)


@pytest.fixture(scope="module")
def pair():
    target, draft = sl.tiny_model(0), sl.tiny_model(0)
    with torch.no_grad():  # a draft that agrees with the target part of the time
        draft.head.weight.add_(torch.randn(draft.head.weight.shape, generator=torch.Generator().manual_seed(1)) * 0.4)
    return target, draft


@pytest.mark.parametrize("tree", [(3, 2), DynamicTree(3, 3, 8)], ids=str)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_each_kept_tree_is_its_steps_tree_and_costs_no_sync(pair, tree, temperature):
    engine = TreeEngine(*pair, tree=tree)
    engine.keep_trees = True
    seen = []
    with count_host_syncs() as syncs:
        res = engine.generate([1, 2, 3], max_new_tokens=30, temperature=temperature, seed=0,
                              on_step=lambda rec, out: seen.append(syncs.count))
    assert [b - a for a, b in zip(seen, seen[1:])] == [1] * (len(seen) - 1), "keeping the trees added a sync"
    assert len(engine.trees) == len(res.steps) >= 5
    size = 10 if isinstance(tree, tuple) else 9  # (3, 2): 1 + 3 + 6; DynamicTree(3, 3, 8): 1 + 8
    for t, rec in zip(engine.trees, res.steps):
        assert len(t.tokens) == len(t.parents) == size and t.parents[0] == -1
        assert all(0 <= p < i for i, p in enumerate(t.parents) if i), "a parent comes before its child"
        assert t.path[0] == 0 and all(t.parents[b] == a for a, b in zip(t.path, t.path[1:])), "a path"
        assert [t.tokens[n] for n in t.path[1:]] == rec.drafted[:rec.num_accepted]
        assert t.next_token == rec.next_token
    assert max(len(t.path) for t in engine.trees) >= 2, "some step accepted a draft"
    plain = TreeEngine(*pair, tree=tree).generate([1, 2, 3], max_new_tokens=30, temperature=temperature, seed=0)
    assert plain.tokens == res.tokens, "keeping the trees changes nothing else"


def test_layout_puts_leaves_in_rows_and_parents_between_their_children():
    depth, row = layout([-1, 0, 0, 1, 1, 2])
    assert depth == [0, 1, 1, 2, 2, 2]
    assert row[3:] == [0, 1, 2] and row[1] == 0.5 and row[2] == 2 and row[0] == 1.25


def test_the_figure_colours_the_path_the_declined_children_and_the_next_token():
    step = TreeStep(tokens=[10, 11, 12, 13, 14, 15], parents=[-1, 0, 0, 1, 1, 2], path=[0, 1], next_token=99)
    fig = tree_step_figure(step, Ids(), index=4)
    markers = {t.name: t for t in fig.data if t.mode == "markers+text"}
    assert list(markers["accepted"].text) == ["t11"]
    declined = markers["rejected: the children of the path's end"]
    assert list(declined.text) == ["t13", "t14"] and declined.marker.color == TRACE_COLORS["rejected"]
    assert list(markers["never reached"].text) == ["t12", "t15"]
    assert list(markers["the target's next token (correction)"].text) == ["t99"]
    assert fig.layout.title.text == "Step 4: 5 drafted nodes, 1 accepted, then a correction: 2 tokens from one " \
                                    "forward over 6 rows"
    leaf = TreeStep(tokens=[10, 11, 12], parents=[-1, 0, 1], path=[0, 1, 2], next_token=7)
    assert any(t.name == "the target's next token (bonus)" for t in tree_step_figure(leaf, Ids()).data)


def test_longest_path_picks_the_first_longest_and_an_empty_run_says_why():
    steps = [TreeStep([1, 2], [-1, 0], p, 0) for p in ([0], [0, 1], [0, 1])]
    assert longest_path(steps) == 1
    with pytest.raises(ValueError, match=r"set engine.keep_trees = True before generate"):
        longest_path([])
