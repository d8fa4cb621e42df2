"""Command line: python -m specdec_lab {fetch, generate, acceptance, prompts, distill, distill-features, bench, export}."""
import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

from .api import (SpeculativeEngine, autoregressive_generate, check_dtype, compiled_twin, load_default_pair,
                  load_eagle3_draft, load_feature_draft, load_pair)
from .bench.main import bench_main
from .bench.peer import PeerConfig, format_peer, run_peer_bench
from .core.config import cache_dir
from .cpu import SelfDraft, best_weights
from .drafters.eagle3 import is_eagle3_folder, shipped_eagle3_draft_dir
from .io.assets import ensure_default_target, ensure_gguf
from .io.export import export_eagle3_vllm, export_gguf_draft, export_hf_draft
from .io.pair import default_draft_dir, load_model_cached
from .train.acceptance import acceptance_report, agreement_table, greedy_agreement
from .train.distill import distill_main
from .train.eagle3 import eagle3_main
from .train.feature import feature_main
from .train.handwritten import HANDWRITTEN_KINDS, HANDWRITTEN_PROMPTS
from .train.magpie import SynthesisConfig, load_prompt_file, magpie_prefix, synthesize_prompts
from .train.prompts import BENCH_KINDS, BENCH_PROMPTS, distill_prompts, split_prompts


def _dtype(args):
    """--dtype as a torch dtype; None (bfloat16 on CUDA, float32 on the CPU) when not given."""
    return getattr(torch, args.dtype) if getattr(args, "dtype", None) else None


def _pair(args):
    compile = getattr(args, "compile", False)
    if compile and getattr(args, "self_draft", False):
        raise ValueError("--compile and --self-draft cannot be combined: the self-draft runs the CPU kernels")
    if args.target:
        return load_pair(args.target, args.draft, args.device, _dtype(args), compile=compile)
    return load_default_pair(args.device, _dtype(args), compile=compile)


def _engine(args, pair):
    """The speculative engine at --k: the pair's draft, or with --self-draft the target's own weights in
    4 bits (int8 where the kernels cannot)."""
    draft = SelfDraft(pair.target, best_weights(pair.target)) if args.self_draft else pair.draft
    return SpeculativeEngine(pair.target, draft, k=args.k)


def cmd_fetch(args):
    print(ensure_default_target())


def cmd_generate(args):
    if args.compare:
        return compare_generate(args)
    if args.k == 0:
        target = load_model_cached(args.target or ensure_default_target(), args.device,
                                   check_dtype(_dtype(args), args.device))
        target = compiled_twin(target) if args.compile else target
        res = autoregressive_generate(target, args.prompt, max_new_tokens=args.max_new_tokens,
                                         temperature=args.temperature, top_p=args.top_p, seed=args.seed)
    else:
        engine = _engine(args, _pair(args))
        res = engine.generate(args.prompt, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                              top_p=args.top_p, seed=args.seed)
    s = res.stats
    if args.json:
        print(json.dumps({"text": res.text, "tokens": res.tokens, "stats": s.as_dict()}))
    else:
        print(res.text)
        print(f"\n[{s.new_tokens} tokens in {s.seconds:.2f} s: {s.tokens_per_second:.1f} tokens/s, "
              f"{s.mean_tokens_per_step:.2f} tokens/step, accepted share {s.accepted_share:.2f}, "
              f"{s.syncs_per_step:.1f} host syncs/step]", file=sys.stderr)


def compare_generate(args):
    """--compare: the autoregressive baseline and speculative decoding at --k, in turn, --reps times."""
    if args.k < 1:
        raise ValueError(f"--compare needs a draft length --k >= 1, got {args.k}")
    if args.reps < 1:
        raise ValueError(f"--reps must be >= 1, got {args.reps}")
    pair = _pair(args)
    engine = _engine(args, pair)
    kw = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p, seed=args.seed)

    def ar():
        return autoregressive_generate(pair.target, args.prompt, **kw)

    def spec():
        return engine.generate(args.prompt, **kw)

    ar(), spec()  # warm-up
    rates = {"autoregressive": [], f"speculative K={args.k}": []}
    for rep in range(args.reps):
        runs = [("autoregressive", ar), (f"speculative K={args.k}", spec)]
        for name, fn in runs if rep % 2 == 0 else runs[::-1]:  # alternate who goes first
            res = fn()
            rates[name].append(res.stats.new_tokens / res.stats.seconds)
            if name == "autoregressive":
                base = res
            else:
                last = res
    med = {n: statistics.median(v) for n, v in rates.items()}
    ratio = med[f"speculative K={args.k}"] / med["autoregressive"]
    doc = {"k": args.k, "reps": args.reps, "tokens_per_second": med, "speculative_over_autoregressive": ratio,
           "tokens_per_step": last.stats.mean_tokens_per_step, "accepted_share": last.stats.accepted_share,
           "same_output": last.tokens == base.tokens}
    if args.json:
        print(json.dumps(doc))
        return
    print(last.text)
    print(f"\n[median of {args.reps} alternating runs, {len(last.tokens)} tokens each: autoregressive "
          f"{med['autoregressive']:.1f} tokens/s, speculative K={args.k} {med[f'speculative K={args.k}']:.1f} "
          f"tokens/s = {ratio:.2f}x; {last.stats.mean_tokens_per_step:.2f} tokens/step; "
          f"same output: {doc['same_output']}]", file=sys.stderr)


def cmd_distill(args):
    out, curve = distill_main(budget=args.budget, out_dir=args.out, data_dir=args.data_dir, work_dir=args.work_dir,
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
    pair = load_pair(ensure_default_target(), args.draft, args.device) if args.draft else load_default_pair(args.device)
    if args.classic:
        _, held = split_prompts(distill_prompts())
        rep = acceptance_report(pair.target, pair.draft, held[:args.num_prompts or 12],
                                max_new_tokens=args.max_new_tokens, temperature=args.temperature)
        print(rep.table())
        if args.json:
            print(json.dumps(rep.__dict__))
        return
    draft = {"token": lambda: pair.draft, "feature": lambda: load_feature_draft(pair.target, args.feature_dir),
             "eagle3": lambda: load_eagle3_draft(pair.target, args.feature_dir)}[args.draft_kind]()
    sets = {"held-out": (HANDWRITTEN_PROMPTS, HANDWRITTEN_KINDS), "bench": (BENCH_PROMPTS, BENCH_KINDS)}
    n = args.num_prompts
    reports = [greedy_agreement(pair.target, draft, sets[s][0][:n], args.max_new_tokens, args.k_max, name=s,
                                kinds=sets[s][1][:n]) for s in args.sets]
    print(f"greedy agreement of the {args.draft_kind} draft along the target's own greedy answers "
          f"({args.max_new_tokens} new tokens); position i counts only where positions < i agreed")
    print(agreement_table(reports))
    if args.json:
        print(json.dumps({"draft": args.draft_kind, "max_new_tokens": args.max_new_tokens,
                          "sets": [r.as_dict() for r in reports]}))


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
    if not args.peer:
        return bench_main(args)
    cfg = PeerConfig(**{k: v for k, v in (("num_prompts", args.prompts), ("max_new_tokens", args.max_new_tokens),
                                          ("threads", args.threads)) if v is not None})
    doc = run_peer_bench(cfg, log=lambda s: print(s, file=sys.stderr, flush=True))
    if not args.json:
        print(format_peer(doc))
    print(json.dumps(doc))


def cmd_export(args):
    """The shipped drafts in the layouts llama.cpp and vLLM load, each with the command that serves it."""
    out = Path(args.out).expanduser() if args.out else cache_dir() / "export"
    target_dir = ensure_default_target()
    if args.to in ("llama.cpp", "all"):
        path = export_gguf_draft(default_draft_dir(), ensure_gguf(), out / "specdec_lab_draft.f32.gguf")
        print(f"{path}\n  llama-server -m {ensure_gguf()} -md {path} --spec-type draft-simple "
              f"--spec-draft-n-max 2")
    if args.to in ("vllm", "all"):
        path = export_hf_draft(default_draft_dir(), target_dir, out / "specdec_lab_draft_hf")
        print(f"{path}\n  vllm serve HuggingFaceTB/SmolLM2-135M-Instruct --speculative-config "
              f"'{{\"method\": \"draft_model\", \"model\": \"{path}\", \"num_speculative_tokens\": 2}}'")
    if args.to in ("vllm-eagle3", "all"):
        path = export_eagle3_vllm(shipped_eagle3_draft_dir(), target_dir, out / "specdec_lab_eagle3_vllm")
        print(f"{path}\n  vllm serve HuggingFaceTB/SmolLM2-135M-Instruct --speculative-config "
              f"'{{\"method\": \"eagle3\", \"model\": \"{path}\", \"num_speculative_tokens\": 3}}'")


def add_bench_parser(sub):
    b = sub.add_parser("bench", help="this engine (autoregressive, speculative K = 1..8, adaptive K, early stop, "
                       "prompt lookup + draft) against "
                       "transformers generate and assisted generation; a table, then one JSON line")
    b.add_argument("--quick", action="store_true", help="2 prompts, 16 tokens, K in {2, 4}: a smoke run")
    b.add_argument("--prompts", type=int, help="the first N prompts of the set (default: all)")
    b.add_argument("--prompt-set", choices=["bench", "held-out"], default="bench",
                   help="bench: the 24 benchmark prompts; held-out: the 72 hand-written prompts that no training "
                        "run sees (train/handwritten.py)")
    b.add_argument("--max-new-tokens", type=int, help="default 128 (16 with --quick)")
    b.add_argument("--temperatures", help="comma list, default 0,0.7")
    b.add_argument("--ks", help="fixed draft lengths: 1-8 (default) or a list like 2,4")
    b.add_argument("--samples", type=int,
                   help="calls per prompt at temperature > 0, each with its own seed (default 1)")
    b.add_argument("--no-hf", action="store_true", help="skip the transformers systems")
    b.add_argument("--no-adaptive", action="store_true", help="skip adaptive K")
    b.add_argument("--no-refinements", action="store_true",
                   help="skip the early-stopping draft and prompt lookup + draft (K <= 6)")
    b.add_argument("--threads", type=int, help="torch threads (default: all cores)")
    b.add_argument("--target", help="hub id or folder of the target (default: SmolLM2-135M-Instruct)")
    b.add_argument("--draft", "--draft-dir", dest="draft",
                   help="hub id or Hugging Face folder of the draft (default: the shipped draft)")
    b.add_argument("--feature-draft", help="folder of a feature draft (drafters/feature.py) to run beside the "
                   "draft (default, for the default target: distill-features' output where it exists, "
                   "else the shipped one)")
    b.add_argument("--no-feature-draft", action="store_true", help="skip the feature draft's systems")
    b.add_argument("--no-self-draft", action="store_true",
                   help="skip the self-draft's systems (the target's own weights in 4 bits or int8 as its draft)")
    b.add_argument("--device", default="cpu")
    b.add_argument("--compile", action="store_true",
                   help="time the models with static shapes and torch.compile instead of the CPU fast path")
    b.add_argument("--dtype", choices=["float32", "bfloat16", "float16"],
                   help="default float32 on CPU, bfloat16 on CUDA")
    b.add_argument("--synthetic", metavar="PRESET", choices=["llama3-8b", "smollm2-1.7b"],
                   help="GPU only: random-weight models of real shapes (llama3-8b: Llama-3-8B with a "
                        "Llama-3.2-1B draft); step costs, c, bandwidth fraction, syncs per step")
    b.add_argument("--serve", action="store_true",
                   help="only batched speculative decoding under load (serve.Server): closed loop at batch "
                        "1, 2, 4, 8, 16 for plain batched decoding, fixed K, a per-batch-size schedule and the "
                        "goodput policy, and a Poisson open loop, with and without speculation")
    b.add_argument("--rounds", type=int, help="--serve: requests each closed-loop client sends (default 2)")
    b.add_argument("--rates", help="--serve: open-loop request rates per second, a comma list (default 0.5,1,2; "
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
                        "shipped draft, self-draft and 4-bit decode; --prompts (default 24), --max-new-tokens "
                        "(default 64), --threads (default 1)")
    b.add_argument("--json", action="store_true", help="print only the JSON document")


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m specdec_lab", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("fetch", help="download and convert the default target (idempotent)")
    g = sub.add_parser("generate", help="generate text (autoregressive with --k 0)")
    g.add_argument("--prompt", required=True)
    g.add_argument("--k", type=int, default=0, help="draft length; 0 = plain autoregressive decoding")
    g.add_argument("--max-new-tokens", type=int, default=128)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--target", help="hub id, folder or .gguf (default: SmolLM2-135M-Instruct)")
    g.add_argument("--draft", help="hub id or folder of the draft (default: the shipped draft)")
    g.add_argument("--self-draft", action="store_true",
                   help="draft with the target's own weights read in 4 bits, or int8 where the kernels cannot "
                        "(cpu/self_draft.py), instead of the draft")
    g.add_argument("--device", default="cpu")
    g.add_argument("--dtype", choices=["float32", "bfloat16", "float16"],
                   help="default float32 on the CPU, bfloat16 on CUDA")
    g.add_argument("--compile", action="store_true",
                   help="static shapes and torch.compile (CUDA graphs on CUDA) instead of the CPU fast path")
    g.add_argument("--json", action="store_true", help="print one JSON document")
    g.add_argument("--compare", action="store_true",
                   help="also run the autoregressive baseline, alternating with --k, and print the speed ratio")
    g.add_argument("--reps", type=int, default=3, help="with --compare: runs of each (default 3)")
    d = sub.add_parser("distill", help="distill a draft for the default target (resumable)")
    d.add_argument("--budget", choices=["tiny", "full"], default="full",
                   help="tiny finishes in minutes (a smoke test); full takes hours on 2 CPU cores")
    d.add_argument("--out", help="output folder (default: specdec_lab/draft for full)")
    d.add_argument("--data-dir", help="where the target's answers are stored (default: in the cache)")
    d.add_argument("--extra-data-dir", action="append", default=[], help="more shards of answers to add")
    d.add_argument("--task-data-dir", help="also answer the task set (prompts.task_prompts) into this folder "
                                           "and train on it")
    d.add_argument("--chat-data-dir", help="also answer the chat set (prompts.chat_prompts) into this folder "
                                           "and train on it")
    d.add_argument("--layers", type=int, help="the draft's depth; with --init-from, grow those weights to it "
                                              "(new blocks start as identities)")
    d.add_argument("--data-minutes", type=float, help="stop generating data after this long, then train")
    d.add_argument("--steps", type=int, help="override the budget's optimizer steps")
    d.add_argument("--work-dir", help="checkpoints and logs (default: in the cache); a rerun resumes from it")
    d.add_argument("--init-from", help="start from these weights (a ckpt.pt or a draft folder) with a fresh "
                                       "optimizer and schedule: a second phase on more data")
    d.add_argument("--lr", type=float, default=3e-3, help="peak learning rate (default 3e-3)")
    f = sub.add_parser("distill-features", help="train a feature draft (EAGLE: it reads the target's hidden "
                       "states) for the default target; resumable")
    f.add_argument("--budget", choices=["tiny", "full"], default="full",
                   help="tiny finishes in a minute (a smoke test); full takes about two hours on 2 CPU cores")
    f.add_argument("--out", help="output folder (default: feature_draft_smollm2 in the cache for full)")
    f.add_argument("--work-dir", help="the target's answers and states (default: in the cache)")
    f.add_argument("--data-minutes", type=float, help="stop generating data after this long, then train")
    f.add_argument("--steps", type=int, help="override the budget's optimizer steps")
    f.add_argument("--lr", type=float, default=3e-3, help="peak learning rate (default 3e-3)")
    f.add_argument("--init", help="a feature draft's folder to continue training from (a second phase)")
    f.add_argument("--recipe", choices=["eagle", "eagle3"], default="eagle",
                   help="eagle: the final state, feature regression (train/feature.py); eagle3: a low, a middle and "
                        "a high layer, token loss and training-time test (train/eagle3.py)")
    f.add_argument("--data-dir", action="append", help="with --recipe eagle3: train on the target's answers "
                   "already in this folder, shards an earlier eagle3 run wrote with the layers' states "
                   "(repeatable), instead of generating them")
    f.add_argument("--unroll", type=int, default=3, help="with --recipe eagle3: training-time test depth (default 3)")
    f.add_argument("--device", default="cpu", help="with --recipe eagle3: where the target and the draft train")
    f.add_argument("--prompt-file", action="append", help="with --recipe eagle3: answer the prompts of this file "
                   "(`prompts --synthesize` writes one; repeatable) instead of the template sets")
    f.add_argument("--temperatures", type=_temperatures,
                   help="with --recipe eagle3: one answer per prompt at each (comma list, default 0,0.7,1)")
    f.add_argument("--max-new-tokens", type=int, help="with --recipe eagle3: answer length cap (default 128)")
    f.add_argument("--data-dtype", choices=["float32", "bfloat16"],
                   help="with --recipe eagle3: the target's precision while it answers (default: as it loads)")
    f.add_argument("--max-tokens", type=int, help="with --recipe eagle3: positions per batch (default 2048)")
    a = sub.add_parser("acceptance", help="greedy agreement per drafted position and tokens per step at "
                       "K = 1..8 on the hand-written held-out and the benchmark prompts")
    a.add_argument("--sets", type=_sets, default=["held-out", "bench"],
                   help="comma list of prompt sets: held-out (hand-written, train/handwritten.py), bench")
    a.add_argument("--draft-kind", choices=["token", "feature", "eagle3"], default="token",
                   help="the default pair's draft, or a feature draft (EAGLE-style; eagle3: EAGLE-3-style) "
                        "read from --feature-dir")
    a.add_argument("--feature-dir", help="the feature draft's folder (feature: default distill-features' "
                                         "output where it exists, else the shipped one; eagle3: the shipped one)")
    a.add_argument("--draft", help="with --draft-kind token: a token draft's folder (default: the shipped draft)")
    a.add_argument("--num-prompts", type=int, help="the first N prompts of each set (default: all; 12 with --classic)")
    a.add_argument("--max-new-tokens", type=int, default=64)
    a.add_argument("--k-max", type=int, default=8, help="tokens per step at K = 1..k-max (default 8)")
    a.add_argument("--classic", action="store_true", help="the former report: alpha, tokens per step measured "
                   "with the engine at K = 1..8, and c, on the template prompts' held-out tenth")
    a.add_argument("--temperature", type=float, default=0.0, help="with --classic: alpha's temperature")
    a.add_argument("--device", default="cpu")
    a.add_argument("--json", action="store_true", help="also print one JSON document")
    p = sub.add_parser("prompts", help="synthesize prompts with the target (Magpie): a deduplicated file with "
                       "its seed and statistics; resumable")
    p.add_argument("--synthesize", type=int, required=True, metavar="N", help="prompts to keep")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="the prompt file (default: prompts_magpie_seed{SEED}.json here)")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--max-new-tokens", type=int, default=64, help="the length cap: a turn that reaches it is dropped")
    p.add_argument("--max-attempts", type=int, default=0, help="give up after this many samples (default 20 N)")
    p.add_argument("--near-duplicate", type=float, default=0.5,
                   help="word 3-gram Jaccard at or above which two prompts count as one (default 0.5)")
    p.add_argument("--batch-size", type=int, default=16, help="turns sampled side by side by the target "
                   "(default 16: about 4x the turns per second of one at a time here); 1: one at a time")
    p.add_argument("--k", type=int, default=3, help="with --batch-size 1: sample through the speculative engine "
                   "at this K with the shipped draft (the same distribution); 0: autoregressive_generate")
    p.add_argument("--minutes", type=float, help="stop after this long; a rerun resumes from the partial file")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", choices=["float32", "bfloat16"],
                   help="the target's precision while it samples (default: bfloat16 on CUDA, float32 on the CPU)")
    p.add_argument("--avoid", action="append", default=[], metavar="FILE",
                   help="a prompt file made earlier: its prompts count as duplicates, so this file adds new ones")
    add_bench_parser(sub)
    e = sub.add_parser("export", help="write the shipped drafts for llama.cpp (GGUF) and vLLM (a draft model "
                       "folder; the EAGLE-3-style draft in vLLM's EAGLE-3 layout), with the commands that serve them")
    e.add_argument("--to", choices=["llama.cpp", "vllm", "vllm-eagle3", "all"], default="all")
    e.add_argument("--out", help="output folder (default: export/ in the cache)")
    args = ap.parse_args(argv)
    if args.cmd == "generate" and not args.prompt.strip():
        print("error: prompt must not be empty", file=sys.stderr)
        return 2
    try:
        {"fetch": cmd_fetch, "generate": cmd_generate, "distill": cmd_distill, "distill-features": cmd_distill_features,
         "acceptance": cmd_acceptance, "prompts": cmd_prompts, "bench": cmd_bench,
         "export": cmd_export}[args.cmd](args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
