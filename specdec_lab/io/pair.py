"""Model pairs: a target and a draft that share a tokenizer.

`load_model_cached` loads a model once per process; `vocab_subset` reads the frequent
tokens a draft's folder names (api.with_vocab_subset gives it that head). api.load_pair and
api.load_default_pair put them together (and make them fast on the CPU).
`tiny_model()` builds small random decoders for tests and chapters.

A model that cannot be loaded raises `LoadError` (a ValueError) with one line that names the
source and what is wrong: a device this machine lacks, a local folder or file that is not there,
a hub id the hub cannot give (offline, misspelt, private).
"""
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from ..core.config import ModelConfig
from ..core.model import Transformer, init_weights
from .weights import load_model


@dataclass
class ModelPair:
    target: Transformer
    draft: Transformer
    tokenizer: object


def default_draft_dir() -> Path:
    """The draft distilled for the default target, shipped with the package; README.md there is its card."""
    return Path(__file__).parent.parent / "draft"


_CACHE = {}


class LoadError(ValueError):
    """A model that cannot be loaded from where it was asked for, or onto the device asked for."""


def check_device(device) -> torch.device:
    try:
        return torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device must be a torch device such as 'cpu' or 'cuda', got {device!r}") from None


def check_device_available(device) -> torch.device:
    """check_device, and a LoadError where the device's backend is not on this machine: without it
    the first tensor moved there fails deep inside a loader with a message about pin_memory."""
    d = check_device(device)
    if d.type == "cuda" and not torch.cuda.is_available():
        raise LoadError(f"device {str(device)!r} needs CUDA, and torch finds none on this machine "
                        f"(torch.cuda.is_available() is False); use device 'cpu'")
    if d.type == "cuda" and d.index is not None and d.index >= torch.cuda.device_count():
        raise LoadError(f"device {str(device)!r}: this machine has {torch.cuda.device_count()} CUDA device(s), "
                        f"cuda:0 to cuda:{torch.cuda.device_count() - 1}")
    return d


def check_source(name, source):
    if not isinstance(source, (str, Path)) or not str(source).strip():
        raise ValueError(f"{name} must be a hub id, a local folder or a .gguf file, got {source!r}")


def looks_like_path(source) -> bool:
    """True where source can only be meant as a local path: a hub id is 'name' or 'namespace/name'."""
    text = str(source)
    return (isinstance(source, Path) or text.startswith(("/", ".", "~")) or "\\" in text
            or text.count("/") > 1 or text.endswith(".gguf"))


def check_loadable(name, source):
    """check_source, and a LoadError naming `name` where source is meant as a local folder or .gguf
    file that does not exist (before this, such a path went to the hub as an id and failed there)."""
    check_source(name, source)
    path = Path(str(source)).expanduser()
    if looks_like_path(source) and not path.exists():
        kind = "file" if path.suffix == ".gguf" else "folder"
        raise LoadError(f"{name} {str(source)!r}: no such {kind}; give an existing folder, a .gguf file or a "
                        f"hub id such as HuggingFaceTB/SmolLM2-135M-Instruct")
    return source


def _load(source, device, dtype):
    """weights.load_model, with what the hub raises for a source it cannot give as one LoadError."""
    try:
        return load_model(source, device=device, dtype=dtype)
    except Exception as e:
        # huggingface_hub's LocalEntryNotFoundError, RepositoryNotFoundError, ... (OSErrors), HFValidationError
        from_hub = isinstance(e, OSError) or type(e).__module__.startswith("huggingface_hub")
        if not from_hub or Path(str(source)).expanduser().exists():
            raise
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise LoadError(f"{str(source)!r} is not a local folder or file, and the Hugging Face hub could not give "
                        f"it ({type(e).__name__}: {first}); check the id, or download it where this machine "
                        f"reaches the hub") from e


def load_model_cached(source, device="cpu", dtype=torch.float32):
    """Load once per process: notebooks and tests load the default pair many times."""
    check_loadable("source", source)
    check_device_available(device)
    key = (str(source), str(device), dtype)
    if key not in _CACHE:
        model, tok = _load(source, device, dtype)
        model.tokenizer = tok
        _CACHE[key] = model
    return _CACHE[key]


def vocab_subset(draft_source):
    """The token ids in draft_source/vocab_subset.json, or None."""
    path = Path(str(draft_source)).expanduser() / "vocab_subset.json"
    return json.loads(path.read_text())["ids"] if path.is_file() else None


def tiny_model(seed=0, vocab_size=64, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, **kw) -> Transformer:
    """A small random decoder (GQA by default) for tests and experiments."""
    std = kw.pop("std", 0.5)  # large enough that random models have peaked, varied distributions
    cfg = ModelConfig(vocab_size=vocab_size, dim=dim, n_layers=n_layers, n_heads=n_heads,
                      n_kv_heads=n_kv_heads, head_dim=dim // n_heads, intermediate_size=2 * dim,
                      max_seq_len=kw.pop("max_seq_len", 512), eos_token_ids=kw.pop("eos_token_ids", (vocab_size - 1,)),
                      **kw)
    model = init_weights(Transformer(cfg), seed=seed, std=std)
    return model.eval().requires_grad_(False)
