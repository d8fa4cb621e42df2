"""tree="auto": the expected tokens of a shape, and a search that picks a chain where trees do not pay."""
import pytest

import specdec_lab as sl
from specdec_lab.tree.auto import Costs, expected_tokens, measure_costs, plan, shapes
from specdec_lab.tree.engine import TreeEngine
from specdec_lab.tree.structure import tree_size

ACCEPTANCE = [0.378, 0.107, 0.065, 0.041, 0.03, 0.02, 0.015, 0.015]  # a draft like the shipped one
ROWS = [1, 2, 4, 8, 16, 32, 64]


def costs(target_by_rows, draft=0.002):
    t = [target_by_rows(n) for n in ROWS]
    d = [draft] * len(ROWS)
    return Costs(ROWS, target_tree=t, target_chain=t, draft_tree=d, draft_chain=d)


def test_a_chains_expected_tokens_are_the_geometric_sum():
    a = 0.6
    for K in range(1, 8):
        assert expected_tokens((1,) * K, [a]) == pytest.approx((1 - a ** (K + 1)) / (1 - a))


def test_wider_levels_add_the_acceptance_of_every_child():
    # (4, 2, 1): A(4) = 0.591, then A(2) = 0.485, then A(1) = 0.378.
    e = expected_tokens((4, 2, 1), ACCEPTANCE)
    a4, a2, a1 = sum(ACCEPTANCE[:4]), sum(ACCEPTANCE[:2]), ACCEPTANCE[0]
    assert e == pytest.approx(1 + a4 + a4 * a2 + a4 * a2 * a1)
    assert e > expected_tokens((1, 1, 1), ACCEPTANCE)


def test_shapes_are_non_increasing_and_within_the_node_limit():
    found = list(shapes(20, max_depth=4))
    assert (4, 2, 1) in found and (1,) * 4 in found and (2, 3) not in found
    assert all(tree_size(s) - 1 <= 20 and list(s) == sorted(s, reverse=True) for s in found)


def test_flat_verification_cost_picks_a_tree():
    best = plan(ACCEPTANCE, costs(lambda n: 0.03))  # a GPU-like target: rows are free up to 64
    assert not best.chain and max(best.shape) > 1, best
    assert best.expected_tokens > expected_tokens((1,) * len(best.shape), ACCEPTANCE)


def test_verification_cost_growing_with_rows_picks_a_chain():
    best = plan(ACCEPTANCE, costs(lambda n: 0.02 + 0.02 * n))  # every row costs as much as a forward
    assert best.chain and set(best.shape) == {1}, best
    assert "chain of" in str(best)


def test_a_tree_must_beat_the_chains_fused_verification():
    # The tree's masked verification costs 50% more per call than the chain's: the chain wins at mild slopes.
    t = [0.03 + 0.0005 * n for n in ROWS]
    c = Costs(ROWS, target_tree=[1.5 * x for x in t], target_chain=t, draft_tree=[0.002] * 7, draft_chain=[0.002] * 7)
    assert plan(ACCEPTANCE, c).chain


def test_bad_acceptance_is_refused():
    with pytest.raises(ValueError, match="acceptance"):
        plan([1.5], costs(lambda n: 0.03))


def test_measured_costs_grow_no_less_with_rows_and_auto_runs_end_to_end(capsys):
    target, draft = sl.tiny_model(0), sl.tiny_model(1, n_layers=1)
    c = measure_costs(target, draft, max_rows=16, context=16, rounds=2)
    assert all(a <= b for a, b in zip(c.target_tree, c.target_tree[1:]))
    engine = TreeEngine(target, draft, tree="auto", auto_prompts=[[1, 2, 3], [4, 5]], auto_max_nodes=8)
    said = capsys.readouterr()
    assert "tree='auto' chose" in said.out
    assert "acceptance by rank" in said.err and "forward costs by rows" in said.err, "its two measurements show progress"
    base = sl.autoregressive_generate(target, [1, 2, 3], max_new_tokens=20).tokens
    assert engine.generate([1, 2, 3], max_new_tokens=20).tokens == base
    with pytest.raises(ValueError, match="auto_prompts"):
        TreeEngine(target, draft, tree="auto")
