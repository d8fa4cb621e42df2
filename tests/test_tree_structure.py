"""Token trees: the tree mask against its reference twin, and the chain as a one-child tree."""
import random

import pytest
import torch

from specdec_lab.core.masks import verification_mask
from specdec_lab.tree.structure import (Tree, ancestors, check_tree_shape, positions, static_parents, tree_mask,
                                        tree_mask_reference, tree_size)


def random_parents(n, seed):
    """A random parent-first tree of n nodes."""
    rng = random.Random(seed)
    return [-1] + [rng.randrange(i) for i in range(1, n)]


def tree_of(parents):
    parents_t = torch.tensor(parents)
    depth = [0] * len(parents)
    for i in range(1, len(parents)):
        depth[i] = depth[parents[i]] + 1
    return Tree(torch.arange(len(parents)), parents_t, torch.tensor(depth), max(depth))


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("L", [0, 3])
def test_tree_mask_equals_its_reference_on_random_trees(seed, L):
    parents = random_parents(1 + seed * 5, seed)
    got = tree_mask(tree_of(parents), L)
    assert torch.equal(got, tree_mask_reference(parents, L)), f"parents {parents}"


@pytest.mark.parametrize("shape", [(4, 2, 1), (2, 2, 2, 2), (1,), (3,), (8, 1, 1, 1)])
def test_static_tree_mask_equals_its_reference(shape):
    parents, depth = static_parents(shape)
    assert len(parents) == tree_size(shape)
    tree = Tree(torch.zeros(len(parents), dtype=torch.long), parents, depth, len(shape))
    assert torch.equal(tree_mask(tree, 5), tree_mask_reference(parents.tolist(), 5))
    assert depth.tolist() == sorted(depth.tolist()), "static trees are laid out level by level"


@pytest.mark.parametrize("K", [1, 2, 4, 7])
@pytest.mark.parametrize("L", [0, 1, 9])
def test_a_one_child_per_node_tree_has_exactly_the_chains_mask_and_positions(K, L):
    parents, depth = static_parents((1,) * K)
    tree = Tree(torch.zeros(K + 1, dtype=torch.long), parents, depth, K)
    assert torch.equal(tree_mask(tree, L), verification_mask(L, K + 1))
    assert positions(tree, L).tolist() == list(range(L, L + K + 1))


def test_a_node_never_sees_its_sibling_or_cousin():
    parents, depth = static_parents((2, 2))  # root, a, b, a1, a2, b1, b2
    rel = ancestors(parents, 2)
    assert rel[3].tolist() == [True, True, False, True, False, False, False]  # a1 sees root, a, itself
    assert rel[6].tolist() == [True, False, True, False, False, False, True]  # b2 sees root, b, itself
    assert positions(Tree(parents, parents, depth, 2), 10).tolist() == [10, 11, 11, 12, 12, 12, 12]


@pytest.mark.parametrize("bad", [(), (0, 2), [4, 2], (2.0,), (True,), (64, 64)])
def test_a_bad_shape_is_refused_with_its_value(bad):
    with pytest.raises(ValueError, match="shape"):
        check_tree_shape(bad)
