"""tree="auto": the tree shape, or a chain, from measured acceptance and measured costs.

Sequoia (arXiv 2402.12374) chooses a tree from two measurements: how often the draft's
rank-r token is the one the target takes (acceptance by rank, a_r), and what the target's
forward costs by the number of rows it verifies. Its positional model takes a node's
acceptance to depend only on its rank among its siblings, independently along a path.
For a static tree of shape (b_1..b_D) the expected tokens per step are then

    E = 1 + sum_{d=1..D} prod_{i=1..d} A(b_i),    A(b) = a_1 + .. + a_b

(with the deterministic rule the events "the target's token is the rank-r child" are
disjoint across r, so the mass of the top b adds up), and a chain of K is the shape
(1,)*K. The time of a step is what this machine measured: the draft's forward per depth
over that depth's nodes (the chain's one-row fused forwards), and the target's forward
over all the nodes (the chain's fused K+1-row forward, the tree's eager masked one).
`plan` searches every shape with non-increasing branching up to a node limit, exhaustively
rather than with Sequoia's dynamic program (the family is small), and returns the best
tokens per second: a chain wherever no tree pays for its extra rows.

`measure_acceptance` and `measure_costs` make the two inputs; `choose` runs both and the
search, and prints its choice with the expected tokens per step.
"""
from dataclasses import dataclass

import torch
from tqdm import tqdm

from ..analysis.timing import best_seconds
from ..core.engine import autoregressive_generate
from ..core.kv_cache import KVCache
from ..core.sampling import logits_to_probs
from ..core.text import encode_prompt
from .structure import Tree, tree_mask, tree_size

MAX_RANK = 8  # acceptance is measured for the draft's top 8 tokens
ROWS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 14, 16, 20, 24, 32, 40, 48, 64)  # row counts timed


@torch.inference_mode()
def measure_acceptance(target, draft, prompts, n_tokens=48, temperature=0.0, top_k=0, top_p=1.0,
                       tokenizer=None, progress=False) -> list[float]:
    """a_1..a_MAX_RANK: the target's processed probability of the draft's rank-r token, averaged over the
    positions of the target's own greedy continuations of `prompts` (one forward of each model per prompt)."""
    totals, rows = torch.zeros(MAX_RANK, dtype=torch.float64), 0
    for prompt in tqdm(prompts, desc="tree='auto': acceptance by rank", unit="prompt", disable=not progress):
        ids = encode_prompt(tokenizer or getattr(target, "tokenizer", None), prompt)
        out = autoregressive_generate(target, ids, max_new_tokens=n_tokens, temperature=0.0).tokens
        x = torch.tensor([ids + out[:-1]], device=target.device)  # (1, T): predict every generated token
        p = target(x)[0, len(ids) - 1:]  # (n, V)
        q = draft(x)[0, len(ids) - 1:]  # (n, V)
        p = logits_to_probs(p, temperature, top_k, top_p)
        ranks = q.topk(MAX_RANK, dim=-1).indices  # (n, R)
        totals += p.gather(1, ranks).double().sum(0).cpu()
        rows += p.shape[0]
    return (totals / rows).tolist()


def _masked_forward(model, cache, L, n):
    """A forward over n rows after L cached positions with an explicit (star-shaped) tree mask."""
    parents = torch.zeros(n, dtype=torch.long, device=model.device)
    parents[0] = -1
    depth = (parents >= 0).long()
    tree = Tree(torch.ones(n, dtype=torch.long, device=model.device), parents, depth, 1)
    cache.rollback(L)
    model(tree.tokens.view(1, n), input_pos=depth + L, cache=cache, mask=tree_mask(tree, L, model.dtype))


def _plain_forward(model, cache, L, n):
    cache.rollback(L)
    model(torch.ones(1, n, dtype=torch.long, device=model.device), cache=cache)


@dataclass
class Costs:
    """Seconds by row count, measured after `context` cached tokens."""
    rows: list  # the row counts timed
    target_tree: list  # the target's forward with a tree mask (the tree's verification)
    target_chain: list  # the target's forward with the default mask (the chain's verification)
    draft_tree: list  # the draft's forward with a tree mask (a tree's depth)
    draft_chain: list  # the draft's forward with the default mask (a chain's step, the tree's root)

    def at(self, name, n) -> float:
        """Seconds for n rows, linear between the row counts timed."""
        xs, ys = self.rows, getattr(self, name)
        if n <= xs[0]:
            return ys[0]
        for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
            if n <= x1:
                return y0 + (y1 - y0) * (n - x0) / (x1 - x0)
        return ys[-1] * n / xs[-1]


@torch.inference_mode()
def measure_costs(target, draft, max_rows=64, context=128, rounds=4, progress=False) -> Costs:
    """Time both models' forwards by row count on this machine. Each round times every (model, mask, rows)
    once, in a rotated order; a figure is the fastest over the rounds (noise on a shared machine only adds
    time), and then the fastest at that row count or more (a forward over more rows costs no less)."""
    rows = [n for n in ROWS if n <= max_rows]
    caches = {}
    for name, model in (("target", target), ("draft", draft)):
        cache = KVCache.for_model(model.cfg, context + max_rows + 1, dtype=model.dtype, device=model.device)
        model(torch.ones(1, context, dtype=torch.long, device=model.device), cache=cache)
        caches[name] = (model, cache)
    jobs = [(f"{name}_{kind}", i) for name in caches for kind in ("tree", "chain") for i in range(len(rows))]
    best = {key: float("inf") for key in jobs}
    for r in tqdm(range(rounds), desc="tree='auto': forward costs by rows", unit="round", disable=not progress):
        for key in jobs[r % len(jobs):] + jobs[:r % len(jobs)]:
            model, cache = caches[key[0].split("_")[0]]
            run = _masked_forward if key[0].endswith("tree") else _plain_forward
            best[key] = min(best[key], best_seconds(lambda: run(model, cache, context, rows[key[1]]), 1,
                                                    model.device))
    out = {}
    for name in {key[0] for key in jobs}:
        times = [best[(name, i)] for i in range(len(rows))]
        out[name] = [min(times[i:]) for i in range(len(rows))]
    return Costs(rows, **out)


@dataclass
class Plan:
    shape: tuple  # branching per depth; (1,) * K is a chain of K
    chain: bool  # run the chain engine (fused verification) rather than the tree engine
    expected_tokens: float  # tokens per step under the positional model
    seconds: float  # predicted seconds per step
    candidates: int  # shapes searched

    @property
    def tokens_per_second(self) -> float:
        return self.expected_tokens / self.seconds

    def __str__(self):
        kind = f"chain of {len(self.shape)}" if self.chain else f"tree {self.shape} ({tree_size(self.shape) - 1} nodes)"
        return (f"tree='auto' chose a {kind}: {self.expected_tokens:.2f} expected tokens per step, "
                f"{1e3 * self.seconds:.1f} ms per step predicted, {self.tokens_per_second:.1f} tokens/s "
                f"({self.candidates} shapes searched)")


def expected_tokens(shape, acceptance) -> float:
    """1 + sum_d prod_{i<=d} A(b_i), A(b) the acceptance mass of the draft's top b (module docstring)."""
    total, path = 1.0, 1.0
    for b in shape:
        path *= min(1.0, sum(acceptance[:b]))
        total += path
    return total


def step_seconds(shape, costs: Costs, chain: bool) -> float:
    """Predicted seconds of one step: the draft's forwards and the target's verification."""
    if chain:
        return len(shape) * costs.at("draft_chain", 1) + costs.at("target_chain", len(shape) + 1)
    levels, n = [], 1
    for b in shape[:-1]:  # every level but the deepest is fed to the draft
        n *= b
        levels.append(n)
    return (costs.at("draft_chain", 1) + sum(costs.at("draft_tree", m) for m in levels)
            + costs.at("target_tree", tree_size(shape)))


def shapes(max_nodes, max_depth=8, max_branch=MAX_RANK):
    """Every shape with non-increasing branching, at most max_depth levels and max_nodes nodes (root excluded)."""
    def grow(prefix, limit):
        if prefix:
            yield prefix
        if len(prefix) == max_depth:
            return
        for b in range(1, limit + 1):
            nxt = prefix + (b,)
            if tree_size(nxt) - 1 <= max_nodes:
                yield from grow(nxt, b)
    yield from grow((), max_branch)


def plan(acceptance, costs: Costs, max_nodes=32, max_depth=8) -> Plan:
    """The shape (or chain) of the most tokens per second predicted (module docstring)."""
    if len(acceptance) < 1 or any(not 0.0 <= a <= 1.0 for a in acceptance):
        raise ValueError(f"acceptance must be probabilities by rank, got {acceptance!r}")
    best, n = None, 0
    for shape in shapes(max_nodes, max_depth, min(MAX_RANK, len(acceptance))):
        for chain in ((True, False) if all(b == 1 for b in shape) else (False,)):
            n += 1
            e, s = expected_tokens(shape, acceptance), step_seconds(shape, costs, chain)
            if best is None or e / s > best.expected_tokens / best.seconds:
                best = Plan(shape, chain, e, s, 0)
    best.candidates = n
    return best


def choose(target, draft, prompts, temperature=0.0, top_k=0, top_p=1.0, max_nodes=32, tokenizer=None,
           verbose=True) -> tuple[Plan, list, Costs]:
    """Measure acceptance by rank and the costs by row count here, search, print the choice (verbose:
    with a progress bar per measurement, on stderr: the two take about half a minute on the default pair)."""
    acceptance = measure_acceptance(target, draft, prompts, temperature=temperature, top_k=top_k, top_p=top_p,
                                    tokenizer=tokenizer, progress=verbose)
    costs = measure_costs(target, draft, max_rows=tree_size((MAX_RANK,)) + max_nodes, progress=verbose)
    best = plan(acceptance, costs, max_nodes)
    if verbose:
        print(best)
    return best, acceptance, costs

