"""Drafting trees: each node's children are what the draft would propose after that node's own path,
and a dynamic tree is a well-formed parent-first tree within its budget."""
import pytest
import torch

import specdec_lab as sl
from specdec_lab.core.config import SamplingConfig
from specdec_lab.tree.draft import DynamicTree, TreeDrafter

PROMPT = [3, 1, 4, 1, 5]


@pytest.fixture(scope="module")
def draft():
    return sl.tiny_model(2)


def path_of(tree, i):
    tokens, parents = tree.tokens.tolist(), tree.parents.tolist()
    path = []
    while i > 0:
        path.append(tokens[i])
        i = parents[i]
    return path[::-1]


def plain_logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids]))[0, -1]


@pytest.mark.parametrize("shape", [(3, 2), (2, 2, 2), (4, 1, 1)])
def test_each_nodes_children_are_the_drafts_top_after_its_own_path(draft, shape):
    drafter = TreeDrafter(draft, 64)
    drafter.prefill(PROMPT)
    with torch.inference_mode():
        tree = drafter.draft_static(shape, SamplingConfig(), None)
    parents = tree.parents.tolist()
    for i in range(tree.size):
        kids = [j for j in range(tree.size) if parents[j] == i]
        if not kids:
            continue
        want = plain_logits(draft, PROMPT + path_of(tree, i)).topk(len(kids)).indices.tolist()
        assert [tree.tokens[j].item() for j in kids] == want, f"node {i}: the draft's tree mask or positions are off"


def test_a_dynamic_tree_is_parent_first_within_budget_and_keeps_the_best_paths(draft):
    spec = DynamicTree(depth=3, top_k=3, budget=7)
    drafter = TreeDrafter(draft, 64)
    drafter.prefill(PROMPT)
    with torch.inference_mode():
        tree = drafter.draft_dynamic(spec, SamplingConfig(), None)
    parents, depth = tree.parents.tolist(), tree.depth.tolist()
    assert tree.size == spec.budget + 1 and parents[0] == -1 and depth[0] == 0
    assert all(0 <= parents[i] < i and depth[i] == depth[parents[i]] + 1 for i in range(1, tree.size))
    # Scores recomputed from plain forwards: every kept node outscores every child it could have had but lacks.
    def score(i):
        ids, s = PROMPT[:], 0.0
        for tok in path_of(tree, i):
            s += plain_logits(draft, ids).log_softmax(-1)[tok].item()
            ids.append(tok)
        return s
    kept = [score(i) for i in range(1, tree.size)]
    root_children = plain_logits(draft, PROMPT).log_softmax(-1).topk(spec.top_k)
    for tok, s in zip(root_children.indices.tolist(), root_children.values.tolist()):
        if tok not in [tree.tokens[j].item() for j in range(tree.size) if parents[j] == 0]:
            assert s <= min(kept) + 1e-5, "a root child better than a kept node was dropped"
    assert tree.slot[0].item() == len(PROMPT) - 1, "the root c sits at the last committed slot"
