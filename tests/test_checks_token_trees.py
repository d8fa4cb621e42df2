"""Chapter 12's checks (specdec_lab/lab/checks/token_trees.py) pass on the chapter's pieces and fail on broken
ones: the rule claim on typical acceptance, the figures on a copy of the stored run with one figure changed,
and compaction and the tree engine on a cache left uncompacted and an output that differs."""
import copy
import json
import math
from collections import Counter
from pathlib import Path

import pytest
import torch

import specdec_lab as sl
from specdec_lab.analysis.roofline import HARDWARE, LLAMA_3_8B, forward_seconds
from specdec_lab.analysis.syncs import count_host_syncs
from specdec_lab.core.masks import verification_mask
from specdec_lab.core.sampling import logits_to_probs
from specdec_lab.lab.checks import token_trees as checks
from specdec_lab.paged import PagedKVCache, PagedSequenceCache
from specdec_lab.tree import Tree, positions, static_parents, tree_mask, tree_mask_reference
from specdec_lab.tree.auto import Costs, plan
from specdec_lab.tree.compact import compact
from specdec_lab.tree.draft import pick_children
from specdec_lab.tree.rules import TYPICAL_DELTA, TYPICAL_EPS, node_decisions, tree_draws

DOCS = Path(__file__).resolve().parents[1] / "docs"
SHAPES = {"chain K=4": (1, 1, 1, 1), "static (4,2,1)": (4, 2, 1)}
RULES = {"deterministic, 4 children": ("deterministic", 4), "sampled, 1 child": ("sampled", 1),
         "sampled, 4 children": ("sampled", 4), "typical, 2 children": ("typical", 2)}
ROOTS, V = 20_000, 16


def stored():
    return json.loads((DOCS / "tree_vs_chain.json").read_text())


def tiny_p_q():
    """Section 3's tiny target's p and weaker draft's q."""
    target = sl.tiny_model(3, vocab_size=V, dim=16, n_heads=2, n_kv_heads=1)
    draft = sl.tiny_model(4, vocab_size=V, dim=16, n_heads=2, n_kv_heads=1)
    with torch.no_grad():
        x = torch.tensor([[1, 2, 5]])
        return logits_to_probs(target(x)[0, -1], 1.0, 0, 1.0), logits_to_probs(draft(x)[0, -1] * 0.5, 1.0, 0, 1.0)


def forest(p, q, rule, b, seed=0):
    """The chapter's forest: ROOTS independent roots with b children each; the token leaving each root."""
    g = torch.Generator().manual_seed(seed)
    kids = pick_children(q.expand(ROOTS, V), b, rule == "sampled", g)
    tokens = torch.cat([torch.zeros(ROOTS, dtype=torch.long), kids.reshape(-1)])
    parents = torch.cat([torch.full((ROOTS,), -1), torch.arange(ROOTS).repeat_interleave(b)])
    n = tokens.shape[0]
    trees = Tree(tokens, parents, (parents >= 0).long(), 1, q.expand(n, V))
    u, w = tree_draws(n, b, g, "cpu")
    chosen, emitted = node_decisions(trees, p.expand(n, V), rule, u, w, b)
    down = chosen[:ROOTS] >= 0
    return torch.where(down, tokens[chosen[:ROOTS].clamp_min(0)], emitted[:ROOTS]), down


def test_the_rules_lossless_and_typical_acceptance_not():
    from specdec_lab.lab import lossless
    p, q = tiny_p_q()
    probs = {t: float(p[t]) for t in range(V)}
    counts, pvalues, descended = {}, {}, {}
    for name, (rule, b) in RULES.items():
        out, down = forest(p, q, rule, b)
        counts[name] = Counter(out.tolist())
        pvalues[name] = lossless.chi_square_test(counts[name], probs).pvalue
        descended[name] = down.double().mean().item()
        if rule != "typical":
            checks.rule_output(counts[name], probs)
    with pytest.raises(AssertionError, match="distributed as the target's p"):
        checks.rule_output(counts["typical, 2 children"], probs)
    entropy = -(p * p.clamp_min(1e-30).log()).sum().item()
    threshold = min(TYPICAL_EPS, TYPICAL_DELTA * math.exp(-entropy))
    checks.rules(pvalues, descended, p, q, threshold)
    with pytest.raises(AssertionError, match="deterministic rule"):
        checks.rules(pvalues, {**descended, "deterministic, 4 children": 0.3}, p, q, threshold)


def test_coverage_and_a_copy_of_the_stored_run_with_one_figure_changed():
    run = stored()
    live_a = run["auto"]["acceptance_by_rank"]
    checks.coverage(run, live_a, SHAPES)
    changed = copy.deepcopy(run)
    changed["auto"]["acceptance_by_rank"][0] = 0.52
    with pytest.raises(AssertionError, match="49%"):
        checks.coverage(changed, live_a, SHAPES)


def test_the_tree_mask():
    L = 5
    tree = Tree(torch.zeros(7, dtype=torch.long), *static_parents((2, 2)), max_depth=2)
    chain = Tree(torch.zeros(4, dtype=torch.long), torch.tensor([-1, 0, 1, 2]), torch.tensor([0, 1, 2, 3]), max_depth=3)
    facts = (torch.equal(tree_mask(tree, L), tree_mask_reference(tree.parents.tolist(), L)),
             torch.equal(tree_mask(chain, L), verification_mask(L, 4)),
             positions(chain, L).tolist() == list(range(L, L + 4)))
    checks.tree_masks(*facts, [6.4e-05, 3.5e-05])
    with pytest.raises(AssertionError, match="own path"):
        checks.tree_masks(*facts, [6.4e-05, 0.8])


NAMES = ["The", "sky", "is", "x0", "a", "b", "a1", "a2", "b1", "b2"]


def compacted(cache, move=True):
    """Section 4: slot s holds s; the path x0 -> b -> b1 is compacted right after x0 (unless not `move`)."""
    codes = torch.arange(len(NAMES), dtype=torch.float32).view(1, 1, -1, 1)
    cache.write_layer(0, codes, codes)
    cache.advance(len(NAMES))
    if move:
        compact(cache, torch.tensor([2, 5]) + 3, 4)
    keys = cache.k[0, 0, :, :cache.length] if isinstance(cache, sl.KVCache) else cache.keys(0)[0]
    return [NAMES[int(s)] for s in keys[0, :, 0]]


def engine_runs(target, draft, prompt, n=32):
    """Section 4's tree engine on both caches, on a tiny pair: output, host reads per step, cached keys' gap."""
    base = sl.autoregressive_generate(target, prompt, max_new_tokens=n)
    text_ids = prompt + base.tokens
    with torch.no_grad():
        fresh = sl.KVCache.for_model(target.cfg, 128)
        target(torch.tensor([text_ids[:-1]]), cache=fresh)
    runs = {}
    for kind in ("contiguous", "paged"):
        engine, seen = sl.TreeEngine(target, draft, tree=(4, 2, 1), cache=kind), []
        with count_host_syncs() as syncs:
            res = engine.generate(prompt, max_new_tokens=n, on_step=lambda rec, out: seen.append(syncs.count))
        m = len(text_ids) - 1
        keys = [engine.cache.k[i, 0, :, :m] if kind == "contiguous" else engine.cache.keys(i)[0, :, :m]
                for i in range(target.cfg.n_layers)]
        gap = max((k - fresh.k[i, 0, :, :m]).abs().max().item() for i, k in enumerate(keys))
        runs[kind] = dict(same=res.tokens == base.tokens, syncs=[b - a for a, b in zip(seen, seen[1:])], gap=gap)
    return runs


def test_compaction_and_the_tree_engine():
    paged = PagedSequenceCache(PagedKVCache(1, 4, 1, 4, 1), 16)
    moved = {"contiguous": compacted(sl.KVCache(1, 1, 1, 16, 1)), "paged": compacted(paged)}
    runs = engine_runs(sl.tiny_model(0), sl.tiny_model(1, n_layers=1), [1, 2, 3])
    checks.compaction(moved, paged, runs)
    left = {**moved, "paged": compacted(PagedSequenceCache(PagedKVCache(1, 4, 1, 4, 1), 16), move=False)}
    with pytest.raises(AssertionError, match="compaction"):
        checks.compaction(left, paged, runs)
    with pytest.raises(AssertionError, match="greedy output"):
        checks.compaction(moved, paged, {**runs, "paged": {**runs["paged"], "same": False}})


def test_when_trees_pay_and_the_answers():
    run, (p, q) = stored(), tiny_p_q()
    costs = run["auto"]["costs"]
    replayed = plan(run["auto"]["acceptance_by_rank"], Costs(**costs))
    one_row = [costs["target_chain"][0]] * len(costs["rows"])
    flat = plan(run["auto"]["acceptance_by_rank"], Costs(costs["rows"], one_row, one_row, costs["draft_tree"],
                                                         costs["draft_chain"]))
    h200 = HARDWARE["H200"]
    roofline = {n: forward_seconds(LLAMA_3_8B, n, h200.peak_flops, h200.bandwidth, context=128) for n in range(1, 65)}
    checks.when_trees_pay(run, replayed, flat, roofline, None)
    checks.exercise_answers(run, p, q, replayed)
    with pytest.raises(AssertionError, match="no GPU measurement"):
        checks.when_trees_pay(run, replayed, flat, roofline, {1: 0.003, 16: 0.003})
    changed = copy.deepcopy(run)
    changed["results"]["0.0"]["table"]["static (4,2,1)"]["ratio_to_chain"] = 0.62
    with pytest.raises(AssertionError, match="0.57"):
        checks.when_trees_pay(changed, replayed, flat, roofline, None)
    with pytest.raises(AssertionError, match="answer 3"):
        checks.exercise_answers(run, p, p, replayed)
