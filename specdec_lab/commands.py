"""The command line's shared helpers and its `generate`: options checked before anything loads, the
models of --target and --draft, the drafter of --drafter, the prompt of --prompt, --prompt-file, --system
and --raw (__main__.py runs every subcommand)."""
import json
import math
import statistics
import sys
from pathlib import Path

import torch

from .api import (LookupThenModelDrafter, SpeculativeEngine, autoregressive_generate, check_dtype, compiled_twin,
                  load_default_pair, load_eagle3_draft, load_feature_draft, load_pair)
from .core.config import MAX_K
from .cpu import SelfDraft, best_weights
from .drafters import NGramDrafter
from .tree.engine import TreeEngine
from .core.sampling import MIN_TEMPERATURE
from .io.assets import cached_default_target, ensure_default_target
from .io.pair import check_device_available, check_loadable, default_draft_dir, load_model_cached
from .io.weights import load_tokenizer
from .core.text import encode_prompt


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
            "self": "the target's own weights in 4 bits (int8 where the kernels cannot); --self-draft",
            "tree": "a token tree of the draft model's candidates, shape (2, 1): two at the first position, one after "
                    "each (what tree='auto' picks on a 2-core CPU, docs/benchmarks.md section 23)"}
CLI_TREE = (2, 1)


def _drafter_kind(args) -> str:
    return "self" if args.self_draft else args.drafter


def _uses_draft_model(args) -> bool:
    return args.k != 0 and _drafter_kind(args) in ("draft", "lookup", "tree")


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
    if kind == "tree":
        return TreeEngine(pair.target, pair.draft, tree=CLI_TREE, max_seq_len=args.max_seq_len)
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
    if args.k != "auto":
        _in("--k", args.k, 0, MAX_K, f"auto or an int in [0, {MAX_K}] (0: plain autoregressive decoding)")
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
    if args.compare and args.k == 0:
        raise ValueError("--compare needs a draft length --k >= 1 or auto, got 0")
    if args.drafter == "tree" and args.k != "auto":
        raise ValueError(f"--drafter tree drafts the tree's shape {CLI_TREE}, not K tokens: it takes no --k "
                         f"(got --k {args.k})")
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
    n = len(_prompt_ids(args, load_tokenizer(folder)))
    ahead = MAX_K + 1 if args.k != 0 else 0
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


def prompt_ids(tokenizer, prompt, system=None, raw=False) -> list:
    """The prompt as the model reads it: core.text.encode_prompt's chat template, with `system` as its system
    turn in place of the template's own; raw=True: the text tokenized as it is, no template."""
    if system is not None and (raw or not getattr(tokenizer, "chat_template", None)):
        raise ValueError("--system needs the chat template: a tokenizer that has one, and no --raw")
    if raw:
        return tokenizer.encode(prompt)
    if system is None:
        return encode_prompt(tokenizer, prompt)
    turns = [{"role": "system", "content": system}, {"role": "user", "content": prompt}]
    ids = tokenizer.apply_chat_template(turns, add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if not isinstance(ids, list) else ids)


def _prompt_ids(args, tokenizer):
    return prompt_ids(tokenizer, args.prompt, system=args.system, raw=args.raw)


def _generator(args):
    """A function (max_new_tokens) -> GenerationResult for --k: the engine, or the baseline at --k 0."""
    kw = dict(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed)
    if args.k != 0:
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


def k_label(args, res) -> str:
    """--k as run: the int, auto with the K it chose (each step's drafts, from the records), or the tree."""
    k = args.k
    if args.drafter == "tree":
        return f"the tree {CLI_TREE}"
    if k != "auto":
        return f"K = {k}"
    ks = [r.k for r in res.steps]
    return f"K = auto (K {min(ks)} to {max(ks)}, mean {sum(ks) / len(ks):.1f})" if ks else "K = auto"


def cmd_generate(args):
    if args.compare:
        return compare_generate(args)
    run = _generator(args)
    if not args.no_warmup:  # the first call in a process pays one-time costs (kernels, allocations)
        _say("warming up: one untimed call of 8 tokens ...")
        run(min(8, args.max_new_tokens))
    res = run(args.max_new_tokens)
    s = res.stats
    ttft = time_to_first_token(res, args.k != 0)
    if args.json:
        print(json.dumps({"text": res.text, "tokens": res.tokens, "stats": s.as_dict(), "k": args.k,
                          "prompt_tokens": len(res.prompt_ids), "time_to_first_token_seconds": ttft,
                          "warmed_up": not args.no_warmup}))
        return
    print(res.text)
    spec = (f", {s.mean_tokens_per_step:.2f} tokens/step, accepted share {s.accepted_share:.2f}"
            if args.k != 0 else "")
    timed = "after one untimed warm-up call" if not args.no_warmup else "the first call, one-time costs included"
    print(f"\n[{s.new_tokens} tokens at {k_label(args, res)}: decode {s.seconds:.2f} s, {s.tokens_per_second:.1f} tokens/s"
          f"{spec}; prefill {s.prefill_seconds:.2f} s ({len(res.prompt_ids)} prompt tokens), time to first token "
          f"{ttft:.2f} s; {s.syncs_per_step:.1f} host syncs/step; {timed}]", file=sys.stderr)


def compare_generate(args):
    """--compare: the autoregressive baseline and speculative decoding at --k, in turn, --reps times."""
    pair = _pair(args)
    engine, ids = _engine(args, pair), _prompt_ids(args, pair.target.tokenizer)
    kw = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
              seed=args.seed)
    spec_name = f"speculative K={args.k}"  # auto: the engine's own choice each step

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
