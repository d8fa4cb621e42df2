"""Benchmarks: this engine against transformers, and the predicted speedup against the measured one.

Contract: `run_bench(target, draft, BenchConfig(...))` returns one JSON-ready dict;
`format_table(doc)` renders it. `python -m specdec_lab bench` prints the table,
then the dict as one JSON document on the last line.

How the figures are made (DESIGN.md section 8):
- a fixed prompt set (prompts.BENCH_PROMPTS), the same token ids for every system;
- prompt-major order: on each prompt every system runs in turn (the order rotates
  from prompt to prompt), so a noisy minute of the machine hits all systems alike;
- a warm-up call of every system before anything is timed;
- tokens/s counts generated tokens only, over the wall time of the whole call
  (prefill included, for every system alike; transformers cannot time its
  decode alone). On CUDA the device is synchronised before every clock read;
- ratios are taken between systems of the same run, never across runs; each ratio to
  the autoregressive decode carries a paired bootstrap interval over the prompts
  (`vs_ar_ci95`, `ratio_interval`): how much it owes to which prompts were in the set;
- when sampling, one answer per prompt is one draw: a figure at temperature 0.7 moved
  by several percent with the seeds alone. `samples` (`--samples N`) runs every system
  N times per prompt, with the seeds of `seeds_for`, the same for every system; the
  interval then resamples prompts together with all their samples;
- both engines read the same draft folder. Ours applies its vocab_subset.json (the
  draft's head over its frequent tokens, pair.with_vocab_subset); transformers'
  assisted generation has no such option and runs the whole head.

The prediction is Leviathan et al.'s (arXiv 2211.17192, Theorem 3.8):
    speedup(alpha, K, c) = (1 - alpha^(K+1)) / ((1 - alpha) (K c + 1)),
with alpha measured teacher-forced along this run's own autoregressive outputs
(sum_v min(p_v, q_v) per position) and c the draft's single-token forward time over
the target's. The theorem assumes that verifying K+1 tokens costs one target
forward; `verify_cost[K]` measures what it really costs, and
`predicted_speedup_with_verify_cost` puts it in the denominator instead of 1.
The theorem also leaves out prefill, so each of our own systems carries
`decode_speedup` (its decode loop against the autoregressive one, prefill excluded)
and `decode_prediction_error_with_verify_cost`, the like-for-like comparison.
Drafters that are not the shipped draft (the feature draft, the self-draft) have an alpha of
their own: a fixed-K self-draft system carries `predicted_speedup_own`, the theorem with the
alpha and c its own steps measured and v_K; the feature draft's acceptance falls with depth, so
it carries none. `targets` reports the best system overall and the best with the shipped draft.

The roofline: autoregressive decode reads every weight and the KV cache once per
token, so bytes/token x tokens/s over the machine's read bandwidth is the fraction
of the memory wall it reaches.

`run_synthetic` (GPU only) builds random-weight models of real shapes on the
device to measure step costs, c and the bandwidth fraction where no weights can
be downloaded.
"""
import math
import os
import statistics
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from . import kernels
from . import model as model_module
from .acceptance import Clock, StepCosts, measure_step_costs  # noqa: F401 (bench.Clock etc. are used by chapters)
from .adaptive import CostAwareController, optimal_k
from .config import ModelConfig
from .drafters import LookupThenModelDrafter, ModelDrafter
from .feature_draft import FeatureDrafter
from .engine import SpeculativeEngine, autoregressive_generate
from .prompts import BENCH_KINDS, BENCH_PROMPTS
from .roofline import expected_speedup, expected_tokens_per_step
from .sampling import logits_to_probs
from .self_draft import QuantizedDecoding, SelfDraft, best_weights
from .text import encode_prompt

# ----------------------------------------------------------------------------- cost arithmetic (pure)


def streamed_weight_bytes(cfg: ModelConfig, bytes_per_param: int) -> int:
    """Weight bytes one decode step reads: every matrix once. An untied input embedding
    is only gathered (one row), so it is left out; a tied one is read whole as the head."""
    untied_embedding = 0 if cfg.tie_embeddings else cfg.vocab_size * cfg.dim
    return (cfg.num_params - untied_embedding) * bytes_per_param


def kv_bytes_read(cfg: ModelConfig, context: float, bytes_per_value: int) -> float:
    """KV bytes one decode step reads at `context` cached positions: K and V, every layer."""
    return 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * context * bytes_per_value


def decode_bytes_per_token(cfg: ModelConfig, context: float, bytes_per_param: int,
                           bytes_per_value: int | None = None) -> float:
    return streamed_weight_bytes(cfg, bytes_per_param) + kv_bytes_read(cfg, context, bytes_per_value or bytes_per_param)


def roofline_fraction(bytes_per_token: float, tokens_per_second: float, bandwidth: float) -> float:
    """Share of the memory read bandwidth (bytes/s) that a decode at this rate uses."""
    if bandwidth <= 0:
        raise ValueError(f"bandwidth must be > 0, got {bandwidth!r}")
    return bytes_per_token * tokens_per_second / bandwidth


def predicted_speedup(alpha: float, k: int, c: float, verify_cost: float = 1.0) -> float:
    """E[tokens per step] / (K c + verify_cost). verify_cost = 1 is Theorem 3.8 of
    arXiv 2211.17192 exactly; a measured verify_cost (target forward over K+1 tokens
    relative to one) accounts for a verification that is not free."""
    return expected_speedup(alpha, k, c, verify_cost)


def alpha_from_steps(accepted: int, rejections: int) -> float | None:
    """The maximum-likelihood alpha of truncated geometric observations: each step
    accepted n drafts and ended with one rejection if n < K. None with no data."""
    trials = accepted + rejections
    return accepted / trials if trials else None


# ----------------------------------------------------------------------------- measurements


class BandwidthProbe:
    """Memory read bandwidth (bytes/s): each call takes the best of `reps` sums over a float32
    buffer much larger than the caches (256 MiB on CPU, 2 GiB on CUDA). The bench calls it
    between prompts, so the roofline's denominator sees the machine as the decode saw it."""

    def __init__(self, device="cpu", nbytes=None, reps=3):
        device = torch.device(device)
        nbytes = nbytes or (2 << 30 if device.type == "cuda" else 256 << 20)
        self.x = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
        self.clock, self.reps, self.samples = Clock(device), reps, []
        self.x.sum()  # warm-up: page faults, thread pool

    @torch.no_grad()
    def __call__(self) -> float:
        best = math.inf
        for _ in range(self.reps):
            t0 = self.clock()
            self.x.sum()
            best = min(best, self.clock() - t0)
        self.samples.append(self.x.numel() * 4 / best)
        return self.samples[-1]


def measure_read_bandwidth(device="cpu", nbytes=None, reps=5) -> float:
    return BandwidthProbe(device, nbytes, reps)()


def machine_bandwidth(device="cpu", quick=False) -> tuple[float, str]:
    """(bytes/s, source): roofline.measure_memory_bandwidth when the library has it, else our own."""
    from . import roofline
    nbytes = 2 << 30 if torch.device(device).type == "cuda" else 256 << 20
    reps = 3 if quick else 7
    fn = getattr(roofline, "measure_memory_bandwidth", None)
    if fn is not None:
        try:
            return float(fn(nbytes=nbytes, reps=reps, device=device)), "roofline.measure_memory_bandwidth (read)"
        except TypeError as e:  # an interface we do not know: fall back, and say so
            warnings.warn(f"roofline.measure_memory_bandwidth: {e}; using bench's own measurement")
    return measure_read_bandwidth(device, nbytes, reps), "bench.measure_read_bandwidth (sum)"


@torch.no_grad()
def teacher_forced_alpha(target, draft, runs, temperature) -> tuple[float, int]:
    """(alpha, positions): mean sum_v min(p_v, q_v) over the positions of `runs`, a list of
    (prompt_ids, new_ids) that the target itself generated at this temperature."""
    total, count = 0.0, 0
    for ids, new in runs:
        if not new:
            continue
        seq = torch.tensor([ids + new], device=target.device)  # (1, P+N)
        start, n = len(ids) - 1, len(new)  # the position that predicts new[0]
        lp, lq = target(seq)[0, start:start + n], draft(seq)[0, start:start + n]  # (N, V)
        p, q = logits_to_probs(lp, temperature), logits_to_probs(lq, temperature)
        total += torch.minimum(p, q).sum().item()  # sync: once per prompt, outside any timing
        count += n
    return (total / count if count else 0.0), count


# ----------------------------------------------------------------------------- the systems


@dataclass
class Tally:
    """What one system did over the prompts of one temperature."""
    calls: int = 0
    tokens: int = 0
    seconds: float = 0.0  # wall time of the calls, prefill included
    decode_seconds: float = 0.0  # the engine's decode loop only (own systems)
    prompt_tokens: int = 0
    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    rejections: int = 0  # drafting steps that ended in a rejection
    draft_seconds: float = 0.0
    target_seconds: float = 0.0
    syncs: int = 0
    outputs: list = field(default_factory=list)  # the new ids of each call, prompt order
    call_seconds: list = field(default_factory=list)  # the wall time of each call, prompt order
    call_steps: list = field(default_factory=list)  # the steps of each call (own systems)
    call_prompts: list = field(default_factory=list)  # which prompt each call ran (several calls when sampling)

    def add(self, ids, tokens, seconds, stats=None, steps=(), prompt=None):
        self.call_prompts.append(self.calls if prompt is None else prompt)
        self.calls += 1
        self.tokens += len(tokens)
        self.seconds += seconds
        self.prompt_tokens += len(ids)
        self.outputs.append(tokens)
        self.call_seconds.append(seconds)
        if stats is None:
            return
        self.call_steps.append(stats.steps)
        self.decode_seconds += stats.seconds
        self.steps += stats.steps
        self.drafted += stats.drafted
        self.accepted += stats.accepted
        self.rejections += sum(1 for s in steps if 0 < s.k and s.num_accepted < s.k)
        self.draft_seconds += stats.draft_seconds
        self.target_seconds += stats.target_seconds
        self.syncs += stats.syncs

    def per_prompt(self) -> tuple[list, list, list]:
        """(prompts, tokens, seconds): each prompt's calls summed, in order of first appearance."""
        tokens, seconds = {}, {}
        for p, new, sec in zip(self.call_prompts, self.outputs, self.call_seconds):
            tokens[p] = tokens.get(p, 0) + len(new)
            seconds[p] = seconds.get(p, 0.0) + sec
        return list(tokens), list(tokens.values()), list(seconds.values())


@dataclass
class System:
    name: str  # the JSON key
    label: str  # the table's row
    run: object  # (ids, max_new_tokens, temperature, seed) -> (new ids, GenerationResult or None)
    k: int | None = None  # fixed draft length, None for adaptive or no drafting
    own: bool = True  # this engine (has step statistics) or transformers
    drafts: bool = False
    k_max: int | None = None  # a ceiling on K that the drafter may stop short of (no prediction then)
    theorem: bool = True  # Theorem 3.8 with the shipped draft's alpha and c applies (not to the feature draft)


# The two drafting refinements the bench runs beside fixed and adaptive K (drafters.py): the
# draft stops after a token it gave less than STOP_BELOW, with K = STOP_K as a ceiling; and
# where the context's last 2-4 tokens occurred before, prompt lookup proposes the STOP_K tokens
# that followed them, the stopping draft proposing everywhere else.
STOP_K, STOP_BELOW = 6, 0.2

# The feature draft (feature_draft.py, EAGLE) runs at these fixed K, with early stopping under
# FEATURE_STOP_K as a ceiling, and behind prompt lookup at FEATURE_LOOKUP_K without the stop: a
# feature draft token costs more than the shipped draft's, and in a side-by-side run on 12 prompts
# the stop at 0.2 with a ceiling of 6 lost to K = 4 (1.47x against 1.56x the autoregressive decode).
# Its acceptance falls with depth (each drafted token reads the draft's own estimate of the state
# before it), so Theorem 3.8's one alpha does not describe it.
FEATURE_KS, FEATURE_STOP_K, FEATURE_LOOKUP_K = (3, 4, 5), 8, 4

# The target's own weights as its draft (self_draft.py), in 4 bits where the kernels allow, else in
# int8: it agrees with the target far more often than a distilled draft and costs a fifth (4 bits) to a
# quarter (int8) of a target forward, so longer drafts pay.
# K = 7 verifies 8 rows, the most the panel kernel takes in one pass over the weights (its RB);
# K = 8's 9 rows need a second pass.
SELF_KS = (4, 6, 7, 8)
# The same draft behind prompt lookup (SelfDraft(lookup=True)): where the context repeats, k copied
# tokens cost no self-draft forward, and each such forward costs a fifth to a quarter of the target's.
SELF_LOOKUP_K = 6


def make_systems(target, draft, ks, adaptive=True, hf_target=None, hf_draft=None, fixed_c=None,
                 verify_cost=None, refinements=True, feature_draft=None, self_draft=None) -> list:
    """The systems in their table order. `fixed_c` pins the adaptive controller's c (CUDA);
    `verify_cost` ({K: cost of a K+1-token forward over a one-token one}) is what it assumes
    a verification costs. `refinements` adds the early-stopping draft and lookup + draft;
    `feature_draft` (a feature_draft.FeatureDraft) its systems at FEATURE_KS and with early stopping;
    `self_draft` (a self_draft.SelfDraft) the target drafting for itself at SELF_KS, and behind prompt
    lookup at SELF_LOOKUP_K."""
    eos = target.cfg.eos_token_ids

    def ar(ids, n, temperature, seed):
        res = autoregressive_generate(target, ids, max_new_tokens=n, temperature=temperature, seed=seed)
        return res.tokens, res

    systems = [System("ar", "this engine, autoregressive", ar)]
    engine = SpeculativeEngine(target, draft, k=1)
    for k in ks:
        def spec(ids, n, temperature, seed, k=k):
            res = engine.generate(ids, max_new_tokens=n, temperature=temperature, seed=seed, k=k)
            return res.tokens, res
        systems.append(System(f"spec_k{k}", f"speculative, K={k}", spec, k=k, drafts=True))
    if adaptive:
        engine_a = SpeculativeEngine(target, draft, k=4)
        engine_a.controller = CostAwareController(c=fixed_c, verify_cost=verify_cost)

        def spec_adaptive(ids, n, temperature, seed):
            res = engine_a.generate(ids, max_new_tokens=n, temperature=temperature, seed=seed)
            return res.tokens, res
        systems.append(System("spec_adaptive", "speculative, adaptive K", spec_adaptive, drafts=True))
    if refinements:
        capacity = min(2048, target.cfg.max_seq_len, draft.cfg.max_seq_len)
        for name, label, drafter in (
                ("spec_stop", f"spec, K<={STOP_K}, stop at q<{STOP_BELOW:g}",
                 ModelDrafter(draft, capacity, stop_below=STOP_BELOW)),
                ("spec_lookup", "spec, prompt lookup + stop",
                 LookupThenModelDrafter(draft, capacity, stop_below=STOP_BELOW))):
            engine_r = SpeculativeEngine(target, drafter, k=STOP_K)

            def spec_refined(ids, n, temperature, seed, engine_r=engine_r):
                res = engine_r.generate(ids, max_new_tokens=n, temperature=temperature, seed=seed)
                return res.tokens, res
            systems.append(System(name, label, spec_refined, drafts=True, k_max=STOP_K))
    if feature_draft is not None:
        capacity = min(2048, target.cfg.max_seq_len)
        feature = [(f"spec_feat_k{k}", f"feature draft, K={k}", FeatureDrafter(feature_draft, capacity), k, None)
                   for k in FEATURE_KS]
        feature.append(("spec_feat_stop", f"feature, K<={FEATURE_STOP_K}, stop at q<{STOP_BELOW:g}",
                        FeatureDrafter(feature_draft, capacity, stop_below=STOP_BELOW), FEATURE_STOP_K,
                        FEATURE_STOP_K))
        feature.append(("spec_feat_lookup", f"feature draft, lookup + K={FEATURE_LOOKUP_K}",
                        LookupThenModelDrafter(feature_draft, capacity), FEATURE_LOOKUP_K, FEATURE_LOOKUP_K))
        for name, label, drafter, k, k_max in feature:
            engine_f = SpeculativeEngine(target, drafter, k=k)

            def spec_feature(ids, n, temperature, seed, engine_f=engine_f):
                res = engine_f.generate(ids, max_new_tokens=n, temperature=temperature, seed=seed)
                return res.tokens, res
            systems.append(System(name, label, spec_feature, k=k, drafts=True, k_max=k_max, theorem=False))
    if self_draft is not None:
        engine_s = SpeculativeEngine(target, self_draft, k=1)
        for k in SELF_KS:
            def spec_self(ids, n, temperature, seed, k=k):
                res = engine_s.generate(ids, max_new_tokens=n, temperature=temperature, seed=seed, k=k)
                return res.tokens, res
            systems.append(System(f"spec_self_k{k}", f"self-draft {self_draft.weights}, K={k}", spec_self, k=k,
                                  drafts=True, theorem=False))
        engine_sl = SpeculativeEngine(target, SelfDraft(target, self_draft.weights, lookup=True), k=SELF_LOOKUP_K)

        def spec_self_lookup(ids, n, temperature, seed):
            res = engine_sl.generate(ids, max_new_tokens=n, temperature=temperature, seed=seed)
            return res.tokens, res
        systems.append(System("spec_self_lookup", f"self-draft {self_draft.weights}, lookup + K={SELF_LOOKUP_K}",
                              spec_self_lookup, drafts=True, k_max=SELF_LOOKUP_K, theorem=False))
        # The same rounded weights decoding alone, nothing verified: faster, but another model's output
        quantized = QuantizedDecoding(self_draft)

        def rounded(ids, n, temperature, seed):
            res = autoregressive_generate(quantized, ids, max_new_tokens=n, temperature=temperature, seed=seed)
            return res.tokens, res
        systems.append(System(f"{self_draft.weights}_decode", f"{self_draft.weights} decode alone, unverified",
                              rounded))
    if hf_target is not None:
        from .weights import hf_generate

        def hf(ids, n, temperature, seed):
            return hf_generate(hf_target, ids, n, temperature=temperature, seed=seed, eos_token_ids=eos), None
        systems.append(System("hf_generate", "transformers generate", hf, own=False))
        if hf_draft is not None:
            def hf_assisted(ids, n, temperature, seed):
                return hf_generate(hf_target, ids, n, assistant=hf_draft, temperature=temperature, seed=seed,
                                   eos_token_ids=eos), None
            systems.append(System("hf_assisted", "transformers assisted", hf_assisted, own=False, drafts=True))
    return systems


# ----------------------------------------------------------------------------- the run


@dataclass
class BenchConfig:
    num_prompts: int = 24  # the first N of BENCH_PROMPTS
    max_new_tokens: int = 128
    temperatures: tuple = (0.0, 0.7)
    ks: tuple = tuple(range(1, 9))  # fixed draft lengths; adaptive K runs besides them
    adaptive: bool = True
    refinements: bool = True  # the early-stopping draft, and prompt lookup + draft (STOP_K, STOP_BELOW)
    self_draft: bool = True  # the target's own weights, 4-bit or int8, as its draft (SELF_KS), where the kernels allow
    hf: bool = True  # the transformers systems (need the HF models)
    seed: int = 0  # prompt i runs with seed + i, the same for every system
    samples: int = 1  # calls per prompt when sampling (temperature > 0), sample s with seed + i + SAMPLE_STRIDE s
    cost_reps: int = 20  # rounds of measure_step_costs
    warmup_tokens: int = 16  # tokens per system in the warm-up call
    quick: bool = False

    def __post_init__(self):
        if not 1 <= self.num_prompts <= len(BENCH_PROMPTS):
            raise ValueError(f"num_prompts must be in [1, {len(BENCH_PROMPTS)}], got {self.num_prompts!r}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens!r}")
        if not self.temperatures or any(t < 0 for t in self.temperatures):
            raise ValueError(f"temperatures must be numbers >= 0, got {self.temperatures!r}")
        if any(not 1 <= k <= 16 for k in self.ks):
            raise ValueError(f"ks must lie in [1, 16], got {self.ks!r}")
        if isinstance(self.samples, bool) or not isinstance(self.samples, int) or not 1 <= self.samples <= 100:
            raise ValueError(f"samples must be an int in [1, 100], got {self.samples!r}")


# Sample s of prompt i runs with seed cfg.seed + i + SAMPLE_STRIDE * s: distinct for up to 1000 prompts.
SAMPLE_STRIDE = 1000


def seeds_for(cfg: BenchConfig, temperature: float, i: int) -> list:
    """The seeds prompt i runs with: one at temperature 0, where every call would give the same
    answer, and cfg.samples when sampling, so that the figure rests on more than one draw per prompt."""
    n = 1 if temperature == 0 else cfg.samples
    return [cfg.seed + i + SAMPLE_STRIDE * s for s in range(n)]


QUICK = dict(num_prompts=2, max_new_tokens=16, ks=(2, 4), cost_reps=5, warmup_tokens=4, quick=True)


def _timed(system, ids, n, temperature, seed, clock):
    t0 = clock()
    tokens, res = system.run(ids, n, temperature, seed)
    return tokens, res, clock() - t0


def run_systems(systems, prompt_ids, cfg, temperature, clock, log=None, probe=None) -> dict:
    """name -> Tally: a warm-up call of each system, then prompt-major timed calls (each system once
    per seed of seeds_for); `probe()` (a BandwidthProbe) runs after each prompt's round."""
    for s in systems:
        s.run(prompt_ids[0], min(cfg.warmup_tokens, cfg.max_new_tokens), temperature, cfg.seed)
    tallies = {s.name: Tally() for s in systems}
    for i, ids in enumerate(prompt_ids):
        for j, seed in enumerate(seeds_for(cfg, temperature, i)):
            r = (i + j) % len(systems)
            for s in systems[r:] + systems[:r]:  # rotate who goes first
                tokens, res, dt = _timed(s, ids, cfg.max_new_tokens, temperature, seed, clock)
                tallies[s.name].add(ids, tokens, dt, res.stats if res else None, res.steps if res else (), prompt=i)
        if probe is not None:
            probe()
        if log:
            log(f"temperature {temperature:g}: prompt {i + 1}/{len(prompt_ids)} done")
    return tallies


def _ratio(a, b):
    return a / b if a and b else None


def ratio_interval(tokens_a, seconds_a, tokens_b, seconds_b, level=0.95, resamples=2000, seed=0):
    """A paired bootstrap interval for (sum tokens_a / sum seconds_a) / (sum tokens_b / sum seconds_b):
    the prompts are drawn with replacement, both systems keeping the same draw, `resamples` times.
    The lists hold one entry per prompt, in the same order. Returns (low, high), or None without
    two prompts. It shows how much the ratio owes to which prompts happened to be in the set (and,
    when sampling, to which answers were drawn); it knows nothing of the machine's noise between runs."""
    n = len(tokens_a)
    if n < 2 or not (n == len(seconds_a) == len(tokens_b) == len(seconds_b)):
        return None
    data = torch.tensor([tokens_a, seconds_a, tokens_b, seconds_b], dtype=torch.float64)  # (4, n)
    idx = torch.randint(0, n, (resamples, n), generator=torch.Generator().manual_seed(seed))
    sums = data[:, idx].sum(-1)  # (4, resamples)
    ratios = (sums[0] / sums[1]) / (sums[2] / sums[3])
    lo, hi = torch.quantile(ratios, torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=torch.float64))
    return float(lo), float(hi)


def _interval_vs(t: Tally, base: Tally):
    """ratio_interval over the prompts: a prompt's samples stay together in every draw."""
    (_, tok_a, sec_a), (_, tok_b, sec_b) = t.per_prompt(), base.per_prompt()
    return ratio_interval(tok_a, sec_a, tok_b, sec_b)


def by_kind(t: Tally, ar: Tally, kinds) -> dict:
    """{kind: tokens/s, its ratio to AR on the same prompts, tokens per step} over the calls of each
    kind of prompt (kinds[i] is prompt i's)."""
    out = {}
    for kind in dict.fromkeys(kinds[p] for p in t.call_prompts):  # the kinds of the prompts that ran, in order
        idx = [j for j, p in enumerate(t.call_prompts) if kinds[p] == kind]  # calls, as both ran the same ones
        tokens, seconds = sum(len(t.outputs[i]) for i in idx), sum(t.call_seconds[i] for i in idx)
        ar_tokens, ar_seconds = sum(len(ar.outputs[i]) for i in idx), sum(ar.call_seconds[i] for i in idx)
        tps = tokens / seconds if seconds > 0 else 0.0
        steps = sum(t.call_steps[i] for i in idx) if t.call_steps else 0
        out[kind] = {"prompts": len({t.call_prompts[i] for i in idx}), "tokens": tokens, "tokens_per_second": tps,
                     "vs_ar": _ratio(tps, ar_tokens / ar_seconds if ar_seconds > 0 else 0.0),
                     "mean_tokens_per_step": tokens / steps if steps else None}
    return out


def summarize_system(s: System, t: Tally, tallies: dict, alpha: float, costs: StepCosts, ks,
                     kinds=BENCH_KINDS) -> dict:
    tps = t.tokens / t.seconds if t.seconds > 0 else 0.0
    rate = {n: (x.tokens / x.seconds if x.seconds > 0 else 0.0) for n, x in tallies.items()}
    out = {"label": s.label, "k": s.k if s.k is not None else ("adaptive" if s.drafts and s.own else None),
           "calls": t.calls, "tokens": t.tokens, "seconds": t.seconds, "tokens_per_second": tps,
           "vs_ar": _ratio(tps, rate.get("ar")), "vs_hf_generate": _ratio(tps, rate.get("hf_generate")),
           "vs_hf_assisted": _ratio(tps, rate.get("hf_assisted")),
           "vs_ar_ci95": _interval_vs(t, tallies["ar"]),  # over the prompts (ratio_interval)
           "by_kind": by_kind(t, tallies["ar"], kinds)}
    if not s.own:
        return out
    ar = tallies["ar"]
    ar_token_s = ar.decode_seconds / max(ar.tokens, 1)  # seconds per AR decode token
    decode_tps = t.tokens / t.decode_seconds if t.decode_seconds else 0.0
    ar_decode_tps = ar.tokens / ar.decode_seconds if ar.decode_seconds else 0.0
    out.update({"decode_tokens_per_second": decode_tps,
                "decode_speedup": _ratio(decode_tps, ar_decode_tps),  # the decode loops only, no prefill
                "mean_tokens_per_step": t.tokens / t.steps if t.steps else 0.0,
                "syncs_per_step": t.syncs / t.steps if t.steps else 0.0})
    if not s.drafts:
        return out
    mean_k = t.drafted / t.steps if t.steps else 0.0
    out.update({
        "mean_k": mean_k,
        "alpha": alpha_from_steps(t.accepted, t.rejections),  # this system's own steps
        "acceptance_rate": t.accepted / t.drafted if t.drafted else 0.0,
        "c": (t.draft_seconds / t.drafted) / ar_token_s if t.drafted and ar_token_s else None,  # as run
        "draft_seconds_per_token": t.draft_seconds / t.drafted if t.drafted else None,
        "target_seconds_per_step": t.target_seconds / t.steps if t.steps else None,
        "measured_speedup": out["vs_ar"],
    })
    if s.k_max is not None:  # K varies within a step's drafting: Theorem 3.8 has no single K to use
        out["k"] = f"<={s.k_max}"
        return out
    if not s.theorem:  # its own alpha and c, as run: the theorem with the figures this system measured
        v = costs.verify_cost(s.k) if s.k in costs.verify else None
        if out["alpha"] is not None and out["c"] is not None and s.k is not None:
            out["predicted_speedup_own"] = predicted_speedup(out["alpha"], s.k, out["c"], v or 1.0)
        return out
    k_pred = s.k if s.k is not None else optimal_k(alpha, costs.c, 1, max(ks or (8,)))
    v = costs.verify_cost(k_pred) if k_pred in costs.verify else None
    predicted = predicted_speedup(alpha, k_pred, costs.c)
    predicted_v = predicted_speedup(alpha, k_pred, costs.c, v) if v else None
    out.update({
        "predicted_k": k_pred,
        "predicted_tokens_per_step": expected_tokens_per_step(alpha, k_pred),
        "predicted_speedup": predicted,
        "predicted_speedup_with_verify_cost": predicted_v,
        "prediction_error": out["vs_ar"] / predicted - 1.0 if out["vs_ar"] else None,
        # The theorem models the decode loop, and v_K is measured here: the like-for-like comparison
        "decode_prediction_error_with_verify_cost": (out["decode_speedup"] / predicted_v - 1.0
                                                     if out["decode_speedup"] and predicted_v else None),
    })
    return out


def roofline_report(target, ar: Tally, prompt_ids, bandwidth: float, source: str, samples=()) -> dict:
    """The AR decode against the memory wall: bytes it read per token, and the share of bandwidth.
    With `samples` (bandwidth measured between prompts) their median is the denominator."""
    at_start, bandwidth = bandwidth, statistics.median(samples) if samples else bandwidth
    nbytes = target.dtype.itemsize
    weights = streamed_weight_bytes(target.cfg, nbytes)
    # Decode step j of a call reads P + j cached positions; sum over the whole run.
    kv = sum(kv_bytes_read(target.cfg, len(prompt_ids[p]) + (len(new) - 1) / 2, nbytes) * len(new)
             for p, new in zip(ar.call_prompts, ar.outputs))
    tokens = max(ar.tokens, 1)
    per_token = weights + kv / tokens
    tps = ar.tokens / ar.decode_seconds if ar.decode_seconds else 0.0
    return {"bandwidth_bytes_per_s": bandwidth, "bandwidth_at_start": at_start, "bandwidth_source": source,
            "bandwidth_samples": {"n": len(samples), "min": min(samples, default=None),
                                  "max": max(samples, default=None)},
            "weight_bytes": weights,
            "kv_bytes_per_token": kv / tokens, "bytes_per_token": per_token,
            "ar_decode_tokens_per_second": tps, "achieved_bytes_per_s": per_token * tps,
            "fraction_of_bandwidth": roofline_fraction(per_token, tps, bandwidth),
            "ceiling_tokens_per_second": bandwidth / per_token}


def _targets(results, roofline) -> dict:
    """DESIGN.md section 8's figures, each with its target and whether this run met it."""
    out = {}

    def put(name, value, target, at_least=True, ci95=None):
        out[name] = {"value": value, "target": target,
                     "met": None if value is None else (value >= target if at_least else value <= target)}
        if ci95 is not None:
            out[name]["ci95"] = ci95

    for r in results:
        sy = r["systems"]
        spec = [n for n in sy if n.startswith("spec_")]
        if not spec:
            continue
        best = max(spec, key=lambda n: sy[n]["tokens_per_second"])
        tag, bar = f"t{r['temperature']:g}", 2.0 if r["temperature"] == 0 else 1.5
        out[f"{tag}_best_speculative"] = best
        put(f"{tag}_best_speculative_vs_ar", sy[best]["vs_ar"], bar, ci95=sy[best].get("vs_ar_ci95"))
        # The same figure with the shipped distilled draft only (no feature draft, no self-draft)
        shipped = [n for n in spec if not n.startswith(("spec_feat", "spec_self"))]
        if shipped and shipped != spec:
            best_s = max(shipped, key=lambda n: sy[n]["tokens_per_second"])
            out[f"{tag}_best_with_shipped_draft"] = best_s
            put(f"{tag}_best_with_shipped_draft_vs_ar", sy[best_s]["vs_ar"], bar, ci95=sy[best_s].get("vs_ar_ci95"))
        if "hf_assisted" in sy:
            put(f"{tag}_best_speculative_vs_hf_assisted", sy[best]["vs_hf_assisted"], 1.5)
        if "hf_generate" in sy:
            put(f"{tag}_ar_vs_hf_generate", sy["ar"]["vs_hf_generate"], 1.5)
        # Theorem 3.8 predicts fixed-K and adaptive systems only: the fastest of those is compared.
        predicted = [n for n in spec if sy[n].get("prediction_error") is not None]
        if predicted:
            best_p = max(predicted, key=lambda n: sy[n]["tokens_per_second"])
            out[f"{tag}_prediction_error_of"] = best_p
            put(f"{tag}_prediction_error", abs(sy[best_p]["prediction_error"]), 0.15, at_least=False)
            e = sy[best_p].get("decode_prediction_error_with_verify_cost")
            if e is not None:  # the same system, decode loops against the theorem with v_K: reported beside it
                put(f"{tag}_decode_prediction_error_with_v", abs(e), 0.15, at_least=False)
    put("ar_fraction_of_bandwidth", roofline["fraction_of_bandwidth"], 0.6)
    return out


def run_bench(target, draft, cfg: BenchConfig, hf_target=None, hf_draft=None, log=None, feature_draft=None) -> dict:
    """Every system on every prompt at every temperature; returns the JSON document."""
    device = target.device
    clock = Clock(device)
    tok = getattr(target, "tokenizer", None)
    prompt_ids = [encode_prompt(tok, p) for p in BENCH_PROMPTS[:cfg.num_prompts]]
    if log:
        log("measuring memory bandwidth and step costs ...")
    bandwidth, source = machine_bandwidth(device, cfg.quick)
    probe = BandwidthProbe(device)
    context = int(statistics.mean(len(p) for p in prompt_ids) + cfg.max_new_tokens / 2)
    self_draft = make_self_draft(target, log) if cfg.self_draft else None
    ks_timed = sorted(set(cfg.ks) | (set(SELF_KS) if self_draft else set()))  # v_K for the self-draft too
    costs = measure_step_costs(target, draft, ks_timed, context, cfg.cost_reps)
    fixed_c = costs.c if device.type == "cuda" else None  # host clocks misplace GPU time (adaptive.py)
    systems = make_systems(target, draft, cfg.ks, cfg.adaptive, hf_target if cfg.hf else None,
                           hf_draft if cfg.hf else None, fixed_c,
                           {k: costs.verify_cost(k) for k in costs.verify}, cfg.refinements, feature_draft,
                           self_draft)
    results, ar_all = [], Tally()
    for temperature in cfg.temperatures:
        tallies = run_systems(systems, prompt_ids, cfg, temperature, clock, log, probe)
        ar = tallies["ar"]
        alpha, positions = teacher_forced_alpha(target, draft, [(prompt_ids[p], new) for p, new in
                                                                zip(ar.call_prompts, ar.outputs)], temperature)
        sy = {s.name: summarize_system(s, tallies[s.name], tallies, alpha, costs, cfg.ks) for s in systems}
        if temperature == 0:  # greedy speculative decoding must reproduce greedy decoding
            for name, t in tallies.items():
                sy[name]["same_output_as_ar"] = sum(a == b for a, b in zip(t.outputs, ar.outputs)) / len(ar.outputs)
        results.append({"temperature": temperature, "samples_per_prompt": len(seeds_for(cfg, temperature, 0)),
                        "alpha": alpha, "alpha_positions": positions, "systems": sy})
        for f in ("tokens", "decode_seconds"):
            setattr(ar_all, f, getattr(ar_all, f) + getattr(ar, f))
        ar_all.outputs += ar.outputs
        ar_all.call_prompts += ar.call_prompts
    rf = roofline_report(target, ar_all, prompt_ids, bandwidth, source, probe.samples)
    del probe
    from datetime import datetime, timezone
    return {
        "measured_at": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "config": asdict(cfg),
        "machine": {"device": str(device), "device_name": _device_name(device),
                    "threads": torch.get_num_threads(), "dtype": str(target.dtype).replace("torch.", "")},
        "models": {"target": _model_info(target), "draft": _model_info(draft),
                   "feature_draft": None if feature_draft is None else _feature_draft_info(feature_draft),
                   "self_draft": None if self_draft is None else self_draft.weights},
        "costs": {"context": costs.context, "target_forward_seconds": costs.target_forward,
                  "draft_forward_seconds": costs.draft_forward, "c": costs.c,
                  "verify_seconds": costs.verify, "verify_cost": {k: costs.verify_cost(k) for k in costs.verify}},
        "roofline": rf,
        "results": results,
        "targets": _targets(results, rf),
    }


def make_self_draft(target, log=None):
    """SelfDraft(target) in 4 bits where the kernels and the model's shapes allow, else in int8
    (self_draft.best_weights); None (with a line to `log`) where the kernels cannot run it."""
    try:
        return SelfDraft(target, best_weights(target))
    except ValueError as e:
        if log:
            log(f"no self-draft systems: {e}")
        return None


def _model_info(m) -> dict:
    return {"params": m.cfg.num_params, "layers": m.cfg.n_layers, "dim": m.cfg.dim, "vocab": m.cfg.vocab_size,
            "head_columns": m.head.weight.shape[1],  # fewer than vocab: a VocabSubsetHead
            "dtype": str(m.dtype).replace("torch.", "")}


def _feature_draft_info(m) -> dict:
    return {"params": sum(v.numel() for v in m.own_state_dict().values()), "layers": m.cfg.n_layers,
            "dim": m.cfg.dim, "head_columns": len(m.body.head.ids), "dtype": str(m.dtype).replace("torch.", "")}


def _device_name(device) -> str:
    if torch.device(device).type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({os.cpu_count()} cores)"


# ----------------------------------------------------------------------------- the table


def _f(x, spec):
    """format(x, spec), or a dash as wide as the spec when there is no value."""
    if x is None:
        width = spec.split(".")[0]
        return "-".rjust(int(width)) if width.isdigit() else "-"
    return format(x, spec)


def format_table(doc) -> str:
    m, c, rf = doc["machine"], doc["costs"], doc["roofline"]
    mt, md, mf = doc["models"]["target"], doc["models"]["draft"], doc["models"].get("feature_draft")
    feature = f", feature draft {mf['params'] / 1e6:.1f}M" if mf else ""
    if doc["models"].get("self_draft"):
        feature += f", self-draft {doc['models']['self_draft']} (pred+v from its own alpha and c)"
    rows = [f"{m['device_name']}, {m['threads']} threads, {m['dtype']}; target {mt['params'] / 1e6:.0f}M "
            f"params, draft {md['params'] / 1e6:.1f}M{feature}; {doc['config']['num_prompts']} prompts, "
            f"up to {doc['config']['max_new_tokens']} new tokens each",
            f"step costs at {c['context']} cached tokens: target {c['target_forward_seconds'] * 1e3:.2f} ms, "
            f"draft {c['draft_forward_seconds'] * 1e3:.2f} ms, c = {c['c']:.3f}; verify K+1 over 1 token: "
            + " ".join(f"K{k}:{v:.2f}" for k, v in c["verify_cost"].items())]
    head = (f"{'system':30s} {'tok/s':>7s} {'vs AR':>6s} {'95% CI':>9s} {'vs HF':>6s} {'vs asst':>7s} "
            f"{'K':>4s} {'alpha':>6s} {'tok/step':>8s} {'c':>6s} {'pred':>5s} {'pred+v':>6s} {'meas':>5s} {'loop':>5s}")
    for r in doc["results"]:
        n = r.get("samples_per_prompt", 1)
        drawn = f"; {n} samples per prompt" if n > 1 else ""
        rows += ["", f"temperature {r['temperature']:g}: alpha = {r['alpha']:.3f} (teacher-forced, "
                     f"{r['alpha_positions']} positions){drawn}", head]
        for s in r["systems"].values():
            ci = s.get("vs_ar_ci95")
            ci = f"{ci[0]:.2f}-{ci[1]:.2f}" if ci else "-"
            rows.append(f"{s['label']:30s} {s['tokens_per_second']:7.1f} {_f(s['vs_ar'], '6.2f')} {ci:>9s} "
                        f"{_f(s['vs_hf_generate'], '6.2f')} {_f(s['vs_hf_assisted'], '7.2f')} "
                        f"{_f(s.get('mean_k'), '4.1f')} "
                        f"{_f(s.get('alpha'), '6.3f')} {_f(s.get('mean_tokens_per_step'), '8.2f')} "
                        f"{_f(s.get('c'), '6.3f')} {_f(s.get('predicted_speedup'), '5.2f')} "
                        f"{_f(s.get('predicted_speedup_with_verify_cost', s.get('predicted_speedup_own')), '6.2f')} "
                        f"{_f(s.get('measured_speedup'), '5.2f')} "
                        f"{_f(s.get('decode_speedup'), '5.2f')}")
        kinds = list(next(iter(r["systems"].values()))["by_kind"])
        rows += ["", "speedup over AR by kind of prompt" + " " * 2 + "".join(f"{k:>9s}" for k in kinds)]
        for name, s in r["systems"].items():
            if name != "ar":
                rows.append(f"  {s['label']:33s}" + "".join(_f(s["by_kind"][k]["vs_ar"], "9.2f") for k in kinds))
    bw = rf["bandwidth_samples"]
    spread = f"{bw['min'] / 1e9:.1f}-{bw['max'] / 1e9:.1f}" if bw["n"] else "-"
    rows += ["", f"roofline: memory read bandwidth {rf['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s (median of "
                 f"{bw['n']} samples between prompts, {spread}; {rf['bandwidth_at_start'] / 1e9:.1f} at the start "
                 f"by {rf['bandwidth_source']});\n  AR decode reads {rf['bytes_per_token'] / 1e6:.0f} MB/token "
                 f"at {rf['ar_decode_tokens_per_second']:.1f} tokens/s = {rf['achieved_bytes_per_s'] / 1e9:.1f} GB/s, "
                 f"{100 * rf['fraction_of_bandwidth']:.0f}% of it "
                 f"(ceiling {rf['ceiling_tokens_per_second']:.0f} tokens/s)"]
    rows.append("targets (DESIGN.md section 8; the best speculative system per temperature):")
    for n, v in doc["targets"].items():
        if isinstance(v, dict):
            rel = "<=" if "prediction_error" in n else ">="
            ci = f"  (95% over prompts: {v['ci95'][0]:.2f}-{v['ci95'][1]:.2f})" if v.get("ci95") else ""
            rows.append(f"  {n:45s} {_f(v['value'], '6.2f')}  target {rel} {v['target']:<5}"
                        f"{'met' if v['met'] else 'NOT met'}{ci}")
        else:
            rows.append(f"  {n:45s} {v}")
    rows.append("pred: Theorem 3.8 of arXiv 2211.17192 from alpha and c; pred+v: with the measured cost of "
                "verifying K+1 tokens; meas: measured speedup over this engine's autoregressive decode, prefill "
                "included; loop: the same, decode loops only; 95% CI: a paired bootstrap of vs AR over the prompts")
    return "\n".join(rows)


# ----------------------------------------------------------------------------- GPU: syncs and synthetic pairs


def count_cuda_syncs(fn):
    """(fn(), n): the host synchronisations CUDA reports while fn runs (torch's sync debug
    mode warns at each one: .item(), .tolist(), a blocking copy). n is None without CUDA."""
    if not torch.cuda.is_available():
        return fn(), None
    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            out = fn()
        finally:
            torch.cuda.set_sync_debug_mode(previous)
    return out, sum("synchroniz" in str(w.message) for w in caught)


def cuda_syncs_per_step(target, draft, ids, k=4, max_new_tokens=32) -> dict:
    """Syncs per speculative step: as the engine counts them, and as CUDA reports them."""
    engine = SpeculativeEngine(target, draft, k=k)
    engine.generate(ids, max_new_tokens=8)  # warm-up
    res, n = count_cuda_syncs(lambda: engine.generate(ids, max_new_tokens=max_new_tokens))
    steps = max(res.stats.steps, 1)
    return {"k": k, "steps": res.stats.steps, "engine_counted_syncs_per_step": res.stats.syncs_per_step,
            "cuda_reported_syncs_per_step": None if n is None else n / steps}


def _llama(vocab, dim, layers, heads, kv_heads, inter, theta, tie):
    return ModelConfig(vocab_size=vocab, dim=dim, n_layers=layers, n_heads=heads, n_kv_heads=kv_heads,
                       head_dim=dim // heads, intermediate_size=inter, rope_theta=theta, max_seq_len=8192,
                       tie_embeddings=tie, eos_token_ids=())  # no EOS: random weights would stop anywhere


# Real shapes (from the models' config.json): target, draft.
SYNTHETIC = {
    "llama3-8b": (_llama(128256, 4096, 32, 32, 8, 14336, 500000.0, False),  # Llama-3-8B
                  _llama(128256, 2048, 16, 32, 8, 8192, 500000.0, True)),  # Llama-3.2-1B
    "smollm2-1.7b": (_llama(49152, 2048, 24, 32, 32, 8192, 130000.0, True),  # SmolLM2-1.7B
                     _llama(49152, 576, 30, 9, 3, 1536, 100000.0, True)),  # SmolLM2-135M
}


@torch.no_grad()
def random_model(cfg: ModelConfig, device, dtype=torch.bfloat16, seed=0, std=0.02):
    """A Transformer with random weights made directly on the device (init_weights draws
    on the host, which for 8B parameters takes minutes and 32 GB of host memory)."""
    from .model import Transformer, rope_table
    with torch.device("meta"):
        model = Transformer(cfg).to(dtype)
    model = model.to_empty(device=device)
    g = torch.Generator(device=device).manual_seed(seed)
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            p.fill_(1.0)
        else:
            p.normal_(0.0, std, generator=g)
    cos, sin = rope_table(cfg)  # to_empty left the buffers uninitialised
    model.rope_cos, model.rope_sin = cos.to(device), sin.to(device)
    return model.eval().requires_grad_(False)


def run_synthetic(preset, device="cuda", dtype=torch.bfloat16, ks=tuple(range(1, 9)), prompt_len=128,
                  max_new_tokens=128, reps=20, alphas=(0.6, 0.7, 0.8, 0.9), allow_cpu=False, log=None) -> dict:
    """Step costs, c, the AR decode's bandwidth fraction and syncs per step of a random-weight
    pair of real shapes. `preset` is a SYNTHETIC key or a (target_cfg, draft_cfg) pair.
    Random weights make alpha meaningless, so speedups are predicted over a range of alpha."""
    device = torch.device(device)
    if device.type != "cuda" and not allow_cpu:
        raise ValueError(f"--synthetic is GPU-only (it builds multi-billion-parameter models); "
                         f"device {str(device)!r} is not CUDA")
    if isinstance(preset, str) and preset not in SYNTHETIC:
        raise ValueError(f"synthetic preset must be one of {sorted(SYNTHETIC)}, got {preset!r}")
    tcfg, dcfg = SYNTHETIC[preset] if isinstance(preset, str) else preset
    if log:
        log("building random-weight models on the device ...")
    target, draft = random_model(tcfg, device, dtype, 0), random_model(dcfg, device, dtype, 1)
    bandwidth = measure_read_bandwidth(device)
    costs = measure_step_costs(target, draft, ks, prompt_len + max_new_tokens // 2, reps)
    ids = torch.randint(0, tcfg.vocab_size, (prompt_len,), generator=torch.Generator().manual_seed(0)).tolist()
    autoregressive_generate(target, ids, max_new_tokens=8)  # warm-up
    clock, ar = Clock(device), Tally()
    t0 = clock()
    res = autoregressive_generate(target, ids, max_new_tokens=max_new_tokens)
    ar.add(ids, res.tokens, clock() - t0, res.stats, res.steps)
    syncs = cuda_syncs_per_step(target, draft, ids, k=min(4, max(ks)), max_new_tokens=min(32, max_new_tokens))
    predictions = {f"{a:g}": {k: {"speedup": predicted_speedup(a, k, costs.c),
                                  "speedup_with_verify_cost": predicted_speedup(a, k, costs.c, costs.verify_cost(k))}
                              for k in ks} for a in alphas}
    return {
        "synthetic": preset if isinstance(preset, str) else "custom",
        "machine": {"device": str(device), "device_name": _device_name(device),
                    "dtype": str(dtype).replace("torch.", "")},
        "models": {"target": _model_info(target), "draft": _model_info(draft)},
        "costs": {"context": costs.context, "target_forward_seconds": costs.target_forward,
                  "draft_forward_seconds": costs.draft_forward, "c": costs.c, "verify_seconds": costs.verify,
                  "verify_cost": {k: costs.verify_cost(k) for k in ks}},
        "roofline": roofline_report(target, ar, [ids], bandwidth, "bench.measure_read_bandwidth (sum)"),
        "syncs": syncs,
        "predicted": predictions,
    }


def format_synthetic(doc) -> str:
    c, rf, m = doc["costs"], doc["roofline"], doc["models"]
    rows = [f"synthetic {doc['synthetic']} on {doc['machine']['device_name']} ({doc['machine']['dtype']}): target "
            f"{m['target']['params'] / 1e9:.2f}B params, draft {m['draft']['params'] / 1e9:.2f}B",
            f"step costs at {c['context']} cached tokens: target {c['target_forward_seconds'] * 1e3:.2f} ms, "
            f"draft {c['draft_forward_seconds'] * 1e3:.2f} ms, c = {c['c']:.3f}",
            "verify K+1 tokens over 1: " + " ".join(f"K{k}:{v:.2f}" for k, v in c["verify_cost"].items()),
            f"AR decode {rf['ar_decode_tokens_per_second']:.1f} tokens/s x "
            f"{rf['bytes_per_token'] / 1e9:.2f} GB/token = "
            f"{rf['achieved_bytes_per_s'] / 1e9:.0f} GB/s, {100 * rf['fraction_of_bandwidth']:.0f}% of the measured "
            f"{rf['bandwidth_bytes_per_s'] / 1e9:.0f} GB/s",
            f"host syncs per speculative step (K={doc['syncs']['k']}): engine counts "
            f"{doc['syncs']['engine_counted_syncs_per_step']:.2f}, CUDA reports "
            f"{_f(doc['syncs']['cuda_reported_syncs_per_step'], '.2f')}",
            "predicted speedup (Theorem 3.8 / with measured verify cost):"]
    for a, per_k in doc["predicted"].items():
        rows.append(f"  alpha {a}: " + " ".join(f"K{k}:{v['speedup']:.2f}/{v['speedup_with_verify_cost']:.2f}"
                                               for k, v in per_k.items()))
    return "\n".join(rows)


# ----------------------------------------------------------------------------- the command line


def _parse_list(text, kind, name):
    """'1-8' or '1,2,4' (ints), '0,0.7' (floats)."""
    try:
        if kind is int and "-" in text:
            lo, hi = text.split("-")
            return tuple(range(int(lo), int(hi) + 1))
        return tuple(kind(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"{name} must be a comma list like 1,2,4 (or a range 1-8 for ks), got {text!r}") from None


@torch.no_grad()
def compare_caches(target, draft, prompts, k=4, max_new_tokens=64, block_size=16, reps=2) -> dict:
    """The same speculative decode on the contiguous and the paged cache, interleaved per prompt:
    target tokens per second on each (target forward seconds only) and whether the outputs agree."""
    engines = {kind: SpeculativeEngine(target, draft, k=k, cache=kind, block_size=block_size)
               for kind in ("contiguous", "paged")}
    rates, same = {kind: [] for kind in engines}, True
    for _ in range(reps):
        for prompt in prompts:
            outs = {}
            for kind, engine in engines.items():
                res = engine.generate(prompt, max_new_tokens=max_new_tokens)
                rates[kind].append(res.stats.new_tokens / res.stats.target_seconds)
                outs[kind] = res.tokens
            same &= outs["contiguous"] == outs["paged"]
    med = {kind: statistics.median(v) for kind, v in rates.items()}
    return {"k": k, "block_size": block_size, "prompts": len(prompts), "max_new_tokens": max_new_tokens,
            "tokens_per_second": med, "contiguous_over_paged": med["contiguous"] / med["paged"],
            "same_outputs": same}


@torch.inference_mode()
def profile_decode(target, context=100, steps=30, bandwidth=None) -> dict:
    """Where one autoregressive decode token's time goes: torch.profiler over `steps` one-token
    forwards at `context` cached positions, split into matrix products (aten::mm, addmm, oneDNN's
    linear and the panel kernel) and everything else, and the rate at which the products stream
    the weights against the machine's read bandwidth. The profile is of the eager forward
    (model.FUSED_FORWARD off): torch.profiler cannot see inside the fused forward's one call.
    Both forwards are then timed without the profiler, interleaved, best of `steps` each:
    eager_seconds and fused_seconds (None where the fused forward does not apply)."""
    from torch.profiler import ProfilerActivity, profile
    from .kv_cache import KVCache
    from .roofline import best_seconds
    device = target.device
    cache = KVCache.for_model(target.cfg, context + 8, dtype=target.dtype, device=device)
    target(torch.randint(0, target.cfg.vocab_size, (1, context), device=device), cache=cache)
    tok = torch.zeros(1, 1, dtype=torch.long, device=device)

    def one_token():
        target(tok, cache=cache, last_only=True)
        cache.rollback(context)

    def timed(fused: bool) -> float:
        was, model_module.FUSED_FORWARD = model_module.FUSED_FORWARD, fused
        try:
            return best_seconds(one_token, 1, device)
        finally:
            model_module.FUSED_FORWARD = was

    for _ in range(3):  # warm-up
        one_token()
    was, model_module.FUSED_FORWARD = model_module.FUSED_FORWARD, False
    kernels.RECORD = True
    try:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(steps):
                one_token()
    finally:
        kernels.RECORD, model_module.FUSED_FORWARD = False, was
    fusable = model_module.fused_forward(target, tok, cache, None, None, None) is not None
    eager, fused = [], []
    for _ in range(steps):  # interleaved, so that both see the same machine
        eager.append(timed(False))
        if fusable:
            fused.append(timed(True))
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events) / steps / 1e6  # seconds per token
    products = sum(e.self_cpu_time_total for e in events
                   if e.key in ("aten::mm", "aten::addmm", "mkldnn::_linear_pointwise", kernels.RECORD_NAME)
                   ) / steps / 1e6
    weight_bytes = streamed_weight_bytes(target.cfg, target.dtype.itemsize)
    bandwidth = bandwidth or machine_bandwidth(device)[0]
    return {"context": context, "steps": steps, "seconds_per_token": total, "product_seconds": products,
            "other_seconds": total - products, "product_share": products / total if total else 0.0,
            "weight_bytes": weight_bytes, "product_bytes_per_s": weight_bytes / products if products else 0.0,
            "bandwidth_bytes_per_s": bandwidth,
            "product_fraction_of_bandwidth": weight_bytes / products / bandwidth if products else 0.0,
            "eager_seconds": min(eager), "fused_seconds": min(fused) if fused else None}


def format_profile(doc) -> str:
    text = (f"eager decode token at {doc['context']} cached positions ({doc['steps']} steps under torch.profiler): "
            f"{doc['seconds_per_token'] * 1e3:.1f} ms; matrix products {doc['product_seconds'] * 1e3:.1f} ms "
            f"({doc['product_share']:.0%}), everything else {doc['other_seconds'] * 1e3:.1f} ms\n"
            f"the products stream {doc['weight_bytes'] / 1e6:.0f} MB of weights at "
            f"{doc['product_bytes_per_s'] / 1e9:.1f} GB/s = {doc['product_fraction_of_bandwidth']:.0%} of the "
            f"measured read bandwidth ({doc['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s)\n"
            f"without the profiler, best of {doc['steps']}: eager forward {doc['eager_seconds'] * 1e3:.1f} ms")
    if doc["fused_seconds"] is not None:
        text += (f", fused forward (one call) {doc['fused_seconds'] * 1e3:.1f} ms = "
                 f"{doc['weight_bytes'] / doc['fused_seconds'] / 1e9:.1f} GB/s of weights "
                 f"({doc['eager_seconds'] / doc['fused_seconds']:.2f}x faster)")
    return text


@torch.inference_mode()
def compare_kernels(target, rows=(1, 5), reps=5) -> dict:
    """Each kind of the target's matrix products (all layers' matrices of that kind in turn, so
    they stream from memory as in a forward) through each float32 CPU kernel Linear can use:
    PyTorch's `x @ W`, oneDNN's prepacked product and the panel kernel. GB/s of weight read,
    best of `reps`, the kernels interleaved within each repetition."""
    from .model import Linear
    groups = {}
    for name, mod in target.named_modules():
        if isinstance(mod, Linear) and mod.weight.dtype == torch.float32:
            groups.setdefault(name.split(".")[-1], []).append(mod)
    systems = {"torch": lambda m, x: x @ m.weight}
    if model_module._HAVE_PACKING:
        systems["onednn"] = lambda m, x: torch.ops.mkldnn._linear_pointwise(x, m.packed_weight(), None, "none",
                                                                             [None], "")
    if kernels.available():
        systems["panel"] = lambda m, x: kernels.matmul(x, m.panel_weight(), m.weight.shape[1])
    out = {}
    for kind, mods in groups.items():
        K, N = mods[0].weight.shape
        nbytes = sum(m.weight.numel() * 4 for m in mods)
        for r in rows:
            x = torch.randn(r, K)
            best = {s: float("inf") for s in systems}
            for _ in range(reps + 1):  # the first round builds the packed copies and warms up
                for s, f in systems.items():
                    t0 = time.perf_counter()
                    for m in mods:
                        f(m, x)
                    best[s] = min(best[s], time.perf_counter() - t0)
            out[f"{kind} {K}x{N}, {r} row{'s' if r > 1 else ''}"] = {
                "matrices": len(mods), "bytes": nbytes, "rows": r,
                "gb_per_s": {s: nbytes / t / 1e9 for s, t in best.items()}}
    return {"threads": torch.get_num_threads(), "reps": reps, "products": out}


def format_kernels(doc) -> str:
    systems = list(next(iter(doc["products"].values()))["gb_per_s"])
    lines = [f"weight read rate, GB/s (best of {doc['reps']}, {doc['threads']} thread(s))",
             f"{'product':32s} " + " ".join(f"{s:>8s}" for s in systems)]
    for name, p in doc["products"].items():
        lines.append(f"{name:32s} " + " ".join(f"{p['gb_per_s'][s]:8.1f}" for s in systems))
    return "\n".join(lines)


# A workload whose acceptance changes: chat answers and code, alternating (DESIGN.md section 6).
POLICY_WORKLOAD = (BENCH_PROMPTS[0], BENCH_PROMPTS[6], BENCH_PROMPTS[1], BENCH_PROMPTS[7])


def compare_policies(target, draft, prompts=POLICY_WORKLOAD, ks=(1, 2, 3, 4, 8), temperature=1.0,
                     max_new_tokens=64, reps=3, verify_cost=None, log=None) -> dict:
    """Fixed K against the adaptive controllers on one workload served in order by one engine per
    policy (a controller's estimates carry from request to request). Repetitions interleave the
    policies, rotating who goes first; tokens/s is the median over repetitions of the workload's
    generated tokens over its wall time. Request i runs with seed i under every policy."""
    from .adaptive import ThresholdController
    if verify_cost is None:
        ctx = int(statistics.mean(len(encode_prompt(target.tokenizer, p)) for p in prompts) + max_new_tokens / 2)
        costs = measure_step_costs(target, None, range(min(ks), max(ks) + 1), ctx, reps=10)  # every K it may pick
        verify_cost = {k: costs.verify_cost(k) for k in costs.verify}
    policies = {f"K={k}": (k, None) for k in ks}
    k_start = min(max(ks), 4)
    policies["cost-aware"] = (k_start, CostAwareController(k_min=min(ks), k_max=max(ks), k_start=k_start,
                                                           verify_cost=verify_cost))
    policies["threshold"] = (max(ks), ThresholdController(k_min=min(ks), k_max=max(ks)))
    engines = {}
    for name, (k, ctl) in policies.items():
        engines[name] = SpeculativeEngine(target, draft, k=k)
        engines[name].controller = ctl
    clock = Clock(target.device)
    for engine in engines.values():  # warm-up, untimed
        engine.generate(prompts[0], max_new_tokens=8, temperature=temperature, seed=0)
    rates, per_step, mean_k = ({n: [] for n in policies} for _ in range(3))
    names = list(policies)
    for rep in range(reps):
        for name in names[rep % len(names):] + names[:rep % len(names)]:
            engine, t0, tokens, steps, drafted = engines[name], clock(), 0, 0, 0
            for i, prompt in enumerate(prompts):
                res = engine.generate(prompt, max_new_tokens=max_new_tokens, temperature=temperature, seed=i)
                tokens, steps, drafted = tokens + res.stats.new_tokens, steps + res.stats.steps, drafted + res.stats.drafted
            rates[name].append(tokens / (clock() - t0))
            per_step[name].append(tokens / steps)
            mean_k[name].append(drafted / steps)
        if log:
            log(f"policies: repetition {rep + 1}/{reps} done")
    med = {n: statistics.median(v) for n, v in rates.items()}
    fixed = {n: v for n, v in med.items() if n.startswith("K=")}
    best = max(fixed, key=fixed.get)
    return {"temperature": temperature, "max_new_tokens": max_new_tokens, "reps": reps, "prompts": list(prompts),
            "verify_cost": verify_cost, "tokens_per_second": med,
            "tokens_per_step": {n: statistics.median(v) for n, v in per_step.items()},
            "mean_k": {n: statistics.median(v) for n, v in mean_k.items()},
            "best_fixed": best, "cost_aware_vs_best_fixed": med["cost-aware"] / fixed[best],
            "cost_aware_vs_k_max": med["cost-aware"] / med[f"K={max(ks)}"],
            "threshold_vs_best_fixed": med["threshold"] / fixed[best]}


def format_policies(doc) -> str:
    lines = [f"workload: {len(doc['prompts'])} requests in order, temperature {doc['temperature']:g}, "
             f"{doc['max_new_tokens']} new tokens each; median of {doc['reps']} interleaved repetitions",
             f"{'policy':12s} {'tokens/s':>9s} {'tok/step':>9s} {'mean K':>7s}"]
    for n, v in doc["tokens_per_second"].items():
        lines.append(f"{n:12s} {v:9.2f} {doc['tokens_per_step'][n]:9.2f} {doc['mean_k'][n]:7.2f}")
    lines.append(f"cost-aware / best fixed ({doc['best_fixed']}) = {doc['cost_aware_vs_best_fixed']:.3f}; "
                 f"cost-aware / K={max(int(n[2:]) for n in doc['tokens_per_second'] if n.startswith('K='))} = "
                 f"{doc['cost_aware_vs_k_max']:.2f}; threshold / best fixed = {doc['threshold_vs_best_fixed']:.3f}")
    return "\n".join(lines)


def bench_main(args, out=print, err=None):
    """`python -m specdec_lab bench`: the table (unless --json), then the JSON document as the last line."""
    import json
    import sys
    err = err or (lambda s: print(s, file=sys.stderr, flush=True))
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads must be >= 1, got {args.threads}")
    torch.set_num_threads(args.threads or os.cpu_count())
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype) if args.dtype else (torch.bfloat16 if device.type == "cuda" else torch.float32)
    if getattr(args, "caches", False):
        cfg = BenchConfig(**{**(QUICK if args.quick else {}), **_overrides(args)})
        target, draft, _, _ = load_systems_models(args, device, dtype, False, err)
        doc = compare_caches(target, draft, list(BENCH_PROMPTS[:cfg.num_prompts]), max_new_tokens=cfg.max_new_tokens)
        text = (f"contiguous {doc['tokens_per_second']['contiguous']:.2f} vs paged "
                f"{doc['tokens_per_second']['paged']:.2f} target tokens/s (K={doc['k']}, P={doc['block_size']}): "
                f"contiguous / paged = {doc['contiguous_over_paged']:.3f}; same outputs: {doc['same_outputs']}")
    elif getattr(args, "kernels", False):
        target, _, _, _ = load_systems_models(args, device, dtype, False, err)
        doc = compare_kernels(target, reps=2 if args.quick else 5)
        text = format_kernels(doc)
    elif getattr(args, "profile", False):
        target, _, _, _ = load_systems_models(args, device, dtype, False, err)
        doc = profile_decode(target)
        text = format_profile(doc)
    elif getattr(args, "policies", False):
        cfg = BenchConfig(**{**(QUICK if args.quick else {}), **_overrides(args)})
        target, draft, _, _ = load_systems_models(args, device, dtype, False, err)
        temps = _parse_list(args.temperatures, float, "--temperatures") if args.temperatures else (1.0,)
        ks = _parse_list(args.ks, int, "--ks") if args.ks else (1, 2, 3, 4, 8)
        doc = compare_policies(target, draft, ks=ks, temperature=temps[0],
                               max_new_tokens=args.max_new_tokens or (16 if args.quick else 64),
                               reps=1 if args.quick else 3, log=err)
        text = format_policies(doc)
    elif args.synthetic:
        ks = _parse_list(args.ks, int, "--ks") if args.ks else tuple(range(1, 9))
        doc = run_synthetic(args.synthetic, device, dtype, ks, max_new_tokens=args.max_new_tokens or 128, log=err)
        text = format_synthetic(doc)
    else:
        cfg = BenchConfig(**{**(QUICK if args.quick else {}), **_overrides(args)})
        target, draft, hf_target, hf_draft = load_systems_models(args, device, dtype, cfg.hf, err)
        doc = run_bench(target, draft, cfg, hf_target, hf_draft, log=err,
                        feature_draft=load_bench_feature_draft(args, target, err))
        if device.type == "cuda":
            doc["gpu"] = cuda_syncs_per_step(target, draft, encode_prompt(target.tokenizer, BENCH_PROMPTS[0]))
        text = format_table(doc)
    if not args.json:
        out(text)
    out(json.dumps(doc))


def _overrides(args) -> dict:
    o = {}
    if args.prompts is not None:
        o["num_prompts"] = args.prompts
    if args.max_new_tokens is not None:
        o["max_new_tokens"] = args.max_new_tokens
    if args.temperatures:
        o["temperatures"] = _parse_list(args.temperatures, float, "--temperatures")
    if args.ks:
        o["ks"] = _parse_list(args.ks, int, "--ks")
    if args.no_hf:
        o["hf"] = False
    if args.no_adaptive:
        o["adaptive"] = False
    if getattr(args, "no_refinements", False):
        o["refinements"] = False
    if getattr(args, "no_self_draft", False):
        o["self_draft"] = False
    if getattr(args, "samples", None) is not None:
        o["samples"] = args.samples
    return o


def load_systems_models(args, device, dtype, with_hf, log):
    """(target, draft, hf_target, hf_draft): ours from the same folders transformers loads."""
    from .assets import ensure_default_target
    from .pair import default_draft_dir, load_model_cached, with_vocab_subset
    target_src = args.target or ensure_default_target()
    draft_src = args.draft or default_draft_dir()
    if not args.draft and not (default_draft_dir() / "model.safetensors").exists():
        raise ValueError(f"the shipped draft is missing from {default_draft_dir()}; pass --draft-dir FOLDER")
    log(f"loading target {target_src} and draft {draft_src} ...")
    target = load_model_cached(target_src, device, dtype)
    if _is_hf_folder(draft_src):
        draft = with_vocab_subset(load_draft(draft_src, device, dtype), draft_src)
    else:
        draft = load_model_cached(draft_src, device, dtype)
    if draft.cfg.vocab_size != target.cfg.vocab_size:
        raise ValueError(f"draft vocabulary ({draft.cfg.vocab_size}) differs from the target's "
                         f"({target.cfg.vocab_size}); the draft must share the target's tokenizer")
    hf_target = hf_draft = None
    if with_hf:
        from .weights import load_hf_causal_lm, load_hf_model
        hf_target = load_hf_model(target_src, dtype=dtype)[0].to(device)
        hf_draft = load_hf_causal_lm(draft_src, device=device, dtype=dtype)
    return target, draft, hf_target, hf_draft


def load_bench_feature_draft(args, target, log):
    """The feature draft the bench runs: --feature-draft FOLDER, else for the default target
    distill-features' output where it exists, else the shipped one; None with --no-feature-draft,
    or for another target."""
    from .feature_draft import find_feature_draft_dir, load_feature_draft
    if getattr(args, "no_feature_draft", False):
        return None
    folder = getattr(args, "feature_draft", None)
    if folder is None:
        if args.target or not (find_feature_draft_dir() / "model.safetensors").exists():
            return None
        folder = find_feature_draft_dir()
    log(f"loading feature draft {folder} ...")
    return load_feature_draft(target, folder)


def _is_hf_folder(source) -> bool:
    path = Path(os.path.expanduser(str(source)))
    return (path / "config.json").exists() and (path / "model.safetensors").exists()


def load_draft(folder, device="cpu", dtype=torch.float32):
    """A draft from a Hugging Face folder that holds no tokenizer (save_draft writes none):
    the draft shares the target's, so only the weights are read."""
    import json
    from safetensors.torch import load_file
    from .weights import build_model, config_from_hf, from_hf_state_dict
    folder = Path(os.path.expanduser(str(folder)))
    cfg = config_from_hf(json.loads((folder / "config.json").read_text()))
    sd = load_file(str(folder / "model.safetensors"))
    if cfg.tie_embeddings:
        sd.pop("lm_head.weight", None)
    return build_model(cfg, from_hf_state_dict(sd, cfg), device, dtype)
