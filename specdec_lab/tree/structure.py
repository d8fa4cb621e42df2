"""A token tree and its attention mask: the chain's K+1 verification generalised.

A tree of N nodes lives in three device tensors, nodes in parent-first order (every
node's parent has a smaller index; node 0 is the root, the pending token c):

    tokens  (N,) int64   the node's token
    parents (N,) int64   its parent's index, -1 for the root
    depth   (N,) int64   0 for the root, the parent's depth + 1 below it

The target reads [c, all nodes] in one forward. Node i sits at position L + depth[i]
(L committed tokens before c) and attends to the committed prefix, its ancestors and
itself, never a sibling or a cousin: so its output row is the target's distribution
after exactly the text on its own path (SpecInfer, arXiv 2305.09781; EAGLE builds the
mask parent-first, mask[i] = mask[parent(i)] | {i}). A tree with one child per node
is a chain, and its mask is the K+1 verification mask (core/masks.py).

`ancestors` computes the (N, N) "j is i or an ancestor of i" matrix on the device by
pointer jumping (log2 of the depth boolean products); `tree_mask_reference` walks
each node up to the root, a loop a learner can read. The tests hold the two equal.
"""
from dataclasses import dataclass

import torch


@dataclass
class Tree:
    tokens: torch.Tensor  # (N,) int64: node 0 is the root c
    parents: torch.Tensor  # (N,) int64: parent index, -1 for the root; parents[i] < i
    depth: torch.Tensor  # (N,) int64: root 0
    max_depth: int  # the deepest level the tree may have (a host int, known before drafting)
    q: torch.Tensor | None = None  # (N, V) the draft's distribution at each node, which its children came from
    slot: torch.Tensor | None = None  # (N,) the node's slot in the draft's cache, -1 if it was never fed

    @property
    def size(self) -> int:
        return self.tokens.shape[0]


def check_tree_shape(shape):
    """A static tree's shape: branching per depth, e.g. (4, 2, 1): 4 children of the root, 2 of each
    of those, 1 below each of those (4 + 8 + 8 = 20 nodes besides the root)."""
    if not (isinstance(shape, tuple) and shape and all(isinstance(b, int) and not isinstance(b, bool)
                                                       and 1 <= b <= 64 for b in shape)):
        raise ValueError(f"shape must be a non-empty tuple of branching factors in [1, 64], got {shape!r}")
    if tree_size(shape) > 256:
        raise ValueError(f"shape {shape!r} has {tree_size(shape)} nodes; at most 256 are allowed")


def tree_size(shape) -> int:
    """Nodes of a static tree of this shape, the root included."""
    total, level = 1, 1
    for b in shape:
        level *= b
        total += level
    return total


def static_parents(shape, device="cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """parents (N,) and depth (N,) of a full tree with branching shape[d] at depth d, level by level,
    each node's children consecutive and in rank order (rank 0 = the draft's most likely)."""
    parents, depth = [-1], [0]
    level = [0]
    for d, b in enumerate(shape):
        nxt = []
        for parent in level:
            for _ in range(b):
                nxt.append(len(parents))
                parents.append(parent)
                depth.append(d + 1)
        level = nxt
    return (torch.tensor(parents, dtype=torch.long, device=device),  # the shape is known on the host:
            torch.tensor(depth, dtype=torch.long, device=device))  # made once per shape, not per step


def ancestors(parents: torch.Tensor, max_depth: int) -> torch.Tensor:
    """(N, N) bool: [i, j] is True where j is i or one of i's ancestors. Pointer jumping: start from
    {i, parent(i)} and square the relation until it spans max_depth levels."""
    N = parents.shape[0]
    idx = torch.arange(N, device=parents.device)
    rel = torch.zeros(N, N, dtype=torch.bool, device=parents.device)
    rel[idx, idx] = True
    rel[idx, torch.where(parents >= 0, parents, idx)] = True  # (N, N): one step up (a root: itself)
    span = 1
    while span < max_depth:  # a host int: log2(max_depth) products, no sync
        rel = (rel.float() @ rel.float()) > 0  # (N, N): up to 2 * span steps
        span *= 2
    return rel


def tree_mask(tree: Tree, L: int, dtype=torch.float32) -> torch.Tensor:
    """Additive mask (1, 1, N, L + N): row i is 0 on the L committed columns and on the columns of
    i's ancestors and i itself, -inf elsewhere."""
    N, device = tree.size, tree.tokens.device
    allowed = torch.cat([torch.ones(N, L, dtype=torch.bool, device=device),
                         ancestors(tree.parents, tree.max_depth)], dim=1)  # (N, L + N)
    mask = torch.zeros(N, L + N, dtype=dtype, device=device).masked_fill(~allowed, float("-inf"))
    return mask.view(1, 1, N, L + N)


def tree_mask_reference(parents: list, L: int) -> torch.Tensor:
    """The same mask from a Python list of parents: each node walks up to the root."""
    N = len(parents)
    mask = torch.full((1, 1, N, L + N), float("-inf"))
    mask[0, 0, :, :L] = 0.0  # the committed prefix
    for i in range(N):
        j = i
        while j != -1:  # i itself, then its parent, up to the root
            mask[0, 0, i, L + j] = 0.0
            j = parents[j]
    return mask


def positions(tree: Tree, L: int) -> torch.Tensor:
    """(N,) input positions: the committed length plus each node's depth."""
    return tree.depth + L
