"""The GPU check's costs beyond one chain: the batched speculative step by rows and K (serve/),
and the target's verification of a token tree by node count (tree/), eager and compiled.

Both are costs, not speeds: a chapter or the goodput policy turns them into a prediction with a
measured alpha. `batched_steps` times real BatchEngine steps (draft forwards, the target's forward
over B (K + 1) tokens, the batch's verdict, its one host read) through serve.measure_step_costs.
`tree_verify` times the target's one forward over n nodes after `context` cached tokens with a
tree mask (a 4-ary tree: node i's parent is (i - 1) // 4), beside the chain's forward over n rows
with the default mask. The compiled figures run the compiled seam's own function
(compiled.static_forward through a StaticRows runner's torch.compile) with the tree mask over a
static cache; a static cache writes each row at its input position, so there the rows take
consecutive positions (the cost of a forward does not depend on the positions' values), and the
graphs compile in a warm-up before the timed window, which records the graph count around it.
"""
import torch

from ..analysis.timing import best_seconds
from ..compiled import StaticRows, graph_counts, static_forward
from ..core.config import MAX_K
from ..core.kv_cache import KVCache
from ..serve import BatchEngine, measure_step_costs
from ..tree.structure import Tree, tree_mask

BLOCK = 16  # the paged cache's block size for the batched steps


def tokens_per_step(alpha: float, k: int) -> float:
    """Expected tokens a row commits per step at per-token acceptance alpha: (1 - a^(K+1)) / (1 - a)."""
    return float(k + 1) if alpha == 1.0 else (1 - alpha ** (k + 1)) / (1 - alpha)


@torch.inference_mode()
def batched_steps(target, draft, batch_sizes, ks, context=128, reps=3, alphas=(0.6, 0.7, 0.8)) -> dict:
    """{"step_costs": {"B,K": seconds}} for every B and K, and what they predict: each row's tokens per
    second at fixed K over plain batched decoding (K = 0) at the given alphas, and the first B where
    each K stops paying."""
    budget = context + (reps + 1) * len(ks) * (MAX_K + 1) + 2  # what measure_step_costs lets a row grow to
    blocks = max(batch_sizes) * (budget // BLOCK + 2)
    engine = BatchEngine(target, draft, num_blocks=blocks, block_size=BLOCK, max_seq_len=budget + BLOCK)
    costs = measure_step_costs(engine, batch_sizes, ks, context=context, reps=reps)
    over_plain = {f"{a:g}": {f"{B},{k}": tokens_per_step(a, k) * costs[(B, 0)] / costs[(B, k)]
                             for B in batch_sizes for k in ks if k} for a in alphas}
    crossover = {f"{a:g}": {k: next((B for B in batch_sizes if over_plain[f"{a:g}"][f"{B},{k}"] < 1.0), None)
                            for k in ks if k} for a in alphas}
    return {"context": context, "step_costs": {f"{B},{k}": s for (B, k), s in costs.items()},
            "predicted_over_plain": over_plain, "crossover_batch_predicted": crossover,
            "note": "fastest of `reps` real batched steps of greedy rows; over plain: tokens per step at alpha "
                    "times the K = 0 step's cost over the K step's, per row"}


def four_ary_tree(n: int, device) -> Tree:
    """n nodes, node i's parent (i - 1) // 4 (the root has none)."""
    parents = torch.tensor([-1] + [(i - 1) // 4 for i in range(1, n)], dtype=torch.long)
    depth = torch.zeros(n, dtype=torch.long)
    for i in range(1, n):
        depth[i] = depth[parents[i]] + 1
    return Tree(torch.ones(n, dtype=torch.long, device=device), parents.to(device), depth.to(device),
                max(1, int(depth.max())))


@torch.inference_mode()
def tree_verify(target, nodes, context=128, reps=5) -> dict:
    """Eager: seconds of the target's forward over n tree nodes (tree mask, positions by depth) and over
    n chain rows (the default mask), after `context` cached tokens, for each n in `nodes`."""
    device, cap = target.device, context + max(nodes) + 1
    cache = KVCache.for_model(target.cfg, cap, dtype=target.dtype, device=device)
    target(torch.ones(1, context, dtype=torch.long, device=device), cache=cache)
    out = {"context": context, "tree": {}, "chain": {}}
    for n in nodes:
        tree = four_ary_tree(n, device)
        mask, pos = tree_mask(tree, context, target.dtype), tree.depth + context

        def as_tree():
            cache.rollback(context)
            target(tree.tokens.view(1, n), input_pos=pos, cache=cache, mask=mask)

        def as_chain():
            cache.rollback(context)
            target(tree.tokens.view(1, n), cache=cache)
        out["tree"][n] = best_seconds(as_tree, reps, device)
        out["chain"][n] = best_seconds(as_chain, reps, device)
    return out


def tree_verify_compiled(target, nodes, context=128, reps=5, mode=None) -> dict:
    """Compiled: the same tree-masked forwards through torch.compile (module docstring), one graph per
    node count, compiled and recorded in a warm-up; then the timed window."""
    cap = context + max(nodes) + 1
    runner = StaticRows(target, compile=True, mode=mode, rows=tuple(nodes), capacity=cap)
    cache = runner.new_cache(cap)  # made outside inference mode: a graph is shared by every call
    device = target.device
    with torch.inference_mode():
        static_forward(target, torch.ones(1, context, dtype=torch.long, device=device),
                       torch.arange(context, device=device), cache)  # the context: uncompiled

        def call(n):
            tree = four_ary_tree(n, device)
            mask = tree_mask(tree, context, target.dtype)  # (1, 1, n, context + n) -> the whole capacity
            mask = torch.nn.functional.pad(mask, (0, cache.capacity - mask.shape[-1]), value=float("-inf"))
            pos = torch.arange(context, context + n, device=device)
            return lambda: runner.compiled(target, tree.tokens.view(1, n), pos, cache, mask, None, True, False, None)
        calls = {n: call(n) for n in nodes}
        before = graph_counts()
        for _ in range(3):  # reduce-overhead records a CUDA graph at a shape's second or third call
            for fn in calls.values():
                fn()
        warm = graph_counts()
        seconds = {n: best_seconds(fn, reps, device) for n, fn in calls.items()}
        after = graph_counts()
    return {"context": context, "capacity": cap, "tree": seconds, "warm_up_graphs": warm["graphs"] - before["graphs"],
            "graphs_before": warm["graphs"], "graphs_after": after["graphs"],
            "cudagraph_skips": after["cudagraph_skips"] - before["cudagraph_skips"]}
