"""specdec_lab: speculative decoding with a draft model, small enough to read.

    import specdec_lab as sl
    pair = sl.load_default_pair()                  # ModelPair(target, draft, tokenizer)
    engine = sl.SpeculativeEngine(pair.target, pair.draft, k=4)
    res = engine.generate("Why is the sky blue?", max_new_tokens=64)
    base = sl.autoregressive_generate(pair.target, "Why is the sky blue?", max_new_tokens=64)

Glossary of shape letters used in comments across the package (DESIGN.md section 3):
  B batch, T new tokens this call, S cache capacity, K draft length, L layers,
  H query heads, Hkv key/value heads, D head dim, V vocab, P tokens per KV block.
p is always the target's distribution and q the draft's; alpha is the
acceptance rate E[min(1, p/q)]; c is the cost of a draft forward relative to a
target forward.
"""
from .config import MAX_K, ModelConfig, SamplingConfig
from .drafters import LookupThenModelDrafter, ModelDrafter, NGramDrafter
from .engine import GenerationResult, SpeculativeEngine, autoregressive_generate
from .feature_draft import (FeatureDraft, FeatureDrafter, default_feature_draft_dir, load_feature_draft,
                            shipped_feature_draft_dir)
from .kv_cache import KVCache
from .metrics import RunStats, StepRecord
from .model import Transformer, init_weights
from .pair import ModelPair, default_draft_dir, load_default_pair, load_pair, tiny_model
from .self_draft import SelfDraft
from .verify import verify, verify_reference

__all__ = [
    "MAX_K", "ModelConfig", "SamplingConfig", "GenerationResult", "SpeculativeEngine",
    "autoregressive_generate", "KVCache", "RunStats", "StepRecord", "Transformer", "init_weights",
    "ModelPair", "default_draft_dir", "load_default_pair", "load_pair", "tiny_model", "verify",
    "verify_reference", "ModelDrafter", "NGramDrafter", "LookupThenModelDrafter",
    "FeatureDraft", "FeatureDrafter", "default_feature_draft_dir", "load_feature_draft", "shipped_feature_draft_dir",
    "SelfDraft",
]
