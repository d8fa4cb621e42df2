"""The files the peers read, exported once into the cache (io/export.py): the token draft for vLLM
(a Hugging Face folder) and llama.cpp (a GGUF), the EAGLE-3 draft as the engines' checkpoint and its
GGUF (llama.cpp's converter), and the target as a float32 GGUF (llama.cpp's converter), so that
llama.cpp computes the lab's target and not its Q4_1 file."""
import fcntl

from ..core.config import cache_dir
from ..drafters.eagle3 import shipped_eagle3_draft_dir
from ..io.assets import ensure_default_target, ensure_gguf
from ..io.export import convert_to_gguf, export_eagle3_vllm, export_gguf_draft, export_hf_draft
from ..io.pair import default_draft_dir


def engine_files(log=None) -> dict:
    """The exports the engines read, written once into the cache (rewritten when a source is newer):
    the token draft as a Hugging Face folder (vLLM) and a GGUF (llama.cpp), the EAGLE-3 draft as
    the engines' checkpoint (vLLM) and its GGUF (llama.cpp's converter), and the target as a
    float32 GGUF (llama.cpp's converter)."""
    log = log or (lambda s: None)
    target_dir = ensure_default_target()
    with open(cache_dir() / ".engine_files.lock", "a") as lock:  # two processes would write the same files
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            return _engine_files(target_dir, log)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _engine_files(target_dir, log) -> dict:
    out = cache_dir() / "export"
    files = {"target_dir": target_dir, "token_hf": out / "specdec_lab_draft_hf", "token_gguf": out / "specdec_lab_draft.f32.gguf",
             "eagle3_dir": out / "specdec_lab_eagle3", "eagle3_gguf": out / "specdec_lab_eagle3.f32.gguf",
             "target_gguf": out / "target.f32.gguf"}

    def stale(path, *sources):
        return not path.exists() or any(path.stat().st_mtime < s.stat().st_mtime for s in sources)
    token_src, e3_src = default_draft_dir() / "model.safetensors", shipped_eagle3_draft_dir() / "model.safetensors"
    if stale(files["token_hf"] / "model.safetensors", token_src):
        log("exporting the token draft for vLLM ...")
        export_hf_draft(default_draft_dir(), target_dir, files["token_hf"])
    if stale(files["token_gguf"], token_src):
        log("exporting the token draft for llama.cpp ...")
        export_gguf_draft(default_draft_dir(), ensure_gguf(), files["token_gguf"])
    if stale(files["eagle3_dir"] / "model.safetensors", e3_src):
        log("exporting the EAGLE-3 draft for vLLM ...")
        export_eagle3_vllm(shipped_eagle3_draft_dir(), target_dir, files["eagle3_dir"])
    if stale(files["eagle3_gguf"], files["eagle3_dir"] / "model.safetensors"):
        log("converting the EAGLE-3 draft with llama.cpp's converter ...")
        convert_to_gguf(files["eagle3_dir"], files["eagle3_gguf"], target_dir=target_dir)
    if stale(files["target_gguf"], target_dir / "model.safetensors"):
        log("converting the target to a float32 GGUF with llama.cpp's converter ...")
        convert_to_gguf(target_dir, files["target_gguf"])
    return files
