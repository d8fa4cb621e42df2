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

`greedy_agreement` measures greedy agreement per drafted position, with any draft the engine
runs (a token draft, a feature draft). Along the target's own greedy answer a_0..a_{n-1}, the
real drafter is started at every answer position t (the text up to a_{t-1} committed, exactly
as after an engine step) and proposes d_1..d_k, k = min(k_max, n - t). Then:
  position i is drafted from t when the draft proposed i tokens and d_1..d_{i-1} all equal
         a_t..a_{t+i-2}: the draft's i-th token then reads exactly the text an engine step
         would give it; it agrees when also d_i = a_{t+i-1}.
  agreement at position i = agreed / drafted over every start of every answer; position 1 is
         the usual teacher-forced greedy agreement (the draft's argmax equals the target's).
  tokens per step at K = the mean over every start t of min(L + 1, n - t), L the number of
         leading agreements among d_1..d_K: what a greedy engine step from t commits, cut to
         the answer's length. It is computed from the agreements, not timed, and it averages
         over every start, where an engine run visits only the starts its steps land on.
"""
import statistics
from dataclasses import dataclass, field

import torch
from tqdm.auto import tqdm

from ..analysis.roofline import expected_speedup, expected_tokens_per_step
from ..analysis.timing import Clock
from ..api import SpeculativeEngine, autoregressive_generate, make_drafter
from ..core.config import SamplingConfig
from ..core.drafter import Verdict
from ..core.sampling import logits_to_probs, make_generator


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
def measure_step_costs(target, draft, ks, context=128, reps=20, warmup=3, caches=None) -> StepCosts:
    """Median forward times at `context` cached positions, every kind timed once per
    round so that drift of the machine hits all alike. Each forward is rolled back. `caches`
    {"target": cache, "draft": cache} reuses caches (a compiled model's graphs then see the
    engine's); else each model makes its own (new_cache: with fixed shapes, the runner's capacity).
    With draft None only the target is timed (draft_forward is then 0)."""
    device, clock = target.device, Clock(target.device)
    kmax = max(ks, default=1)
    models = (target,) if draft is None else (target, draft)
    given = caches or {}
    caches = {id(m): given.get(name) or m.new_cache(context + kmax + 2) for name, m in zip(("target", "draft"), models)}
    for c in caches.values():
        c.reset()
    prefix = torch.zeros(1, context, dtype=torch.long, device=device)  # (1, context)
    for m in models:
        m(prefix, cache=caches[id(m)], last_only=True)
    def forward(m, T, last_only=False):
        x = prefix[:, :T].clone(memory_format=torch.contiguous_format)  # (1, T), the strides a fresh tensor has
        return lambda: m(x, cache=caches[id(m)], last_only=last_only)

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


# ----------------------------------------------------------------------------- greedy agreement by position

@dataclass
class AgreementReport:
    name: str  # the prompt set
    num_prompts: int
    answer_tokens: int  # target answer tokens, one start position each
    drafted: list  # drafted[i - 1]: starts where position i was drafted (positions < i agreed)
    agreed: list  # agreed[i - 1]: of those, starts where position i agreed as well
    tokens_per_step: dict  # K -> mean committed tokens per greedy step, from the agreements
    by_kind: dict = field(default_factory=dict)  # kind -> [agreed, drafted] at position 1
    runs: list = field(default_factory=list, repr=False)  # per prompt, per start t: leading agreements L

    def at(self, i: int) -> float:
        """Agreement at drafted position i (1-based), given that positions < i agreed."""
        return self.agreed[i - 1] / self.drafted[i - 1] if self.drafted[i - 1] else float("nan")

    @property
    def agreement(self) -> float:
        """Greedy agreement: position 1, the draft's argmax against the target's at every answer token."""
        return self.at(1)

    def as_dict(self) -> dict:
        return {"name": self.name, "num_prompts": self.num_prompts, "answer_tokens": self.answer_tokens,
                "agreement": self.agreement, "by_position": [self.at(i) for i in range(1, len(self.drafted) + 1)],
                "drafted": self.drafted, "agreed": self.agreed, "tokens_per_step": self.tokens_per_step,
                "by_kind": {k: a / d for k, (a, d) in self.by_kind.items()}}


def agreement_table(reports: list) -> str:
    """Agreement at positions 1..3, then tokens per step at each K, one row per prompt set."""
    w = max(len(r.name) for r in reports)
    ks = list(reports[0].tokens_per_step)
    rows = [f"{'prompt set':{w}}  prompts  tokens  agreement  pos 1  pos 2  pos 3",
            *[f"{r.name:{w}}  {r.num_prompts:7d}  {r.answer_tokens:6d}  {r.agreement:9.3f}  "
              f"{r.at(1):5.3f}  {r.at(2):5.3f}  {r.at(3):5.3f}" for r in reports],
            "", f"{'tokens per step':{w}}  " + "  ".join(f"K={k:<3d}" for k in ks),
            *[f"{r.name:{w}}  " + "  ".join(f"{r.tokens_per_step[k]:5.2f}" for k in ks) for r in reports]]
    return "\n".join(rows)


def run_lengths(proposed: list, answer: list) -> int:
    """How many of the proposed tokens agree with the answer before the first that does not."""
    n = 0
    while n < len(proposed) and proposed[n] == answer[n]:
        n += 1
    return n


def _states(target, drafter, seq):
    """The target states a drafter reads (as the engine hands them out) over seq (1, N): the final
    states, or the layers it declares in `hidden_layers`, concatenated; None if it reads none."""
    if not drafter.needs_hidden:
        return None
    layers = getattr(drafter, "hidden_layers", None)
    return (target.hidden(seq) if layers is None else target.hidden(seq, layers=layers)[1])[0]


@torch.no_grad()
def greedy_agreement(target, draft, prompts, max_new_tokens=64, k_max=8, name="prompts", kinds=None,
                     progress=True) -> AgreementReport:
    """Agreement per drafted position and tokens per step at K = 1..k_max (the module docstring
    defines both), for any draft the engine runs, along the target's own greedy answers."""
    if isinstance(k_max, bool) or not isinstance(k_max, int) or not 1 <= k_max <= 16:
        raise ValueError(f"k_max must be an int in [1, 16], got {k_max!r}")
    if kinds is not None and len(kinds) != len(prompts):
        raise ValueError(f"kinds must give one kind per prompt ({len(prompts)}), got {len(kinds)}")
    greedy, g = SamplingConfig(temperature=0.0), make_generator(0, target.device)
    drafted, agreed, by_kind = [0] * k_max, [0] * k_max, {}
    committed, starts, runs = dict.fromkeys(range(1, k_max + 1), 0), 0, []
    for j, prompt in enumerate(tqdm(prompts, desc=f"agreement on {name}", disable=not progress)):
        res = autoregressive_generate(target, prompt, max_new_tokens=max_new_tokens)
        P, a = len(res.prompt_ids), res.tokens
        seq = torch.tensor([res.prompt_ids + a], device=target.device)  # (1, P + n)
        drafter = make_drafter(target, draft, P + len(a) + k_max + 2)
        hidden = _states(target, drafter, seq)  # (P + n, width): what the drafter reads along the answer, or None
        drafter.prefill(res.prompt_ids, None if hidden is None else hidden[:P - 1])
        runs.append([])
        for t in range(len(a)):
            ids, _ = drafter.propose(min(k_max, len(a) - t), greedy, g)
            d = ids.tolist()  # sync: one per start; this is a measurement, not the engine's loop
            L = run_lengths(d, a[t:])
            runs[-1].append(L)
            for i in range(min(L + 1, len(d))):  # positions 1..L agreed; L + 1 was drafted and did not
                drafted[i] += 1
                agreed[i] += i < L
            for k in committed:
                committed[k] += min(min(L, k) + 1, len(a) - t)
            starts += 1
            if kinds is not None and d:
                ka = by_kind.setdefault(kinds[j], [0, 0])
                ka[0], ka[1] = ka[0] + (L > 0), ka[1] + 1
            # Step to t + 1 as a step that rejected d_1 and drew a_t would: the drafter keeps the
            # committed text and hears the target's state at the pending token (hidden row 0).
            verdict = Verdict(d, 0, a[t], ids, seq[0, P + t:P + t + 1])
            drafter.commit(verdict, None if hidden is None else hidden[P + t - 1:P + t + len(d)])
    return AgreementReport(name, len(prompts), starts, drafted, agreed,
                           {k: v / max(starts, 1) for k, v in committed.items()}, by_kind, runs)
