"""Is a sampler distributed as the target? Exact enumeration against counts, with a chi-square test.

Speculative sampling claims that its output has exactly the distribution of
sampling from the target alone (Leviathan et al., arXiv 2211.17192; Chen et al.,
arXiv 2302.01318). With a tiny vocabulary and a few new tokens that claim can be
checked directly:

1. `exact_sequence_probs` enumerates P(x_1..x_n | prompt) of the target's own
   sampling: V^n sequences, one batched forward per generated position;
2. `sample_sequences` runs a sampler (a SpeculativeEngine, correct or broken)
   with seeds 0..N-1 and counts each sequence it produced;
3. `chi_square_test` compares the counts with N times the exact probabilities.
   A small p-value says the sampler is not distributed as the target. A sample
   of a sequence whose exact probability is 0 fails outright.

One verification step can also be enumerated without a model, in fractions (chapter 03):
`exact_step_output` runs a rule (`EXACT_RULES`: token by token, block, exact match) over
every block a toy draft can propose and every decision, and a lossless rule gives
`exact_target_joint` exactly; `sample_step_outputs` samples a tensor rule of
verification/ on the same toy models for the chi-square test.

The same probabilities, temperature, top-k and top-p must be used on both sides:
speculative sampling is lossless with respect to the target's processed p.
"""
import itertools
import random
from collections import Counter
from dataclasses import dataclass
from fractions import Fraction

import torch
from scipy.stats import chisquare

from ..core.sampling import logits_to_probs

MAX_OUTCOMES = 100_000  # V^n sequences enumerated at most


@torch.no_grad()
def exact_sequence_probs(model, prompt, n_tokens, temperature=1.0, top_k=0, top_p=1.0) -> dict:
    """{(x_1, .., x_n): probability} under the model's own sampling, every sequence included."""
    V = model.cfg.vocab_size
    if isinstance(n_tokens, bool) or not isinstance(n_tokens, int) or n_tokens < 1:
        raise ValueError(f"n_tokens must be an int >= 1, got {n_tokens!r}")
    if V ** n_tokens > MAX_OUTCOMES:
        raise ValueError(f"V^n_tokens = {V}^{n_tokens} sequences is too many to enumerate (max {MAX_OUTCOMES})")
    if temperature == 0:
        raise ValueError("temperature must be > 0: greedy decoding has a single outcome, nothing to test")
    probs = {(): 1.0}
    for _ in range(n_tokens):
        prefixes = list(probs)
        x = torch.tensor([list(prompt) + list(pre) for pre in prefixes], device=model.device)  # (B, T)
        dist = logits_to_probs(model(x)[:, -1], temperature, top_k, top_p).double().cpu()  # (B, V)
        probs = {pre + (v,): probs[pre] * float(dist[b, v])
                 for b, pre in enumerate(prefixes) for v in range(V)}
    return probs


def sample_sequences(engine, prompt, n_tokens, n_samples, temperature=1.0, top_k=0, top_p=1.0, k=None,
                     first_seed=0) -> Counter:
    """Counts of the sequences `engine.generate` produced with seeds first_seed .. first_seed + n_samples - 1.
    The model must not stop early (no EOS inside its vocabulary), so every sample has n_tokens tokens."""
    counts = Counter()
    for seed in range(first_seed, first_seed + n_samples):
        res = engine.generate(prompt, max_new_tokens=n_tokens, temperature=temperature, top_k=top_k,
                              top_p=top_p, seed=seed, **({} if k is None else {"k": k}))
        counts[tuple(res.tokens)] += 1
    return counts


@dataclass
class ChiSquareResult:
    statistic: float  # sum (observed - expected)^2 / expected over the pooled cells
    pvalue: float  # P(statistic at least this large | the sampler is distributed as the target)
    dof: int  # cells - 1
    n: int  # samples
    impossible: int  # samples of sequences whose exact probability is 0 (any makes pvalue 0)
    total_variation: float  # 0.5 sum |frequency - probability|, a distance to read, not a test


def total_variation(counts, probs) -> float:
    n = sum(counts.values())
    keys = set(probs) | set(counts)
    return 0.5 * sum(abs(counts.get(x, 0) / n - probs.get(x, 0.0)) for x in keys)


def chi_square_test(counts, probs, min_expected=5.0) -> ChiSquareResult:
    """Pearson's chi-square goodness of fit. Cells expected fewer than `min_expected` times are
    pooled into one, the usual condition for the chi-square approximation to hold."""
    n = sum(counts.values())
    if n == 0:
        raise ValueError("counts is empty: draw some samples first")
    impossible = sum(c for x, c in counts.items() if probs.get(x, 0.0) == 0.0)
    support = sorted((x for x in probs if probs[x] > 0), key=lambda x: -probs[x])
    big = [x for x in support if probs[x] * n >= min_expected]
    small = [x for x in support if probs[x] * n < min_expected]
    observed = [counts.get(x, 0) for x in big]
    expected = [probs[x] * n for x in big]
    if small:
        observed.append(sum(counts.get(x, 0) for x in small))
        expected.append(sum(probs[x] for x in small) * n)
    scale = sum(observed) / sum(expected)  # samples of impossible sequences are left out of both
    expected = [e * scale for e in expected]
    if len(observed) < 2:
        stat, pvalue = 0.0, 1.0
    else:
        stat, pvalue = (float(v) for v in chisquare(observed, expected))
    if impossible:
        pvalue = 0.0
    return ChiSquareResult(stat, pvalue, len(observed) - 1, n, impossible, total_variation(counts, probs))


# ---- One verification step, exactly: every drafted block, every decision, every next token, in fractions ----
#
# A toy language model here is a function prefix -> tuple of Fractions over V tokens (p for the target,
# q for the draft). A step rule takes the rows of one drafted block, p_rows = p_1..p_{K+1} and
# q_rows = q_1..q_K (p_i and q_i conditioned on d_<i), and the drafts d_1..d_K, and returns every way
# the step can end: [(n accepted, the next token's distribution, probability)]. `exact_step_output`
# sums over every block the draft can propose, so a rule is lossless exactly when its output equals
# `exact_target_joint`, fraction for fraction. The tensor rules of verification/ are checked against
# samples with `sample_step_outputs`.


def fraction_norm(weights):
    """weights / their sum as Fractions, or None when they sum to 0."""
    total = sum(weights)
    return [w / total for w in weights] if total > 0 else None


def iid_lm(dist):
    """A toy model that gives the same distribution whatever the prefix."""
    dist = tuple(Fraction(x) for x in dist)
    return lambda prefix: dist


def random_fraction_lm(seed, V, zeros=False, power=1):
    """A toy model with a distribution per prefix, the same whatever order the prefixes are asked in:
    integer weights 1..9 (0..9 with `zeros`) drawn by random.Random(f"{seed}:{prefix}"), raised to
    `power` (a larger power, a more peaked model)."""
    table = {}

    def lm(prefix):
        prefix = tuple(prefix)
        if prefix not in table:
            rng = random.Random(f"{seed}:{prefix}")
            w = [rng.randint(0 if zeros else 1, 9) ** power for _ in range(V)]
            if sum(w) == 0:
                w[rng.randrange(V)] = 1
            table[prefix] = tuple(Fraction(x, sum(w)) for x in w)
        return table[prefix]
    return lm


def exact_token_rule(p_rows, q_rows, drafts):
    """Token by token (arXiv 2211.17192, Algorithm 1): keep d_i with probability min(1, p_i(d_i) / q_i(d_i));
    at the first rejection the next token comes from the residual norm(max(p_i - q_i, 0))."""
    K, out, alive = len(drafts), [], Fraction(1)
    for i, x in enumerate(drafts):
        a = min(p_rows[i][x] / q_rows[i][x], Fraction(1))
        residual = fraction_norm([max(pv - qv, 0) for pv, qv in zip(p_rows[i], q_rows[i])])
        out.append((i, residual or p_rows[i], alive * (1 - a)))
        alive *= a
    return out + [(K, p_rows[K], alive)]


def exact_match_rule(p_rows, q_rows, drafts):
    """Exact match: keep d_i while the target's own draw from p_i equals it (probability p_i(d_i)); at
    the first mismatch the next token is that draw, p_i given that it is not d_i. q is not read."""
    K, out, alive = len(drafts), [], Fraction(1)
    for i, x in enumerate(drafts):
        others = fraction_norm([Fraction(0) if y == x else pv for y, pv in enumerate(p_rows[i])])
        out.append((i, others or p_rows[i], alive * (1 - p_rows[i][x])))
        alive *= p_rows[i][x]
    return out + [(K, p_rows[K], alive)]


def block_thresholds(p_rows, q_rows, drafts):
    """The block rule's weights [P_0..P_K] and thresholds [h_1..h_K] (arXiv 2403.10444, Algorithm 2;
    verification/block.py's `block_weights` in fractions)."""
    K, P, h = len(drafts), [Fraction(1)], []
    for i, x in enumerate(drafts):
        P.append(min(P[-1] * p_rows[i][x] / q_rows[i][x], Fraction(1)))
        if i + 1 < K:
            r = sum(max(P[-1] * pv - qv, 0) for pv, qv in zip(p_rows[i + 1], q_rows[i + 1]))
            h.append(r / (r + 1 - P[-1]) if r + 1 - P[-1] > 0 else Fraction(1))
        else:
            h.append(P[-1])
    return P, h


def block_outcomes(P, h, p_rows, q_rows, scaled=True):
    """The block rule's outcomes from its weights and thresholds: tau = the largest i whose test
    u_i < h_i passes, and the next token from norm(max(P_tau p_{tau+1} - q_{tau+1}, 0)) (the bonus
    from p_{K+1} at tau = K). scaled=False leaves P_tau out of the residual (a broken variant's)."""
    K, out = len(h), []
    for tau in range(K + 1):  # tau passes (tau = 0: no test needed), every test after it fails
        prob = Fraction(1) if tau == 0 else h[tau - 1]
        for j in range(tau, K):
            prob *= 1 - h[j]
        if tau == K:
            dist = p_rows[K]
        else:
            scale = P[tau] if scaled else 1
            dist = fraction_norm([max(scale * pv - qv, 0) for pv, qv in zip(p_rows[tau], q_rows[tau])]) or p_rows[tau]
        out.append((tau, dist, prob))
    return out


def exact_block_rule(p_rows, q_rows, drafts):
    """Block verification (arXiv 2403.10444, Algorithm 2): the block judged as a whole."""
    P, h = block_thresholds(p_rows, q_rows, drafts)
    return block_outcomes(P, h, p_rows, q_rows)


EXACT_RULES = {"token": exact_token_rule, "block": exact_block_rule, "match": exact_match_rule}


def exact_step_output(rule, p, q, K, V):
    """(the step's first K+1 emitted tokens -> probability, expected accepted drafts), in fractions.
    The accepted prefix and the next token come from `rule`; the tokens after them are the target's
    own draws from p, so every outcome has K+1 tokens and a lossless rule gives `exact_target_joint`.
    The drafts are drawn from q (a one-hot q is a draft that proposes its top token)."""
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
        for n, nxt, prob in rule(p_rows, q_rows, drafts):
            if prob:
                expected += weight * prob * n
                for y, py in enumerate(nxt):
                    if py:
                        extend(drafts[:n] + (y,), weight * prob * py)
    return dist, expected


def exact_target_joint(p, K, V):
    """The target's own K+1 tokens -> probability, in fractions (zero-probability sequences left out)."""
    out = {}
    for seq in itertools.product(range(V), repeat=K + 1):
        prob = Fraction(1)
        for j, y in enumerate(seq):
            prob *= p(seq[:j])[y]
        if prob:
            out[seq] = prob
    return out


def ideal_accepted(p, q, K, V):
    """sum over i <= K and prefixes x_1..x_i of min(p(x_1..x_i), q(x_1..x_i)): the most accepted drafts
    any coupling of the drafted block with the target's block keeps in expectation."""
    total = Fraction(0)
    for i in range(1, K + 1):
        for seq in itertools.product(range(V), repeat=i):
            pp = qq = Fraction(1)
            for j, y in enumerate(seq):
                pp, qq = pp * p(seq[:j])[y], qq * q(seq[:j])[y]
            total += min(pp, qq)
    return total


def sample_step_outputs(rule, p, q, K, V, samples=20000, seed=0) -> Counter:
    """Counts of the first K+1 emitted tokens of `samples` steps of a tensor rule (core.verify.verify's
    signature: draft_ids, p, q, u, e), vectorised over the steps with torch.vmap: drafts drawn from the
    toy draft q, verified against the toy target p, the tokens after the verdict drawn from p. Compare
    with `exact_target_joint` by `chi_square_test`."""
    g = torch.Generator().manual_seed(seed)
    prefixes = [s for n in range(K + 1) for s in itertools.product(range(V), repeat=n)]
    index = {s: i for i, s in enumerate(prefixes)}
    p_table = torch.tensor([[float(x) for x in p(s)] for s in prefixes])  # (prefixes, V)
    q_table = torch.tensor([[float(x) for x in q(s)] for s in prefixes])
    pos = torch.zeros(samples, dtype=torch.long)  # each sample's prefix index
    first = lambda n: sum(V ** j for j in range(n))  # noqa: E731 (the index of the first prefix of length n)
    drafts, p_rows, q_rows = [], [], []
    for i in range(K + 1):
        p_rows.append(p_table[pos])
        if i == K:
            break
        q_rows.append(q_table[pos])
        d = torch.multinomial(q_rows[-1], 1, generator=g).view(-1)
        drafts.append(d)
        pos = first(i + 1) + (pos - first(i)) * V + d
    D, P, Q = torch.stack(drafts, 1), torch.stack(p_rows, 1), torch.stack(q_rows, 1)  # (B, K), (B, K+1, V), (B, K, V)
    U, E = torch.rand(samples, K, generator=g), -torch.rand(samples, V, generator=g).clamp(min=2.0 ** -25).log()
    verdicts = torch.vmap(rule)(D, P, Q, U, E)  # (B, 2)
    counts = Counter()
    for d, (n, nxt) in zip(D.tolist(), verdicts.tolist()):
        seq = tuple(d[:n]) + (nxt,)
        while len(seq) < K + 1:
            seq += (int(torch.multinomial(p_table[index[seq]], 1, generator=g)),)
        counts[seq] += 1
    return counts
