"""The acceptance report: the inputs of the Leviathan et al. speedup formula for a pair.

For a target/draft pair and a prompt set it measures
  alpha  E[min(1, p/q)] per draft position = sum_v min(p_v, q_v), averaged over the
         positions of the target's own generations (teacher-forced: one forward
         of each model over the whole sequence). At temperature 0 it is the rate
         at which the draft's argmax equals the target's.
  tokens per step at K = 1..8, from real engine runs;
  c      the draft's forward time over the target's, single-token decode steps timed
         side by side, interleaved, medians.
The formula it feeds (arXiv 2211.17192, Theorem 3.8): expected tokens per step
(1 - alpha^(K+1)) / (1 - alpha) and speedup (1 - alpha^(K+1)) / ((1 - alpha)(K c + 1)).
"""
import statistics
from dataclasses import dataclass, field

import torch
from tqdm.auto import tqdm

from ..analysis.roofline import expected_speedup, expected_tokens_per_step
from ..analysis.timing import Clock
from ..api import SpeculativeEngine, autoregressive_generate
from ..core.kv_cache import KVCache
from ..core.sampling import logits_to_probs


@dataclass
class AcceptanceReport:
    alpha: float
    tokens_per_step: dict  # K -> measured mean tokens per step
    c: float
    temperature: float
    num_prompts: int
    positions: int  # draft positions alpha was averaged over
    predicted_tokens_per_step: dict = field(default_factory=dict)
    predicted_speedup: dict = field(default_factory=dict)

    def table(self) -> str:
        rows = [f"alpha = {self.alpha:.3f} over {self.positions} positions of {self.num_prompts} prompts, "
                f"c = {self.c:.3f}, temperature {self.temperature}",
                " K  tokens/step (measured)  tokens/step (predicted)  speedup (predicted)"]
        for k, v in self.tokens_per_step.items():
            rows.append(f"{k:2d}  {v:22.2f}  {self.predicted_tokens_per_step[k]:23.2f}  "
                        f"{self.predicted_speedup[k]:19.2f}")
        return "\n".join(rows)


@torch.no_grad()
def measure_alpha(target, draft, prompts, max_new_tokens=64, temperature=0.0):
    """(alpha, positions): mean sum_v min(p_v, q_v) along the target's own greedy continuations."""
    total, count = 0.0, 0
    for prompt in prompts:
        res = autoregressive_generate(target, prompt, max_new_tokens=max_new_tokens)
        seq = torch.tensor([res.prompt_ids + res.tokens], device=target.device)
        start = len(res.prompt_ids) - 1  # the position that predicts the first new token
        n = len(res.tokens)
        lp, lq = target(seq)[0, start:start + n], draft(seq)[0, start:start + n]  # (n, V)
        p, q = logits_to_probs(lp, temperature), logits_to_probs(lq, temperature)
        total += torch.minimum(p, q).sum(-1).sum().item()
        count += n
    return total / max(count, 1), count


@dataclass
class StepCosts:
    target_forward: float  # seconds, one token at `context` cached positions (median)
    draft_forward: float  # seconds, the same for the draft
    verify: dict  # K -> seconds of one target forward over K+1 tokens
    context: int

    @property
    def c(self) -> float:
        return self.draft_forward / self.target_forward

    def verify_cost(self, k: int) -> float:
        """Target forward over K+1 tokens relative to one over a single token (1 in the theorem)."""
        return self.verify[k] / self.target_forward


@torch.inference_mode()
def measure_step_costs(target, draft, ks, context=128, reps=20, warmup=3) -> StepCosts:
    """Median forward times at `context` cached positions, every kind timed once per
    round so that drift of the machine hits all alike. Each forward is rolled back.
    With draft None only the target is timed (draft_forward is then 0)."""
    device, clock = target.device, Clock(target.device)
    kmax = max(ks, default=1)
    models = (target,) if draft is None else (target, draft)
    caches = {id(m): KVCache.for_model(m.cfg, context + kmax + 2, dtype=m.dtype, device=m.device) for m in models}
    prefix = torch.zeros(1, context, dtype=torch.long, device=device)  # (1, context)
    for m in models:
        m(prefix, cache=caches[id(m)], last_only=True)
    def forward(m, T, last_only=False):
        return lambda: m(prefix[:, :T], cache=caches[id(m)], last_only=last_only)  # (1, T) tokens

    kinds = [("target", target, forward(target, 1))]
    if draft is not None:  # the draft is timed as ModelDrafter runs it
        kinds.append(("draft", draft, forward(draft, 1, last_only=True)))
    kinds += [(k, target, forward(target, k + 1)) for k in ks]
    times = {name: [] for name, _, _ in kinds}
    for r in range(warmup + reps):
        for name, m, run in kinds:
            t0 = clock()
            run()
            dt = clock() - t0
            caches[id(m)].rollback(context)
            if r >= warmup:
                times[name].append(dt)
    med = {name: statistics.median(v) for name, v in times.items()}
    return StepCosts(med["target"], med.get("draft", 0.0), {k: med[k] for k in ks}, context)


def measure_cost_ratio(target, draft, context=128, reps=30) -> float:
    """c: median single-token forward time of the draft over the target's, timed alternately."""
    return measure_step_costs(target, draft, (), context, reps).c


def measure_verify_cost(target, ks=range(1, 9), context=128, reps=10) -> dict:
    """{K: time of one target forward over K+1 tokens / time over 1 token}, medians, timed alternately.
    Leviathan et al.'s Theorem 3.8 assumes 1; batch-1 float32 matmuls on a CPU can make it 2 or more."""
    ks = list(ks)
    costs = measure_step_costs(target, None, ks, context, reps)
    return {k: costs.verify_cost(k) for k in ks}


def acceptance_report(target, draft, prompts, ks=range(1, 9), max_new_tokens=64, temperature=0.0,
                      progress=True) -> AcceptanceReport:
    alpha, positions = measure_alpha(target, draft, prompts, max_new_tokens, temperature)
    c = measure_cost_ratio(target, draft)
    engine = SpeculativeEngine(target, draft, k=1)
    per_k = {}
    for k in tqdm(list(ks), desc="tokens per step at each K", disable=not progress):
        tokens = steps = 0
        for i, prompt in enumerate(prompts):
            res = engine.generate(prompt, max_new_tokens=max_new_tokens, temperature=temperature, seed=i, k=k)
            tokens, steps = tokens + res.stats.new_tokens, steps + res.stats.steps
        per_k[k] = tokens / max(steps, 1)
    return AcceptanceReport(alpha, per_k, c, temperature, len(prompts), positions,
                            {k: expected_tokens_per_step(alpha, k) for k in per_k},
                            {k: expected_speedup(alpha, k, c) for k in per_k})
