"""verification/: block verification (arXiv 2403.10444) and exact-match verification.

The proofs: the vectorised rules equal their readable twins; the rules' math is lossless by exact
enumeration with fractions (every drafted block, every decision, every next token), and a broken
variant of each is not; the vectorised code's samples pass a chi-square test against the exact
target distribution where the broken variants' are rejected; the paper's binary example to the
fraction; block >= token >= match in expected accepted tokens; greedy is unchanged by the rule; an
argmax draft (q one-hot) is lossless under every rule, and its soft q breaks all but exact match.
"""
import itertools
import random
from fractions import Fraction

import pytest
import scipy.stats
import torch

import specdec_lab as sl
from specdec_lab.core.verify import draw, verify, verify_reference
from specdec_lab.lab import lossless, pitfalls
from specdec_lab.verification import RULES, block_weights, verify_block, verify_match
from specdec_lab.verification.block import _next_dist

# ---- the rules' math, exactly: p(prefix) and q(prefix) return a tuple of Fractions over V tokens ----


def norm(w):
    total = sum(w)
    return [x / total for x in w] if total > 0 else None


def block_thresholds(p_rows, q_rows, drafts, ratio_rule=False):
    """[P_0..P_K], [h_1..h_K] (arXiv 2403.10444, Algorithm 2). ratio_rule: the defect of vllm-ascend
    issue #7807, the token rule's per-token test min(1, p/q) in place of the block's h_i."""
    K, P, h = len(drafts), [Fraction(1)], []
    for i, x in enumerate(drafts):
        a = p_rows[i][x] / q_rows[i][x]
        P.append(min(P[-1] * a, 1))
        if ratio_rule:
            h.append(min(a, 1))
        elif i + 1 < K:
            r = sum(max(P[-1] * pv - qv, 0) for pv, qv in zip(p_rows[i + 1], q_rows[i + 1]))
            h.append(r / (r + 1 - P[-1]) if r + 1 - P[-1] > 0 else Fraction(1))
        else:
            h.append(P[-1])
    return P, h


def step_outcomes(rule, p_rows, q_rows, drafts):
    """[(num_accepted, next-token distribution, probability)] of one step given its drafted tokens."""
    K, out = len(drafts), []
    if rule == "token":
        alive = Fraction(1)
        for i, x in enumerate(drafts):
            a = min(p_rows[i][x] / q_rows[i][x], 1)
            out.append((i, norm([max(pv - qv, 0) for pv, qv in zip(p_rows[i], q_rows[i])]) or p_rows[i], alive * (1 - a)))
            alive *= a
        return out + [(K, p_rows[K], alive)]
    if rule in ("match", "match-broken"):  # match-broken keeps a drafted token whenever p > 0
        alive = Fraction(1)
        for i, x in enumerate(drafts):
            keep = (p_rows[i][x] > 0) if rule == "match-broken" else p_rows[i][x]
            others = [Fraction(0) if y == x else pv for y, pv in enumerate(p_rows[i])]
            out.append((i, norm(others) or p_rows[i], alive * (1 - keep)))
            alive *= keep
        return out + [(K, p_rows[K], alive)]
    P, h = block_thresholds(p_rows, q_rows, drafts, ratio_rule=(rule == "block-ratio"))
    for tau in range(K + 1):  # tau = the largest i whose test passes: passes at tau, fails after
        prob = (1 if tau == 0 else h[tau - 1])
        for j in range(tau, K):
            prob *= 1 - h[j]
        scale = 1 if rule == "block-unscaled" else P[tau]
        dist = p_rows[K] if tau == K else (
            norm([max(scale * pv - qv, 0) for pv, qv in zip(p_rows[tau], q_rows[tau])]) or p_rows[tau])
        out.append((tau, dist, prob))
    return out


def exact_output(rule, p, q, K, V):
    """The step's first K+1 emitted tokens (the accepted prefix, the next token, then the target's
    own draws from p) -> probability, and the expected number of accepted tokens."""
    dist, expected = {}, Fraction(0)

    def extend(seq, prob):
        if len(seq) == K + 1:
            dist[seq] = dist.get(seq, 0) + prob
            return
        for y, py in enumerate(p(seq)):
            if py:
                extend(seq + (y,), prob * py)

    for drafts in itertools.product(range(V), repeat=K):
        q_rows = [q(drafts[:i]) for i in range(K)]
        weight = Fraction(1)
        for i, x in enumerate(drafts):
            weight *= q_rows[i][x]
        if weight == 0:
            continue
        p_rows = [p(drafts[:i]) for i in range(K + 1)]
        for n, nxt, prob in step_outcomes(rule, p_rows, q_rows, drafts):
            if prob:
                expected += weight * prob * n
                for y, py in enumerate(nxt):
                    if py:
                        extend(drafts[:n] + (y,), weight * prob * py)
    return dist, expected


def target_joint(p, K, V):
    out = {}
    for seq in itertools.product(range(V), repeat=K + 1):
        prob = Fraction(1)
        for j, y in enumerate(seq):
            prob *= p(seq[:j])[y]
        if prob:
            out[seq] = prob
    return out


def ideal(p, q, K, V):
    """sum over i and prefixes x^i of min(p(x^i), q(x^i)): the most any coupling of the blocks keeps."""
    total = Fraction(0)
    for i in range(1, K + 1):
        for seq in itertools.product(range(V), repeat=i):
            pp = qq = Fraction(1)
            for j, y in enumerate(seq):
                pp, qq = pp * p(seq[:j])[y], qq * q(seq[:j])[y]
            total += min(pp, qq)
    return total


def random_lm(rng, V, zeros=False, power=1):
    """A distribution per prefix, fixed at first use: integer weights 1..9 (some 0 if zeros), to `power`."""
    table = {}

    def lm(prefix):
        if prefix not in table:
            w = [rng.randint(0 if zeros else 1, 9) ** power for _ in range(V)]
            if sum(w) == 0:
                w[rng.randrange(V)] = 1
            table[prefix] = tuple(Fraction(x, sum(w)) for x in w)
        return table[prefix]
    return lm


def argmax_draft(rng, V):
    """A deterministic draft: q one-hot at a token fixed at first use of each prefix."""
    table = {}

    def lm(prefix):
        if prefix not in table:
            top = rng.randrange(V)
            table[prefix] = tuple(Fraction(int(x == top)) for x in range(V))
        return table[prefix]
    return lm


def iid(dist):
    return lambda prefix: dist


CASES = [(V, K, seed) for V in (2, 3) for K in (1, 2, 3) for seed in range(3)]


@pytest.mark.parametrize("V,K,seed", CASES)
def test_rules_lossless_by_exact_enumeration(V, K, seed):
    rng = random.Random(seed * 100 + V * 10 + K)
    p, q = random_lm(rng, V, zeros=seed == 2), random_lm(rng, V)
    want = target_joint(p, K, V)
    for rule in ("token", "block", "match"):
        assert exact_output(rule, p, q, K, V)[0] == want, rule


def test_broken_variants_are_not_lossless():
    p, q, K, V = iid((Fraction(1, 3), Fraction(2, 3))), iid((Fraction(2, 3), Fraction(1, 3))), 2, 2
    rng = random.Random(7)
    p3, q3 = random_lm(rng, 3), random_lm(rng, 3)
    for rule in ("block-ratio", "block-unscaled", "match-broken"):
        assert exact_output(rule, p3, q3, 3, 3)[0] != target_joint(p3, 3, 3), rule
    for rule in ("block-ratio", "match-broken"):  # over two tokens a block stops only where P_tau = 1
        assert exact_output(rule, p, q, K, V)[0] != target_joint(p, K, V), rule


def test_paper_binary_example():
    """arXiv 2403.10444's binary illustration: p = (1/3, 2/3), q = (2/3, 1/3) at every position, K = 2.
    Token by token keeps beta + beta^2 = 10/9 (beta = sum min(p, q) = 2/3); the block rule 11/9."""
    p, q = iid((Fraction(1, 3), Fraction(2, 3))), iid((Fraction(2, 3), Fraction(1, 3)))
    assert exact_output("token", p, q, 2, 2)[1] == Fraction(10, 9)
    assert exact_output("block", p, q, 2, 2)[1] == Fraction(11, 9)
    assert ideal(p, q, 2, 2) == Fraction(12, 9)
    assert exact_output("match", p, q, 2, 2)[1] == Fraction(4, 9) + Fraction(16, 81)  # sum q p = 4/9 per token


@pytest.mark.parametrize("seed", range(12))
def test_expected_accepted_block_token_match(seed):
    rng = random.Random(1000 + seed)
    V, K = rng.choice([2, 3]), rng.choice([1, 2, 3])
    p, q = random_lm(rng, V, zeros=seed % 3 == 0), random_lm(rng, V)
    block, token, match = (exact_output(r, p, q, K, V)[1] for r in ("block", "token", "match"))
    assert ideal(p, q, K, V) >= block >= token >= match
    if K == 1:
        assert block == token


@pytest.mark.parametrize("seed", range(6))
def test_with_an_argmax_draft_the_three_rules_are_lossless_and_keep_the_same(seed):
    """A deterministic draft's q is one-hot at its token: then sum min(p, q) = sum q p = p(d), and the
    token rule already keeps the best coupling's amount, so block = token = match = ideal."""
    rng = random.Random(2000 + seed)
    V, K = rng.choice([2, 3]), rng.choice([1, 2, 3])
    p = random_lm(rng, V, zeros=seed % 2 == 0)
    q = argmax_draft(rng, V)
    want = target_joint(p, K, V)
    kept = set()
    for rule in ("token", "block", "match"):
        dist, expected = exact_output(rule, p, q, K, V)
        assert dist == want, rule
        kept.add(expected)
    assert kept == {ideal(p, q, K, V)}


# ---- the code: twins, thresholds, samples ----


def random_step(g, K, V, q_kind):
    p = torch.rand(K + 1, V, generator=g) ** 3
    p[torch.rand(K + 1, V, generator=g) < 0.15] = 0.0
    p[torch.arange(K + 1), torch.randint(V, (K + 1,), generator=g)] += 0.05
    p = p / p.sum(-1, keepdim=True)
    u, e = torch.rand(K, generator=g), -torch.rand(V, generator=g).clamp(min=2.0 ** -25).log()
    if q_kind == "none":
        return torch.randint(V, (K,), generator=g), p, None, u, e
    q = torch.rand(K, V, generator=g) ** 3 + 1e-3
    q = q / q.sum(-1, keepdim=True)
    return torch.multinomial(q, 1, generator=g).view(-1), p, q, u, e


@pytest.mark.parametrize("name", ["token", "block", "match"])
@pytest.mark.parametrize("q_kind", ["sampled", "none"])
def test_twins_agree(name, q_kind):
    device_rule, reference = RULES[name]
    g = torch.Generator().manual_seed(hash((name, q_kind)) % 2 ** 31)
    for trial in range(400):
        K, greedy = trial % 4 + 1, trial % 5 == 0
        args = random_step(g, K, 5, q_kind)
        assert torch.equal(device_rule(*args, greedy=greedy), reference(*args, greedy=greedy)), (trial, args)


def test_block_weights_equal_the_fraction_math():
    g = torch.Generator().manual_seed(3)
    for trial in range(60):
        K = trial % 4 + 1
        d, p, q, _, _ = random_step(g, K, 4, "sampled")
        p, q = p.double(), q.double()
        P, h = block_weights(d, p, q)
        rows = lambda t: [[Fraction(float(x)) for x in row] for row in t.tolist()]  # noqa: E731
        P_exact, h_exact = block_thresholds(rows(p), rows(q), d.tolist())
        assert P.tolist() == pytest.approx([float(x) for x in P_exact], abs=1e-12)
        assert h.tolist() == pytest.approx([float(x) for x in h_exact], abs=1e-12)


def test_block_is_the_token_rule_at_k1_and_keeps_everything_when_q_is_p():
    g = torch.Generator().manual_seed(4)
    for _ in range(300):
        args = random_step(g, 1, 5, "sampled")
        assert torch.equal(verify_block(*args), verify(*args))
    _, p, _, u, e = random_step(g, 4, 5, "sampled")
    d = torch.multinomial(p[:4], 1, generator=g).view(-1)  # drafted from q = p
    assert verify_block(d, p, p[:4], u, e)[0] == 4


def test_block_accepts_a_later_token_after_an_earlier_test_failed():
    """The paper's example, drafts (A, B): P_1 = 1/2 fails at u_1 = 0.9 (h_1 = 0), yet P_2 = 1 keeps both."""
    p = torch.tensor([[1 / 3, 2 / 3]] * 3)
    q = torch.tensor([[2 / 3, 1 / 3]] * 2)
    d, u, e = torch.tensor([0, 1]), torch.tensor([0.9, 0.9]), torch.ones(2)
    assert verify_block(d, p, q, u, e)[0] == 2 and verify(d, p, q, u, e)[0] == 0


def test_greedy_verdicts_are_identical():
    g = torch.Generator().manual_seed(5)
    for trial in range(300):
        K, V = trial % 4 + 1, 6
        logits = torch.randn(K + 1, V, generator=g)
        best = logits.argmax(-1)[:K]
        d = torch.where(torch.rand(K, generator=g) < 0.7, best, torch.randint(V, (K,), generator=g))
        verdicts = {name: f(d, logits, None, torch.zeros(K), None, greedy=True)
                    for name, pair in RULES.items() for f in pair}
        first = next(iter(verdicts.values()))
        assert all(torch.equal(v, first) for v in verdicts.values())
        # The sampling rules' math at temperature 0 (one-hot p, a one-hot draft q) reaches the same verdict.
        one_hot_p = torch.nn.functional.one_hot(logits.argmax(-1), V).float()
        u, e = torch.rand(K, generator=g), -torch.rand(V, generator=g).log()
        for name, (f, _) in RULES.items():
            assert torch.equal(f(d, one_hot_p, None, u, e), first), name


# ---- chi-square: the vectorised rules' samples against the exact target distribution ----


def broken_block_ratio(draft_ids, p, q, u, e, greedy=False):
    """vllm-ascend #7807's defect: the token rule's test u_i < min(1, p_i/q_i), the largest passing i."""
    K = draft_ids.shape[0]
    P, _ = block_weights(draft_ids, p, q)
    idx = torch.arange(K)
    h = (p[idx, draft_ids] / q[idx, draft_ids]).clamp(max=1.0)  # (K,)
    tau = torch.cat([(u < h).long() * torch.arange(1, K + 1), torch.zeros(1, dtype=torch.long)]).max().view(1)
    return torch.cat([tau, draw(_next_dist(tau, P, p, q, K), e).view(1)])


def broken_block_unscaled(draft_ids, p, q, u, e, greedy=False):
    """The residual max(p - q, 0) at tau+1, without the weight P_tau."""
    K = draft_ids.shape[0]
    P, h = block_weights(draft_ids, p, q)
    tau = torch.cat([(u < h).long() * torch.arange(1, K + 1), torch.zeros(1, dtype=torch.long)]).max().view(1)
    return torch.cat([tau, draw(_next_dist(tau, torch.ones_like(P), p, q, K), e).view(1)])


def broken_match(draft_ids, p, q, u, e, greedy=False):
    """Keeps a drafted token whenever the target gives it p > 0."""
    K = draft_ids.shape[0]
    n = (p[torch.arange(K), draft_ids] > 0).long().cumprod(0).sum().view(1)
    return torch.cat([n, draw(p.index_select(0, n)[0], e).view(1)])


def chi_square_pvalue(rule, p, q, K, V, samples=20000, seed=0):
    """Sample drafts from q, run `rule` (vmapped over the samples), extend with p's own draws to
    K+1 tokens, and test the counts against the target's exact joint distribution."""
    g = torch.Generator().manual_seed(seed)
    prefixes = [s for n in range(K + 1) for s in itertools.product(range(V), repeat=n)]
    index = {s: i for i, s in enumerate(prefixes)}
    p_table = torch.tensor([[float(x) for x in p(s)] for s in prefixes])  # (prefixes, V)
    q_table = torch.tensor([[float(x) for x in q(s)] for s in prefixes])
    B, pos = samples, torch.zeros(samples, dtype=torch.long)  # pos: each sample's prefix index
    radix = lambda n: sum(V ** j for j in range(n))  # noqa: E731  (the first index of length-n prefixes)
    drafts, p_rows, q_rows = [], [], []
    for i in range(K + 1):
        p_rows.append(p_table[pos])
        if i == K:
            break
        q_rows.append(q_table[pos])
        d = torch.multinomial(q_rows[-1], 1, generator=g).view(-1)
        drafts.append(d)
        pos = radix(i + 1) + (pos - radix(i)) * V + d
    D, P, Q = torch.stack(drafts, 1), torch.stack(p_rows, 1), torch.stack(q_rows, 1)  # (B, K), (B, K+1, V), (B, K, V)
    U, E = torch.rand(B, K, generator=g), -torch.rand(B, V, generator=g).clamp(min=2.0 ** -25).log()
    verdict = torch.vmap(rule)(D, P, Q, U, E)  # (B, 2)
    counts = {}
    for d, (n, nxt) in zip(D.tolist(), verdict.tolist()):
        seq = tuple(d[:n]) + (nxt,)
        while len(seq) < K + 1:
            seq += (int(torch.multinomial(p_table[index[seq]], 1, generator=g)),)
        counts[seq] = counts.get(seq, 0) + 1
    want = target_joint(p, K, V)
    assert set(counts) <= set(want)
    observed = [counts.get(s, 0) for s in want]
    expected = [float(want[s]) * B for s in want]
    return scipy.stats.chisquare(observed, expected).pvalue


@pytest.mark.parametrize("name,rule,correct", [
    ("block", verify_block, True), ("match", verify_match, True), ("token", verify, True),
    ("block-ratio", broken_block_ratio, False), ("block-unscaled", broken_block_unscaled, False),
    ("match-broken", broken_match, False)])
def test_chi_square(name, rule, correct):
    """K = 2, V = 3 with peaked p and q (weights squared: the smallest expected count is 9 of 20k), where
    each broken variant's bias is large enough to see; the correct rules also at K = 3 with flatter ones."""
    rng = random.Random(9)
    p, q = random_lm(rng, 3, power=2), random_lm(rng, 3, power=2)
    pvalue = chi_square_pvalue(rule, p, q, K=2, V=3)
    print(f"chi-square {name}, K = 2: p = {pvalue:.3g}")
    assert (pvalue > 1e-3) if correct else (pvalue < 1e-6)
    if correct:
        rng = random.Random(11)
        p, q = random_lm(rng, 3), random_lm(rng, 3)
        pvalue = chi_square_pvalue(rule, p, q, K=3, V=3, seed=1)
        print(f"chi-square {name}, K = 3: p = {pvalue:.3g}")
        assert pvalue > 1e-3


# ---- the engine ----


@pytest.mark.parametrize("verifier", ["block", "match", "block-reference", "match-reference"])
def test_engine_greedy_is_autoregressive(verifier):
    target, draft = sl.tiny_model(0), sl.tiny_model(1, n_layers=1)
    prompt = [1, 2, 3]
    base = sl.autoregressive_generate(target, prompt, max_new_tokens=24).tokens
    engine = sl.SpeculativeEngine(target, draft, k=3, verifier=verifier)
    assert engine.generate(prompt, max_new_tokens=24).tokens == base


def test_engine_sampling_repeats_with_a_seed():
    target, draft = sl.tiny_model(0), sl.tiny_model(1, n_layers=1)
    for verifier in ("block", "match"):
        runs = [sl.SpeculativeEngine(target, draft, k=3, verifier=verifier).generate(
            [1, 2, 3], max_new_tokens=16, temperature=1.0, seed=7).tokens for _ in range(2)]
        assert runs[0] == runs[1]
        twin = sl.SpeculativeEngine(target, draft, k=3, verifier=verifier + "-reference").generate(
            [1, 2, 3], max_new_tokens=16, temperature=1.0, seed=7).tokens
        assert twin == runs[0]


def test_bad_verifier_name_lists_the_choices():
    target, draft = sl.tiny_model(0), sl.tiny_model(1, n_layers=1)
    with pytest.raises(ValueError) as err:
        sl.SpeculativeEngine(target, draft, k=3, verifier="blocks")
    for name in ("device", "reference", "block", "block-reference", "match", "match-reference"):
        assert repr(name) in str(err.value)


# ---- an argmax draft (propose="argmax", as llama.cpp and vLLM draft) ----

SHAPE = dict(vocab_size=5, dim=16, n_heads=2, n_kv_heads=1, eos_token_ids=(10 ** 6,))  # never stops early


@pytest.fixture(scope="module")
def weak_pair():
    target, draft = sl.tiny_model(3, **SHAPE), sl.tiny_model(4, **SHAPE)
    with torch.no_grad():
        draft.head.weight.mul_(0.3)  # a weak draft: rejections are common
    return target, draft


@pytest.mark.parametrize("verifier", ["match", "device", "block"])
def test_an_argmax_draft_is_lossless_under_every_rule_and_a_soft_q_breaks_all_but_exact_match(weak_pair, verifier):
    """An argmax draft is deterministic: its true q is one-hot at the drafted token, which the engine
    hands the rules (q None), so each stays lossless (the token rule then keeps d with probability p(d),
    as exact match does). The bug is reporting the soft q it did not draw from (pitfalls.GreedyDraftSampledQ):
    the token and block rules divide by it and fail; exact match never reads q and passes."""
    target, draft = weak_pair
    probs = lossless.exact_sequence_probs(target, [1, 2], 2, temperature=1.0)
    argmax = sl.SpeculativeEngine(target, draft, k=2, verifier=verifier, propose="argmax")
    ok = lossless.chi_square_test(lossless.sample_sequences(argmax, [1, 2], 2, 1200), probs)
    assert ok.pvalue > 1e-3, f"{verifier} with an argmax draft failed the lossless check (p = {ok.pvalue:.1e})"
    soft = sl.SpeculativeEngine(target, pitfalls.GreedyDraftSampledQ(draft, 64), k=2, verifier=verifier)
    soft_q = lossless.chi_square_test(lossless.sample_sequences(soft, [1, 2], 2, 1200), probs)
    if verifier == "match":
        assert soft_q.pvalue > 1e-3, f"exact match read q (p = {soft_q.pvalue:.1e})"
    else:
        assert soft_q.pvalue < 1e-6, f"the check did not catch the soft q under {verifier} (p = {soft_q.pvalue:.1e})"


def test_an_argmax_proposal_drafts_the_top_token_with_a_one_hot_q(weak_pair):
    target, draft = weak_pair
    engine = sl.SpeculativeEngine(target, draft, k=3, verifier="match", propose="argmax")
    res = engine.generate([1, 2], max_new_tokens=8, temperature=1.0, seed=0)
    assert res.steps[0].drafted == sl.autoregressive_generate(draft, [1, 2], max_new_tokens=3).tokens
    assert all(q == 1.0 for r in res.steps for q in r.q_draft), "q is one-hot at the drafted token"


def test_bad_propose_name_lists_the_choices(weak_pair):
    with pytest.raises(ValueError) as err:
        sl.SpeculativeEngine(*weak_pair, k=3, verifier="match", propose="top")
    assert all(word in str(err.value) for word in ("propose", "'top'", "'sample'", "'argmax'"))


# ---- verification/expect.py: the expected figures of bench/rules.py, against the exact enumeration ----


@pytest.mark.parametrize("seed", range(6))
def test_the_expected_block_walk_equals_exact_enumeration_on_a_grid(seed):
    """With each position's p and q the same whatever came before (the model of expect.py), the
    grid walk of the block rule's chain gives what exact enumeration in fractions gives, within the
    grid's error; the token and match products are exact."""
    from specdec_lab.verification.expect import block_expected, chain_expected, rates
    rng = random.Random(3000 + seed)
    V, K = rng.choice([2, 3, 4]), rng.choice([2, 3])
    rows = [[Fraction(rng.randint(1 if seed % 2 else 0, 9)) for _ in range(V)] for _ in range(2)]
    rows[0][0] += 1  # p and q keep some mass on token 0
    pd, qd = (tuple(x / sum(r) for x in r) for r in rows)
    if min(qd) == 0:
        qd = tuple((x + Fraction(1, 10)) / Fraction(10 + V, 10) for x in qd)
    p, q = iid(pd), iid(qd)
    pt = torch.tensor([[float(x) for x in pd]] * K, dtype=torch.float64)
    qt = torch.tensor([[float(x) for x in qd]] * K, dtype=torch.float64)
    beta, gamma, _ = rates(pt, qt)
    assert chain_expected(beta)[-1] == pytest.approx(float(exact_output("token", p, q, K, V)[1]), abs=1e-12)
    assert chain_expected(gamma)[-1] == pytest.approx(float(exact_output("match", p, q, K, V)[1]), abs=1e-12)
    walk = block_expected(pt, qt)
    assert walk[-1] == pytest.approx(float(exact_output("block", p, q, K, V)[1]), abs=3e-3)
    assert walk[0] == pytest.approx(float(exact_output("token", p, q, 1, V)[1]), abs=3e-3)


def test_the_expected_walk_reproduces_the_papers_binary_example():
    from specdec_lab.verification.expect import expected_accepted
    p = torch.tensor([[1 / 3, 2 / 3]] * 2, dtype=torch.float64)
    q = torch.tensor([[2 / 3, 1 / 3]] * 2, dtype=torch.float64)
    e = expected_accepted(p, q, (1, 2))
    assert e["token"][2] == pytest.approx(10 / 9) and e["match"][2] == pytest.approx(4 / 9 + 16 / 81)
    assert e["block"][2] == pytest.approx(11 / 9, abs=2e-3) and e["block"][1] == pytest.approx(2 / 3, abs=2e-3)
    assert e["match_argmax"][2] == pytest.approx(1 / 3 + 1 / 9), "the top token of q is token 0, p(0) = 1/3"
