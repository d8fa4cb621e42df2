"""Benchmarks: this engine against transformers, and the predicted speedup against the measured one.

Contract: `run_bench(target, draft, BenchConfig(...))` returns one JSON-ready dict;
`report.format_table(doc)` renders it. `python -m specdec_lab bench` (main.py) prints
the table, then the dict as one JSON document on the last line.

How the figures are made:
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
  draft's head over its frequent tokens, api.with_vocab_subset); transformers'
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

gpu.py's `run_synthetic` (GPU only) builds random-weight models of real shapes on
the device to measure step costs, c and the bandwidth fraction where no weights can
be downloaded; probes.py holds the smaller side-by-side measurements.
"""

import os
import statistics
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

import torch

from ..analysis.roofline import bytes_per_token, expected_speedup, expected_tokens_per_step, optimal_k
from ..analysis.timing import BandwidthProbe, Clock
from ..core.sampling import logits_to_probs
from ..core.text import encode_prompt
from ..cpu import SelfDraft, best_weights
from ..train.acceptance import StepCosts, measure_step_costs
from ..train.handwritten import HANDWRITTEN_KINDS, HANDWRITTEN_PROMPTS
from ..train.prompts import BENCH_KINDS, BENCH_PROMPTS
from .systems import SELF_KS, System, Tally, make_systems


def alpha_from_steps(accepted: int, rejections: int) -> float | None:
    """The maximum-likelihood alpha of truncated geometric observations: each step
    accepted n drafts and ended with one rejection if n < K. None with no data."""
    trials = accepted + rejections
    return accepted / trials if trials else None


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


PROMPT_SETS = {"bench": BENCH_PROMPTS, "held-out": HANDWRITTEN_PROMPTS}
PROMPT_KINDS = {"bench": BENCH_KINDS, "held-out": HANDWRITTEN_KINDS}  # the kind of each prompt, for by_kind


@dataclass
class BenchConfig:
    num_prompts: int | None = None  # the first N of the prompt set (default: all of it)
    prompt_set: str = "bench"  # bench: BENCH_PROMPTS; held-out: the hand-written prompts (train/handwritten.py)
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
        if self.prompt_set not in PROMPT_SETS:
            raise ValueError(f"prompt_set must be one of {', '.join(PROMPT_SETS)}, got {self.prompt_set!r}")
        n = len(PROMPT_SETS[self.prompt_set])
        if self.num_prompts is not None and not 1 <= self.num_prompts <= n:
            raise ValueError(f"num_prompts must be in [1, {n}] for the {self.prompt_set} prompts, "
                             f"got {self.num_prompts!r}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens!r}")
        if not self.temperatures or any(t < 0 for t in self.temperatures):
            raise ValueError(f"temperatures must be numbers >= 0, got {self.temperatures!r}")
        if any(not 1 <= k <= 16 for k in self.ks):
            raise ValueError(f"ks must lie in [1, 16], got {self.ks!r}")
        if isinstance(self.samples, bool) or not isinstance(self.samples, int) or not 1 <= self.samples <= 100:
            raise ValueError(f"samples must be an int in [1, 100], got {self.samples!r}")


    def prompts(self) -> list:
        """The prompt texts this configuration runs."""
        return list(PROMPT_SETS[self.prompt_set][:self.num_prompts])


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
        "accepted_share": t.accepted / t.drafted if t.drafted else 0.0,
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
            out["predicted_speedup_own"] = expected_speedup(out["alpha"], s.k, out["c"], v or 1.0)
        return out
    k_pred = s.k if s.k is not None else optimal_k(alpha, costs.c, 1, max(ks or (8,)))
    v = costs.verify_cost(k_pred) if k_pred in costs.verify else None
    predicted = expected_speedup(alpha, k_pred, costs.c)
    predicted_v = expected_speedup(alpha, k_pred, costs.c, v) if v else None
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
    weights = bytes_per_token(target.cfg, 0, nbytes)
    # Decode step j of a call reads P + j cached positions: on average P + (N - 1) / 2, N times.
    kv = sum((bytes_per_token(target.cfg, len(prompt_ids[p]) + (len(new) - 1) / 2, nbytes) - weights) * len(new)
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
            "fraction_of_bandwidth": per_token * tps / bandwidth,
            "ceiling_tokens_per_second": bandwidth / per_token}


def judged(cfg) -> str | None:
    """None where a run can say whether it met the speed targets; else why it cannot. A target is a claim
    about the whole benchmark: a few prompts and a few tokens give a figure, not a verdict."""
    full = len(PROMPT_SETS[cfg.prompt_set])
    if cfg.quick:
        return "a --quick run is a smoke test: it prints figures and establishes no target"
    if cfg.num_prompts is not None and cfg.num_prompts < full:
        return f"{cfg.num_prompts} of the {full} prompts: only a run over all of them is held to the targets"
    if cfg.max_new_tokens < 64:
        return f"{cfg.max_new_tokens} new tokens a prompt: only runs of 64 or more are held to the targets"
    return None


def _targets(results, roofline, not_judged=None) -> dict:
    """The project's speed targets (docs/design.md), each with its target and whether this run met it; "met"
    is None for every target where the run cannot tell (not_judged: why, from `judged`)."""
    out = {} if not_judged is None else {"not_judged": not_judged}

    def put(name, value, target, at_least=True, ci95=None):
        met = None if value is None or not_judged else (value >= target if at_least else value <= target)
        out[name] = {"value": value, "target": target, "met": met}
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
    prompt_ids = [encode_prompt(tok, p) for p in cfg.prompts()]
    if log:
        log("measuring memory bandwidth and step costs ...")
    probe = BandwidthProbe(device, reps=3 if cfg.quick else 7)
    bandwidth, source = probe(), "analysis.timing.BandwidthProbe (sum)"
    probe.samples.clear()
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
        sy = {s.name: summarize_system(s, tallies[s.name], tallies, alpha, costs, cfg.ks,
                                       PROMPT_KINDS[cfg.prompt_set]) for s in systems}
        if temperature == 0:  # greedy speculative decoding must reproduce greedy decoding
            for name, t in tallies.items():
                same = [a == b for a, b in zip(t.outputs, ar.outputs)]
                sy[name]["same_output_as_ar"] = sum(same) / len(ar.outputs)
                diffs = [first_difference(target, prompt_ids[p], a, b)
                         for p, a, b, s in zip(ar.call_prompts, ar.outputs, t.outputs, same) if not s]
                if diffs and not any(d is None for d in diffs):
                    sy[name]["first_differences"] = diffs
                    sy[name]["max_logit_gap_at_first_difference"] = max(d["logit_gap"] for d in diffs)
        results.append({"temperature": temperature, "samples_per_prompt": len(seeds_for(cfg, temperature, 0)),
                        "alpha": alpha, "alpha_positions": positions, "systems": sy})
        for f in ("tokens", "decode_seconds"):
            setattr(ar_all, f, getattr(ar_all, f) + getattr(ar, f))
        ar_all.outputs += ar.outputs
        ar_all.call_prompts += ar.call_prompts
    rf = roofline_report(target, ar_all, prompt_ids, bandwidth, source, probe.samples)
    del probe
    return {
        "measured_at": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "config": asdict(cfg),
        "prompts": {"set": cfg.prompt_set, "count": len(prompt_ids)},
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
        "targets": _targets(results, rf, judged(cfg)),
    }


@torch.inference_mode()
def first_difference(target, prompt, reference, other):
    """Where a greedy answer first leaves the autoregressive one, and the target's logit gap there
    between the two tokens (one forward over the shared prefix). In bfloat16 a T=1 and a T=K+1
    forward take different GEMM shapes, and a near-tie (a gap near bf16's rounding) may go either
    way; a large gap is a bug. None when `other` is a prefix of `reference` or the reverse (an
    answer cut short by EOS is no difference of tokens)."""
    i = next((i for i, (a, b) in enumerate(zip(reference, other)) if a != b), None)
    if i is None:
        return None
    x = torch.tensor([list(prompt) + list(reference[:i])], device=target.device)
    logits = target(x, last_only=True)[0, -1]  # (V,) after the shared prefix
    gap = float(logits[reference[i]] - logits[other[i]])
    return {"position": i, "reference_token": reference[i], "other_token": other[i], "logit_gap": gap}


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
    return f"{cpu_name()}, {os.cpu_count()} cores"


def cpu_name() -> str:
    """The CPU's model name and its widest vector extension, from /proc/cpuinfo where there is one."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        import platform
        return platform.processor() or platform.machine()
    name = next((l.split(":", 1)[1].strip() for l in info.splitlines() if l.startswith("model name")), "unknown")
    flags = set(next((l.split(":", 1)[1].split() for l in info.splitlines() if l.startswith("flags")), []))
    widest = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
    return f"{name} ({widest})"
