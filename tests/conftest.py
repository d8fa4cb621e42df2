"""Shared fixtures: the default target (ours and transformers'), and a tiny random pair.

The default target loads once per session (about 6 s); transformers' copy of it
is the oracle for parity tests. Tests marked `gpu` are skipped without CUDA.
"""
import pytest
import torch

from specdec_lab.io.pair import ModelPair, load_model_cached, tiny_model


@pytest.fixture(autouse=True, scope="session")
def one_torch_thread():
    """One torch thread per process: tiny models on 2 busy cores run ~10x slower with two
    contending threads, and `make test` runs JupyterLab and a kernel beside pytest."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA (marked gpu)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def default_target_dir():
    """The converted Hugging Face folder of SmolLM2-135M-Instruct (fetched once if missing)."""
    from specdec_lab.io.assets import ensure_default_target
    return ensure_default_target()


@pytest.fixture(scope="session")
def default_target(default_target_dir):
    """The project's decoder for the default target, float32 on CPU, with `.tokenizer`."""
    return load_model_cached(default_target_dir)


@pytest.fixture(scope="session")
def hf_target(default_target_dir):
    """transformers' LlamaForCausalLM for the same folder, float32 on CPU: the oracle."""
    from specdec_lab.io.weights import load_hf_model
    model, _ = load_hf_model(default_target_dir)
    return model


@pytest.fixture
def tiny_pair():
    """A 2-layer GQA target and a 1-layer draft with the same 64-token vocabulary; no tokenizer."""
    return ModelPair(target=tiny_model(0), draft=tiny_model(1, n_layers=1), tokenizer=None)
