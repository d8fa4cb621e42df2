"""Chapter 12's checks: the draft's coverage and the positional model, the tree mask, the tree rules (lossless,
and typical acceptance not), compaction and the tree engine, when trees pay, and the exercises' answers.

`rule_output` is the rule claim: the token leaving a node is distributed as the target's p. The chapter runs
it on the lossless rules' forests and, through `must_fail`, on typical acceptance (Medusa), the lossy negative
control. The other functions hold the figures the prose quotes against docs/tree_vs_chain.json (the chapter's
`stored`) and the chapter's live cells.
"""
import json
import math
from pathlib import Path

import torch

from ...analysis.roofline import HARDWARE, LLAMA_3_8B, bytes_per_token, critical_batch_size
from ...tree import Tree, static_parents, tree_mask
from ...tree.auto import Costs, expected_tokens, step_seconds
from ...tree.rules import TYPICAL_DELTA, TYPICAL_EPS
from .. import lossless

DOCS = Path(__file__).resolve().parents[3] / "docs"


def measured_tokens(stored):
    """Tokens per step of the stored run at temperature 0, for the systems the prose quotes."""
    table = stored["results"]["0.0"]["table"]
    return {name: table[name]["tokens_per_step"] for name in ("chain K=4", "static (4,2,1)", "dynamic d4 k4 n12")}


def coverage(stored, live_a, shapes):
    """Section 1: the stored coverage the prose quotes (49% and 74%), the live draft's top 4 covering more than
    its first choice, and the positional model over-predicting the chain and the tree (`shapes`: name ->
    shape) but ordering them right."""
    stored_a = stored["auto"]["acceptance_by_rank"]
    assert f"{stored_a[0]:.2f} {sum(stored_a[:4]):.2f}" == "0.49 0.74", "the prose's 49% and 74%"
    assert sum(live_a[:4]) > live_a[0] + 0.1, "the live draft's top 4 cover clearly more than its first choice"
    measured = measured_tokens(stored)
    assert [f"{v:.2f}" for v in measured.values()] == ["1.65", "1.97", "2.01"], \
        f"the stored tokens per step: 1.65, 1.97 and 2.01, not {measured}"
    assert all(expected_tokens(s, stored_a) > measured[n] for n, s in shapes.items()), "the model over-predicts both"
    assert expected_tokens(shapes["static (4,2,1)"], stored_a) > expected_tokens(shapes["chain K=4"], stored_a), \
        "the model orders the tree above the chain"


def tree_masks(same_as_loop, chain_is_k_plus_1, chain_positions, tree_gaps):
    """Section 2: `tree_mask` equals the loop, a chain's tree mask and positions are chapter 05's, and one
    masked forward over the tree gives each node its own path's distribution (`tree_gaps`: per node, the
    largest logit difference from the path alone)."""
    assert same_as_loop and chain_is_k_plus_1 and chain_positions, \
        "tree_mask equals the loop, and a chain's mask and positions are verification_mask's"
    assert max(tree_gaps) < 1e-3, "a node's row must be its own path's distribution"


def rule_output(counts, probs):
    """A lossless rule: the tokens leaving the roots of a forest (`counts`: token -> how often) are distributed
    as the target's p (`probs`: token -> probability), by chapter 02's chi-square test."""
    assert lossless.chi_square_test(counts, probs).pvalue > 1e-3, \
        "the token leaving a node must be distributed as the target's p"


def rules(pvalues, descended, p, q, typical_threshold):
    """Section 3's figures: typical acceptance fails outright, and what each rule descends with (`descended`:
    the share of roots that descended), for the tiny target's p and the weaker draft's q."""
    for name, pv in pvalues.items():
        assert (pv < 1e-6) if name.startswith("typical") else (pv > 1e-3), f"{name}: p-value {pv:.2e}"
    top4, top2 = q.topk(4).indices, q.topk(2).indices
    assert abs(descended["deterministic, 4 children"] - p[top4].sum().item()) < 0.015, \
        "the deterministic rule descends with p's mass on its children"
    assert abs(descended["sampled, 1 child"] - torch.minimum(p, q).sum().item()) < 0.015, \
        "the sampled rule with one child descends as often as the chain, sum min(p, q)"
    assert descended["sampled, 4 children"] > descended["sampled, 1 child"] + 0.05, "and more with four children"
    assert descended["typical, 2 children"] == 1.0 and pvalues["typical, 2 children"] == 0.0, "the prose's typical run"
    assert (TYPICAL_EPS, TYPICAL_DELTA) == (0.09, 0.3), "Medusa's posterior_threshold and posterior_alpha, in that order"
    assert [f"{x:.3f}" for x in (p[top2[0]].item(), typical_threshold, p[top2[1]].item())] == \
        ["0.001", "0.043", "0.098"], "the draft's first choice below the typical threshold, its second above"
    assert f"{p[top4].sum().item():.3f}" == "0.135" \
        and descended["sampled, 1 child"] > descended["deterministic, 4 children"], \
        "with this poor draft (its top 4 hold 0.135 of p) Sequoia's rule wins even with one child"


def compaction(moved, paged, engine_runs):
    """Section 4: compaction on both caches (`moved`: the slots' names after it; `paged`: the paged cache),
    and the tree engine on each (`engine_runs`: same greedy output, host reads per step, cached keys' gap),
    and docs/tree_equality.json's 96 of 96."""
    assert moved["contiguous"] == moved["paged"] == ["The", "sky", "is", "x0", "b", "b1"], \
        "compaction moves the accepted path right after c, on both caches"
    assert len(paged.paged.block_table(paged.seq)) == 2, "the rollback freed the third block"
    for kind, run in engine_runs.items():
        assert run["same"] and set(run["syncs"]) == {1} and run["gap"] < 1e-3, \
            f"{kind}: the target's greedy output, one host read per step, the keys a plain forward computes"
    assert set(json.loads((DOCS / "tree_equality.json").read_text())["identical"].values()) == {96}, \
        "both trees and both caches give the target's output on 96 of 96 prompts"


def when_trees_pay(stored, replayed, flat, roofline, gpu_tree):
    """Section 5: the quoted costs and speeds from the stored run, tree="auto"'s choice replayed (`replayed`)
    and replayed with flat verification (`flat`), the 8B roofline on an H200 (`roofline`: rows -> seconds),
    no GPU measurement stored (`gpu_tree` None), and the pull request's figures."""
    costs, table = stored["auto"]["costs"], stored["results"]["0.0"]["table"]
    at = {n: i for i, n in enumerate(costs["rows"])}
    measured = measured_tokens(stored)

    def ms(key, n):
        return f"{1e3 * costs[key][at[n]]:.1f}"

    assert [ms("target_tree", 1), ms("target_chain", 1), ms("target_tree", 16), ms("target_chain", 16)] == \
        ["28.5", "28.2", "57.0", "57.0"], "a tree's rows cost what a chain's cost"
    assert [ms("target_tree", 20), ms("target_chain", 20)] == ["71.7", "89.7"], \
        "past 16 rows the chain's forward goes to oneDNN's products"
    ratios = [table[n]["ratio_to_chain"] for n in ("static (4,2,1)", "dynamic d4 k4 n12", "chain (1,1,1,1) via tree")]
    assert [f"{r:.2f}" for r in ratios] == ["0.57", "0.80", "0.95"], \
        f"the trees at 0.57 and 0.80, the chain via tree 0.95, not {ratios}"
    stored_costs_21 = Costs(**costs).at("target_tree", 21)
    assert f"{stored_costs_21 / costs['target_tree'][0]:.1f} {measured['static (4,2,1)'] / measured['chain K=4']:.1f}" \
        == "2.6 1.2", "21 rows cost 2.6 one-row forwards; the tree accepts 1.2 times the chain's tokens"
    assert f"{table['auto']['ratio_to_chain']:.2f}" == "0.98" \
        and [f"{x:.2f}" for x in table["auto"]["ratio_interval"]] == ["0.91", "1.05"], "auto: 0.98 (0.91-1.05)"
    for result in stored["results"].values():  # every tree system slower than the chain, beyond its interval
        assert all(r["ratio_interval"][1] < 1 for n, r in result["table"].items() if "(" in n or "dynamic" in n), \
            "every tree system is slower than the chain, beyond its interval"
    assert not replayed.chain and replayed.shape == tuple(stored["auto"]["shape"]) == (2, 1), "auto chose (2, 1)"
    assert f"{replayed.expected_tokens:.2f}" == f"{stored['auto']['expected_tokens_per_step']:.2f}" == "1.95", \
        "the replayed search expects the stored 1.95 tokens per step"
    assert table["auto"]["ratio_interval"][0] < 1 < table["auto"]["ratio_interval"][1], "auto: level with the chain"
    assert flat.shape == (3, 3, 2) and not flat.chain, "flat verification picks the tree (3, 3, 2)"
    assert f"{flat.tokens_per_second / replayed.tokens_per_second:.2f}" == "1.39", "at 1.39 times auto's tokens/s"
    h200 = HARDWARE["H200"]
    assert f"{bytes_per_token(LLAMA_3_8B, 128) / 1e9:.0f} {1e3 * roofline[1]:.1f}" == "15 3.1", \
        "the 8B target reads 15 GB per forward, 3.1 ms on an H200"
    assert round(critical_batch_size(h200.peak_flops, h200.bandwidth)) == 206 and roofline[64] == roofline[1], \
        "the roofline is flat to about 206 rows"
    assert gpu_tree is None, "the prose says no GPU measurement of tree verification is stored"
    pr_22752 = {"tau": (2.05, 2.37), "tokens_per_s_batch_1": (114.27, 128.63),
                "tokens_per_s_batch_16": (1567.5, 1640.95)}
    gain = {k: b / a for k, (a, b) in pr_22752.items()}  # tree over chain, as the pull request reports them
    assert [f"{gain[k]:.3f}" for k in gain] == ["1.156", "1.126", "1.047"], f"the pull request's gains, not {gain}"
    assert f"{gain['tau'] / gain['tokens_per_s_batch_1']:.2f}" == "1.03", "a tree step in chain steps"


def exercise_answers(stored, p, q, replayed):
    """The exercises' answers, from the stored run, section 3's p and q, and tree="auto"'s replayed choice."""
    stored_a, costs = stored["auto"]["acceptance_by_rank"], stored["auto"]["costs"]
    assert f"{expected_tokens((1, 1, 1), stored_a):.2f} {expected_tokens((2, 2, 2), stored_a):.2f}" == "1.86 2.30", \
        "answer 1: 1.86 and 2.30 tokens per step"
    tree_421 = Tree(torch.zeros(21, dtype=torch.long), *static_parents((4, 2, 1)), max_depth=3)
    chain_20 = Tree(torch.zeros(21, dtype=torch.long), torch.arange(-1, 20), torch.arange(21), max_depth=20)
    assert [int((tree_mask(t, 0) == 0).sum()) for t in (tree_421, chain_20)] == [65, 231], \
        "answer 2: 65 light entries of 441, against 231 for the chain"
    one_child = {"deterministic": (p * q).sum().item(), "sampled": torch.minimum(p, q).sum().item()}
    assert f"{one_child['deterministic']:.2f} {one_child['sampled']:.2f}" == "0.04 0.37", \
        f"answer 3: 0.04 against 0.37, not {one_child}"
    assert torch.equal(p * q, torch.minimum(p, q) * torch.maximum(p, q)) \
        and bool((p * q <= torch.minimum(p, q)).all()), "answer 3: pq = min(p, q) max(p, q) <= min(p, q)"
    stored_costs = Costs(**costs)
    step = replayed.seconds * expected_tokens((4, 2, 1), stored_a) / replayed.expected_tokens  # at the chain's speed
    drafting = step_seconds((4, 2, 1), stored_costs, chain=False) - stored_costs.at("target_tree", 21)
    figures = [1e3 * replayed.seconds, replayed.tokens_per_second, 1e3 * step, 1e3 * drafting, 1e3 * (step - drafting),
               1e3 * stored_costs.at("target_tree", 21)]
    assert " ".join(f"{x:.1f}" for x in figures) == "31.7 61.5 39.7 1.7 38.0 74.6", f"answer 4's times, not {figures}"
    assert f"{expected_tokens((4, 2, 1), stored_a):.2f} {(step - drafting) / costs['target_chain'][0]:.2f}" \
        == "2.44 1.35", "answer 4: 2.44 tokens, 1.35 times the one-row forward"
