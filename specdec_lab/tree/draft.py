"""Drafting a token tree with a small model: one draft forward per depth, over the frontier.

The draft's cache holds every committed token except `pending` (as drafters/model.py's
ModelDrafter keeps it); pending ends with c, the tree's root. A step feeds pending, which
gives q at the root, then feeds each depth's frontier in one forward with a tree mask of
the draft's own: a frontier node sees the committed prefix, its fed ancestors and itself,
at position (c's position + its depth). Fed nodes take consecutive cache slots after the
committed prefix; `Tree.slot` remembers each node's slot (-1 for nodes never fed: the
leaves, which only the target reads).

Two ways to choose the nodes:

- a static tree of a given shape (branching per depth, e.g. (4, 2, 1)): every node at
  depth d gets shape[d] children, the draft's top ones (`sampled=False`) or drawn from q
  without replacement (`sampled=True`, the exponential race: the b largest q(x) / e_x are a
  sample of b tokens without replacement; Sequoia's rule needs children drawn so);
- a dynamic tree grown EAGLE-2's way (arXiv 2406.16858): a node's score is the sum of the
  draft's log-probabilities along its path; at each depth the `top_k` best-scored nodes of the
  depth are expanded (fed, and given their top_k children as candidates), and at the end the
  `budget` best-scored candidates of all depths form the tree. A child never scores above its
  parent, so a chosen node's parent is chosen too (ties go to the shallower node).

Every size is a host int known before drafting, so nothing is read back to the host: the
tree's topology lives in device tensors.

After verification, `commit` keeps the accepted path's fed nodes: their keys and values
are moved to the consecutive slots after the committed prefix (EAGLE's compaction), the
rest of the tree is dropped, and an accepted node never fed joins the next token in pending.
"""
from dataclasses import dataclass

import torch

from ..core.kv_cache import KVCache
from ..core.sampling import logits_to_probs
from .compact import compact
from .structure import Tree, static_parents


@dataclass(frozen=True)
class DynamicTree:
    """EAGLE-2's dynamic tree: expand the top_k best-scored nodes per depth, keep `budget` nodes."""
    depth: int = 4  # levels below the root
    top_k: int = 4  # nodes expanded per depth, and children per expanded node
    budget: int = 16  # nodes in the tree besides the root

    def __post_init__(self):
        for name, v, hi in [("depth", self.depth, 16), ("top_k", self.top_k, 16), ("budget", self.budget, 255)]:
            if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= hi:
                raise ValueError(f"{name} must be an int in [1, {hi}], got {v!r}")
        if self.budget > self.top_k + (self.depth - 1) * self.top_k ** 2:
            raise ValueError(f"budget {self.budget} exceeds the {self.top_k + (self.depth - 1) * self.top_k ** 2} "
                             f"candidates that depth {self.depth} and top_k {self.top_k} give")


def pick_children(q, b, sampled, generator):
    """(n, b) token ids: each row's top b of q (n, V), or b drawn from q without replacement."""
    if sampled:
        e = torch.rand(q.shape, generator=generator, device=q.device).clamp_(min=2.0 ** -25).log_().neg_()
        return (q / e).topk(b, dim=-1).indices  # the exponential race, b winners
    return q.topk(b, dim=-1).indices


class TreeDrafter:
    """A draft model that proposes token trees (module docstring)."""

    def __init__(self, model, capacity, cache_factory=KVCache.for_model):
        self.model = model
        self.cache = cache_factory(model.cfg, capacity, dtype=model.dtype, device=model.device)
        self._shapes = {}  # static shape -> (parents, depth) on the device
        self.reset()

    def reset(self):
        self.cache.reset()
        self.pending = torch.empty(0, dtype=torch.long, device=self.model.device)

    def prefill(self, prompt_ids):
        self.reset()
        prompt = torch.tensor(prompt_ids, device=self.model.device)  # the prompt's one copy to the device
        if len(prompt_ids) > 1:
            self.model(prompt[:-1].view(1, -1), cache=self.cache, last_only=True)
        self.pending = prompt[-1:]

    def _root(self):
        """Feed pending; the draft's logits at the root c (1, V)."""
        return self.model(self.pending.view(1, -1), cache=self.cache, last_only=True)[0]  # (1, V)

    def _feed(self, tokens, depth, anc):
        """One forward over a frontier (n,) at `depth`; anc (n, F) marks each node's fed ancestors among
        the F nodes fed before it. Returns the logits (n, V)."""
        n, base = tokens.shape[0], self._base
        F = anc.shape[1]
        allowed = torch.cat([torch.ones(n, base, dtype=torch.bool, device=tokens.device), anc,
                             torch.eye(n, dtype=torch.bool, device=tokens.device)], dim=1)  # (n, base + F + n)
        mask = torch.zeros(allowed.shape, dtype=self.model.dtype, device=tokens.device)
        mask = mask.masked_fill(~allowed, float("-inf")).view(1, 1, n, base + F + n)
        pos = torch.full((n,), base - 1 + depth, dtype=torch.long, device=tokens.device)
        return self.model(tokens.view(1, n), input_pos=pos, cache=self.cache, mask=mask)[0]  # (n, V)

    @staticmethod
    def _dist(logits, sampling):
        """What children are ranked by (logits when greedy) and q, the processed distribution."""
        if sampling.greedy:
            return logits, None
        q = logits_to_probs(logits, sampling.temperature, sampling.top_k, sampling.top_p)
        return q, q

    def draft_static(self, shape, sampling, generator, sampled=False, keep_q=False) -> Tree:
        """A full tree of `shape`; keep_q stores each node's q (Sequoia's rule reads it)."""
        device = self.model.device
        if shape not in self._shapes:  # made from host lists once per shape: not a copy per step
            self._shapes[shape] = static_parents(shape, device)
        parents, depth = self._shapes[shape]
        c = self.pending[-1:]
        rank, q = self._dist(self._root(), sampling)
        self._base = self.cache.length  # c sits at slot base - 1
        tokens, qs = [c], [q]
        anc_self = torch.zeros(1, 0, dtype=torch.bool, device=device)  # the root is not among the fed nodes
        for d, b in enumerate(shape):
            children = pick_children(rank, b, sampled and not sampling.greedy, generator).reshape(-1)  # (n*b,)
            tokens.append(children)
            if d + 1 == len(shape):
                break  # the deepest level is never fed: only the target reads it
            anc = anc_self.repeat_interleave(b, dim=0)  # (n*b, F): a child sees what its parent sees
            rank, q = self._dist(self._feed(children, d + 1, anc), sampling)
            qs.append(q)
            anc_self = torch.cat([anc, torch.eye(children.shape[0], dtype=torch.bool, device=device)], 1)
        N = depth.shape[0]
        fed = N - tokens[-1].shape[0]  # the root and every level above the deepest
        slot = torch.full((N,), -1, dtype=torch.long, device=device)
        slot[:fed] = torch.arange(self._base - 1, self._base - 1 + fed, device=device)
        q = None
        if keep_q and not sampling.greedy:
            q = torch.cat(qs + [qs[0].new_zeros(N - fed, qs[0].shape[-1])])  # (N, V): leaves have no children
        return Tree(torch.cat(tokens), parents, depth, len(shape), q, slot)

    def draft_dynamic(self, spec: DynamicTree, sampling, generator) -> Tree:
        """EAGLE-2's tree (module docstring): expand the top_k best paths per depth, keep `budget` nodes."""
        device, k = self.model.device, spec.top_k
        c = self.pending[-1:]
        logp = self._logp(self._root(), sampling)[0]  # (V,)
        self._base = self.cache.length
        top = logp.topk(k)
        tok, score = [top.indices], [top.values]  # candidates, depth by depth
        parent = [torch.full((k,), -1, dtype=torch.long, device=device)]  # global candidate index; -1: root
        level = [torch.ones(k, dtype=torch.long, device=device)]
        slot = [torch.full((k,), -1, dtype=torch.long, device=device)]
        frontier = torch.arange(k, device=device)  # global indices of the nodes to expand
        anc = torch.zeros(k, 0, dtype=torch.bool, device=device)  # (k, F): the frontier's fed ancestors
        for d in range(1, spec.depth):
            F, first = anc.shape[1], sum(t.shape[0] for t in tok)
            all_slot = torch.cat(slot)
            all_slot[frontier] = torch.arange(self._base + F, self._base + F + k, device=device)
            slot = [all_slot]  # one tensor from here on; new candidates are appended
            tok, score, parent, level = [torch.cat(tok)], [torch.cat(score)], [torch.cat(parent)], [torch.cat(level)]
            logp = self._logp(self._feed(tok[0][frontier], d, anc), sampling)  # (k, V)
            top = logp.topk(k, dim=-1)  # (k, k)
            tok.append(top.indices.reshape(-1))
            score.append((score[0][frontier].unsqueeze(1) + top.values).reshape(-1))  # path log-probability
            parent.append(frontier.repeat_interleave(k))
            level.append(torch.full((k * k,), d + 1, dtype=torch.long, device=device))
            slot.append(torch.full((k * k,), -1, dtype=torch.long, device=device))
            child_anc = torch.cat([anc, torch.eye(k, dtype=torch.bool, device=device)], 1).repeat_interleave(k, 0)
            best = score[-1].topk(k).indices  # (k,) among the k*k new candidates
            frontier, anc = first + best, child_anc[best]
        tok, score, parent, level, slot = (torch.cat(x) for x in (tok, score, parent, level, slot))
        by_depth = level.sort(stable=True).indices  # ties in score go to the shallower node
        ranked = by_depth[score[by_depth].sort(descending=True, stable=True).indices]
        keep = ranked[:spec.budget]
        keep = keep[level[keep].sort(stable=True).indices]  # parent-first: level by level
        index = torch.zeros(tok.shape[0], dtype=torch.long, device=device)
        index[keep] = torch.arange(1, spec.budget + 1, device=device)  # new index of each kept candidate
        parents = torch.where(parent[keep] >= 0, index[parent[keep].clamp_min(0)], 0)
        root = lambda v: torch.full((1,), v, dtype=torch.long, device=device)  # noqa: E731
        return Tree(torch.cat([c, tok[keep]]), torch.cat([root(-1), parents]), torch.cat([root(0), level[keep]]),
                    spec.depth, None, torch.cat([root(self._base - 1), slot[keep]]))

    @staticmethod
    def _logp(logits, sampling):
        """Log-probabilities the dynamic tree scores paths with: the processed q's (log_softmax when greedy)."""
        if sampling.greedy:
            return logits.log_softmax(-1)
        return logits_to_probs(logits, sampling.temperature, sampling.top_k, sampling.top_p).log()

    def commit(self, tree: Tree, path, m: int, last_fed: bool, nxt):
        """Keep the accepted path's fed nodes (path (max_depth + 1,) node indices on the device, m the
        accepted depth), drop the rest of the tree; the next token (1,) and an unfed last node are pending."""
        keep = m if last_fed else m - 1 if m > 0 else 0
        compact(self.cache, tree.slot.index_select(0, path[1:keep + 1]), self._base)
        pending = [tree.tokens.index_select(0, path[m:m + 1])] if m > 0 and not last_fed else []
        self.pending = torch.cat(pending + [nxt])
