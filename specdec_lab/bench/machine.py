"""The machine profile: the figures of this machine that the chapters quote, measured by one command
into one file, so that no two chapters quote the same quantity from different days.

    python -m specdec_lab bench --machine          # writes docs/machine_profile.json

What it holds, all on one thread unless said otherwise (`threads`):
- `bandwidth_read` and `bandwidth_copy` (bytes/s; copy counts read + write) and `matmul_flops`
  (float32 FLOP/s of a 1024-square product), each the best of its repetitions, at one thread and at
  every core (`*_all_cores`); `ridge_intensity` (FLOP per byte) and `critical_rows_float32` (the
  roofline's batch at which a float32 forward would turn compute-bound: 2 FLOPs per weight per row
  against 4 bytes per weight) follow from them.
- `forward`: one forward of the default target on the engine's path (the CPU fast twin, logits for
  every row) by its number of rows T, after 64 cached positions: the median over interleaved rounds
  (analysis.timing.forward_rows_rounds), the ratio to one row, and `ridge_rows`, the largest T whose
  ratio is at most 1.25. Up to there extra rows ride on one weight read almost free.
- `c`: each shipped draft's cost per drafted token over the target's per decoded token, as the
  engine runs them (K = 2, greedy, the bench's prompts; the bench's "c as run"), timed in one
  interleaved run: the token draft, the feature draft and the EAGLE-3 draft.

A chapter that measures one of these live prints it as today's, beside the profile's.

Machines of one kind differ: the profile's CPU has AVX2, and `docs/machine_profile_avx512.json` is
the same command's profile of a CPU of the same 2-core kind with AVX-512 (AVX512_PROFILE), where the
forward stays flat to 8 rows instead of 3. `cpu_name()` says which a run had.
"""
import datetime
import json
import statistics
from pathlib import Path

import torch

from ..analysis import roofline, timing
from ..analysis.timing import Clock
from ..api import SpeculativeEngine, autoregressive_generate, load_default_pair, load_eagle3_draft, load_feature_draft
from ..core.text import encode_prompt
from ..drafters import Eagle3Drafter, FeatureDrafter
from ..train.prompts import BENCH_PROMPTS
from .run import BenchConfig, cpu_name, run_systems  # noqa: F401 (cpu_name: the chapters import it from here)
from .systems import System

PROFILE = Path(__file__).resolve().parents[2] / "docs" / "machine_profile.json"
AVX512_PROFILE = PROFILE.with_name("machine_profile_avx512.json")   # the same figures on an AVX-512 CPU
ROWS = [1, 2, 3, 4, 5, 6, 8, 9, 12, 17, 24, 33]
CONTEXT = 64
RIDGE_RATIO = 1.25
DRAFTS = ("token", "feature", "eagle3")


def ridge_rows(rows, ratios, limit=RIDGE_RATIO):
    """The largest T whose ratio to one row is at most `limit`."""
    return max(T for T, r in zip(rows, ratios) if r <= limit)


def measure_forward(target, rows=ROWS, context=CONTEXT, rounds=31, quartiles=False) -> dict:
    """The target's forward by rows: medians over `rounds` interleaved rounds, in ms and over one row.
    quartiles=True adds each one's [first, third] quartile over the rounds (`ms_quartiles`,
    `ratio_quartiles`: a round's ratio is its T rows over its own one row), the record's noise."""
    per_round = timing.forward_rows_rounds(target, rows, context=context, rounds=rounds)
    ms = [statistics.median(r[i] for r in per_round) * 1e3 for i in range(len(rows))]
    one = rows.index(1)
    ratios = [m / ms[one] for m in ms]
    out = {"rows": list(rows), "context": context, "rounds": rounds, "ms_median": [round(m, 2) for m in ms],
           "ratio_to_one_row": [round(r, 3) for r in ratios], "ridge_rows": ridge_rows(rows, ratios)}
    if quartiles:
        def q(xs):
            qs = statistics.quantiles(xs, n=4)
            return [round(qs[0], 3), round(qs[2], 3)]
        out["ms_quartiles"] = [q([r[i] * 1e3 for r in per_round]) for i in range(len(rows))]
        out["ratio_quartiles"] = [q([r[i] / r[one] for r in per_round]) for i in range(len(rows))]
    return out


def measure_rooflines(reps=10) -> dict:
    """Bandwidth (read, copy) and float32 matmul FLOP/s, at the current thread count."""
    return {"bandwidth_read": timing.measure_memory_bandwidth(mode="read", reps=reps),
            "bandwidth_copy": timing.measure_memory_bandwidth(mode="copy", reps=reps),
            "matmul_flops": timing.measure_matmul_flops(reps=reps)}


def measure_draft_costs(pair, feature, eagle3, k=2, prompts=8, tokens=48, log=None) -> dict:
    """{draft: c}: draft seconds per drafted token over AR seconds per decoded token, one interleaved run."""
    target, capacity = pair.target, min(2048, pair.target.cfg.max_seq_len)
    drafters = {"token": pair.draft, "feature": FeatureDrafter(feature, capacity),
                "eagle3": Eagle3Drafter(eagle3, capacity)}

    def ar(ids, n, temperature, seed):
        res = autoregressive_generate(target, ids, max_new_tokens=n, temperature=temperature, seed=seed)
        return res.tokens, res
    systems = [System("ar", "autoregressive", ar)]
    for name, drafter in drafters.items():
        engine = SpeculativeEngine(target, drafter, k=k)

        def spec(ids, n, temperature, seed, engine=engine):
            res = engine.generate(ids, max_new_tokens=n, temperature=temperature, seed=seed)
            return res.tokens, res
        systems.append(System(name, f"{name} draft, K={k}", spec, k=k, drafts=True))
    cfg = BenchConfig(num_prompts=prompts, max_new_tokens=tokens, temperatures=(0.0,), ks=(k,), adaptive=False,
                      hf=False, warmup_tokens=8)
    ids = [encode_prompt(pair.tokenizer, p) for p in BENCH_PROMPTS[:prompts]]
    tallies = run_systems(systems, ids, cfg, 0.0, Clock(target.device), log=log)
    ar_token_s = tallies["ar"].decode_seconds / tallies["ar"].tokens
    return {name: round((tallies[name].draft_seconds / tallies[name].drafted) / ar_token_s, 4) for name in drafters}


def measure_machine(rounds=31, log=print, quartiles=False) -> dict:
    """The whole profile (see the module's docstring). Sets torch to one thread for the per-thread figures;
    quartiles as measure_forward's."""
    cores = torch.get_num_threads()
    log(f"rooflines at {cores} threads ...")
    all_cores = measure_rooflines()
    torch.set_num_threads(1)
    log("rooflines at 1 thread ...")
    one = measure_rooflines()
    pair = load_default_pair()
    log(f"the target's forward by rows, {rounds} interleaved rounds ...")
    forward = measure_forward(pair.target, rounds=rounds, quartiles=quartiles)
    log("each shipped draft's c, as the engine runs it ...")
    c = measure_draft_costs(pair, load_feature_draft(pair.target), load_eagle3_draft(pair.target), log=log)
    ridge = one["matmul_flops"] / one["bandwidth_read"]
    return {"date": datetime.date.today().isoformat(), "cpu": cpu_name(), "threads": 1, "cores": cores,
            **{k: round(v) for k, v in one.items()},
            **{f"{k}_all_cores": round(v) for k, v in all_cores.items()},
            "ridge_intensity": round(ridge, 2),
            "critical_rows_float32": round(roofline.critical_batch_size(one["matmul_flops"], one["bandwidth_read"], 4),
                                           1),
            "forward": {**forward, "what": "load_default_pair() target (CPU fast path: fused float32 kernels), "
                                           "logits for every row, one thread"},
            "c": {"k": 2, "temperature": 0.0, **c}}


def load_profile(path=PROFILE) -> dict:
    """The stored profile; a missing file says which command makes it."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist: python -m specdec_lab bench --machine writes it")
    return json.loads(path.read_text())


def forward_cost(p: dict, rows: int) -> float:
    """The profile's forward of `rows` rows over one row's, linear between the row counts it measured."""
    xs, ys = p["forward"]["rows"], p["forward"]["ratio_to_one_row"]
    if not isinstance(rows, int) or not xs[0] <= rows <= xs[-1]:
        raise ValueError(f"rows must be an int in [{xs[0]}, {xs[-1]}] (the profile's range), got {rows!r}")
    i = next(i for i, x in enumerate(xs) if x >= rows)
    if xs[i] == rows:
        return ys[i]
    return ys[i - 1] + (ys[i] - ys[i - 1]) * (rows - xs[i - 1]) / (xs[i] - xs[i - 1])


def format_profile(p: dict) -> str:
    f = p["forward"]
    lines = [f"machine profile ({p['date']}, {p['cpu']}), one thread of {p['cores']}:",
             f"  read bandwidth {p['bandwidth_read'] / 1e9:.1f} GB/s (all cores {p['bandwidth_read_all_cores'] / 1e9:.1f}),"
             f" copy {p['bandwidth_copy'] / 1e9:.1f} GB/s",
             f"  float32 matmul {p['matmul_flops'] / 1e9:.1f} GFLOP/s (all cores {p['matmul_flops_all_cores'] / 1e9:.1f})",
             f"  ridge {p['ridge_intensity']:.1f} FLOP/byte -> roofline's critical rows in float32: "
             f"{p['critical_rows_float32']:.1f}",
             f"  the target's forward by rows (x one row): " + ", ".join(
                 f"{T}: {r:.2f}" for T, r in zip(f["rows"], f["ratio_to_one_row"])),
             f"  ridge_rows (last T at <= {RIDGE_RATIO}x one row): {f['ridge_rows']}",
             "  c as run (K = 2, greedy): " + ", ".join(f"{d} {p['c'][d]:.3f}" for d in DRAFTS)]
    return "\n".join(lines)


def write_profile(p: dict, path=PROFILE) -> Path:
    path = Path(path)
    path.write_text(json.dumps(p, indent=1) + "\n")
    return path


def machine_main(args, log):
    """bench --machine: measure, store docs/machine_profile.json, print the table (unless --json) and the JSON."""
    profile = measure_machine(log=log)
    path = write_profile(profile)
    if not args.json:
        print(format_profile(profile))
        print(f"-> {path}")
    print(json.dumps(profile))
