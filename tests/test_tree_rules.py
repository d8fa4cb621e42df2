"""Tree verification rules: the device version against its reference loop, and losslessness by chi-square.

The chi-square tests run the rules' per-node decisions over a forest of many independent roots at
once (every node's decision depends on its own p, q, children and random numbers only): the token
leaving a root must be distributed as the root's p. Medusa's typical acceptance, and Sequoia's rule
with either renormalisation left out, must fail the same test.
"""
import math
import random

import pytest
import torch
from scipy.stats import chisquare

import specdec_lab as sl
from specdec_lab.core.sampling import logits_to_probs
from specdec_lab.tree.draft import pick_children
from specdec_lab.tree.rules import (RULES, children_table, draw_with, node_decisions, tree_draws, verify_tree,
                                    verify_tree_reference)
from specdec_lab.tree.structure import Tree

V = 16


def random_tree(n, seed, V=V):
    """A random parent-first tree whose siblings carry distinct tokens, with random p and q rows."""
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    parents = [-1] + [rng.randrange(i) for i in range(1, n)]
    tokens, used = [rng.randrange(V)], {}
    for i in range(1, n):
        taken = used.setdefault(parents[i], set())
        tok = rng.choice([t for t in range(V) if t not in taken])
        taken.add(tok)
        tokens.append(tok)
    depth = [0] * n
    for i in range(1, n):
        depth[i] = depth[parents[i]] + 1
    logits = torch.randn(n, V, generator=g) * 2
    for i in range(1, n):  # the target often likes some child: paths go deeper than the root
        logits[parents[i], tokens[i]] += 3.0 * torch.rand(1, generator=g).item()
    p = logits.softmax(-1)
    q = (torch.randn(n, V, generator=g) * 2).softmax(-1)
    tree = Tree(torch.tensor(tokens), torch.tensor(parents), torch.tensor(depth), max(max(depth), 1), q)
    return tree, parents, tokens, p, q, g


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("seed", range(12))
def test_device_verdict_equals_the_reference_walk(rule, seed):
    tree, parents, tokens, p, q, g = random_tree(2 + 3 * seed, seed)
    width = tree.size - 1
    u, w = tree_draws(tree.size, width, g, "cpu")
    verdict = verify_tree(tree, p, rule, u, w, width).tolist()
    path, nxt = verify_tree_reference(parents, tokens, p, q, rule, u, w)
    m, D = verdict[0], tree.max_depth
    assert verdict[3:4 + m] == path, f"{rule}: paths differ"
    assert verdict[1] == nxt, f"{rule}: the token after the path differs"
    assert verdict[4 + D:4 + D + m + 1] == [tokens[i] for i in path]
    assert all(x == -1 for x in verdict[4 + m:4 + D]), "path entries past depth m must be -1"


def test_children_table_lists_children_in_index_order():
    parents = torch.tensor([-1, 0, 0, 1, 2, 1, 0])
    assert children_table(parents, 3).tolist() == [[1, 2, 6], [3, 5, -1], [4, -1, -1], [-1] * 3, [-1] * 3,
                                                   [-1] * 3, [-1] * 3]


def test_greedy_descends_while_the_child_is_the_argmax():
    # root -> a (argmax at root) -> a1 (not the argmax at a): accept a, then emit the argmax at a.
    p = torch.eye(V)[[3, 9, 0, 0]] * 5  # argmax 3 at the root, 9 at a
    tree = Tree(torch.tensor([0, 3, 4, 7]), torch.tensor([-1, 0, 0, 1]), torch.tensor([0, 1, 1, 2]), 2)
    verdict = verify_tree(tree, p, "greedy", width=2).tolist()
    assert verdict[:2] == [1, 9] and verdict[3:6] == [0, 1, -1]


# --------------------------------------------------------------------------- losslessness over a forest

SETTINGS = [(1.0, 0, 1.0), (0.7, 0, 0.8), (1.3, 5, 1.0), (1.0, 3, 0.9)]  # temperature, top_k, top_p
R = 20000  # roots in the forest: samples per test


@pytest.fixture(scope="module")
def rows():
    """Logits of a tiny target and a weaker tiny draft after the same context."""
    target = sl.tiny_model(3, vocab_size=V, dim=16, n_heads=2, n_kv_heads=1)
    draft = sl.tiny_model(4, vocab_size=V, dim=16, n_heads=2, n_kv_heads=1)
    x = torch.tensor([[1, 2, 5]])
    with torch.no_grad():
        return target(x)[0, -1], draft(x)[0, -1] * 0.5


def forest_tokens(p, q, rule, b, seed, decisions=node_decisions):
    """R independent roots with b children each (drafted as the rule needs); the token leaving each root."""
    g = torch.Generator().manual_seed(seed)
    roots = q.expand(R, V)
    kids = pick_children(roots, b, rule == "sampled", g)  # (R, b)
    tokens = torch.cat([torch.zeros(R, dtype=torch.long), kids.reshape(-1)])
    parents = torch.cat([torch.full((R,), -1), torch.arange(R).repeat_interleave(b)])
    n = tokens.shape[0]
    tree = Tree(tokens, parents, torch.zeros(n, dtype=torch.long), 1, q.expand(n, V))
    u, w = tree_draws(n, b, g, "cpu")
    chosen, emitted = decisions(tree, p.expand(n, V), rule, u, w, b)
    return torch.where(chosen[:R] >= 0, tokens[chosen[:R].clamp_min(0)], emitted[:R])


def chi_square_pvalue(tokens, p):
    counts = torch.bincount(tokens, minlength=V).double()
    assert counts[p == 0].sum() == 0, "emitted a token the target gives probability 0"
    keep = p * R >= 5
    obs = torch.cat([counts[keep], counts[~keep].sum().view(1)])
    exp = torch.cat([p[keep].double() * R, (p[~keep].double().sum() * R).view(1)])
    nonzero = exp > 0
    obs, exp = obs[nonzero], exp[nonzero]
    return chisquare(obs.numpy(), exp.numpy() * obs.sum().item() / exp.sum().item()).pvalue


@pytest.mark.parametrize("temperature,top_k,top_p", SETTINGS)
@pytest.mark.parametrize("rule,b", [("deterministic", 1), ("deterministic", 4), ("sampled", 1), ("sampled", 2),
                                    ("sampled", 4)])
def test_the_lossless_rules_emit_the_targets_distribution(rows, rule, b, temperature, top_k, top_p):
    p = logits_to_probs(rows[0], temperature, top_k, top_p)
    q = logits_to_probs(rows[1], temperature, top_k, top_p)
    pvalue = chi_square_pvalue(forest_tokens(p, q, rule, b, seed=b), p)
    assert pvalue > 1e-3, f"{rule} with {b} children is not distributed as p (p-value {pvalue:.2e})"


def test_sequoias_rule_accepts_more_than_one_child_does(rows):
    p, q = logits_to_probs(rows[0], 1.0), logits_to_probs(rows[1], 1.0)
    n = R + 3 * R
    share = []
    for b in (1, 3):
        g = torch.Generator().manual_seed(0)
        kids = pick_children(q.expand(R, V), b, True, g)
        tree = Tree(torch.cat([torch.zeros(R, dtype=torch.long), kids.reshape(-1)]),
                    torch.cat([torch.full((R,), -1), torch.arange(R).repeat_interleave(b)]),
                    torch.zeros(R + R * b, dtype=torch.long), 1, q.expand(R + R * b, V))
        u, w = tree_draws(R + R * b, b, g, "cpu")
        chosen, _ = node_decisions(tree, p.expand(R + R * b, V), "sampled", u, w, b)
        share.append((chosen[:R] >= 0).double().mean().item())
    alpha = torch.minimum(p, q).sum().item()
    assert share[0] == pytest.approx(alpha, abs=0.015), "one child accepts with probability sum min(p, q)"
    assert share[1] > share[0] + 0.05, f"three children accepted no more often: {share} (n {n})"


def test_medusas_typical_acceptance_fails_the_chi_square(rows):
    p = logits_to_probs(rows[0], 1.0)
    q = logits_to_probs(rows[1], 1.0)
    pvalue = chi_square_pvalue(forest_tokens(p, q, "typical", 2, seed=0), p)
    assert pvalue < 1e-6, f"the test has no power: typical acceptance passed (p-value {pvalue:.2e})"


def typical_case(x, fill):
    """A root whose one child (token 5) has target probability x; the rest is `fill` (V,) scaled to 1 - x."""
    rest = fill.clone()
    rest[5] = 0.0
    p = rest / rest.sum() * (1 - x)
    p[5] = x
    entropy = -(p * p.log()).sum().item()
    tree = Tree(torch.tensor([0, 5]), torch.tensor([-1, 0]), torch.tensor([0, 1]), 1)
    return tree, torch.stack([p, p]), entropy


def solve_threshold(fill, threshold_of):
    """x with x == threshold_of(entropy of the case with child probability x), by bisection."""
    lo, hi = 1e-4, 0.5
    for _ in range(60):
        mid = (lo + hi) / 2
        if mid > threshold_of(typical_case(mid, fill)[2]):
            hi = mid
        else:
            lo = mid
    return (lo + hi) / 2


@pytest.mark.parametrize("fill,which", [
    (torch.tensor([60.0] + [1.0] * (V - 1)), "epsilon"),  # low entropy: min(0.09, 0.3 e^-H) = 0.09
    (torch.ones(V), "delta e^-H"),  # near-uniform: min(0.09, 0.3 e^-H) = 0.3 e^-H, below 0.09
], ids=["low-entropy", "high-entropy"])
def test_typical_acceptance_uses_medusas_constants_in_their_roles(fill, which, monkeypatch):
    """Medusa (medusa/model/utils.py, evaluate_posterior) accepts x when p(x) > min(epsilon, delta e^-H(p)),
    epsilon = posterior_threshold = 0.09 and delta = posterior_alpha = 0.3. A child just above that threshold
    is accepted and one just below is rejected, by the device rule and by the reference walk; with the two
    constants swapped (min(0.3, 0.09 e^-H), always lower) the child just below would be accepted."""
    from specdec_lab.tree import rules

    def medusa(entropy):
        return min(0.09, 0.3 * math.exp(-entropy))

    x0 = solve_threshold(fill, medusa)
    assert (x0 == pytest.approx(0.09, abs=1e-6)) == (which == "epsilon"), f"threshold {x0}: not the {which} case"
    g = torch.Generator().manual_seed(0)
    u, w = tree_draws(2, 1, g, "cpu")
    verdicts = {}
    for name, x in (("above", x0 * 1.01), ("below", x0 * 0.99)):
        tree, p, entropy = typical_case(x, fill)
        assert (x > medusa(entropy)) == (name == "above")
        device = verify_tree(tree, p, "typical", u, w, width=1).tolist()[0]
        path, _ = verify_tree_reference([-1, 0], [0, 5], p, None, "typical", u, w)
        assert device == len(path) - 1, "the device rule and the reference walk disagree"
        verdicts[name] = device
        swapped = x > min(0.3, 0.09 * math.exp(-entropy))
        assert swapped, "the swapped constants accept both children: the case must tell them apart"
    assert verdicts == {"above": 1, "below": 0}, f"{which}: a child just above Medusa's threshold must be accepted, " \
                                                 f"one just below rejected: {verdicts}"
    monkeypatch.setattr(rules, "TYPICAL_EPS", 0.3)
    monkeypatch.setattr(rules, "TYPICAL_DELTA", 0.09)
    tree, p, _ = typical_case(x0 * 0.99, fill)
    assert verify_tree(tree, p, "typical", u, w, width=1).tolist()[0] == 1, "swapped, the child just below is accepted"


def broken_sampled(renormalise_residual, renormalise_q):
    """Sequoia's rule with one renormalisation left out: the bugs the chi-square test must catch."""
    def decisions(tree, p, rule, u, w, width):
        children = children_table(tree.parents, width)
        N = children.shape[0]
        r, qq = p.clone(), tree.q.clone()
        chosen = torch.full((N,), -1, dtype=torch.long)
        for j in range(width):
            child = children[:, j]
            live = (child >= 0) & (chosen < 0)
            x = tree.tokens[child.clamp_min(0)].unsqueeze(1)
            r_x, q_x = r.gather(1, x).squeeze(1), qq.gather(1, x).squeeze(1)
            accept = live & (q_x > 0) & (u[:, j] * q_x < r_x)
            chosen = torch.where(accept, child, chosen)
            reject = (live & ~accept).unsqueeze(1)
            rest = (r - qq).clamp_min(0.0)
            if renormalise_residual:
                rest = rest / rest.sum(1, keepdim=True).clamp_min(1e-30)
            r = torch.where(reject, rest, r)
            q_next = qq.scatter(1, x, 0.0)
            if renormalise_q:
                q_next = q_next / q_next.sum(1, keepdim=True).clamp_min(1e-30)
            qq = torch.where(reject, q_next, qq)
        return chosen, draw_with(r, w)
    return decisions


@pytest.mark.parametrize("renormalise_residual,renormalise_q", [(False, True), (True, False)])
def test_sequoias_rule_with_a_renormalisation_left_out_fails_the_chi_square(rows, renormalise_residual,
                                                                              renormalise_q):
    p = logits_to_probs(rows[0], 1.0)
    q = logits_to_probs(rows[1], 1.0)
    assert chi_square_pvalue(forest_tokens(p, q, "sampled", 4, seed=0, decisions=broken_sampled(True, True)), p) > 1e-3
    bad = forest_tokens(p, q, "sampled", 4, seed=0, decisions=broken_sampled(renormalise_residual, renormalise_q))
    pvalue = chi_square_pvalue(bad, p)
    assert pvalue < 1e-6, f"the test has no power: the broken rule passed (p-value {pvalue:.2e})"


def test_a_bad_rule_is_refused_with_its_value():
    tree, *_ = random_tree(3, 0)
    with pytest.raises(ValueError, match="rule must be one of"):
        verify_tree(tree, torch.ones(3, V) / V, "medusa")
