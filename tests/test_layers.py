"""The package's shape: layers that import-linter checks, and files a reader can hold in their head."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "specdec_lab"
LINT = Path(sys.executable).with_name("lint-imports")


def _lint(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(LINT), "--config", str(root / "pyproject.toml"), "--no-cache"], cwd=root,
                          env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"}, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.skipif(not LINT.exists(), reason="import-linter is not installed (pip install -e '.[test]')")
def test_the_layer_contracts_hold_and_an_upward_import_breaks_them(tmp_path):
    kept = _lint(ROOT)
    assert kept.returncode == 0, kept.stdout + kept.stderr
    assert "3 kept, 0 broken" in kept.stdout, kept.stdout
    copy = tmp_path / "repo"
    shutil.copytree(PACKAGE, copy / "specdec_lab", ignore=shutil.ignore_patterns("__pycache__", "*.safetensors"))
    shutil.copy(ROOT / "pyproject.toml", copy / "pyproject.toml")
    verify = copy / "specdec_lab" / "core" / "verify.py"
    verify.write_text(verify.read_text() + "\n\ndef _upward():\n    import specdec_lab.bench  # noqa: F401\n")
    broken = _lint(copy)
    assert broken.returncode != 0, "a core module importing the benchmark (inside a function) must break the layers"
    assert "specdec_lab.core.verify -> specdec_lab.bench" in broken.stdout, broken.stdout


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def test_the_core_is_small_and_no_module_is_long():
    core = {p.name: _lines(p) for p in (PACKAGE / "core").glob("*.py")}
    # Fixed shapes and torch.compile live in compiled/, the CPU's fast forward in cpu/: both are
    # installed on a model from outside (Transformer.runner), so the core stays this small. The
    # request options' seam (Engine.generate's `processor`: a grammar, penalties, logprobs) took 12, and
    # Linear.columns (a tied embedding read through the head's module, so a fast twin reads it) took 3.
    assert sum(core.values()) <= 1118, f"core/ has {sum(core.values())} lines: {core}"
    assert max(core.values()) <= 300, core
    source = "".join((PACKAGE / "core" / f).read_text() for f in core)
    for name in ("static_shapes", "torch.compile", "mark_static_address", "static_forward", "write_at", "_dynamo"):
        assert name not in source, f"core/ uses {name!r}: that belongs in compiled/"
    long = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py") if (n := _lines(p)) > 500}
    assert not long, f"modules over 500 lines: {long}"
