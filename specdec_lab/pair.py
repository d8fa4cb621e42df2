"""Model pairs: a target and a draft that share a tokenizer.

`load_default_pair()` gives SmolLM2-135M-Instruct (fetched and cached by
assets.py) with the draft distilled by this project and shipped in
specdec_lab/draft/. `load_pair(target, draft)` takes any two Llama-family
models by hub id, local folder or .gguf. `tiny_model()` builds small random
decoders for tests and notebooks.
"""
import copy
from dataclasses import dataclass
from pathlib import Path

import torch

from .config import ModelConfig
from .model import Transformer, VocabSubsetHead, init_weights, restrict_vocab


@dataclass
class ModelPair:
    target: Transformer
    draft: Transformer
    tokenizer: object


def default_draft_dir() -> Path:
    return Path(__file__).parent / "draft"


_CACHE = {}


def load_model_cached(source, device="cpu", dtype=torch.float32):
    """Load once per process: notebooks and tests load the default pair many times."""
    from .weights import load_model
    key = (str(source), str(device), dtype)
    if key not in _CACHE:
        model, tok = load_model(source, device=device, dtype=dtype)
        model.tokenizer = tok
        _CACHE[key] = model
    return _CACHE[key]


# A draft folder may hold vocab_subset.json (distill.frequent_tokens): load_pair then gives the
# draft a head over those tokens only (model.VocabSubsetHead). Outputs do not change (the
# verification is lossless for any q); the draft's time per token does. False: the full head.
DRAFT_VOCAB_SUBSET = True


def vocab_subset(draft_source):
    """The token ids in draft_source/vocab_subset.json, or None."""
    import json
    path = Path(str(draft_source)).expanduser() / "vocab_subset.json"
    return json.loads(path.read_text())["ids"] if path.is_file() else None


def with_vocab_subset(model, draft_source):
    """`model` with its head restricted to draft_source's vocab_subset.json, in place; unchanged
    when the folder has none, DRAFT_VOCAB_SUBSET is off, or the head is restricted already."""
    ids = vocab_subset(draft_source) if DRAFT_VOCAB_SUBSET else None
    if ids is None or isinstance(model.head, VocabSubsetHead):
        return model
    return restrict_vocab(model, ids)


def load_pair(target, draft, device="cpu", dtype=torch.float32) -> ModelPair:
    t = load_model_cached(target, device, dtype)
    d = load_model_cached(draft, device, dtype)
    if DRAFT_VOCAB_SUBSET and vocab_subset(draft) is not None:
        key = (str(draft), str(device), dtype, "vocab_subset")
        if key not in _CACHE:
            tok = getattr(d, "tokenizer", None)
            _CACHE[key] = with_vocab_subset(copy.deepcopy(d, {id(tok): tok}), draft)  # the cached draft stays whole
        d = _CACHE[key]
    if d.cfg.vocab_size != t.cfg.vocab_size:
        raise ValueError(f"draft vocabulary ({d.cfg.vocab_size}) differs from the target's "
                         f"({t.cfg.vocab_size}); the draft must share the target's tokenizer")
    d.tokenizer = t.tokenizer
    return ModelPair(t, d, t.tokenizer)


def load_default_pair(device="cpu", dtype=torch.float32) -> ModelPair:
    """SmolLM2-135M-Instruct and the project's distilled draft."""
    from .assets import ensure_default_target
    draft = default_draft_dir()
    if not (draft / "model.safetensors").exists():
        raise FileNotFoundError(f"the shipped draft is missing from {draft}; "
                                "make it with `python -m specdec_lab distill`")
    return load_pair(ensure_default_target(), draft, device, dtype)


def tiny_model(seed=0, vocab_size=64, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, **kw) -> Transformer:
    """A small random decoder (GQA by default) for tests and experiments."""
    std = kw.pop("std", 0.5)  # large enough that random models have peaked, varied distributions
    cfg = ModelConfig(vocab_size=vocab_size, dim=dim, n_layers=n_layers, n_heads=n_heads,
                      n_kv_heads=n_kv_heads, head_dim=dim // n_heads, intermediate_size=2 * dim,
                      max_seq_len=kw.pop("max_seq_len", 512), eos_token_ids=kw.pop("eos_token_ids", (vocab_size - 1,)),
                      **kw)
    model = init_weights(Transformer(cfg), seed=seed, std=std)
    return model.eval().requires_grad_(False)
