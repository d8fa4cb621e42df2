"""The decode_ceiling exercise (chapter 01): the reference passes, each classic mistake fails with its own
diagnosis, a correct answer written another way passes, and the reference is analysis/roofline.py's
arithmetic on the chapter's figures. The mistaken answers are written as a learner would write them."""
import time

import pytest
import torch

from specdec_lab.analysis import roofline as rf
from specdec_lab.bench.machine import load_profile
from specdec_lab.lab import exercises
from specdec_lab.lab.exercises.ceiling import CASES, PROFILE_READ, decode_ceiling
from test_exercises import assert_diagnosed


def check(fn):
    return exercises.check("decode_ceiling", fn)


# ---- a learner's mistakes ----

def weights_only(n_params, bytes_per_param, context, kv_bytes_per_position, bandwidth):
    return bandwidth / (n_params * bytes_per_param)


def in_bits(n_params, bytes_per_param, context, kv_bytes_per_position, bandwidth):
    bits = 8 * (n_params * bytes_per_param + context * kv_bytes_per_position)
    return bandwidth / bits


def weight_bits_as_bytes(n_params, bytes_per_param, context, kv_bytes_per_position, bandwidth):
    bits_per_param = 8 * bytes_per_param  # a float32 weight counted as 32 bytes
    return bandwidth / (n_params * bits_per_param + context * kv_bytes_per_position)


def bandwidth_in_bits(n_params, bytes_per_param, context, kv_bytes_per_position, bandwidth):
    return bandwidth * 8 / (n_params * bytes_per_param + context * kv_bytes_per_position)


def one_byte_per_param(n_params, bytes_per_param, context, kv_bytes_per_position, bandwidth):
    return bandwidth / (n_params + context * kv_bytes_per_position)


def fp16_everywhere(n_params, bytes_per_param, context, kv_bytes_per_position, bandwidth):
    return bandwidth / (2 * n_params + context * kv_bytes_per_position)


def cache_times_b(n_params, bytes_per_param, context, kv_bytes_per_position, bandwidth):
    return bandwidth / ((n_params + context * kv_bytes_per_position) * bytes_per_param)


def seconds(n_params, bytes_per_param, context, kv_bytes_per_position, bandwidth):
    return (n_params * bytes_per_param + context * kv_bytes_per_position) / bandwidth


MISTAKES = [
    (weights_only, "no_kv_cache"),
    (in_bits, "bits_for_bytes"),
    (weight_bits_as_bytes, "bits_for_bytes"),
    (bandwidth_in_bits, "bits_for_bytes"),
    (one_byte_per_param, "params_as_bytes"),
    (fp16_everywhere, "two_bytes_assumed"),
    (cache_times_b, "cache_bytes_times_b"),
    (seconds, "seconds_per_token"),
]


# ---- correct, written another way ----

def with_the_library(n_params, bytes_per_param, context, kv_bytes_per_position, bandwidth):
    return rf.tokens_per_second_ceiling(n_params * bytes_per_param + context * kv_bytes_per_position, bandwidth)


def in_gigabytes(n_params, bytes_per_param, context, kv_bytes_per_position, bandwidth):
    weights_gb = n_params * bytes_per_param / 1e9
    cache_gb = context * kv_bytes_per_position / 1e9
    return (bandwidth / 1e9) / (weights_gb + cache_gb)


def one_over_seconds(n_params, bytes_per_param, context, kv_bytes_per_position, bandwidth):
    seconds_per_token = (n_params * bytes_per_param + context * kv_bytes_per_position) / bandwidth
    return torch.tensor(1.0, dtype=torch.float64) / seconds_per_token  # a 0-d tensor is a number too


def counting_the_new_position(n_params, bytes_per_param, context, kv_bytes_per_position, bandwidth):
    return bandwidth / (n_params * bytes_per_param + (context + 1) * kv_bytes_per_position)


OTHER_WAYS = [with_the_library, in_gigabytes, one_over_seconds, counting_the_new_position]


def test_the_reference_passes():
    report = check(exercises.solution("decode_ceiling"))
    assert report.passed, repr(report)
    assert report.diagnosis is None and "6 cases" in report.message


@pytest.mark.parametrize("fn, diagnosis", MISTAKES, ids=[f"{d}-{f.__name__}" for f, d in MISTAKES])
def test_each_mistake_fails_with_its_own_diagnosis(fn, diagnosis):
    report = check(fn)
    assert_diagnosed(report, diagnosis)


def test_a_forgotten_cache_is_right_at_short_contexts_and_caught_at_long_ones():
    message = check(weights_only).message
    assert "context 4,096" in message, message
    assert "29.06 tokens/s, but your function returned 29.34" in message, message
    assert "implies 139.0 GB read per token, where a token reads 140.3 GB: 139.0 GB of weights and 1.342 GB" in message


def test_the_failure_names_the_case_both_ceilings_and_the_bytes_they_imply():
    message = check(in_bits).message
    assert message.startswith("For 70B parameters in FP16 at context 0 on one A100 80GB (2.039 TB/s), "
                              "the ceiling is 14.56 tokens/s, but your function returned 1.821."), message
    assert "Yours implies 1,120 GB read per token, where a token reads 140.0 GB: the weights alone" in message, message


@pytest.mark.parametrize("fn", OTHER_WAYS, ids=[f.__name__ for f in OTHER_WAYS])
def test_a_correct_answer_written_another_way_passes(fn):
    report = check(fn)
    assert report.passed, repr(report)


@pytest.mark.parametrize("returned", ["14.6 tokens/s", None, [14.6]])
def test_a_non_number_gets_a_clear_message(returned):
    report = check(lambda *args: returned)
    assert not report.passed and report.diagnosis is None
    assert "it should return a number" in report.message and repr(returned) in report.message, report.message


@pytest.mark.parametrize("returned", [0, -14.56, float("nan"), float("inf")])
def test_a_ceiling_that_is_not_a_positive_rate_is_told_so(returned):
    report = check(lambda *args: returned)
    assert not report.passed and "a ceiling is a positive number of tokens per second" in report.message, report


def test_a_starter_that_raises_not_implemented_is_not_written_yet():
    def my_ceiling(n_params, bytes_per_param, context, kv_bytes_per_position, bandwidth):
        raise NotImplementedError("write the ceiling here")
    report = check(my_ceiling)
    assert not report.passed and report.diagnosis is None and "not written" in report.message


def test_an_exception_is_reported_with_its_case_not_raised():
    def divides_by_context(n_params, bytes_per_param, context, kv_bytes_per_position, bandwidth):
        return bandwidth / (n_params * bytes_per_param) * context / context
    report = check(divides_by_context)
    assert not report.passed and "ZeroDivisionError" in report.message and "context 0" in report.message


def test_the_reference_is_the_rooflines_arithmetic_on_the_default_target_and_70b():
    a100, h200 = rf.HARDWARE["A100 80GB"].bandwidth, rf.HARDWARE["H200"].bandwidth
    for cfg, b, bandwidth in ((rf.SMOLLM2_135M, 4, PROFILE_READ), (rf.LLAMA_3_70B, 2, a100), (rf.LLAMA_3_70B, 1, h200)):
        for context in (0, 1, 64, 4096, 8192, 32768):
            mine = decode_ceiling(rf.streamed_params(cfg), b, context, rf.kv_bytes_per_position(cfg, b), bandwidth)
            library = rf.tokens_per_second_ceiling(rf.bytes_per_token(cfg, context, b), bandwidth)
            assert mine == pytest.approx(library, rel=1e-12), (cfg, b, context)


def test_the_cases_are_the_chapters_figures():
    ceilings = [decode_ceiling(*args) for _, args in CASES]
    assert [f"{c:.1f}" for c in ceilings[:4]] == ["14.6", "69.1", "29.1", "27.2"], ceilings
    assert f"{load_profile()['bandwidth_read'] / 1e9:.1f}" == f"{PROFILE_READ / 1e9:.1f}" == "32.6"
    n, b = CASES[-1][1][:2]
    assert f"{n / 1e6:.1f} {n * b / 1e6:.0f}" == "134.5 538", "SmolLM2-135M: 134.5M parameters, 538 MB in float32"


def test_the_check_runs_well_under_a_second():
    start = time.perf_counter()
    check(decode_ceiling), check(weights_only), check(seconds)
    assert time.perf_counter() - start < 0.5
