"""Shared fixtures: the default target (ours and transformers'), and a tiny random pair.

The default target loads once per session (about 6 s; once per worker under `pytest -n`);
transformers' copy of it is the oracle for parity tests. Tests marked `gpu` are skipped without CUDA.

`make test` runs two pytest-xdist workers that share the cache (~/.cache/specdec_lab): what is
built there on first use is built under a file lock (cache_lock), so one worker builds it and the
other waits and reads the finished file.
"""
import fcntl
import json
import os
from contextlib import contextmanager

import pytest
import torch

from specdec_lab.core.config import cache_dir
from specdec_lab.io.pair import ModelPair, load_model_cached, tiny_model


@contextmanager
def cache_lock(name):
    """Hold an exclusive lock on cache_dir()/.name.lock, across processes, for the block."""
    with open(cache_dir() / f".{name}.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@pytest.fixture(autouse=True, scope="session")
def one_torch_thread():
    """One torch thread per process: tiny models on 2 busy cores run ~10x slower with two
    contending threads, and `make test` runs JupyterLab and a kernel beside pytest."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def pytest_collection_finish(session):
    """Under pytest-xdist, export the shipped draft's GGUF into the cache (bench/peer.py's
    exported_draft_gguf) before any test or chapter reads it: a chapter's kernel and a test in the
    other worker would otherwise write the same file at once. The first worker exports it under
    the lock; the other finds it there. A failure is left to the tests that need the file."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    files = {item.path for item in session.items}
    if not any("exported_draft_gguf" in path.read_text(errors="ignore") for path in files if path.is_file()):
        return
    from specdec_lab.bench.peer import exported_draft_gguf
    with cache_lock("export"):
        try:
            exported_draft_gguf()
        except Exception:  # noqa: BLE001 -- the tests that read the file report it
            pass


# Files that take minutes (a fixture, a subprocess or a browser), in the order `make test` starts them.
# pytest-xdist hands each worker a whole file (--dist loadfile) in the collection's order; these go
# first so that neither worker is left with one of them at the end while the other idles.
# tests/test_engines.py is not among them: its vLLM servers take more than a core while they start,
# and early on they overlapped chapter 01's live bandwidth and FLOP/s measurement; it runs late.
LONG_FILES = ("tests/test_bench.py", "tests/test_gpu_check.py", "tests/test_browser_demo.py",
              "tests/test_eagle3.py", "notebooks/07_engine_loop.ipynb", "tests/test_engine_default.py", "tests/test_distill.py",
              "tests/test_options.py")


def _long_first(items, root):
    """Whole files, the LONG_FILES first, then the others by item count, largest first (what
    pytest-xdist's own reordering does); each file's items stay in their order."""
    files = {}
    for item in items:
        files.setdefault(item.path.relative_to(root).as_posix() if item.path.is_relative_to(root) else str(item.path),
                         []).append(item)

    def rank(name):
        return (LONG_FILES.index(name), 0) if name in LONG_FILES else (len(LONG_FILES), -len(files[name]))
    items[:] = [item for name in sorted(files, key=rank) for item in files[name]]


def pytest_collection_modifyitems(config, items):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        _long_first(items, config.rootpath)
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
    with cache_lock("default_target"):  # two workers would convert it into the same folder at once
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


@pytest.fixture(scope="session")
def notebook_cells():
    """run(notebook, ids): a fresh namespace after executing those code cells of a chapter (a path), in the
    order given. Tests that check a chapter's figures compute them as the chapter does."""
    def run(notebook, ids):
        cells = {c.get("id"): "".join(c["source"]) for c in json.loads(notebook.read_text())["cells"]}
        namespace = {}
        for cell in ids:
            exec(cells[cell], namespace)  # noqa: S102 -- the repository's own notebook
        return namespace
    return run

