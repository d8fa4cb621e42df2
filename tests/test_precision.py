"""Precision defaults (bfloat16 on CUDA, float32 on the CPU), and what the bench reports where a
greedy answer leaves the autoregressive one."""
import argparse

import pytest
import torch

from specdec_lab.api import autoregressive_generate, check_dtype, compiled_twin, default_dtype, load_pair
from specdec_lab.bench.main import bench_main
from specdec_lab.bench.run import first_difference
from specdec_lab.io.pair import tiny_model


def test_default_dtype_is_bfloat16_on_cuda_and_float32_on_the_cpu():
    assert default_dtype("cpu") == torch.float32
    assert default_dtype("cuda") == torch.bfloat16  # decided from the name: no device needed
    assert check_dtype(None, "cuda:0") == torch.bfloat16
    assert check_dtype(torch.float16, "cpu") == torch.float16
    with pytest.raises(ValueError, match="dtype must be"):
        check_dtype(torch.int8, "cpu")


def test_load_pair_refuses_two_fast_paths_and_bad_flags():
    with pytest.raises(ValueError, match="two different fast paths"):
        load_pair("t", "d", compile=True, accelerate=True)
    with pytest.raises(TypeError, match="compile must be"):
        load_pair("t", "d", compile="yes")
    with pytest.raises(TypeError, match="model must be"):
        compiled_twin("not a model")


def test_compiled_twin_leaves_the_model_as_it_was():
    model = tiny_model()
    twin = compiled_twin(model)
    assert twin.forward_kind == "compiled" and twin.fixed_shapes
    assert model.forward_kind == "eager" and not model.fixed_shapes and model.runner is None
    assert twin.head.weight is model.head.weight  # the same weights, not a copy


def test_first_difference_reports_the_targets_logit_gap():
    model = tiny_model(seed=4)
    prompt = [5, 6, 7]
    ref = autoregressive_generate(model, prompt, max_new_tokens=8).tokens
    assert first_difference(model, prompt, ref, list(ref)) is None
    other = list(ref)
    with torch.inference_mode():
        logits = model(torch.tensor([prompt + ref[:3]]))[0, -1]
    other[3] = int(logits.argsort()[-2])  # the runner-up at position 3
    d = first_difference(model, prompt, ref, other)
    assert d["position"] == 3 and d["reference_token"] == ref[3] and d["other_token"] == other[3]
    assert d["logit_gap"] == pytest.approx(float(logits[ref[3]] - logits[other[3]]), abs=1e-5)
    assert d["logit_gap"] > 0  # greedy took the larger logit


@pytest.mark.parametrize("probe", ["kernels", "profile"])
def test_cpu_only_probes_say_so_on_another_device(probe):
    args = argparse.Namespace(threads=1, device="meta", dtype=None, kernels=probe == "kernels",
                              profile=probe == "profile", caches=False)
    with pytest.raises(ValueError, match=f"--{probe} measures the CPU"):
        bench_main(args, out=lambda s: None, err=lambda s: None)
