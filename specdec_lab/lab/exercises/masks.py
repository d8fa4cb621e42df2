"""Exercises "verify_mask" and "tree_mask": which positions a new token may attend to.

The learner returns the bool pattern (True where attention is allowed); the model consumes it as an
additive mask, 0 where True and -inf where False (core/masks.py, tree/structure.py). Each is compared
with the library's own mask, cell by cell.
"""
import torch

from ...core.masks import verification_mask
from ...tree.structure import ancestors, static_parents
from .report import Exercise, Failure, grade_cases


def _read_bool(out, case):
    if not isinstance(out, torch.Tensor):
        raise Failure(f"Your function returned a {type(out).__name__}: it should return a torch tensor of dtype "
                      f"torch.bool, True where attention is allowed.")
    if out.dtype != torch.bool:
        raise Failure(f"Your mask has dtype {out.dtype}: return the bool pattern (True where attention is "
                      f"allowed). The model turns it into the additive mask of 0 and -inf itself.")
    return out


def _same(a, b):
    return a.shape == b.shape and torch.equal(a, b)


# ---- verify_mask ----

def verify_mask(prefix_len, k):
    """The verification pass's mask, (k + 1, prefix_len + k + 1) bool. The pass feeds [c, d_1..d_k]
    after a cache of prefix_len positions: query row i is the token at position prefix_len + i, and it
    may attend key j when j <= prefix_len + i (the cache, the new tokens before it, and itself)."""
    row = torch.arange(k + 1).unsqueeze(1)  # (K+1, 1)
    col = torch.arange(prefix_len + k + 1).unsqueeze(0)  # (1, L+K+1)
    return col <= prefix_len + row  # (K+1, L+K+1)


def library_verify_mask(prefix_len, k):
    """core.masks.verification_mask as a bool pattern."""
    return verification_mask(prefix_len, k + 1)[0, 0] == 0  # (K+1, L+K+1)


def _pattern(allowed):
    """A candidate mask from allowed(row, col, prefix_len), rows and columns as broadcast aranges."""
    def fn(prefix_len, k):
        row, col = torch.arange(k + 1).unsqueeze(1), torch.arange(prefix_len + k + 1).unsqueeze(0)
        return allowed(row, col, prefix_len).expand(k + 1, prefix_len + k + 1)
    return fn


MASK_MISTAKES = [
    ("unmasked", _pattern(lambda row, col, L: torch.ones_like(col, dtype=torch.bool))),
    ("no_self", _pattern(lambda row, col, L: col < L + row)),
    ("off_by_one", _pattern(lambda row, col, L: col <= L + row + 1)),
    ("off_by_one", _pattern(lambda row, col, L: col <= L + row - 1)),
    ("transposed", _pattern(lambda row, col, L: col >= L + row)),
    ("transposed", lambda prefix_len, k: library_verify_mask(prefix_len, k).T),
    ("not_shifted", _pattern(lambda row, col, L: col <= row)),
]

MASK_HINTS = {
    "unmasked": "Every new token sees every new token, the drafts after it included: d_i's prediction then "
                "depends on d_{i+1}, and p is no longer the target's distribution at that point.",
    "no_self": "A token must see its own position: its query attends to its own key. Without it the first "
               "new token of an empty cache sees nothing at all.",
    "off_by_one": "Your diagonal is one column off: token i sits at position prefix_len + i, and it sees keys "
                  "up to and including that position, not one before or one after.",
    "transposed": "Your triangle is the wrong way round (rows and columns swapped): each token sees the "
                  "positions after it instead of those before it.",
    "not_shifted": "Your causal triangle starts at column 0: the new tokens come after prefix_len cached "
                   "positions, so the diagonal is shifted right by prefix_len and every row sees the whole cache.",
}

MASK_CASES = [(0, 1), (3, 2), (5, 4), (1, 3), (4, 1), (0, 4)]


def _explain_mask(case, got, want):
    L, k = case
    if got.shape != want.shape:
        return (f"For prefix_len = {L} and k = {k} your mask has shape {tuple(got.shape)}, but it should be "
                f"{tuple(want.shape)}: a row per new token (k + 1 = {k + 1}) and a column per key "
                f"(prefix_len + k + 1 = {L + k + 1}).")
    i, j = [int(x) for x in (got != want).nonzero()[0]]
    said, truth = ("may", "must not") if bool(got[i, j]) else ("may not", "should")
    return (f"For prefix_len = {L} and k = {k}: you say the token at row {i} (position {L + i}) {said} attend "
            f"key {j}, but it {truth}: a token sees every position up to and including its own.")


def grade_verify_mask(fn):
    grade_cases(fn, MASK_CASES, library_verify_mask, MASK_MISTAKES, describe=lambda c: "prefix_len = {}, "
                "k = {}".format(*c), read=_read_bool, explain=_explain_mask, same=_same)
    return (f"Your mask equals the library's verification mask (core/masks.py) on {len(MASK_CASES)} shapes, "
            f"from an empty cache to prefix_len = 5 with k = 4.")


# ---- tree_mask ----

def tree_mask(parents):
    """The tree's attention among its nodes, (N, N) bool: node i sees node j when j is i itself or one of
    i's ancestors. parents (N,) int64: each node's parent index, -1 for the root, parents[i] < i."""
    parents = parents.tolist()
    N = len(parents)
    mask = torch.zeros(N, N, dtype=torch.bool)
    for i in range(N):
        j = i
        while j != -1:  # i itself, then its parent, up to the root
            mask[i, j] = True
            j = parents[j]
    return mask


def library_tree_mask(parents):
    """tree.structure.ancestors: pointer jumping over the whole tree's depth."""
    return ancestors(parents, max_depth=parents.shape[0])


def _random_parents(N, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.tensor([-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, N)])


TREES = {  # name -> parents (N,) int64
    "a chain of 5 nodes": torch.tensor([-1, 0, 1, 2, 3]),
    "a star of 5 nodes": torch.tensor([-1, 0, 0, 0, 0]),
    "the (2, 2) tree": static_parents((2, 2))[0],
    "the (4, 2, 1) tree": static_parents((4, 2, 1))[0],
    "a random tree of 12 nodes": _random_parents(12, seed=3),
}

TREE_MISTAKES = [
    ("chain_mask", lambda parents: torch.ones(len(parents), len(parents)).tril().bool()),
    ("parent_only", lambda parents: torch.eye(len(parents), dtype=torch.bool)
     | torch.nn.functional.one_hot(parents.clamp(min=0), len(parents)).bool() & (parents >= 0).unsqueeze(1)),
    ("no_self", lambda parents: library_tree_mask(parents) & ~torch.eye(len(parents), dtype=torch.bool)),
    ("transposed", lambda parents: library_tree_mask(parents).T),
]

TREE_HINTS = {
    "chain_mask": "You used the chain's causal mask (every earlier node): in a tree a node must not see its "
                  "siblings and cousins, which sit earlier in the order but are not on its path.",
    "parent_only": "A node sees only its parent: it must see its whole path, every ancestor up to the root, "
                   "for its prediction to be the target's after exactly the text on that path.",
    "no_self": "A node must see itself: its query attends to its own key.",
    "transposed": "Rows and columns are swapped: each node sees its descendants instead of its ancestors.",
}


def _explain_tree(case, got, want):
    (parents,) = case
    name = next(n for n, t in TREES.items() if torch.equal(t, parents))
    if got.shape != want.shape:
        return f"For {name} your mask has shape {tuple(got.shape)}, but it should be {tuple(want.shape)}."
    i, j = [int(x) for x in (got != want).nonzero()[0]]
    path = want[i].nonzero().view(-1).tolist()
    said = "lets node {i} see node {j}, but it must not" if bool(got[i, j]) else "hides node {j} from node {i}"
    return (f"For {name} (parents {parents.tolist()}) your mask " + said.format(i=i, j=j) + f": node {i} sees "
            f"exactly the nodes on its path to the root, {path}.")


def grade_tree_mask(fn):
    cases = [(parents,) for parents in TREES.values()]
    grade_cases(fn, cases, library_tree_mask, TREE_MISTAKES, describe=lambda c: f"the parents {c[0].tolist()}",
                read=_read_bool, explain=_explain_tree, same=_same)
    return (f"Your mask equals the library's (tree/structure.py's ancestors) on {len(cases)} trees: "
            f"{', '.join(TREES)}.")


VERIFY_MASK = Exercise("verify_mask", verify_mask, grade_verify_mask, MASK_HINTS)
TREE_MASK = Exercise("tree_mask", tree_mask, grade_tree_mask, TREE_HINTS)
