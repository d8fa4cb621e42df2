"""K by load: how many tokens to draft per step as the batch grows.

Speculation pays when verification is nearly free: a target forward over B (K+1) tokens costs
about what one over B tokens costs, because it is bound by reading the weights. As B grows the
forward turns compute-bound and the K extra tokens per row start to cost their full price;
past some batch size speculation loses. Two ways to turn K down:

- `KSchedule`: a fixed table, vLLM's `num_speculative_tokens_per_batch_size` semantics: a list
  of (start_bs, end_bs, K) ranges, both ends included; a batch size in no range drafts 0 tokens
  (speculation off).
- `GoodputPolicy` (SmartSpec, arXiv 2406.14066): each step, the K in [0, k_max] that maximises
  goodput, the expected tokens committed per second,
        goodput(B, K) = B * (1 - alpha^(K+1)) / (1 - alpha) / step_seconds(B, K),
  from a table of measured step costs by row count and K (`measure_step_costs`: the fastest of a
  few real steps) and a running estimate of alpha. The table is not updated from the steps the
  server runs: those are typical times, the table's are best times, and mixing them would make
  whichever K ran lately look dearer than the others. K = 0 gives B / cost(B, 0),
  plain batched decoding, so the policy leaves speculation only where the table says it pays.

alpha is estimated from the verdicts: a row that drafts k tokens and accepts n saw n
acceptances and, when n < k, one rejection; with i.i.d. acceptance (Leviathan et al., arXiv
2211.17192) the maximum-likelihood alpha is accepted / (accepted + rejections), kept here as
decayed sums so that it follows the traffic.
"""
import math
import time

import torch

from ..core.config import MAX_K
from .engine import make_sequence


def _check_int(name, value, lo, hi=None):
    if isinstance(value, bool) or not isinstance(value, int) or value < lo or (hi is not None and value > hi):
        raise ValueError(f"{name} must be an int in [{lo}, {hi if hi is not None else 'inf'}], got {value!r}")


class KSchedule:
    """K by batch size from ranges [(start_bs, end_bs, k), ...]; 0 outside every range."""

    def __init__(self, ranges):
        ranges = [tuple(r) for r in ranges]
        for r in ranges:
            if len(r) != 3:
                raise ValueError(f"ranges must hold (start_bs, end_bs, k) triples, got {r!r}")
            _check_int("start_bs", r[0], 1)
            _check_int("end_bs", r[1], r[0])
            _check_int("k", r[2], 0, MAX_K)
        spans = sorted(ranges)
        for a, b in zip(spans, spans[1:]):
            if b[0] <= a[1]:
                raise ValueError(f"ranges must not overlap: {a} and {b}")
        self.ranges = spans

    def k_for(self, batch_size: int) -> int:
        for start, end, k in self.ranges:
            if start <= batch_size <= end:
                return k
        return 0

    def observe(self, record):
        pass  # a fixed table learns nothing


def expected_tokens(alpha: float, k: int) -> float:
    """Tokens one row commits per step: (1 - alpha^(K+1)) / (1 - alpha) (arXiv 2211.17192, eq. 1)."""
    return k + 1.0 if alpha >= 1.0 else (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


class GoodputPolicy:
    """The K that maximises expected tokens per second at this batch size (module docstring).

    costs: {(batch_size, k): seconds of one step}, measured (measure_step_costs); a batch size
    between two measured ones is interpolated linearly, beyond them the nearest is used.
    alpha: the starting estimate, worth `prior_weight` drafted positions; `decay` forgets old
    verdicts (per step)."""

    def __init__(self, costs, k_max=4, alpha=0.5, prior_weight=20.0, decay=0.99):
        _check_int("k_max", k_max, 0, MAX_K)
        if not costs or not all(isinstance(b, int) and isinstance(k, int) and s > 0 for (b, k), s in costs.items()):
            raise ValueError("costs must map (batch_size, k) int pairs to positive seconds")
        sizes = sorted({b for b, _ in costs})
        missing = [(b, k) for b in sizes for k in range(k_max + 1) if (b, k) not in costs]
        if missing:  # an unmeasured K would borrow a smaller K's cost and look cheaper than it is
            raise ValueError(f"costs must hold every k in [0, k_max={k_max}] for every batch size they cover "
                             f"{sizes}; missing (batch_size, k): {missing[:8]}")
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0.0 <= alpha < 1.0:
            raise ValueError(f"alpha must be in [0, 1), got {alpha!r}")
        if isinstance(prior_weight, bool) or not isinstance(prior_weight, (int, float)) or not 0 < prior_weight < math.inf:
            raise ValueError(f"prior_weight must be a finite number > 0 (drafted positions alpha is worth), "
                             f"got {prior_weight!r}")
        if isinstance(decay, bool) or not isinstance(decay, (int, float)) or not 0.0 < decay <= 1.0:
            raise ValueError(f"decay must be in (0, 1] (1 forgets nothing), got {decay!r}")
        self.costs = dict(costs)
        self.k_max, self.decay = k_max, decay
        self.accepted, self.rejected = alpha * prior_weight, (1.0 - alpha) * prior_weight

    @property
    def alpha(self) -> float:
        return self.accepted / (self.accepted + self.rejected)

    def cost(self, batch_size: int, k: int) -> float:
        """The step cost at this batch size and K: interpolated over batch sizes, and never below the
        cost at a smaller K (more tokens cannot be cheaper; a noisy measurement can say they are)."""
        return max(self._interpolated(batch_size, kk) for kk in range(k + 1))

    def _interpolated(self, batch_size: int, k: int) -> float:
        sizes = sorted(b for b, kk in self.costs if kk == k)  # every K is measured: __init__ checks
        if batch_size <= sizes[0]:
            return self.costs[(sizes[0], k)]  # below the table: no cheaper than its smallest batch
        if batch_size >= sizes[-1]:
            return self.costs[(sizes[-1], k)] * batch_size / sizes[-1]  # beyond the table: linear in rows
        hi = next(b for b in sizes if b >= batch_size)
        lo = max(b for b in sizes if b <= batch_size)
        if hi == lo:
            return self.costs[(lo, k)]
        w = (batch_size - lo) / (hi - lo)
        return (1 - w) * self.costs[(lo, k)] + w * self.costs[(hi, k)]

    def goodput(self, batch_size: int, k: int) -> float:
        return batch_size * expected_tokens(self.alpha, k) / self.cost(batch_size, k)

    def k_for(self, batch_size: int) -> int:
        """The K with the highest goodput (the smaller on a tie)."""
        return max(range(self.k_max + 1), key=lambda kk: (self.goodput(batch_size, kk), -kk))

    def observe(self, record):
        """Hear a BatchRecord: its verdicts update alpha."""
        self.accepted *= self.decay
        self.rejected *= self.decay
        for r in record.rows:
            if r.k > 0:
                self.accepted += r.num_accepted
                self.rejected += r.num_accepted < r.k


def step_cost_budget(ks, reps) -> int:
    """New tokens a row of measure_step_costs may commit: every K once per round, warm-up included."""
    return (reps + 1) * len(ks) * (max(ks) + 1) + 1


@torch.inference_mode()
def measure_step_costs(engine, batch_sizes, ks, context=64, reps=3, seed=0) -> dict:
    """{(B, K): seconds}: the fastest of `reps` batched steps of B greedy rows of about `context`
    tokens, every row drafting K. Real steps of `engine` (draft forwards, the target forward over
    B (K+1) tokens, verification, the host read). For each B the rows are prefilled once and each
    rep steps them at every K in turn (the contexts grow by a few tokens); then they are released."""
    g = torch.Generator().manual_seed(seed)
    V = engine.target.cfg.vocab_size
    out = {}
    budget = step_cost_budget(ks, reps)
    for B in batch_sizes:
        seqs = [make_sequence(torch.randint(0, V, (context,), generator=g).tolist(), budget, device=engine.device)
                for _ in range(B)]
        engine.prefill(seqs)
        try:
            for rep in range(reps + 1):  # rep 0 warms up
                for k in ks:
                    for s in seqs:
                        s.k = k
                    t0 = time.perf_counter()
                    engine.step(seqs)  # its one host read waits for the device
                    seconds = time.perf_counter() - t0
                    if rep:
                        out[(B, k)] = min(out.get((B, k), float("inf")), seconds)
        finally:
            engine.release(seqs)
    return out
