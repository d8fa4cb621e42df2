"""`python -m specdec_lab bench`: load the models, run the chosen measurement, print a table and one JSON line."""
import json
import os
import sys
from pathlib import Path

import torch

from ..api import compiled_twin, default_dtype, load_eagle3_draft, load_feature_draft, with_vocab_subset
from ..core.text import encode_prompt
from ..cpu import accelerated
from ..drafters.eagle3 import is_eagle3_folder
from ..drafters.feature import find_feature_draft_dir
from ..io.assets import ensure_default_target
from ..io.pair import default_draft_dir, load_model_cached
from ..io.weights import load_draft, load_hf_causal_lm, load_hf_model
from ..train.handwritten import HANDWRITTEN_PROMPTS
from ..train.prompts import BENCH_PROMPTS
from .gpu import cuda_syncs_per_step, run_synthetic
from .parity import QUICK_PARITY, format_parity, run_parity
from .probes import (compare_caches, compare_kernels, compare_policies, format_kernels, format_policies,
                     format_profile, profile_decode)
from .report import format_synthetic, format_table
from .run import QUICK, BenchConfig, run_bench
from .serve import QUICK_SERVE, ServeBenchConfig, format_serve, greedy_equality, run_serve_bench


# bench --serve-equality --quick: arrivals midway still happen (every third prompt), in seconds
QUICK_EQUALITY = {"prompts": 6, "max_new_tokens": 16}


def parse_list(text, kind, name):
    """'1-8' or '1,2,4' (ints), '0,0.7' (floats)."""
    try:
        if kind is int and "-" in text:
            lo, hi = text.split("-")
            return tuple(range(int(lo), int(hi) + 1))
        return tuple(kind(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"{name} must be a comma list like 1,2,4 (or a range 1-8 for ks), got {text!r}") from None


def env_threads():
    """OMP_NUM_THREADS as an int where it is set to one, else None: the thread count a user who sets it
    expects every part of the bench to run with."""
    text = os.environ.get("OMP_NUM_THREADS", "").strip()
    if not text:
        return None
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"OMP_NUM_THREADS must be an int >= 1 where it is set, got {text!r}")
    return int(text)


def bench_threads(args) -> int:
    """--threads, else OMP_NUM_THREADS, else every core."""
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads must be >= 1, got {args.threads}")
    return args.threads or env_threads() or os.cpu_count()


def bench_main(args, out=print, err=None):
    """`python -m specdec_lab bench`: the table (unless --json), then the JSON document as the last line."""
    err = err or (lambda s: print(s, file=sys.stderr, flush=True))
    torch.set_num_threads(bench_threads(args))
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype) if args.dtype else default_dtype(device)
    for probe in ("kernels", "profile"):
        if getattr(args, probe, False) and device.type != "cpu":
            raise ValueError(f"--{probe} measures the CPU kernels and the CPU forward; on {device} use the "
                             f"default bench (it reports c, v_K and the bandwidth fraction) or --synthetic")
    if getattr(args, "serve", False):
        cfg = ServeBenchConfig(**(QUICK_SERVE if args.quick else {}))
        if args.max_new_tokens is not None:
            cfg.max_new_tokens = args.max_new_tokens
        if getattr(args, "rounds", None) is not None:
            cfg.requests_per_client = args.rounds
        if getattr(args, "rates", None) is not None:
            cfg.rates = parse_list(args.rates, float, "--rates")
        target, draft, _, _ = load_systems_models(args, device, dtype, False, err)
        prompts = BENCH_PROMPTS[:args.prompts] if args.prompts else BENCH_PROMPTS
        doc = run_serve_bench(target, draft, prompts, cfg, log=err)
        text = format_serve(doc)
    elif getattr(args, "parity", False):
        q = QUICK_PARITY if args.quick else {}
        target, draft, _, _ = load_systems_models(args, device, dtype, False, err)
        doc = run_parity(target, draft, prompts=args.prompts or q.get("prompts", 6),
                         max_new_tokens=args.max_new_tokens or q.get("max_new_tokens", 48),
                         rounds=q.get("rounds", 15), log=err)
        text = format_parity(doc)
    elif getattr(args, "serve_equality", False):
        target, draft, _, _ = load_systems_models(args, device, dtype, False, err)
        prompts = BENCH_PROMPTS + HANDWRITTEN_PROMPTS
        n = args.prompts or (QUICK_EQUALITY["prompts"] if args.quick else len(prompts))
        tokens = args.max_new_tokens or (QUICK_EQUALITY["max_new_tokens"] if args.quick else 48)
        err(f"greedy equality: {n} prompts x {tokens} tokens through the server, then batch-1 references ...")
        doc = greedy_equality(target, draft, prompts[:n], max_new_tokens=tokens, log=err)
        text = (f"greedy, batch of up to {doc['max_batch']} with arrivals midway, K = {doc['k']}: {doc['identical']} "
                f"of {doc['prompts']} answers identical to batch-1 decoding; first differences: {doc['differences']}")
    elif getattr(args, "caches", False):
        cfg = BenchConfig(**{**(QUICK if args.quick else {}), **_overrides(args)})
        target, draft, _, _ = load_systems_models(args, device, dtype, False, err)
        doc = compare_caches(target, draft, cfg.prompts(), max_new_tokens=cfg.max_new_tokens)
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
        temps = parse_list(args.temperatures, float, "--temperatures") if args.temperatures else (1.0,)
        ks = parse_list(args.ks, int, "--ks") if args.ks else (1, 2, 3, 4, 8)
        doc = compare_policies(target, draft, ks=ks, temperature=temps[0],
                               max_new_tokens=args.max_new_tokens or (16 if args.quick else 64),
                               reps=1 if args.quick else 3, log=err)
        text = format_policies(doc)
    elif args.synthetic:
        ks = parse_list(args.ks, int, "--ks") if args.ks else tuple(range(1, 9))
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
    if getattr(args, "prompt_set", None):
        o["prompt_set"] = args.prompt_set
    if args.max_new_tokens is not None:
        o["max_new_tokens"] = args.max_new_tokens
    if args.temperatures:
        o["temperatures"] = parse_list(args.temperatures, float, "--temperatures")
    if args.ks:
        o["ks"] = parse_list(args.ks, int, "--ks")
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
    if getattr(args, "compile", False):  # static shapes and torch.compile instead of the CPU fast path
        target, draft = compiled_twin(target), compiled_twin(draft)
    elif device.type == "cpu":  # fast twins, as load_pair gives out (api.py)
        target, draft = accelerated(target), accelerated(draft, weights="float16")
    if draft.cfg.vocab_size != target.cfg.vocab_size:
        raise ValueError(f"draft vocabulary ({draft.cfg.vocab_size}) differs from the target's "
                         f"({target.cfg.vocab_size}); the draft must share the target's tokenizer")
    hf_target = hf_draft = None
    if with_hf:
        hf_target = load_hf_model(target_src, dtype=dtype)[0].to(device)
        hf_draft = load_hf_causal_lm(draft_src, device=device, dtype=dtype)
    return target, draft, hf_target, hf_draft


def load_bench_feature_draft(args, target, log):
    """The feature draft the bench runs: --feature-draft FOLDER, else for the default target
    distill-features' output where it exists, else the shipped one; None with --no-feature-draft,
    or for another target."""
    if getattr(args, "no_feature_draft", False):
        return None
    folder = getattr(args, "feature_draft", None)
    if folder is None:
        if args.target or not (find_feature_draft_dir() / "model.safetensors").exists():
            return None
        folder = find_feature_draft_dir()
    log(f"loading feature draft {folder} ...")
    # an EAGLE-3-style draft (drafters/eagle3.py) runs the same systems; either is made fast on the CPU
    load = load_eagle3_draft if is_eagle3_folder(folder) else load_feature_draft
    return load(target, folder)


def _is_hf_folder(source) -> bool:
    path = Path(os.path.expanduser(str(source)))
    return (path / "config.json").exists() and (path / "model.safetensors").exists()
