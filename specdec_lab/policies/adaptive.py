"""Adaptive K: choosing the draft length step by step from what verification showed.

A controller has the interface the engine calls (core/engine.py, `engine.controller = ...`):
  next_k() -> int           before each step: the K to draft (the engine clamps it
                            to the remaining budget, and a drafter may propose fewer)
  update(record)            after each step, with that step's StepRecord
Both controllers keep `history`, the K each next_k() returned; the K actually
drafted is in each StepRecord.k.

ThresholdController is the rule of the Rust article "Speculative Decoding in Custom LLM Servicing: Implementing Draft Models in Rust": watch a moving average of the
per-step acceptance num_accepted / k; below `low` drop K to k_min, above `high`
raise it back to k_max. Note that num_accepted / k is not alpha: for a fixed
alpha it grows as K shrinks, E[n / K] = (alpha - alpha^(K+1)) / (K (1 - alpha)),
so after a drop the ratio rises by itself. That works as hysteresis, but it is
why the thresholds are empirical.

CostAwareController estimates alpha and c and picks the K that maximises the
expected speedup of Leviathan et al. (arXiv 2211.17192, Theorem 3.8):
  speedup(alpha, K, c) = (1 - alpha^(K+1)) / ((1 - alpha) (K c + 1)).
"""
import math

import torch

from ..analysis.moving import MovingRatio
from ..analysis.roofline import _check_int, expected_speedup, expected_tokens_per_step, optimal_k  # noqa: F401
from ..core.config import MAX_K
from ..core.records import StepRecord


class _Controller:
    """What both controllers share: the K range, the warmup and the history of choices."""
    K_FLOOR = 1  # the smallest k_min a controller takes

    def __init__(self, k_min, k_max, k_start, warmup):
        _check_int("k_min", k_min, self.K_FLOOR, MAX_K)
        _check_int("k_max", k_max, k_min, MAX_K)
        _check_int("k_start", k_start, k_min, k_max)
        _check_int("warmup", warmup, 0)
        self.k_min, self.k_max, self.k_start, self.warmup = k_min, k_max, k_start, warmup
        self.reset()

    def reset(self):
        self.k = self.k_start  # the K the next step will draft
        self.observed = 0  # steps with k > 0 seen by update()
        self.history = []  # the K returned by each next_k() call

    def next_k(self) -> int:
        self.history.append(self.k)
        return self.k


class ThresholdController(_Controller):
    """The Rust article's rule: K = k_max while acceptance is high, k_min when it falls.

    acceptance: a moving average of num_accepted / k per step (MovingRatio, weight
    `decay` on the past). The first `warmup` drafting steps run at k_start; from
    then on, after each step: below `low` set K = k_min, above `high` set
    K = k_max, in between keep K (hysteresis).
    """

    def __init__(self, k_min=2, k_max=5, k_start=None, low=0.4, high=0.6, decay=0.7, warmup=2):
        for name, value in (("low", low), ("high", high)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be a number in [0, 1], got {value!r}")
        if low > high:
            raise ValueError(f"low ({low}) must not exceed high ({high})")
        self.low, self.high, self.decay = low, high, decay
        super().__init__(k_min, k_max, k_max if k_start is None else k_start, warmup)

    def reset(self):
        super().reset()
        self._acceptance = MovingRatio(self.decay)

    @property
    def acceptance(self) -> float | None:
        """The moving per-step acceptance, None before the first drafting step."""
        return self._acceptance.value

    def update(self, record: StepRecord):
        if record.k == 0:
            return  # a plain target step says nothing about the draft
        self._acceptance.update(record.num_accepted / record.k, 1.0)
        self.observed += 1
        if self.observed < self.warmup:
            return
        if self.acceptance < self.low:
            self.k = self.k_min
        elif self.acceptance > self.high:
            self.k = self.k_max


class CostAwareController(_Controller):
    """K = argmax of the expected speedup at the moving estimates of alpha and c.

    alpha: a step with n accepted out of k is a truncated geometric observation: n
    successes, then one failure if n < k. Its maximum-likelihood estimate is
    accepted / trials with trials = n + (1 if n < k else 0), here with both sums
    exponentially weighted (weight `decay` on the past) so alpha can drift.
    c: the draft's seconds per drafted token over the target's one-token forward time
    (its step time divided by verify_cost[k] when that is given), both moving, unless a
    fixed `c` is given (e.g. from a roofline, or on a GPU where host clocks without a
    device sync misplace the time).
    The first `warmup` drafting steps run at k_start; see reset() for what carries over
    from one request to the next.
    k_min = 0 lets it stop drafting (plain decoding) where no K is expected to pay. A step
    without drafts tells nothing about alpha, so while K is 0 every `probe_every`-th step
    drafts one token, a probe: the estimate moves, and K comes back once drafts pay again.
    """
    K_FLOOR = 0

    def __init__(self, k_min=1, k_max=8, k_start=4, decay=0.95, warmup=4, c=None, verify_cost=None, carry=True,
                 probe_every=16):
        if c is not None and (isinstance(c, bool) or not isinstance(c, (int, float)) or not c >= 0 or math.isinf(c)):
            raise ValueError(f"c must be None (measure it) or a finite number >= 0, got {c!r}")
        if verify_cost is not None and not all(v > 0 for v in dict(verify_cost).values()):
            raise ValueError(f"verify_cost must map K to a positive cost, got {verify_cost!r}")
        # verify_cost[K]: a (K+1)-token target forward over a one-token one (train.acceptance.measure_verify_cost).
        # The theorem takes it as 1; on a CPU it is more, and it rises as the one-token forward it is
        # measured against gets faster (docs/benchmarks.md has the measured values).
        _check_int("probe_every", probe_every, 1)
        if k_start == 0:
            raise ValueError("k_start must be >= 1: a controller that starts without drafting learns nothing")
        self.decay, self.fixed_c, self.verify_cost, self.carry = decay, c, dict(verify_cost or {}), carry
        self.probe_every = probe_every
        self._alpha = None
        super().__init__(k_min, k_max, k_start, warmup)

    def reset(self):
        """The engine calls this at the start of every generation. With carry=True (the
        default) the estimates of alpha and c, and the K they chose, carry over to the next
        request: c is the machine's and changes little, and alpha moves with the moving
        average as the new request's steps arrive. Only the history starts again. Without
        it, every request starts cold at k_start for `warmup` drafting steps."""
        if self.carry and self._alpha is not None and self._alpha.value is not None:
            self.history = []
            return
        super().reset()
        self._plain_steps = 0  # steps in a row at K = 0, since the last probe
        self._alpha = MovingRatio(self.decay)  # accepted / trials
        self._draft_per_token = MovingRatio(self.decay)  # draft seconds / drafted tokens
        self._target_per_step = MovingRatio(self.decay)  # target seconds / steps

    def next_k(self) -> int:
        if self.k > 0:
            return super().next_k()
        self._plain_steps += 1
        probe = self._plain_steps >= self.probe_every
        if probe:
            self._plain_steps = 0
        self.history.append(1 if probe else 0)
        return self.history[-1]

    @property
    def alpha(self) -> float | None:
        return self._alpha.value

    @property
    def c(self) -> float | None:
        if self.fixed_c is not None:
            return float(self.fixed_c)
        draft, target = self._draft_per_token.value, self._target_per_step.value
        if draft is None or target is None:
            return None
        return draft / target if target > 0 else 0.0

    def update(self, record: StepRecord):
        k, n = record.k, record.num_accepted
        if k == 0:
            return
        self._alpha.update(n, n + (1 if n < k else 0))
        self._draft_per_token.update(record.draft_seconds, k)
        self._target_per_step.update(record.target_seconds / self.verify_cost.get(k, 1.0), 1.0)  # one-token time
        self.observed += 1
        if self.observed >= self.warmup and self.alpha is not None and self.c is not None:
            self.k = optimal_k(self.alpha, self.c, self.k_min, self.k_max, self.verify_cost)


# SpeculativeEngine's default (k="auto"): a (K+1)-row verification's cost over a one-row forward on a
# CPU, the default target's one-call forward after 200 positions, one thread, on the project's 2-core
# AVX-512 machine (docs/benchmarks.md, section 38); on a GPU a few rows cost what one does, the theorem's 1.
CPU_VERIFY_COST = {1: 1.0, 2: 1.016, 3: 1.076, 4: 1.167, 5: 1.265, 6: 1.29, 7: 1.313, 8: 1.529}  # 6: interpolated
AUTO_K_MAX = 4


def weight_bytes(model) -> int:
    """Bytes of a module's parameters and buffers (0 for a drafter without weights: n-grams, lookup)."""
    model = getattr(model, "model", model)  # a drafter that wraps its model
    if not isinstance(model, torch.nn.Module):
        return 0
    return sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))


def auto_controller(target, draft, k_max=AUTO_K_MAX) -> CostAwareController:
    """The default engine's K: the cost-aware controller from K = 0 (plain decoding) to `k_max`, with
    costs fixed in advance so that a seeded run repeats: c, a drafted token over a target token, as the
    ratio of the two models' weight bytes (a forward this small is bound by reading its weights), and
    verification's cost by rows from CPU_VERIFY_COST (1 on a GPU). Only alpha is estimated, from the
    verdicts, so the choices depend on the tokens alone."""
    _check_int("k_max", k_max, 1, max(CPU_VERIFY_COST))
    c = weight_bytes(draft) / max(weight_bytes(target), 1)
    on_gpu = getattr(target, "device", torch.device("cpu")).type != "cpu"
    verify_cost = {k: 1.0 if on_gpu else CPU_VERIFY_COST[k] for k in range(1, k_max + 1)}
    return CostAwareController(k_min=0, k_max=k_max, k_start=min(2, k_max), c=c, verify_cost=verify_cost,
                               carry=False)  # each generate starts afresh: a seeded call repeats
