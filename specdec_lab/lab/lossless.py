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

The same probabilities, temperature, top-k and top-p must be used on both sides:
speculative sampling is lossless with respect to the target's processed p.
"""
from collections import Counter
from dataclasses import dataclass

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
