"""A new user's first hour with the command line (issue 45): errors in one line before anything
loads, defaults that speculate, figures that say what they timed, and words that mean one thing."""
import json
import os
import subprocess
import sys
import time
from argparse import Namespace
from pathlib import Path

import pytest
import torch

import specdec_lab as sl
from specdec_lab.__main__ import build_parser
from specdec_lab.bench.main import bench_threads
from specdec_lab.bench.report import format_table
from specdec_lab.bench.serve import format_serve
from specdec_lab.core.text import encode_prompt
from specdec_lab.io.pair import LoadError
from specdec_lab.train.magpie import SynthesisConfig, attempts_log, synthesize_prompts

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "Why is the sky blue?"


def run_cli(*args, timeout=300, **env):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), **env)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "specdec_lab", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)
    proc.seconds = time.perf_counter() - t0
    return proc


def assert_one_line_error(proc, *words):
    assert proc.returncode == 2, f"exit code {proc.returncode}, stderr: {proc.stderr[-2000:]}"
    lines = proc.stderr.strip().splitlines()  # progress lines may come first; the error is the last, alone
    errors = [line for line in lines if line.startswith("error: ")]
    assert errors == lines[-1:] and "Traceback" not in proc.stderr, f"not one line: {proc.stderr[-2000:]}"
    for w in words:
        assert w in lines[-1], (w, lines[-1])


# ----------------------------------------------------------------------------- item 5: errors

@pytest.mark.parametrize("args, words", [
    (("--k", "17"), ("--k", "17", "[0, 16]")),
    (("--temperature", "-1"), ("--temperature", "-1", "0 (greedy) or")),
    (("--top-p", "0"), ("--top-p", "0", "(0, 1]")),
    (("--max-new-tokens", "0"), ("--max-new-tokens", "0", ">= 1")),
    (("--max-seq-len", "1"), ("--max-seq-len", "1", ">= 2")),
    (("--reps", "0", "--compare"), ("--reps", "0")),
    (("--target", "/no/such/folder"), ("--target", "/no/such/folder", "no such folder")),
    (("--draft", "./no_such_draft"), ("--draft", "./no_such_draft", "no such folder")),
    (("--target", "missing.gguf"), ("--target", "missing.gguf", "no such file")),
    (("--device", "cuda:99"), ("cuda:99",)),
])
def test_bad_generate_options_are_one_line_errors_before_any_model_loads(args, words):
    proc = run_cli("generate", "--prompt", PROMPT, *args)
    assert_one_line_error(proc, *words)
    assert "loading" not in proc.stderr, f"the check waited for a model to load: {proc.stderr[-500:]}"


def test_cuda_without_cuda_is_one_line_and_a_load_error_in_the_library():
    if not torch.cuda.is_available():
        assert_one_line_error(run_cli("generate", "--prompt", PROMPT, "--device", "cuda"), "cuda", "CUDA")
        with pytest.raises(LoadError, match="needs CUDA"):
            sl.load_pair(str(ROOT / "specdec_lab" / "draft"), str(ROOT / "specdec_lab" / "draft"), device="cuda")
    with pytest.raises(LoadError, match="cuda:99"):
        sl.load_pair(str(ROOT / "specdec_lab" / "draft"), str(ROOT / "specdec_lab" / "draft"), device="cuda:99")
    assert issubclass(LoadError, ValueError), "callers that catch bad input catch it"


def test_a_hub_id_that_cannot_be_fetched_is_one_line_and_a_load_error(tmp_path):
    # An empty hub cache and no network (HF_HUB_OFFLINE): the hub cannot give the id, whatever the machine reaches.
    env = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path)}
    proc = run_cli("generate", "--prompt", PROMPT, "--target", "HuggingFaceTB/SmolLM2-360M-Instruct", **env)
    assert_one_line_error(proc, "HuggingFaceTB/SmolLM2-360M-Instruct", "hub")
    assert "Traceback" not in proc.stderr


def test_a_missing_folder_is_a_load_error_naming_it():
    with pytest.raises(LoadError, match="no such folder"):
        sl.load_pair("/no/such/target", str(ROOT / "specdec_lab" / "draft"))


def test_debug_shows_the_traceback():
    proc = run_cli("generate", "--prompt", PROMPT, "--target", "/no/such/folder", "--debug")
    assert proc.returncode == 2 and "Traceback" in proc.stderr and "error: --target" in proc.stderr


def test_acceptance_options_are_checked_before_loading():
    assert_one_line_error(run_cli("acceptance", "--k-max", "17"), "--k-max", "17")
    assert_one_line_error(run_cli("acceptance", "--num-prompts", "0"), "--num-prompts", "0")


# ----------------------------------------------------------------------------- item 4: feedback on long waits

def test_a_gguf_target_says_what_it_waits_for_before_it_loads(tmp_path):
    bad = tmp_path / "model.gguf"
    bad.write_text("not a gguf")  # fails in transformers' reader, after the line that names the wait
    proc = run_cli("generate", "--prompt", PROMPT, "--k", "0", "--target", str(bad))
    lines = proc.stderr.strip().splitlines()
    assert lines[0].startswith(f"loading target {bad}") and "dequantizes" in lines[0], proc.stderr
    assert_one_line_error(proc, "GGUF")


@pytest.mark.slow
def test_acceptance_classic_says_what_it_measures_before_it_measures():
    proc = run_cli("acceptance", "--classic", "--num-prompts", "1", "--max-new-tokens", "8")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "alpha (teacher-forced) and c on 1 prompts" in proc.stderr
    assert proc.stderr.index("loading") < proc.stderr.index("alpha (teacher-forced)")


# ----------------------------------------------------------------------------- item 6: defaults

def test_bench_takes_its_threads_from_omp_num_threads(monkeypatch):
    args = Namespace(threads=None)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert bench_threads(args) == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert bench_threads(args) == 3
    assert bench_threads(Namespace(threads=2)) == 2, "--threads wins"
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert bench_threads(args) == os.cpu_count()
    monkeypatch.setenv("OMP_NUM_THREADS", "many")
    with pytest.raises(ValueError, match="OMP_NUM_THREADS"):
        bench_threads(args)


def test_distill_never_writes_into_the_package_unless_told_to():
    proc = run_cli("distill", "--budget", "tiny", "--out", "specdec_lab/draft")
    assert_one_line_error(proc, "--out", "--into-package")
    help_text = run_cli("distill", "--help").stdout
    assert "--into-package" in help_text and "default: specdec_lab/draft" not in help_text


def test_generate_speculates_by_default():
    g = build_parser().parse_args(["generate", "--prompt", "x"])
    assert g.k == "auto" and not g.self_draft and g.drafter == "draft"


def _tiny_target():
    model = sl.tiny_model(0, vocab_size=8, dim=32, n_heads=4, n_kv_heads=2, eos_token_ids=(7,), std=0.3)
    with torch.no_grad():
        model.head.weight[7] = model.head.weight[0]
    return model


def _decode(ids):
    return " ".join(["what", "how", "is", "the", "cat", "why", "river?"][i] for i in ids)


def test_synthesis_keeps_exactly_n_and_a_rerun_starts_from_what_is_stored(tmp_path):
    target = _tiny_target()
    cfg = SynthesisConfig(n=3, seed=1, max_new_tokens=10, max_attempts=120, batch_size=8)
    out = tmp_path / "p.json"
    doc = synthesize_prompts(target, [1, 2, 3], _decode, cfg, out, progress=False)
    assert doc["complete"] and len(doc["prompts"]) == 3 and doc["stats"]["count"] == 3
    assert doc["attempts"] == 3 + sum(doc["rejected"].values()), "every attempt is kept or has a reason"
    assert attempts_log(out).exists()
    again = synthesize_prompts(target, [1, 2, 3], _decode, cfg, out, progress=False, stop_after=0)
    assert again == doc, "a rerun of a complete file samples nothing (stop_after=0) and gives the same file"
    more = SynthesisConfig(**{**cfg.__dict__, "n": 5})
    grown = synthesize_prompts(target, [1, 2, 3], _decode, more, out, progress=False)
    direct = synthesize_prompts(target, [1, 2, 3], _decode, more, tmp_path / "direct.json", progress=False)
    assert grown == direct and grown["prompts"][:3] == doc["prompts"]


# ----------------------------------------------------------------------------- item 8: words and help

def _subparsers():
    ap = build_parser()
    return next(a for a in ap._actions if a.choices and isinstance(a.choices, dict)).choices


def test_every_option_of_every_subcommand_has_help_with_its_default():
    missing = []
    for name, sub in _subparsers().items():
        for action in sub._actions:
            if action.dest == "help" or not action.option_strings:
                continue
            text = action.help or ""
            takes_value = action.nargs != 0
            if not text or (takes_value and not action.required and "default" not in text):
                missing.append(f"{name} {action.option_strings[0]}")
            if takes_value and action.required and "required" not in text:
                missing.append(f"{name} {action.option_strings[0]} (required)")
    assert not missing, missing


def test_fetch_and_export_have_descriptions_and_the_prompt_count_has_one_spelling():
    subs = _subparsers()
    assert subs["fetch"].description and subs["export"].description
    assert next(a for a in subs["export"]._actions if a.dest == "to").help
    ap = build_parser()
    for cmd in ("bench", "acceptance"):
        new = ap.parse_args([cmd, "--num-prompts", "3"])
        old = ap.parse_args([cmd, "--prompts", "3"])
        assert vars(new) == vars(old), f"{cmd}: --prompts stays an alias of --num-prompts"


def test_bench_table_shows_the_k_set_and_the_mean_k_apart():
    doc = json.loads((ROOT / "docs" / "bench_fast_memory.json").read_text())
    lines = format_table(doc).splitlines()
    head = next(line for line in lines if line.startswith("system"))
    assert " K mean K " in head
    row = next(line for line in lines if line.startswith("speculative, K=2"))
    s = doc["results"][0]["systems"]["spec_k2"] if "spec_k2" in doc["results"][0]["systems"] else None
    cells = row.split()
    assert "2" in cells, row  # the K set, 2, not its mean
    if s is not None:
        assert f"{s['mean_k']:.2f}" in cells


def test_serve_says_where_speculation_pays_without_none():
    doc = json.loads((ROOT / "docs" / "serve_load.json").read_text())
    doc["crossover_batch_measured"] = None
    doc["roofline"]["crossover_batch_predicted"] = None
    text = format_serve(doc)
    assert "None" not in text and "pays at every batch size measured" in text


# ----------------------------------------------------------------------------- item 9: the README

def test_readme_explains_the_tree_dynamic_tree_and_k_schedule_numbers_and_uses_eagle3():
    readme = (ROOT / "README.md").read_text()
    for spec in ("tree=(4, 2, 1)", "DynamicTree(4, 4, 12)", "KSchedule([(1, 2, 4), (3, 8, 2)])"):
        assert spec in readme
    assert "auto_prompts" in readme, "tree='auto' needs auto_prompts"
    code = readme.split("```python")[1].split("```")[0]
    uses = [line for line in code.splitlines() if "eagle3" in line and "load_eagle3_draft" not in line]
    assert any("SpeculativeEngine" in line or "Engine(" in line for line in uses), \
        "the EAGLE-3 draft is loaded and never used"
    for words in ("children", "per level", "batch size"):
        assert words in readme, words


# ----------------------------------------------------------------------------- the default pair (slow)

@pytest.mark.slow
def test_generate_speculates_warms_up_and_reports_prefill_and_time_to_first_token(default_target):
    proc = run_cli("generate", "--prompt", PROMPT, "--max-new-tokens", "16")
    assert proc.returncode == 0, proc.stderr[-2000:]
    err = proc.stderr.strip().splitlines()
    assert any(line.startswith("loading the default pair") for line in err), "no line before the load"
    assert any(line.startswith("warming up") for line in err), "the first call must not be the timed one"
    summary = err[-1]
    for words in ("K = auto (K ", "mean", "tokens/s", "prefill", "prompt tokens", "time to first token", "accepted share",
                  "after one untimed warm-up call"):
        assert words in summary, (words, summary)
    doc = json.loads(run_cli("generate", "--prompt", PROMPT, "--max-new-tokens", "16", "--json").stdout)
    assert doc["k"] == "auto" and doc["stats"]["drafted"] > 0 and doc["warmed_up"], "generate speculates by default"
    assert doc["tokens"] == sl.autoregressive_generate(default_target, PROMPT, max_new_tokens=16).tokens
    assert doc["time_to_first_token_seconds"] >= doc["stats"]["prefill_seconds"] > 0


@pytest.mark.slow
def test_compare_while_sampling_says_it_checks_a_distribution_not_tokens():
    proc = run_cli("generate", "--prompt", PROMPT, "--k", "2", "--compare", "--reps", "1", "--max-new-tokens", "8",
                   "--temperature", "0.7")
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = proc.stderr.strip().splitlines()[-1]
    assert "same output" not in summary and "distribution, not its tokens" in summary, summary
    assert "run 1 of 1" in proc.stderr, "--compare prints a line per run"
    doc = json.loads(run_cli("generate", "--prompt", PROMPT, "--k", "2", "--compare", "--reps", "1",
                             "--max-new-tokens", "8", "--temperature", "0.7", "--json").stdout)
    assert doc["same_output"] is None and doc["checks"] == "distribution"


@pytest.mark.slow
def test_a_target_without_a_draft_gets_the_shipped_draft(default_target, default_target_dir):
    proc = run_cli("generate", "--prompt", PROMPT, "--target", str(default_target_dir), "--max-new-tokens", "8",
                   "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    assert doc["stats"]["drafted"] > 0, "the shipped draft should draft"
    assert doc["tokens"] == sl.autoregressive_generate(default_target, PROMPT, max_new_tokens=8).tokens
    assert "draft " + str(ROOT / "specdec_lab" / "draft") in proc.stderr


@pytest.mark.slow
def test_max_seq_len_goes_to_the_engine_up_to_what_the_pair_supports():
    proc = run_cli("generate", "--prompt", PROMPT, "--max-new-tokens", "4", "--max-seq-len", "8192")
    assert_one_line_error(proc, "--max-seq-len 8192", "4096")  # the shipped draft's rotary table: 4,096 positions
    proc = run_cli("generate", "--prompt", PROMPT, "--max-new-tokens", "4", "--max-seq-len", "4096", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    proc = run_cli("generate", "--prompt", PROMPT, "--k", "0", "--max-new-tokens", "4", "--max-seq-len", "8192",
                   "--json")
    assert proc.returncode == 0, "the target alone supports 8,192 positions: " + proc.stderr[-2000:]


@pytest.mark.slow
def test_serve_equality_quick_is_quick():
    proc = run_cli("bench", "--serve-equality", "--quick", "--json", timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(proc.stdout.strip().splitlines()[-1])
    assert doc["prompts"] == 6 and doc["max_new_tokens"] == 16 and doc["identical"] == 6, doc
    assert "greedy equality: 6 prompts x 16 tokens" in proc.stderr


@pytest.mark.slow
def test_peer_quick_is_quick_and_says_what_it_starts():
    from specdec_lab.bench.peer import llama_server_path
    llama_server_path()  # set-up builds it (tests/test_peer.py): missing, this fails here, saying how to build it
    proc = run_cli("bench", "--peer", "--quick", "--json", timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout.strip().splitlines()[-1])
    assert doc["config"]["num_prompts"] == 2 and doc["config"]["max_new_tokens"] == 16, doc["config"]
    # the three engines side by side: the lab, llama.cpp and vLLM (eager), each draft in each
    for name in ("lab_eagle3_k3", "llamacpp_eagle3_k3", "vllm_ar", "vllm_spec_k2", "vllm_eagle3_k3"):
        assert doc["systems"][name]["tokens"] > 0, name
    assert doc["systems"]["vllm_eagle3_k3"]["drafted"] > 0
    first = proc.stderr.strip().splitlines()[0]
    assert first.startswith("bench --peer: 2 prompts x 16 tokens, 1 thread(s)"), first


def test_a_long_prompt_past_the_drafts_positions_is_refused_before_the_models_load():
    """Before: 4,126 tokens with --max-seq-len 8192 ran 103 s in silence, then an IndexError at the draft's
    rotary table. The folders' config.json declare their positions; they are read before anything loads."""
    proc = run_cli("generate", "--prompt", "word " * 4000, "--max-seq-len", "8192")
    assert_one_line_error(proc, "--max-seq-len 8192", "the draft", "4096 positions")
    assert "loading" not in proc.stderr, "refused before any model loads"
    temperature = run_cli("generate", "--prompt", PROMPT, "--temperature", "1e-45")
    assert_one_line_error(temperature, "--temperature", "1e-05")


# ----------------------------------------------------------------------------- issue 57: the second first hour

@pytest.mark.parametrize("cmd, args, words", [
    ("generate", ("--prompt", PROMPT, "--max-seq-len", "100000"), ("--max-seq-len 100000", "the draft", "at most 4096")),
    ("generate", ("--prompt", PROMPT, "--max-seq-len", "60"),  # the prompt alone is 34 tokens: 34 + 16 + 17 > 60
     ("--max-new-tokens 16", "--max-seq-len 60", "17 (the positions one speculative step may write")),
    ("generate", ("--prompt", PROMPT, "--self-draft", "--draft", "x"), ("--self-draft", "no --draft")),
    ("generate", ("--prompt", PROMPT, "--raw", "--system", "Be brief."), ("--raw", "no --system")),
    ("generate", ("--prompt", PROMPT, "--top-k", "-1"), ("--top-k", "-1", ">= 0")),
    ("generate", ("--prompt", PROMPT, "--threads", "0"), ("--threads", "0", ">= 1")),
    ("generate", ("--prompt", PROMPT, "--k", "fast"), ("--k must be auto or an int", "'fast'")),
    ("generate", ("--prompt-file", "/no/such/prompt.txt"), ("--prompt-file /no/such/prompt.txt", "no such file")),
    ("generate", ("--prompt", PROMPT, "--prompt-file", "x"), ("--prompt-file", "not allowed with", "--prompt")),
    ("serve", ("--k", "-1"), ("--k", "-1", "[0, 16]", "serve --help")),
    ("serve", ("--threads", "0"), ("--threads", "0", ">= 1")),
    ("serve", ("--max-seq-len", "64"), ("--k goodput", "--max-seq-len >= 89", "an int --k")),
    ("bench", ("--no-such-option",), ("unrecognized arguments: --no-such-option", "bench --help")),
])
def test_every_subcommands_bad_option_is_one_line_naming_it_and_the_smallest_limit_comes_first(cmd, args, words):
    """Before: serve printed a 9-line usage block; --max-seq-len 100000 named the target's 8,192 and then,
    on the second try, the draft's 4,096; a prompt too long for the cache was refused after loading, with the
    warm-up's 8 tokens in the message. Every one of these is one line, before any model loads."""
    extra = ("--max-new-tokens", "16") if "60" in args else ()
    proc = run_cli(cmd, *args, *extra)
    assert_one_line_error(proc, *words)
    assert "loading" not in proc.stderr, "refused before any model loads"


def test_options_that_slow_the_cpu_down_say_so_before_loading(capsys):
    from specdec_lab.commands import cpu_warnings
    args = build_parser().parse_args(["generate", "--prompt", PROMPT, "--dtype", "float16", "--compile"])
    cpu_warnings(args)
    err = capsys.readouterr().err.strip().splitlines()
    assert [line.split(":")[0] for line in err] == ["warning", "warning"], err
    assert "--dtype float16 on the CPU" in err[0] and "--compile on the CPU" in err[1], err
    cpu_warnings(build_parser().parse_args(["generate", "--prompt", PROMPT]))
    assert capsys.readouterr().err == "", "the defaults warn of nothing"


def test_a_system_turn_replaces_the_templates_and_raw_skips_the_template(default_target):
    from specdec_lab.commands import prompt_ids
    tok = default_target.tokenizer
    plain, system = prompt_ids(tok, PROMPT), prompt_ids(tok, PROMPT, system="Answer in French.")
    assert plain == encode_prompt(tok, PROMPT), "without --system: the library's own template"
    assert "Answer in French." in tok.decode(system) and "Answer in French." not in tok.decode(plain)
    assert tok.decode(plain).count("<|im_start|>system") == tok.decode(system).count("<|im_start|>system") == 1
    assert "<|im_start|>" not in tok.decode(prompt_ids(tok, PROMPT, raw=True)), "--raw: no template"
    with pytest.raises(ValueError, match="--system needs the chat template"):
        prompt_ids(tok, PROMPT, system="x", raw=True)


@pytest.mark.slow
def test_generate_reads_its_prompt_from_stdin_with_a_system_turn_top_k_and_threads(default_target):
    """The options llama.cpp's and vLLM's users reach for: a prompt from a file or standard input, a system
    turn, --top-k, --threads. Greedy, the answer is the library's for the same ids."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    args = ["generate", "--prompt-file", "-", "--system", "Answer in one word.", "--top-k", "5", "--threads", "1",
            "--max-new-tokens", "8", "--json", "--no-warmup"]
    proc = subprocess.run([sys.executable, "-m", "specdec_lab", *args], cwd=ROOT, env=env, input=PROMPT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    from specdec_lab.commands import prompt_ids
    ids = prompt_ids(default_target.tokenizer, PROMPT, system="Answer in one word.")
    assert doc["prompt_tokens"] == len(ids)
    assert doc["tokens"] == sl.autoregressive_generate(default_target, ids, max_new_tokens=8, top_k=5).tokens


def test_acceptance_quick_is_a_smoke_run_and_the_options_given_still_win():
    from specdec_lab.__main__ import check_acceptance_options
    args = build_parser().parse_args(["acceptance", "--quick"])
    check_acceptance_options(args)
    assert (args.num_prompts, args.max_new_tokens) == (6, 32)
    args = build_parser().parse_args(["acceptance", "--quick", "--num-prompts", "2", "--max-new-tokens", "8"])
    check_acceptance_options(args)
    assert (args.num_prompts, args.max_new_tokens) == (2, 8)
    args = build_parser().parse_args(["acceptance"])
    check_acceptance_options(args)
    assert (args.num_prompts, args.max_new_tokens) == (None, 64), "without --quick: every prompt, 64 tokens"


def test_openmp_threads_wait_passively_unless_told_otherwise():
    """Spinning OpenMP threads collapse decoding beside a busy process (docs/threads.json); the package sets
    OMP_WAIT_POLICY=PASSIVE before torch loads, and keeps a value the user set."""
    code = "import os, specdec_lab; print(os.environ['OMP_WAIT_POLICY'])"
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    run = lambda e: subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True,
                                   timeout=120, cwd=ROOT).stdout.strip()
    assert run(env) == "PASSIVE"
    assert run({**env, "OMP_WAIT_POLICY": "ACTIVE"}) == "ACTIVE"


def test_the_stored_thread_run_shows_the_default_never_collapses():
    """docs/threads.json (scripts/threads_bench.py): the library's default (2 threads here, waiting passively)
    beside a busy process keeps most of one thread's speed, where 2 spinning threads lost more than half."""
    doc = json.loads((ROOT / "docs" / "threads.json").read_text())
    m = doc["median_tokens_per_second"]
    assert doc["cores"] == 2 and all(r["threads"] == 2 for r in doc["runs"]["library_library_busy"])
    for kind in ("plain", "speculative"):
        assert m["library_library_busy"][kind] > 0.85 * m["1_default_busy"][kind], kind
        assert m["2_default_busy"][kind] < 0.5 * m["2_default_alone"][kind], f"{kind}: the collapse it avoids"
        assert m["library_library_alone"][kind] >= m["1_default_alone"][kind] * 0.95, kind


@pytest.mark.parametrize("args, words", [
    (("--drafter", "feature", "--target", "x"), ("--drafter feature", "no --target")),
    (("--drafter", "ngram", "--draft", "x"), ("--draft", "not ngram")),
    (("--self-draft", "--drafter", "eagle3"), ("--self-draft", "--drafter eagle3")),
    (("--k", "0", "--drafter", "ngram"), ("--k 0", "--drafter")),
    (("--drafter", "tree", "--k", "3"), ("--drafter tree", "(2, 1)", "no --k", "got --k 3")),
    (("--drafter", "forest"), ("--drafter", "invalid choice: 'forest'")),
])
def test_a_drafter_that_does_not_fit_the_other_options_is_one_line(args, words):
    assert_one_line_error(run_cli("generate", "--prompt", PROMPT, *args), *words)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["lookup", "ngram", "feature", "eagle3", "self", "tree"])
def test_every_drafter_the_command_line_offers_keeps_the_targets_greedy_output(kind):
    """generate --drafter: prompt lookup with and without the draft model, the shipped feature and EAGLE-3
    drafts, the self-draft and a token tree, each through the engine the command line builds."""
    from specdec_lab.commands import _engine, check_generate_options
    args = build_parser().parse_args(["generate", "--prompt", PROMPT, "--drafter", kind, "--max-new-tokens", "24"])
    check_generate_options(args)
    pair = sl.load_default_pair()
    engine = _engine(args, pair)
    res = engine.generate(PROMPT, max_new_tokens=24)
    assert res.tokens == sl.autoregressive_generate(pair.target, PROMPT, max_new_tokens=24).tokens, kind
    assert res.stats.drafted > 0 or kind == "ngram", f"{kind} drafted nothing"
    assert (kind == "self") == args.self_draft


@pytest.mark.slow
def test_parity_quick_runs_every_shape_through_the_one_call():
    """bench --parity --quick: the server at batch 1 answers what the single engine answers, at every K,
    through the CPU's one-call forward; every ratio comes with its interval."""
    proc = run_cli("bench", "--parity", "--quick", "--threads", "1", "--json", timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(proc.stdout.strip().splitlines()[-1])
    assert doc["forward_kind"] == "cpu-fused" and doc["prompts"] == 2 and doc["max_new_tokens"] == 16, doc
    assert set(doc["server_over_engine"]) == {"0", "2", "4"}
    assert all(r["same_answers"] for r in doc["server_over_engine"].values()), doc["server_over_engine"]
    for r in [*doc["server_over_engine"].values(), doc["tree_over_chain"], doc["eagle3_over_plain"]]:
        lo, hi = r["interval"]
        assert 0 < lo <= r["ratio"] <= hi, r
    assert [r["rows"] for r in doc["batch_rows"].values()] == [10, 20, 40]
