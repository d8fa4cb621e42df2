"""The sampling harness behind "verify" and "block_verify": is a rule lossless, and is it the rule it claims?

A toy step (`ToyStep`) has the target's rows p_1..p_{K+1} and the draft's q_1..q_K in fractions, the
same whatever tokens come before them, so the target's own K+1 tokens are independent draws from
p_1..p_{K+1}. The checker draws the drafts from q, calls the learner's rule, and counts two things:

(a) the emitted tokens: the accepted drafts and the next token, continued with the target's own draws
    up to K+1 tokens. A lossless rule gives exactly the target's law (lossless.exact_target_joint).
(b) the step itself, (drafts, n, next token). Any rule written in lossless.py's exact form,
    rule(p_rows, q_rows, drafts) -> [(n, the next token's distribution, probability)], has an exact
    law of it, enumerated here in fractions over every block the draft can propose.

Both are compared with lossless.chi_square_test. The known mistakes have exact laws too, so the
mistake whose law the learner's counts fit is the diagnosis. The counts come from a seeded
generator, so a check gives the same verdict every time.
"""
import warnings
from collections import Counter
from dataclasses import dataclass
from fractions import Fraction
from itertools import product

import torch

from .. import lossless
from .report import Failure, call

THRESHOLD = 1e-4  # a p-value below this fails: a correct rule passes with probability 1 - 1e-4 per test
CHUNK = 5000  # steps between two looks at the counts
ORDINALS = ("first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth")


@dataclass
class ToyStep:
    p: list  # K+1 tuples of V Fractions: the target's rows p_1..p_{K+1}
    q: list  # K tuples of V Fractions: the draft's rows q_1..q_K

    @property
    def K(self) -> int:
        return len(self.q)

    @property
    def V(self) -> int:
        return len(self.p[0])

    def tensors(self, dtype=torch.float32):
        """p (K+1, V) and q (K, V) as the learner's function receives them."""
        return (torch.tensor([[float(x) for x in row] for row in self.p], dtype=dtype),
                torch.tensor([[float(x) for x in row] for row in self.q], dtype=dtype))

    def target(self, prefix):
        """The toy target as lossless.py's models are: a prefix -> the next token's distribution."""
        return self.p[len(prefix)]


def toy_step(p_rows, q_rows) -> ToyStep:
    """A ToyStep from rows of integer weights, each row normalised to sum to 1."""
    norm = lambda row: tuple(Fraction(w, sum(row)) for w in row)  # noqa: E731
    return ToyStep([norm(r) for r in p_rows], [norm(r) for r in q_rows])


def step_law(rule, step: ToyStep) -> dict:
    """{(drafts, n, next token): probability} of one step of `rule`, the drafts drawn from q."""
    law = Counter()
    for drafts in product(range(step.V), repeat=step.K):
        weight = Fraction(1)
        for i, x in enumerate(drafts):
            weight *= step.q[i][x]
        if weight == 0:
            continue
        for n, dist, prob in rule(step.p, step.q, drafts):
            for y, py in enumerate(dist):
                if prob * py:
                    law[(drafts, n, y)] += weight * prob * py
    return dict(law)


def target_law(step: ToyStep) -> dict:
    """{K+1 tokens: probability} of the target's own sampling."""
    return lossless.exact_target_joint(step.target, step.K, step.V)


def read_verdict(out, drafts, V):
    """(n, token) as ints from what the learner returned, or Failure saying what is wrong with it."""
    K = len(drafts)
    try:
        n, token = out
        n, token = int(n), int(token)
    except (TypeError, ValueError):
        raise Failure(f"For the drafts {drafts} your function returned {out!r}: it should return a pair "
                      f"(n, token), the number of drafts accepted and the next token.") from None
    if not 0 <= n <= K:
        raise Failure(f"For the drafts {drafts} your function returned n = {n}, but only {K} drafts were "
                      f"proposed: n must be between 0 and {K}.")
    if not 0 <= token < V:
        raise Failure(f"For the drafts {drafts} your function returned the token {token}, which is not in the "
                      f"vocabulary of {V} tokens (0 to {V - 1}).")
    return n, token


def run_rule(fn, step: ToyStep, samples: int, g: torch.Generator):
    """Counts of (drafts, n, token) and of the K+1 emitted tokens over `samples` steps of fn."""
    p, q = step.tensors()
    K = step.K
    drafts = torch.stack([torch.multinomial(q[i], samples, replacement=True, generator=g) for i in range(K)], 1)
    # (samples, K+1): the target's own draws, which continue the emitted tokens up to K+1
    after = torch.stack([torch.multinomial(p[j], samples, replacement=True, generator=g) for j in range(K + 1)], 1)
    steps, emitted = Counter(), Counter()
    for s, (d, tail) in enumerate(zip(drafts.tolist(), after.tolist())):
        out = call(fn, (p.clone(), q.clone(), drafts[s].clone(), g), f"the drafts {d}")
        n, token = read_verdict(out, d, step.V)
        steps[(tuple(d), n, token)] += 1
        emitted[tuple(d[:n]) + (token,) + tuple(tail[n + 1:])] += 1
    return steps, emitted


def fit(counts, law) -> lossless.ChiSquareResult:
    """chi_square_test against an exact law. Where every sample is impossible under it the statistic is
    0 / 0 (scipy warns) and the p-value 0: the law does not fit, which is all that matters."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return lossless.chi_square_test(counts, {x: float(w) for x, w in law.items()})


def best_fit(counts, mistakes, step: ToyStep):
    """The name of the mistake whose step law the counts fit best (p-value >= THRESHOLD), or None."""
    best, best_p = None, THRESHOLD
    for name, rule in mistakes:
        pvalue = fit(counts, step_law(rule, step)).pvalue
        if pvalue >= best_p:
            best, best_p = name, pvalue
    return best


def output_gap(emitted, step: ToyStep) -> str:
    """The sentence that says where the emitted tokens differ most from the target's."""
    N, worst = sum(emitted.values()), None
    for j in range(step.K + 1):
        freq = Counter()
        for seq, c in emitted.items():
            freq[seq[j]] += c / N
        for y in range(step.V):
            gap = abs(freq[y] - float(step.p[j][y]))
            if worst is None or gap > worst[0]:
                worst = (gap, j, y, freq[y], float(step.p[j][y]))
    gap, j, y, got, want = worst
    where = f"the {ORDINALS[j]} emitted token" if j < len(ORDINALS) else f"emitted token {j + 1}"
    if want == 0:
        return (f"The output is no longer the target's distribution: token {y} comes out as {where} in "
                f"{got:.3f} of the steps, although the target never gives it there (probability 0).")
    if gap >= 0.015:
        return (f"The output is no longer the target's distribution: token {y} comes out as {where} "
                f"{got:.2f} of the time, where the target gives it {want:.2f}.")
    law = target_law(step)
    seq = max(set(law) | set(emitted), key=lambda s: abs(emitted.get(s, 0) / N - float(law.get(s, 0))))
    return (f"The output is no longer the target's distribution: each token on its own comes out about as "
            f"often as it should, but the tokens {list(seq)} come out together {emitted.get(seq, 0) / N:.3f} "
            f"of the time, where the target gives them {float(law.get(seq, 0)):.3f}.")


def step_gap(counts, law, rule_words) -> str:
    """The sentence that says for which drafts the verdicts differ most from `rule_words`'s."""
    by_drafts = Counter()
    for (d, _, _), c in counts.items():
        by_drafts[d] += c
    weight = Counter()
    for (d, _, _), w in law.items():
        weight[d] += w
    worst = None
    for cell in set(counts) | set(law):
        d, N = cell[0], by_drafts[cell[0]]
        if N == 0:
            continue
        want = float(law.get(cell, 0) / weight[d]) if weight[d] else 0.0
        score = abs(counts.get(cell, 0) - N * want) / (N * want * (1 - want) + 1) ** 0.5
        if worst is None or score > worst[0]:
            worst = (score, cell, counts.get(cell, 0) / N, want)
    _, (d, n, y), got, want = worst
    said = "never does" if want == 0 else f"does so in {want:.2f}"
    drafts = "draft" if n == 1 else "drafts"
    return (f"when the drafts are {list(d)}, you accept {n} {drafts} and return the token {y} in {got:.2f} of the "
            f"steps, where the {rule_words} {said}.")


def grade_rule(fn, step: ToyStep, rule, rule_words: str, mistakes, samples: int, seed: int = 0) -> str:
    """Check fn against `rule` on `step`: (a) lossless, (b) the same per-step law. Raises Failure.
    The steps run in chunks; a rule that is already far off (p-value below 1e-12) after half of
    them is judged there, which halves the wait for a wrong rule and leaves the diagnosis as sure."""
    g, law, target = torch.Generator().manual_seed(seed), step_law(rule, step), target_law(step)
    counts, emitted, done = Counter(), Counter(), 0
    while done < samples:
        chunk = min(CHUNK, samples - done)
        more_counts, more_emitted = run_rule(fn, step, chunk, g)
        counts, emitted, done = counts + more_counts, emitted + more_emitted, done + chunk
        output, per_step = fit(emitted, target), fit(counts, law)
        if done >= samples // 2 and min(output.pvalue, per_step.pvalue) < 1e-12:
            break
    if output.pvalue < THRESHOLD:
        raise Failure(output_gap(emitted, step), best_fit(counts, mistakes, step))
    if per_step.pvalue < THRESHOLD:
        raise Failure(f"Your emitted tokens pass the test against the target's distribution, but your verdicts are "
                      f"not the {rule_words}'s: " + step_gap(counts, law, rule_words), best_fit(counts, mistakes, step))
    return (f"Your rule ran {samples} steps, K = {step.K} drafts drawn from q over {step.V} tokens. The emitted "
            f"tokens are distributed as the target's (chi-square p-value {output.pvalue:.2f}), and the number "
            f"accepted and the next token follow the {rule_words} for every drafted block (p-value "
            f"{per_step.pvalue:.2f}).")
