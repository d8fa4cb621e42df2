"""The benchmark: its cost arithmetic, its smoke run on the default target, and its CLI."""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specdec_lab import bench
from specdec_lab.cpu import build as kernels
from specdec_lab.cpu import accelerated
from specdec_lab.cpu.linear import HAVE_PACKING
from specdec_lab.core.config import ModelConfig
from specdec_lab.drafters.feature import FeatureDraft
from specdec_lab.io.pair import tiny_model
from specdec_lab.io.weights import load_draft
from specdec_lab.train.acceptance import measure_step_costs
from specdec_lab.analysis.roofline import bytes_per_token, expected_speedup

ROOT = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------- pure pieces


@pytest.mark.parametrize("run", ["bench_full.json", "bench_slow_memory.json"])
def test_prediction_gap_walks_from_theorem_3_8_to_the_measured_calls(run):
    doc = json.loads((ROOT / "docs" / run).read_text())
    for t in range(len(doc["results"])):
        rows = bench.report.prediction_rows(doc, t)
        assert [x["k"] for x in rows] == doc["config"]["ks"]
        for x in rows:
            s = doc["results"][t]["systems"][f"spec_k{x['k']}"]
            chain = [v for _, v in bench.report.prediction_gap(x)]
            assert chain[0] == pytest.approx(s["predicted_speedup"]), "starts at the theorem"
            assert chain[1] == pytest.approx(s["predicted_speedup_with_verify_cost"]), "then v_K in place of 1"
            assert chain[5] == pytest.approx(s["decode_speedup"]) and chain[6] == s["vs_ar"], "ends measured"
            assert x["step"] == pytest.approx(x["draft"] + x["target"] + x["other"])
    with pytest.raises(ValueError, match="temperature_index"):
        bench.report.prediction_rows(doc, len(doc["results"]))


def test_bytes_per_token_counts_every_weight_once_and_the_kv_cache_read():
    cfg = ModelConfig()  # SmolLM2-135M: tied embeddings, 30 layers, 3 KV heads of 64
    assert bytes_per_token(cfg, 0, 4) == cfg.num_params * 4, "a tied embedding is the head: read whole"
    untied = ModelConfig(tie_embeddings=False)
    assert bytes_per_token(untied, 0, 2) == (untied.num_params - 49152 * 576) * 2, \
        "an untied input embedding is only gathered, one row per token, and must not be counted as streamed"
    assert bytes_per_token(cfg, 100, 4) == cfg.num_params * 4 + 2 * 30 * 3 * 64 * 100 * 4


def test_alpha_from_steps_is_accepted_over_trials():
    assert bench.alpha_from_steps(6, 2) == pytest.approx(0.75)  # e.g. K=4 steps: 4 accepted (bonus), then 2, then 0
    assert bench.alpha_from_steps(0, 0) is None


def test_ratio_interval_is_a_paired_bootstrap_over_the_prompts():
    tokens, seconds = [60, 64, 20, 64, 48], [2.0, 2.5, 0.6, 1.9, 1.7]
    same = bench.ratio_interval(tokens, seconds, tokens, seconds)
    assert same == pytest.approx((1.0, 1.0)), "a system against itself: every resample gives 1"
    twice = bench.ratio_interval(tokens, [x / 2 for x in seconds], tokens, seconds)
    assert twice == pytest.approx((2.0, 2.0)), "twice as fast on every prompt: pairing removes the spread"
    # Faster on some prompts only: the interval is wide and holds the ratio of the sums
    tokens, seconds = tokens * 3, seconds * 3  # 15 prompts
    fast = [x * f for x, f in zip(seconds, [0.5, 1.0, 0.5, 0.5, 1.0, 0.6, 0.9, 0.5, 0.7, 1.0, 0.5, 0.8, 0.6, 0.5, 1.0])]
    lo, hi = bench.ratio_interval(tokens, fast, tokens, seconds)
    point = (sum(tokens) / sum(fast)) / (sum(tokens) / sum(seconds))
    assert lo < point < hi and hi - lo > 0.1
    assert bench.ratio_interval(tokens, fast, tokens, seconds, seed=1) != (lo, hi), "the seed is used"
    assert bench.ratio_interval(tokens, fast, tokens, seconds) == (lo, hi), "and it repeats with the same seed"
    assert bench.ratio_interval([5], [1.0], [5], [2.0]) is None, "one prompt has no spread to resample"
    assert bench.ratio_interval(tokens, seconds, tokens[:3], seconds[:3]) is None, "unpaired lists"


def test_list_options_parse_ranges_and_lists_and_name_the_option_when_bad():
    assert bench.parse_list("1-8", int, "--ks") == tuple(range(1, 9))
    assert bench.parse_list("2,4", int, "--ks") == (2, 4)
    assert bench.parse_list("0,0.7", float, "--temperatures") == (0.0, 0.7)
    with pytest.raises(ValueError, match="--ks"):
        bench.parse_list("two", int, "--ks")


def test_bench_config_rejects_bad_values_naming_them():
    for kw, name in [(dict(num_prompts=0), "num_prompts"), (dict(num_prompts=25), "num_prompts"),
                     (dict(prompt_set="held-out", num_prompts=73), "num_prompts"), (dict(prompt_set="x"), "prompt_set"),
                     (dict(max_new_tokens=0), "max_new_tokens"), (dict(temperatures=(-1.0,)), "temperatures"),
                     (dict(ks=(0,)), "ks"), (dict(samples=0), "samples"), (dict(samples=True), "samples"),
                     (dict(samples=1.5), "samples")]:
        with pytest.raises(ValueError, match=name):
            bench.BenchConfig(**kw)


def test_sampling_runs_every_system_once_per_seed_with_the_same_seeds():
    """samples=N: N calls per prompt when sampling, one when greedy; every system gets the same seeds,
    and a prompt's samples stay together in the per-prompt sums the interval resamples."""
    cfg = bench.BenchConfig(num_prompts=2, samples=3, seed=5, warmup_tokens=1, max_new_tokens=3)
    assert bench.seeds_for(cfg, 0.0, 1) == [6]
    assert bench.seeds_for(cfg, 0.7, 1) == [6, 6 + bench.SAMPLE_STRIDE, 6 + 2 * bench.SAMPLE_STRIDE]
    assert bench.seeds_for(bench.BenchConfig(seed=5), 0.7, 1) == [6], "one sample keeps the seeds of before"
    seen = {"a": [], "b": []}

    def system(name):
        def run(ids, n, temperature, seed):
            seen[name].append((ids[0], seed))
            return [seed % 7] * (1 + seed % 3), None  # lengths that differ from sample to sample
        return bench.System(name, name, run, own=False)

    prompts = [[10], [20]]
    for temperature, calls in ((0.0, 1), (0.7, 3)):
        seen = {"a": [], "b": []}
        tallies = bench.run_systems([system("a"), system("b")], prompts, cfg, temperature, lambda: 0.0)
        timed = {n: v[1:] for n, v in seen.items()}  # the first call of each is the warm-up
        assert timed["a"] and sorted(timed["a"]) == sorted(timed["b"]), "both systems must run the same seeds"
        assert sorted(timed["a"]) == sorted((p[0], s) for i, p in enumerate(prompts)
                                            for s in bench.seeds_for(cfg, temperature, i))
        t = tallies["a"]
        assert t.calls == 2 * calls and t.call_prompts == [0] * calls + [1] * calls
        prompt_ids, tokens, _ = t.per_prompt()
        assert prompt_ids == [0, 1] and tokens == [sum(len(o) for o in t.outputs[:calls]),
                                                   sum(len(o) for o in t.outputs[calls:])]


def test_the_interval_and_kinds_count_prompts_not_calls_when_sampling():
    ar, spec = bench.Tally(), bench.Tally()
    calls = [(0, 4, 1.0, 0.5), (0, 2, 1.0, 1.0), (1, 6, 2.0, 1.0), (1, 6, 2.0, 3.0)]  # prompt, tokens, ar s, spec s
    for p, n, sec_ar, sec_spec in calls:
        ar.add([1], [0] * n, sec_ar, prompt=p)
        spec.add([1], [0] * n, sec_spec, prompt=p)
    assert spec.per_prompt() == ([0, 1], [6, 12], [1.5, 4.0])
    assert bench.run._interval_vs(spec, ar) == bench.ratio_interval([6, 12], [1.5, 4.0], [6, 12], [2.0, 4.0])
    out = bench.by_kind(spec, ar, ["a", "b"])
    assert out["a"]["prompts"] == 1 and out["a"]["tokens"] == 6 and out["b"]["tokens"] == 12
    assert out["a"]["vs_ar"] == pytest.approx((6 / 1.5) / (6 / 2.0))
    assert out["b"]["vs_ar"] == pytest.approx((12 / 4.0) / (12 / 4.0))


def test_step_costs_time_every_kind_and_restore_the_caches(tiny_pair):
    costs = measure_step_costs(tiny_pair.target, tiny_pair.draft, ks=(1, 3), context=16, reps=2, warmup=1)
    assert costs.target_forward > 0 and costs.draft_forward > 0 and set(costs.verify) == {1, 3}
    assert costs.c == costs.draft_forward / costs.target_forward
    assert costs.verify_cost(3) == costs.verify[3] / costs.target_forward


def test_synthetic_mode_is_gpu_only_with_a_clear_error():
    with pytest.raises(ValueError, match="GPU-only"):
        bench.run_synthetic("llama3-8b", device="cpu")


def test_synthetic_mode_runs_end_to_end_on_tiny_shapes():
    """The GPU path's pieces, on CPU with small shapes: random models on the device, costs,
    roofline, syncs per step, predictions."""
    t = ModelConfig(vocab_size=128, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16,
                    intermediate_size=128, max_seq_len=256, eos_token_ids=())
    d = ModelConfig(vocab_size=128, dim=32, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=16,
                    intermediate_size=64, max_seq_len=256, eos_token_ids=())
    doc = bench.run_synthetic((t, d), device="cpu", dtype=torch.float32, ks=(1, 2), prompt_len=8,
                              max_new_tokens=8, reps=2, allow_cpu=True)
    json.dumps(doc)
    assert doc["models"]["target"]["params"] == t.num_params
    assert doc["roofline"]["ar_decode_tokens_per_second"] > 0 and doc["costs"]["c"] > 0
    assert doc["syncs"]["engine_counted_syncs_per_step"] == 1.0, "the vectorised step has exactly one sync"
    assert doc["predicted"]["0.8"][2]["speedup"] == pytest.approx(expected_speedup(0.8, 2, doc["costs"]["c"]))
    assert "synthetic" in bench.format_synthetic(doc)


def test_random_model_on_the_device_has_real_weights_and_rope_tables():
    cfg = ModelConfig(vocab_size=64, dim=32, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=16,
                      intermediate_size=64, max_seq_len=64)
    m = bench.random_model(cfg, "cpu", torch.float32, seed=0)
    assert m.layers[0].attn_norm.weight.eq(1).all() and m.head.weight.std() == pytest.approx(0.02, rel=0.2)
    assert m.rope_cos[0].eq(1).all(), "to_empty leaves the rope buffers as garbage unless they are rebuilt"
    assert torch.isfinite(m(torch.tensor([[1, 2, 3]]))).all()


# ----------------------------------------------------------------------------- the smoke run


@pytest.fixture(scope="module")
def stand_in_draft_dir(default_target, tmp_path_factory):
    """A 1-layer random draft with the target's vocabulary, saved as the shipped draft is (float16)."""
    from specdec_lab.train.distill import draft_config, save_draft
    from specdec_lab.core.model import Transformer, init_weights
    out = tmp_path_factory.mktemp("draft")
    return save_draft(init_weights(Transformer(draft_config(default_target.cfg, n_layers=1))), out)


@pytest.fixture(scope="module")
def quick_doc(default_target, hf_target, stand_in_draft_dir):
    from specdec_lab.io.weights import load_hf_causal_lm
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        draft = load_draft(stand_in_draft_dir)
        cfg = bench.BenchConfig(num_prompts=2, max_new_tokens=8, temperatures=(0.0, 0.7), ks=(2,),
                                cost_reps=3, warmup_tokens=2, quick=True, samples=2)
        feature = FeatureDraft(default_target, vocab_ids=range(4096)).eval().requires_grad_(False)  # random
        return bench.run_bench(default_target, draft, cfg, hf_target, load_hf_causal_lm(stand_in_draft_dir),
                               feature_draft=feature)
    finally:
        torch.set_num_threads(threads)


FEATURE = [f"spec_feat_k{k}" for k in bench.FEATURE_KS] + ["spec_feat_stop", "spec_feat_lookup"]
SELF = [f"spec_self_k{k}" for k in bench.SELF_KS]
SELF_WEIGHTS = "int4" if kernels.has_int4() else "int8"  # the default target's shapes fit 4 bits
EXPECTED = ["ar", "spec_k2", "spec_adaptive", "spec_stop", "spec_lookup", *FEATURE, *SELF, "spec_self_lookup",
            f"{SELF_WEIGHTS}_decode", "hf_generate", "hf_assisted"]


@pytest.mark.slow
def test_quick_bench_runs_every_system_with_positive_tokens_per_second(quick_doc):
    doc = json.loads(json.dumps(quick_doc))  # what the CLI prints must round-trip
    assert [r["temperature"] for r in doc["results"]] == [0.0, 0.7]
    assert [r["samples_per_prompt"] for r in doc["results"]] == [1, 2], "greedy runs once, sampling twice"
    for r in doc["results"]:
        assert list(r["systems"]) == EXPECTED
        for name, s in r["systems"].items():
            assert s["tokens_per_second"] > 0 and s["calls"] == 2 * r["samples_per_prompt"], \
                f"{name} at T={r['temperature']}"


@pytest.mark.slow
def test_ratios_are_the_quotients_of_the_tokens_per_second_figures(quick_doc):
    for r in quick_doc["results"]:
        sy = r["systems"]
        for s in sy.values():
            assert s["tokens_per_second"] == pytest.approx(s["tokens"] / s["seconds"])
            assert s["vs_ar"] == pytest.approx(s["tokens_per_second"] / sy["ar"]["tokens_per_second"])
            assert s["vs_hf_generate"] == pytest.approx(s["tokens_per_second"] / sy["hf_generate"]["tokens_per_second"])
            assert s["vs_hf_assisted"] == pytest.approx(s["tokens_per_second"] / sy["hf_assisted"]["tokens_per_second"])
            lo, hi = s["vs_ar_ci95"]
            assert lo <= s["vs_ar"] + 1e-9 and s["vs_ar"] <= hi + 1e-9, "the interval must hold the ratio itself"
        assert sy["ar"]["vs_ar_ci95"] == pytest.approx((1.0, 1.0))
        best = quick_doc["targets"][f"t{r['temperature']:g}_best_speculative"]
        assert quick_doc["targets"][f"t{r['temperature']:g}_best_speculative_vs_ar"]["ci95"] == sy[best]["vs_ar_ci95"]


@pytest.mark.slow
def test_a_quick_run_prints_its_figures_and_judges_no_target(quick_doc):
    t = quick_doc["targets"]
    assert t["not_judged"].startswith("a --quick run is a smoke test")
    judged = {n: v for n, v in t.items() if isinstance(v, dict)}
    assert judged and all(v["met"] is None and v["value"] is not None for v in judged.values()), judged
    table = bench.format_table(quick_doc)
    assert "NOT JUDGED, a --quick run is a smoke test" in table and "not judged" in table
    assert " met" not in table.replace("NOT met", ""), "a quick run never says a target is met"


def test_only_a_full_run_is_held_to_the_targets():
    assert bench.judged(bench.BenchConfig()) is None
    assert bench.judged(bench.BenchConfig(max_new_tokens=64, num_prompts=24)) is None
    assert "2 of the 24 prompts" in bench.judged(bench.BenchConfig(num_prompts=2))
    assert "16 new tokens" in bench.judged(bench.BenchConfig(max_new_tokens=16))
    assert "smoke test" in bench.judged(bench.BenchConfig(quick=True))


@pytest.mark.slow
def test_predicted_speedup_is_theorem_3_8_from_the_measured_alpha_and_c(quick_doc):
    c = quick_doc["costs"]["c"]
    costs = quick_doc["costs"]
    assert c == pytest.approx(costs["draft_forward_seconds"] / costs["target_forward_seconds"])
    for r in quick_doc["results"]:
        s = r["systems"]["spec_k2"]
        assert 0.0 <= r["alpha"] <= 1.0 and r["alpha_positions"] > 0
        assert s["predicted_speedup"] == pytest.approx(expected_speedup(r["alpha"], 2, c))
        assert s["measured_speedup"] == s["vs_ar"]
        assert s["prediction_error"] == pytest.approx(s["measured_speedup"] / s["predicted_speedup"] - 1)
        assert s["mean_tokens_per_step"] >= 1.0 and s["syncs_per_step"] == 1.0
        ar = r["systems"]["ar"]
        assert ar["decode_speedup"] == 1.0
        assert s["decode_speedup"] == pytest.approx(s["decode_tokens_per_second"] / ar["decode_tokens_per_second"])
        v = costs["verify_cost"]["2"] if "2" in costs["verify_cost"] else costs["verify_cost"][2]
        assert s["predicted_speedup_with_verify_cost"] == pytest.approx(expected_speedup(r["alpha"], 2, c, v))
        assert s["decode_prediction_error_with_verify_cost"] == pytest.approx(
            s["decode_speedup"] / s["predicted_speedup_with_verify_cost"] - 1)


@pytest.mark.slow
def test_variable_k_systems_carry_no_prediction_and_the_error_target_names_its_system(quick_doc):
    for r in quick_doc["results"]:
        tag = f"t{r['temperature']:g}"
        for name in ("spec_stop", "spec_lookup"):
            s = r["systems"][name]
            assert s["k"] == f"<={bench.STOP_K}" and 0 < s["mean_k"] <= bench.STOP_K
            assert "predicted_speedup" not in s and s["measured_speedup"] == s["vs_ar"]
        for name in FEATURE:  # the feature draft's acceptance falls with depth: no one alpha to predict with
            s = r["systems"][name]
            assert "predicted_speedup" not in s and s["measured_speedup"] == s["vs_ar"] and s["alpha"] is not None
        assert r["systems"]["spec_feat_stop"]["k"] == f"<={bench.FEATURE_STOP_K}"
        assert r["systems"]["spec_feat_lookup"]["k"] == f"<={bench.FEATURE_LOOKUP_K}"
        t = quick_doc["targets"]
        assert t[f"{tag}_prediction_error_of"] in ("spec_k2", "spec_adaptive")
        assert t[f"{tag}_prediction_error"]["value"] == pytest.approx(
            abs(r["systems"][t[f"{tag}_prediction_error_of"]]["prediction_error"]))
        e = r["systems"][t[f"{tag}_prediction_error_of"]]["decode_prediction_error_with_verify_cost"]
        if e is None:  # adaptive K predicted at a K whose verification was not timed: no v_K to use
            assert f"{tag}_decode_prediction_error_with_v" not in t
        else:
            assert t[f"{tag}_decode_prediction_error_with_v"]["value"] == pytest.approx(abs(e))


@pytest.mark.slow
def test_self_draft_systems_are_predicted_from_their_own_alpha_and_c(quick_doc):
    # The self-draft's alpha is not the shipped draft's: the theorem takes the figures its own steps
    # measured, with the verification cost timed at its K.
    costs = quick_doc["costs"]
    assert quick_doc["models"]["self_draft"] == SELF_WEIGHTS
    for r in quick_doc["results"]:
        for k, name in zip(bench.SELF_KS, SELF):
            s = r["systems"][name]
            assert s["label"] == f"self-draft {SELF_WEIGHTS}, K={k}" and "predicted_speedup" not in s
            assert 0.0 <= s["alpha"] <= 1.0 and s["c"] > 0 and s["mean_k"] <= k
            v = costs["verify_cost"][str(k)] if str(k) in costs["verify_cost"] else costs["verify_cost"][k]
            assert s["predicted_speedup_own"] == pytest.approx(expected_speedup(s["alpha"], k, s["c"], v))
        s = r["systems"]["spec_self_lookup"]  # copied and drafted steps mixed: no single alpha and c to predict from
        assert s["label"] == f"self-draft {SELF_WEIGHTS}, lookup + K={bench.SELF_LOOKUP_K}"
        assert s["k"] == f"<={bench.SELF_LOOKUP_K}" and "predicted_speedup_own" not in s and "predicted_speedup" not in s
        s = r["systems"][f"{SELF_WEIGHTS}_decode"]  # the same weights decoding alone: no drafts, no prediction
        assert s["label"] == f"{SELF_WEIGHTS} decode alone, unverified" and "alpha" not in s and s["mean_tokens_per_step"] == 1.0
        # the bar is also reported for the shipped draft alone, where another draft is the fastest
        t, tag = quick_doc["targets"], f"t{r['temperature']:g}"
        shipped = t.get(f"{tag}_best_with_shipped_draft")
        if t[f"{tag}_best_speculative"].startswith(("spec_feat", "spec_self")):
            assert shipped in ("spec_k2", "spec_adaptive", "spec_stop", "spec_lookup")
            assert t[f"{tag}_best_with_shipped_draft_vs_ar"]["value"] == r["systems"][shipped]["vs_ar"]
        else:
            assert shipped == t[f"{tag}_best_speculative"]


@pytest.mark.slow
def test_speedups_by_kind_of_prompt_are_ratios_over_those_prompts(quick_doc):
    from specdec_lab.train.prompts import BENCH_KINDS
    for r in quick_doc["results"]:
        sy = r["systems"]
        for name, s in sy.items():
            bk = s["by_kind"]
            assert list(bk) == ["chat"], "the quick run's 2 prompts are both chat prompts"
            assert bk["chat"]["prompts"] == 2 and bk["chat"]["tokens"] == s["tokens"]
            # Every call is of one kind here, so the kind's figures are the system's.
            assert bk["chat"]["vs_ar"] == pytest.approx(s["vs_ar"])
            if name in ("hf_generate", "hf_assisted"):
                assert bk["chat"]["mean_tokens_per_step"] is None
            else:
                assert bk["chat"]["mean_tokens_per_step"] == pytest.approx(s["mean_tokens_per_step"])
    assert BENCH_KINDS[:2] == ["chat", "chat"]


def test_by_kind_splits_the_calls_by_their_prompts_kind():
    ar, spec = bench.Tally(), bench.Tally()
    for n, sec_ar, sec_spec in [(4, 1.0, 0.5), (2, 1.0, 1.0), (6, 2.0, 1.0)]:
        ar.add([1], [0] * n, sec_ar)
        spec.add([1], [0] * n, sec_spec)
    kinds = ["a", "b", "a"]
    out = bench.by_kind(spec, ar, kinds)
    assert list(out) == ["a", "b"]
    assert out["a"]["tokens"] == 10 and out["a"]["vs_ar"] == pytest.approx((10 / 1.5) / (10 / 3.0))
    assert out["b"]["vs_ar"] == pytest.approx(1.0) and out["b"]["mean_tokens_per_step"] is None


@pytest.mark.slow
def test_greedy_speculative_and_transformers_reproduce_greedy_decoding(quick_doc):
    sy = quick_doc["results"][0]["systems"]
    for name in EXPECTED:
        if name != f"{SELF_WEIGHTS}_decode":  # the rounded weights alone, unverified: another model, reported as such
            assert sy[name]["same_output_as_ar"] == 1.0, f"{name} at temperature 0 differs from greedy decoding"
    assert 0.0 <= sy[f"{SELF_WEIGHTS}_decode"]["same_output_as_ar"] <= 1.0


@pytest.mark.slow
def test_roofline_fraction_uses_the_ar_decode_rate_and_the_measured_bandwidth(quick_doc, default_target):
    rf = quick_doc["roofline"]
    assert rf["weight_bytes"] == default_target.cfg.num_params * 4  # float32, tied embeddings
    assert rf["bandwidth_bytes_per_s"] > 1e8 and 0 < rf["fraction_of_bandwidth"] < 5
    assert rf["bandwidth_samples"]["n"] == 2 * 2, "one bandwidth sample after each prompt's rounds, per temperature"
    assert rf["fraction_of_bandwidth"] == pytest.approx(
        rf["bytes_per_token"] * rf["ar_decode_tokens_per_second"] / rf["bandwidth_bytes_per_s"])
    table = bench.format_table(quick_doc)
    assert "roofline" in table and "transformers assisted" in table


@pytest.mark.slow
def test_cli_prints_a_table_then_one_json_document_as_the_last_line(stand_in_draft_dir):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "specdec_lab", "bench", "--quick", "--no-hf", "--prompts", "1",
                           "--max-new-tokens", "4", "--ks", "2", "--temperatures", "0", "--threads", "1",
                           "--draft-dir", str(stand_in_draft_dir), "--no-feature-draft", "--no-self-draft",
                           "--prompt-set", "held-out"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.strip().splitlines()
    doc = json.loads(lines[-1])
    assert doc["prompts"] == {"set": "held-out", "count": 1} and "1 held-out prompts" in proc.stdout
    assert list(doc["results"][0]["systems"]["ar"]["by_kind"]) == ["explain"], "the hand-written prompts' kinds"
    assert len(lines) > 5 and "speculative, K=2" in proc.stdout, "the table should come before the JSON"
    assert list(doc["results"][0]["systems"]) == ["ar", "spec_k2", "spec_adaptive", "spec_stop", "spec_lookup"]
    assert math.isfinite(doc["roofline"]["fraction_of_bandwidth"])


def test_cli_refuses_synthetic_on_cpu_with_exit_code_2():
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "specdec_lab", "bench", "--synthetic", "llama3-8b", "--threads", "1"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "GPU-only" in proc.stderr and "Traceback" not in proc.stderr


def test_compare_caches_runs_both_caches_and_finds_the_same_outputs():
    t = tiny_model(0)
    d = tiny_model(1, dim=32, n_heads=2, n_kv_heads=1)
    doc = bench.compare_caches(t, d, [[1, 2, 3], [4, 5]], k=3, max_new_tokens=12, block_size=4, reps=1)
    assert doc["same_outputs"], "the paged cache changed the greedy output"
    assert doc["contiguous_over_paged"] > 0 and set(doc["tokens_per_second"]) == {"contiguous", "paged"}


def test_compare_policies_times_every_policy_and_reports_the_ratios():
    t = tiny_model(0)
    d = tiny_model(1, dim=32, n_heads=2, n_kv_heads=1)
    doc = bench.compare_policies(t, d, prompts=([1, 2, 3], [4, 5]), ks=(1, 3), temperature=1.0,
                                 max_new_tokens=10, reps=2, verify_cost={1: 1.0, 2: 1.0, 3: 1.0})
    assert set(doc["tokens_per_second"]) == {"K=1", "K=3", "cost-aware", "threshold"}
    assert all(v > 0 for v in doc["tokens_per_second"].values())
    rate = doc["tokens_per_second"]
    assert doc["best_fixed"] == max(("K=1", "K=3"), key=rate.get)
    assert doc["cost_aware_vs_best_fixed"] == pytest.approx(rate["cost-aware"] / rate[doc["best_fixed"]])
    assert doc["cost_aware_vs_k_max"] == pytest.approx(rate["cost-aware"] / rate["K=3"])
    assert doc["mean_k"]["K=1"] <= 1 and doc["mean_k"]["K=3"] <= 3
    assert "cost-aware / best fixed" in bench.format_policies(doc)


def test_profile_decode_splits_a_token_into_products_and_the_rest():
    t = accelerated(tiny_model(0))
    doc = bench.profile_decode(t, context=8, steps=3, bandwidth=1e10)
    assert doc["seconds_per_token"] > 0 and 0 < doc["product_share"] <= 1
    assert doc["product_seconds"] + doc["other_seconds"] == pytest.approx(doc["seconds_per_token"])
    assert doc["weight_bytes"] == bytes_per_token(t.cfg, 0, 4)
    assert doc["product_fraction_of_bandwidth"] == pytest.approx(doc["product_bytes_per_s"] / 1e10)
    assert "matrix products" in bench.format_profile(doc)
    assert doc["eager_seconds"] > 0
    from specdec_lab.cpu import build as kernels
    if kernels.available():
        assert doc["fused_seconds"] > 0 and "fused forward" in bench.format_profile(doc)
        assert t.runner is not None, "profile_decode must give the model back accelerated"
    plain = bench.profile_decode(tiny_model(0), context=8, steps=3, bandwidth=1e10)
    assert plain["fused_seconds"] is None, "a plain model has no one-call forward to time"


def test_compare_kernels_times_every_product_kind_through_every_kernel():
    from specdec_lab.cpu import build as kernels
    t = tiny_model(0)
    doc = bench.compare_kernels(t, rows=(1, 3), reps=1)
    kinds = {name.split(" ")[0] for name in doc["products"]}
    assert kinds == {"wqkv", "wo", "w13", "w2", "head"}
    expected = {"torch"} | ({"onednn"} if HAVE_PACKING else set()) | (
        {"panel"} if kernels.available() else set())
    for name, p in doc["products"].items():
        assert set(p["gb_per_s"]) == expected, name
        assert all(v > 0 for v in p["gb_per_s"].values())
        assert p["bytes"] == p["matrices"] * 4 * int(name.split(" ")[1].split("x")[0]) * int(
            name.split(" ")[1].split("x")[1].rstrip(","))
    header = bench.format_kernels(doc).splitlines()[1]
    assert all(system in header for system in expected)
