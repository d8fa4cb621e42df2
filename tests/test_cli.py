"""The command line, run as a user runs it: a subprocess of `python -m specdec_lab`."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specdec_lab import autoregressive_generate

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "Why is the sky blue?"


def run_cli(*args, timeout=180):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "specdec_lab", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_generate_json_prints_one_json_document_equal_to_the_library_result(default_target):
    proc = run_cli("generate", "--prompt", PROMPT, "--max-new-tokens", "8", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(proc.stdout)  # the whole stdout, nothing else printed there
    assert isinstance(doc["tokens"], list) and 1 <= len(doc["tokens"]) <= 8, "--max-new-tokens 8 was not honoured"
    assert isinstance(doc["text"], str) and isinstance(doc["stats"], dict)
    expected = autoregressive_generate(default_target, PROMPT, max_new_tokens=8)  # --k 0, greedy by default
    assert doc["tokens"] == expected.tokens and doc["text"] == expected.text, \
        "the CLI's default greedy run differs from the library's autoregressive_generate"


def test_empty_prompt_exits_with_code_2_and_names_the_prompt():
    proc = run_cli("generate", "--prompt", "", "--max-new-tokens", "8")
    assert proc.returncode == 2, f"exit code {proc.returncode}, stderr: {proc.stderr[-1000:]}"
    assert "prompt" in proc.stderr and "Traceback" not in proc.stderr, \
        "a bad prompt should give a one-line error naming it, not a traceback"


@pytest.mark.slow
def test_generate_with_the_self_draft_keeps_the_target_output_and_accepts_most_drafts(default_target):
    proc = run_cli("generate", "--prompt", PROMPT, "--k", "6", "--self-draft", "--max-new-tokens", "16", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    assert doc["tokens"] == autoregressive_generate(default_target, PROMPT, max_new_tokens=16).tokens
    assert doc["stats"]["accepted_share"] > 0.7, doc["stats"]


def test_missing_prompt_is_a_usage_error():
    proc = run_cli("generate")
    assert proc.returncode == 2 and "--prompt" in proc.stderr


@pytest.mark.slow
def test_generate_compare_times_both_and_reports_their_ratio_with_the_same_greedy_output():
    proc = run_cli("generate", "--prompt", PROMPT, "--k", "2", "--compare", "--reps", "1",
                   "--max-new-tokens", "8", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    rates = doc["tokens_per_second"]
    assert set(rates) == {"autoregressive", "speculative K=2"} and all(v > 0 for v in rates.values())
    assert doc["speculative_over_autoregressive"] == pytest.approx(rates["speculative K=2"] / rates["autoregressive"])
    assert doc["same_output"] is True, "greedy speculative decoding must reproduce the baseline"
    bad = run_cli("generate", "--prompt", PROMPT, "--k", "0", "--compare")
    assert bad.returncode == 2 and "--k" in bad.stderr


def test_prompts_with_a_bad_count_is_a_one_line_error_naming_it():
    proc = run_cli("prompts", "--synthesize", "0")
    assert proc.returncode == 2 and "--synthesize" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_the_eagle3_recipes_options_are_refused_with_the_other_recipe_and_bad_temperatures_named():
    proc = run_cli("distill-features", "--prompt-file", "prompts.json")
    assert proc.returncode != 0 and "--prompt-file" in proc.stderr and "--recipe eagle3" in proc.stderr, proc.stderr
    proc = run_cli("distill-features", "--recipe", "eagle3", "--temperatures", "0,hot")
    assert proc.returncode == 2 and "--temperatures" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_prompts_avoiding_a_file_that_is_not_a_prompt_file_is_an_error_naming_it(tmp_path):
    (tmp_path / "other.json").write_text("[1, 2]")
    proc = run_cli("prompts", "--synthesize", "4", "--avoid", str(tmp_path / "other.json"))
    assert proc.returncode != 0 and "prompt file" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_acceptance_with_a_token_drafts_folder_for_another_kind_is_an_error_naming_it():
    proc = run_cli("acceptance", "--draft-kind", "feature", "--draft", "somewhere")
    assert proc.returncode != 0 and "--draft" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_acceptance_with_an_unknown_set_is_a_usage_error_naming_it():
    proc = run_cli("acceptance", "--sets", "held-out,mystery")
    assert proc.returncode == 2 and "--sets" in proc.stderr, proc.stderr


@pytest.mark.slow
def test_prompts_synthesize_writes_a_file_that_accounts_for_every_attempt(tmp_path):
    out = tmp_path / "p.json"
    proc = run_cli("prompts", "--synthesize", "2", "--batch-size", "4", "--max-attempts", "8",
                   "--max-new-tokens", "24", "--seed", "5", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["seed"] == 5 and doc["settings"]["batch_size"] == 4 and doc["complete"]
    assert doc["attempts"] == len(doc["prompts"]) + sum(doc["rejected"].values()) in (4, 8), "whole batches of 4"
    assert len(doc["prompts"]) == 2 or doc["attempts"] == 8, "it keeps exactly 2 prompts, or stops at 8 attempts"
    assert doc["stats"]["count"] == len(doc["prompts"]) and str(out) in proc.stdout


@pytest.mark.slow
def test_prompts_without_out_write_into_the_cache_not_the_working_folder():
    from specdec_lab.core.config import cache_dir
    name = "prompts_magpie_seed9137.json"
    proc = run_cli("prompts", "--synthesize", "1", "--batch-size", "2", "--max-attempts", "2", "--max-new-tokens", "8",
                   "--seed", "9137")
    assert proc.returncode == 0, proc.stderr[-2000:]
    written = cache_dir() / "prompts" / name
    try:
        assert str(written) in proc.stdout and not (ROOT / name).exists(), proc.stdout
        assert json.loads((written if written.exists() else Path(f"{written}.partial")).read_text())["seed"] == 9137
    finally:
        for f in written.parent.glob(name + "*"):
            f.unlink()


@pytest.mark.slow
def test_acceptance_reports_agreement_by_position_and_tokens_per_step():
    proc = run_cli("acceptance", "--sets", "held-out,bench", "--num-prompts", "2", "--max-new-tokens", "8",
                   "--k-max", "3", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [s["name"] for s in doc["sets"]] == ["held-out", "bench"]
    for s in doc["sets"]:
        assert s["num_prompts"] == 2 and s["drafted"][0] == s["answer_tokens"] <= 16
        assert s["agreement"] == s["by_position"][0] == s["agreed"][0] / s["drafted"][0]
        tps = [s["tokens_per_step"][k] for k in ("1", "2", "3")]
        assert 1 <= tps[0] <= tps[1] <= tps[2] <= 4, tps
    assert "pos 2" in proc.stdout and "K=3" in proc.stdout


def test_acceptance_of_an_eagle3_draft_from_a_folder_without_one_is_an_error_naming_it(tmp_path):
    proc = run_cli("acceptance", "--draft-kind", "eagle3", "--feature-dir", str(tmp_path))
    assert proc.returncode == 2 and "--feature-dir" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
