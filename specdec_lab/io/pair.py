"""Model pairs: a target and a draft that share a tokenizer.

`load_model_cached` loads a model once per process; `vocab_subset` reads the frequent
tokens a draft's folder names (api.with_vocab_subset gives it that head). api.load_pair and
api.load_default_pair put them together (and make them fast on the CPU).
`tiny_model()` builds small random decoders for tests and chapters.
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


def check_device(device) -> torch.device:
    try:
        return torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device must be a torch device such as 'cpu' or 'cuda', got {device!r}") from None


def check_source(name, source):
    if not isinstance(source, (str, Path)) or not str(source).strip():
        raise ValueError(f"{name} must be a hub id, a local folder or a .gguf file, got {source!r}")


def load_model_cached(source, device="cpu", dtype=torch.float32):
    """Load once per process: notebooks and tests load the default pair many times."""
    check_source("source", source)
    check_device(device)
    key = (str(source), str(device), dtype)
    if key not in _CACHE:
        model, tok = load_model(source, device=device, dtype=dtype)
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
