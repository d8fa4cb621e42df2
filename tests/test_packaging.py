"""Packaging: pip users and conda users get the same pinned versions, and the two commands exist.

environment.yml is read without PyYAML (it may not be installed): the pins are the
'- ' lines under 'pip:'.
"""
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def pyproject():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def pyproject_pins():
    project = pyproject()["project"]
    pins = list(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        pins += extra
    return pins


def environment_pip_pins():
    pins, in_pip, indent = [], False, None
    for line in (ROOT / "environment.yml").read_text().splitlines():
        text = line.split("#", 1)[0].rstrip()
        if not text.strip():
            continue
        depth = len(text) - len(text.lstrip())
        if text.strip() in ("- pip:", "pip:"):
            in_pip, indent = True, depth
            continue
        if in_pip and depth > indent and text.strip().startswith("- "):
            pins.append(text.strip()[2:].strip())
        elif in_pip and depth <= indent:
            in_pip = False
    return pins


def name_of(pin):
    return re.split(r"[=<>!~\[ ;]", pin, maxsplit=1)[0].lower().replace("_", "-")


def test_environment_yml_pins_exactly_what_pyproject_pins():
    py, env = pyproject_pins(), environment_pip_pins()
    assert env, "found no pip pins in environment.yml"
    assert len(py) == len(set(py)), "pyproject.toml lists a dependency twice"
    assert sorted(py) == sorted(env), (f"conda and pip users would get different packages: only in pyproject "
                                       f"{sorted(set(py) - set(env))}, only in environment.yml "
                                       f"{sorted(set(env) - set(py))}")


def test_every_dependency_is_pinned_exactly():
    loose = [p for p in pyproject_pins() if "==" not in p]
    assert not loose, f"unpinned dependencies make installs drift: {loose}"


def test_torch_is_pinned_to_2_13_0_everywhere():
    assert "torch==2.13.0" in pyproject()["project"]["dependencies"], \
        "a looser torch lets pip pull a multi-GB CUDA build"
    assert "torch==2.13.0" in environment_pip_pins()
    assert "torch==2.13.0" in (ROOT / "Makefile").read_text(), "the Makefile installs another torch first"


def test_core_dependencies_are_not_hidden_in_extras():
    core = {name_of(p) for p in pyproject()["project"]["dependencies"]}
    assert {"torch", "transformers", "safetensors", "gguf", "accelerate", "tokenizers"} <= core
    extras = pyproject()["project"]["optional-dependencies"]
    assert {"pytest", "hypothesis"} <= {name_of(p) for p in extras["test"]}


def test_environment_python_satisfies_requires_python():
    env_python = re.search(r"^\s*-\s*python\s*=\s*([\d.]+)", (ROOT / "environment.yml").read_text(), re.M)
    assert env_python, "environment.yml does not pin python"
    want = re.fullmatch(r">=\s*(\d+)\.(\d+)", pyproject()["project"]["requires-python"])
    have = tuple(int(x) for x in env_python.group(1).split(".")[:2])
    assert have >= (int(want.group(1)), int(want.group(2)))


def test_pytest_markers_are_registered():
    markers = " ".join(pyproject()["tool"]["pytest"]["ini_options"]["markers"])
    assert "gpu:" in markers and "slow:" in markers


def test_makefile_has_lab_test_and_demo_targets():
    targets = set(re.findall(r"^([A-Za-z_][\w-]*)\s*:", (ROOT / "Makefile").read_text(), re.M))
    missing = {"lab", "test", "demo", "setup"} - targets
    assert not missing, f"Makefile lacks targets {sorted(missing)}"


def test_ci_script_runs_make_test():
    script = ROOT / ".ci" / "run"
    assert script.exists(), ".ci/run is missing"
    lines = [ln.split("#", 1)[0].strip() for ln in script.read_text().splitlines()]
    assert "make test" in lines, "CI does not run the README's test command"
    assert script.stat().st_mode & 0o111, ".ci/run is not executable"


def test_the_kernel_source_ships_with_the_package():
    from fnmatch import fnmatch
    from specdec_lab.cpu.build import SOURCE
    patterns = pyproject()["tool"]["setuptools"]["package-data"]["specdec_lab"]
    rel = SOURCE.relative_to(ROOT / "specdec_lab").as_posix()
    assert SOURCE.exists() and any(fnmatch(rel, p) for p in patterns), f"{rel} would be left out of a wheel"


@pytest.mark.parametrize("folder,names", [("draft", ("config.json", "model.safetensors", "vocab_subset.json",
                                                     "README.md")),
                                          ("feature_draft_smollm2", ("config.json", "model.safetensors", "README.md"))])
def test_the_draft_folders_ship_whole_with_the_package(folder, names):
    from fnmatch import fnmatch
    patterns = pyproject()["tool"]["setuptools"]["package-data"]["specdec_lab"]
    for name in names:
        path = ROOT / "specdec_lab" / folder / name
        assert path.exists(), f"{folder}/{name} is missing"
        assert any(fnmatch(f"{folder}/{name}", p) for p in patterns), f"{folder}/{name} would be left out of a wheel"
