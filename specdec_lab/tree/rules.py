"""Verifying a token tree: which path the target accepts, and the token after it.

Every rule decides, at each node i, either one child to descend into or a token to
emit; the step's output is the path from the root down the chosen children, then the
token emitted where the path stops. What differs is the decision at a node. With p_i
the target's distribution after node i's path, and the children x_1..x_b of i in rank
order:

- "greedy": y_i = argmax p_i; descend into the child whose token is y_i, else emit y_i.
  Every output token is then the target's argmax after the text before it: the output
  equals greedy autoregressive decoding token for token.
- "deterministic" (children are the draft's top-b, chosen without randomness): draw
  y_i ~ p_i; descend into the child whose token is y_i, else emit y_i. Lossless by
  construction, whatever the children are: the token leaving node i is y_i ~ p_i. The
  chance of descending is p_i's mass on the children.
- "sampled" (children drawn from q_i without replacement; Sequoia, arXiv 2402.12374):
  with r = p_i and q = q_i, try the children in order: accept x_j if u_j < r(x_j) / q(x_j);
  else r = norm(max(0, r - q)) and q = q with x_j removed, renormalised; if none is
  accepted, emit a draw from r. One child is the chain's rule (arXiv 2211.17192).
- "typical" (Medusa's typical acceptance, arXiv 2401.10774): descend into the first child
  with p_i(x) > min(eps, delta * exp(-H(p_i))), H the entropy of p_i, eps = 0.09 a hard
  threshold and delta = 0.3 = sqrt(eps) the entropy-scaled one (Medusa's posterior_threshold
  and posterior_alpha defaults), else emit y_i ~ p_i. NOT lossless: the output is not
  distributed as p. It is here as the negative control the tests reject.

`verify_tree` makes these decisions for every node at once on the device (the rules'
state is per node, so a loop over the child rank, not over nodes) and never reads a
value to the host; `verify_tree_reference` walks down from the root, one node at a
time, a loop a learner can read. Both take the same random numbers: w (N,) uniforms
for the one draw per node (inverse CDF) and u (N, W) for the acceptance tests, so the
tests can hold their decisions equal.
"""
import math

import torch

from .structure import Tree, ancestors

RULES = ("greedy", "deterministic", "sampled", "typical")
TYPICAL_EPS, TYPICAL_DELTA = 0.09, 0.3  # Medusa's posterior_threshold and posterior_alpha (arXiv 2401.10774)


def check_rule(rule):
    if rule not in RULES:
        raise ValueError(f"rule must be one of {RULES}, got {rule!r}")


def draw_with(dist: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draws from unnormalised rows dist (..., V) with given uniforms w (...,)."""
    cdf = dist.cumsum(-1)  # (..., V)
    idx = torch.searchsorted(cdf, (w * cdf[..., -1]).unsqueeze(-1), right=True)  # (..., 1)
    return idx.clamp_max(dist.shape[-1] - 1).squeeze(-1)


def tree_draws(n_nodes: int, width: int, generator, device) -> tuple[torch.Tensor, torch.Tensor]:
    """The step's randomness: u (N, W) for the acceptance tests, w (N,) for the draws."""
    u = torch.rand(n_nodes, width, generator=generator, device=device)
    w = torch.rand(n_nodes, generator=generator, device=device)
    return u, w


def children_table(parents: torch.Tensor, width: int) -> torch.Tensor:
    """(N, W) int64: row i lists i's children in index (= rank) order, -1 where there are fewer."""
    N = parents.shape[0]
    idx = torch.arange(N, device=parents.device)
    key = torch.where(parents >= 0, parents, N)  # (N,): roots go to row N, dropped below
    sorted_key, order = key.sort(stable=True)  # siblings together, in index order
    first = torch.searchsorted(sorted_key, sorted_key)  # (N,): where each node's sibling group starts
    rank = torch.empty_like(idx).scatter_(0, order, idx - first)  # (N,): earlier siblings
    table = torch.full((N + 1, width), -1, dtype=torch.long, device=parents.device)
    table[key, rank.clamp_max(width - 1)] = idx  # a node past `width` children would overwrite; callers size W
    return table[:N]


def _decisions_match(tree, y, children):
    """Descend into the first child whose token equals y (N,): (chosen (N,), emitted (N,))."""
    tok = torch.where(children >= 0, tree.tokens[children.clamp_min(0)], -1)  # (N, W)
    hit = tok == y.unsqueeze(1)  # (N, W)
    first = hit.long().argmax(1)  # (N,): the first hit, 0 when none
    chosen = torch.where(hit.any(1), children.gather(1, first.unsqueeze(1)).squeeze(1), -1)
    return chosen, y


def _decisions_sampled(tree, p, q, children, u, w):
    """Sequoia's rule at every node at once: a loop over child rank j, vectorised over nodes."""
    N, W = children.shape
    r, qq = p.clone(), q.clone()  # (N, V): the residual and the draft's remaining distribution
    chosen = torch.full((N,), -1, dtype=torch.long, device=p.device)
    for j in range(W):
        child = children[:, j]  # (N,)
        live = (child >= 0) & (chosen < 0)  # (N,): a child to try and none accepted yet
        x = tree.tokens[child.clamp_min(0)].unsqueeze(1)  # (N, 1)
        r_x, q_x = r.gather(1, x).squeeze(1), qq.gather(1, x).squeeze(1)  # (N,)
        accept = live & (q_x > 0) & (u[:, j] * q_x < r_x)  # u < r(x) / q(x), no division
        chosen = torch.where(accept, child, chosen)
        reject = (live & ~accept).unsqueeze(1)  # (N, 1)
        rest = (r - qq).clamp_min(0.0)  # (N, V)
        total = rest.sum(1, keepdim=True)
        r = torch.where(reject & (total > 0), rest / total.clamp_min(1e-30), r)
        q_next = qq.scatter(1, x, 0.0)  # x removed
        q_total = q_next.sum(1, keepdim=True)
        qq = torch.where(reject, q_next / q_total.clamp_min(1e-30), qq)
    return chosen, draw_with(r, w)


def _decisions_typical(tree, p, children, w):
    entropy = -(p * p.clamp_min(1e-30).log()).sum(1, keepdim=True)  # (N, 1)
    threshold = torch.minimum(torch.full_like(entropy, TYPICAL_EPS), TYPICAL_DELTA * torch.exp(-entropy))
    tok = tree.tokens[children.clamp_min(0)]  # (N, W)
    ok = (children >= 0) & (p.gather(1, tok) > threshold)  # (N, W)
    first = ok.long().argmax(1)
    chosen = torch.where(ok.any(1), children.gather(1, first.unsqueeze(1)).squeeze(1), -1)
    return chosen, draw_with(p, w)


def node_decisions(tree: Tree, p, rule, u, w, width):
    """(chosen (N,), emitted (N,)): each node's child to descend into (-1: none) and its token to
    emit if the path stops there. p (N, V) processed target distributions (logits for greedy)."""
    children = children_table(tree.parents, width)  # (N, W)
    if rule == "greedy":
        return _decisions_match(tree, p.argmax(-1), children)
    if rule == "deterministic":
        return _decisions_match(tree, draw_with(p, w), children)
    if rule == "sampled":
        return _decisions_sampled(tree, p, tree.q, children, u, w)
    return _decisions_typical(tree, p, children, w)


def accepted_path(tree: Tree, chosen, emitted):
    """The verdict from the nodes' decisions: (m, next, path), m (1,) the accepted depth, next (1,)
    the token after the path, path (max_depth + 1,) the nodes of depths 0..m (then -1). On the device."""
    N, D = tree.size, tree.max_depth
    idx = torch.arange(N, device=chosen.device)
    parent = tree.parents.clamp_min(0)
    picked = (chosen[parent] == idx) | (tree.parents < 0)  # (N,): the root, and each chosen child
    on_path = ~(ancestors(tree.parents, D) & ~picked.unsqueeze(0)).any(1)  # every ancestor was picked
    m = torch.where(on_path, tree.depth, -1).max().view(1)  # (1,): the path is a chain, one node per depth
    path = torch.full((D + 1,), -1, dtype=torch.long, device=chosen.device)
    path = path.scatter_reduce(0, tree.depth, torch.where(on_path, idx, -1), "amax")  # (D + 1,)
    end = path.index_select(0, m)  # (1,): the deepest accepted node
    return m, emitted.index_select(0, end), path


def verify_tree(tree: Tree, p, rule, u=None, w=None, width=None) -> torch.Tensor:
    """The packed verdict (3 + 2 (max_depth + 1),) int64: [m, next, N, path nodes..., path tokens...]
    (-1 past depth m). No host read."""
    check_rule(rule)
    width = width or max(1, tree.size - 1)
    chosen, emitted = node_decisions(tree, p, rule, u, w, width)
    m, nxt, path = accepted_path(tree, chosen, emitted)
    tokens = torch.where(path >= 0, tree.tokens[path.clamp_min(0)], -1)
    n = torch.full((1,), tree.size, dtype=torch.long, device=p.device)
    return torch.cat([m, nxt, n, path, tokens])


def verify_tree_reference(parents: list, tokens: list, p, q, rule, u, w) -> tuple[list, int]:
    """The loop: (path nodes from the root, the token after them). parents and tokens are Python
    lists; p, q (N, V) tensors (q only for "sampled"); u (N, W), w (N,) the same numbers verify_tree uses."""
    check_rule(rule)
    children = [[j for j in range(len(parents)) if parents[j] == i] for i in range(len(parents))]
    path, i = [0], 0
    while True:
        pick, emit = None, None
        if rule in ("greedy", "deterministic"):
            y = int(p[i].argmax()) if rule == "greedy" else int(draw_with(p[i], w[i]))  # sync: reference
            pick = next((c for c in children[i] if tokens[c] == y), None)
            emit = y
        elif rule == "sampled":
            r, qq = p[i].clone(), q[i].clone()
            for j, c in enumerate(children[i]):
                x = tokens[c]
                if float(qq[x]) > 0 and float(u[i, j]) * float(qq[x]) < float(r[x]):  # sync: reference
                    pick = c
                    break
                rest = (r - qq).clamp_min(0.0)
                if float(rest.sum()) > 0:  # sync: reference
                    r = rest / rest.sum()
                qq = qq.clone()
                qq[x] = 0.0
                qq = qq / qq.sum().clamp_min(1e-30)
            emit = int(draw_with(r, w[i]))
        else:
            entropy = float(-(p[i] * p[i].clamp_min(1e-30).log()).sum())
            threshold = min(TYPICAL_EPS, TYPICAL_DELTA * math.exp(-entropy))
            pick = next((c for c in children[i] if float(p[i, tokens[c]]) > threshold), None)
            emit = int(draw_with(p[i], w[i]))
        if pick is None:
            return path, emit
        path.append(pick)
        i = pick
