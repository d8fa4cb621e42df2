"""Prefill speed: the lab's prefill beside transformers' forward over the same prompt, in one run.

    python -m specdec_lab.bench.prefill [--json] [--threads 1] [--reps 3] [--lengths 128,512,1786,2048]

At each prompt length every system runs once per repetition, in an order that rotates from one
repetition to the next (each is the others' neighbour as often as it can be), after a warm-up
call of each:

    engine        SpeculativeEngine(target, draft, k=4).generate(ids, max_new_tokens=1): the path a
                  generation takes, the target over the prompt but its last token and the draft's
                  own prefill, then the first token (the target's forward over the last one)
    target        autoregressive_generate(target, ids, max_new_tokens=1): the target alone, its first
                  token from the prefill's last row
    target_plain  the same in plain PyTorch (what accelerate=False loads): one forward, no chunks
    transformers  transformers' model(ids) under torch.inference_mode, its first token the argmax of
                  the last row

Prefill seconds are the engine's own `prefill_seconds` (RunStats) for the lab's systems and the
forward for transformers; time to first token is the whole call, on the wall clock and in CPU
seconds (process_time). Tokens/s counts the prompt's tokens. Ratios are transformers' seconds over
a system's, per repetition (so above 1 is faster than transformers); the document keeps their
median, minimum and maximum.

Before timing, each length is checked: the lab's fast prefill against its plain one and against
the reference forward (last-row logits, first token). A prefill that leaves other logits raises
PrefillMismatch rather than timing a wrong answer. The document is printed as the last line (the
project's bench convention) and stored as docs/prefill.json unless --out says otherwise.
"""
import argparse
import copy
import itertools
import os
import statistics
import sys
import time
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

import torch

from ..analysis.timing import Clock
from ..api import SpeculativeEngine, autoregressive_generate
from ..cpu.accelerate import unaccelerate
from ..cpu.prefill import PREFILL_CHUNK
from .report import emit

LENGTHS = (128, 512, 1786, 2048)  # 1,786: the prompt of the report that asked for this measurement
SYSTEMS = {"engine": "lab engine (target + draft prefill)", "target": "lab target alone",
           "target_plain": "lab target, plain PyTorch", "transformers": "transformers model(ids)"}
RATIO_OF = ("engine", "target", "target_plain")
KEYS = ("prefill_seconds", "ttft_seconds", "ttft_cpu_seconds")  # what each call records, per repetition
LOGIT_TOLERANCE = 1e-2  # float32 against float32: the lab and transformers agreed within 0.002 (docs/export.md)
DEFAULT_OUT = Path(__file__).resolve().parents[2] / "docs" / "prefill.json"


class PrefillMismatch(AssertionError):
    """The lab's prefill left other logits than the reference forward over the same prompt."""


def prompt_ids(n, vocab_size, seed=0) -> list:
    """n token ids drawn at random: a forward's arithmetic does not depend on which tokens they are."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (n,), generator=g).tolist()


def plain_twin(model):
    """The model without the CPU's fast path, sharing its weights (what accelerate=False loads). A twin
    rather than cpu.eager around each call: leaving eager() swaps in new fast modules, which pack their
    oneDNN weights again on first use, a cost that would land on whichever system ran next."""
    held = (v for m in model.modules() for v in vars(m).values() if isinstance(v, torch.Tensor))  # packed copies
    shared = {id(t): t for t in itertools.chain(model.parameters(), model.buffers(), held)}
    shared[id(getattr(model, "tokenizer", None))] = getattr(model, "tokenizer", None)
    runner, model.runner = model.runner, None  # the runner is the fast path: the twin goes without it
    try:
        return unaccelerate(copy.deepcopy(model, shared))
    finally:
        model.runner = runner


@torch.inference_mode()
def check_prefill(target, plain, reference, ids) -> dict:
    """The fast prefill's last-row logits against the plain one's and the reference forward's."""
    x = torch.tensor([ids])
    fast = target(x, cache=target.new_cache(len(ids)), last_only=True)[0, -1]  # (V,)
    slow = plain(x, cache=plain.new_cache(len(ids)), last_only=True)[0, -1]
    ref = reference(x)[0, -1].float()
    out = {"max_abs_logit_diff_vs_plain": float((fast - slow).abs().max()),
           "max_abs_logit_diff_vs_reference": float((fast - ref).abs().max()),
           "first_token": {"target": int(fast.argmax()), "target_plain": int(slow.argmax()),
                           "reference": int(ref.argmax())}}
    worst = max(out["max_abs_logit_diff_vs_plain"], out["max_abs_logit_diff_vs_reference"])
    if worst > LOGIT_TOLERANCE or len(set(out["first_token"].values())) > 1:
        raise PrefillMismatch(f"prefill of {len(ids)} tokens: {out}")
    return out


def make_systems(target, plain, draft, reference, capacity, k=4) -> dict:
    """name -> fn(ids) returning (prefill seconds, time to first token, its CPU seconds, first token).
    The CPU seconds (process_time) of the whole call stand beside the wall clock: one thread's work,
    which other jobs on a shared machine slow less than they slow the wall clock."""
    engine = SpeculativeEngine(target, draft, k=k, max_seq_len=capacity)
    clock = Clock(target.device)

    def timed(run):
        def call(ids):
            t0, c0 = clock(), time.process_time()
            prefill, first = run(ids)
            ttft, cpu = clock() - t0, time.process_time() - c0
            return (ttft if prefill is None else prefill), ttft, cpu, first
        return call

    def lab(run):
        def call(ids):
            res = run(ids)
            return res.stats.prefill_seconds, res.tokens[0]
        return timed(call)

    @torch.inference_mode()
    def transformers(ids):
        logits = reference(torch.tensor([ids], device=target.device))
        return None, int(logits[0, -1].argmax())  # the forward is the prefill; the argmax is all that follows

    return {"engine": lab(lambda ids: engine.generate(ids, max_new_tokens=1)),
            "target": lab(lambda ids: autoregressive_generate(target, ids, max_new_tokens=1)),
            "target_plain": lab(lambda ids: autoregressive_generate(plain, ids, max_new_tokens=1)),
            "transformers": timed(transformers)}


def _spread(values) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def measure_prefill(target, draft, reference, lengths=LENGTHS, reps=3, k=4, log=None) -> dict:
    """Every system at every length, `reps` interleaved repetitions; returns the JSON document.
    reference: fn(ids (1, T)) -> logits (1, T, V), transformers' forward (a stand-in in the tests)."""
    log = log or (lambda s: None)
    plain = plain_twin(target)
    systems = make_systems(target, plain, draft, reference, max(lengths) + 32, k)
    names = list(systems)
    prompts = {n: prompt_ids(n, target.cfg.vocab_size, seed=n) for n in lengths}
    checks = {n: check_prefill(target, plain, reference, prompts[n]) for n in lengths}
    for name in names:  # warm-up: first-call costs (weight packing, allocator) stay out of the figures
        systems[name](prompts[min(lengths)])
    timed = {n: {name: {key: [] for key in KEYS} for name in names} for n in lengths}
    for r in range(reps):
        for n in lengths:
            for name in names[r % len(names):] + names[:r % len(names)]:  # rotating order
                *seconds, first = systems[name](prompts[n])
                if first != checks[n]["first_token"]["reference"]:
                    raise PrefillMismatch(f"{name} at {n} tokens gave first token {first}, the reference "
                                          f"{checks[n]['first_token']['reference']}")
                for key, value in zip(KEYS, seconds):
                    timed[n][name][key].append(value)
            log(f"rep {r + 1}/{reps}, {n} tokens: " + ", ".join(
                f"{name} {timed[n][name]['prefill_seconds'][-1]:.3f} s" for name in names))
    return {"bench": "prefill", "measured_at": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": machine(), "config": {"lengths": list(lengths), "reps": reps, "k": k,
                                             "prefill_chunk": PREFILL_CHUNK, "systems": SYSTEMS},
            "lengths": {str(n): summarise(n, timed[n], checks[n]) for n in lengths}}


def summarise(n, timed, check) -> dict:
    """One length's figures: per system the seconds of each repetition and the median rates; per lab
    system its ratios to transformers (transformers' seconds over its own, paired by repetition)."""
    systems = {name: {**t, "prefill_tokens_per_second": n / statistics.median(t["prefill_seconds"]),
                      "ttft_seconds_median": statistics.median(t["ttft_seconds"])} for name, t in timed.items()}
    hf = timed["transformers"]
    ratios = {name: {kind: _spread([b / a for a, b in zip(timed[name][key], hf[key])])
                     for kind, key in zip(("prefill", "ttft", "ttft_cpu"), KEYS)}
              for name in RATIO_OF}
    return {"prompt_tokens": n, "systems": systems, "vs_transformers": ratios, "check": check}


def machine() -> dict:
    try:
        hf_version = metadata.version("transformers")
    except metadata.PackageNotFoundError:
        hf_version = None
    return {"cpus": os.cpu_count(), "threads": torch.get_num_threads(), "torch": torch.__version__,
            "transformers": hf_version, "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
            "note": "a shared machine: ratios come from one run, side by side; absolute times do not carry over"}


def format_table(doc) -> str:
    kinds = ("prefill", "ttft", "ttft_cpu")
    rows = [f"prefill, {doc['machine']['threads']} thread(s), medians of {doc['config']['reps']} interleaved "
            f"repetitions; ratio = transformers' seconds / the system's (min-max over repetitions)",
            f"{'tokens':>6}  {'system':<37} {'prefill tok/s':>13} {'TTFT s':>7} "
            + " ".join(f"{h:>19}" for h in ("prefill ratio", "TTFT ratio", "TTFT CPU-time ratio"))]
    for n, entry in doc["lengths"].items():
        for name, s in entry["systems"].items():
            ratio = entry["vs_transformers"].get(name)
            cells = [f"{ratio[kind]['median']:.2f}x ({ratio[kind]['min']:.2f}-{ratio[kind]['max']:.2f})"
                     if ratio else "" for kind in kinds]
            rows.append(f"{n:>6}  {SYSTEMS[name]:<37} {s['prefill_tokens_per_second']:>13.0f} "
                        f"{s['ttft_seconds_median']:>7.3f} " + " ".join(f"{c:>19}" for c in cells))
    return "\n".join(rows)


def load_default(threads):
    """The default pair (made fast on the CPU) and transformers' forward over the same target folder."""
    from ..api import load_default_pair
    from ..io.assets import ensure_default_target
    from ..io.weights import load_hf_model
    torch.set_num_threads(threads)
    pair = load_default_pair(device="cpu")
    hf, _ = load_hf_model(ensure_default_target())
    return pair.target, pair.draft, lambda ids: hf(ids).logits


def main(argv=None, out=print, load=load_default) -> dict:
    p = argparse.ArgumentParser(prog="python -m specdec_lab.bench.prefill", description=__doc__.split("\n")[0])
    p.add_argument("--json", action="store_true", help="print only the JSON document (default: the table too)")
    p.add_argument("--threads", type=int, default=1, help="torch threads for every system (default 1)")
    p.add_argument("--reps", type=int, default=3, help="interleaved repetitions (default 3)")
    p.add_argument("--lengths", default=",".join(map(str, LENGTHS)),
                   help=f"prompt lengths in tokens (default {','.join(map(str, LENGTHS))})")
    p.add_argument("--out", default=str(DEFAULT_OUT), help="where to store the document ('' for nowhere; "
                                                          "default docs/prefill.json)")
    args = p.parse_args(argv)
    lengths = tuple(int(x) for x in args.lengths.split(",") if x.strip())
    if args.threads < 1 or args.reps < 1 or not lengths or min(lengths) < 2:
        p.error("--threads and --reps must be >= 1, and every length >= 2")
    target, draft, reference = load(args.threads)
    doc = measure_prefill(target, draft, reference, lengths, args.reps,
                          log=lambda s: print(s, file=sys.stderr, flush=True))
    return emit(doc, format_table(doc), out, args.out, args.json)


if __name__ == "__main__":
    main()
