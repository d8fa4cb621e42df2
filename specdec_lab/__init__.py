"""specdec_lab: speculative decoding with a draft model, small enough to read.

    import specdec_lab as sl
    pair = sl.load_default_pair()                  # ModelPair(target, draft, tokenizer)
    engine = sl.SpeculativeEngine(pair.target, pair.draft, k=4)
    res = engine.generate("Why is the sky blue?", max_new_tokens=64)
    base = sl.autoregressive_generate(pair.target, "Why is the sky blue?", max_new_tokens=64)

The layers (docs/design.md): core/ (the decoder, cache, sampling, verification and the loop;
torch only), drafters/, cpu/ (the CPU's fast forward) and compiled/ (fixed shapes and
torch.compile), both installed as a model's runner from outside, paged/, io/, analysis/, policies/,
serve/ (many requests at once), tree/ (token trees), train/, bench/, lab/ (what the chapters use),
and api.py, which this module re-exports with the serving and tree engines.

Glossary of shape letters used in comments across the package:
  B batch, T new tokens this call, S cache capacity, K draft length, L layers,
  H query heads, Hkv key/value heads, D head dim, V vocab, P tokens per KV block.
p is always the target's distribution and q the draft's; alpha is the
acceptance rate E[min(1, p/q)]; c is the cost of a draft forward relative to a
target forward.
"""
import os

# OpenMP's threads spin on their core while they wait at a barrier. With a thread per core and another
# process on one core, each barrier waits for a thread that has lost its core, and decoding collapses
# (docs/threads.json, plain decode on 2 cores: 2 threads fell from 53 to 19 tokens/s beside one busy
# process, and a user saw 1.5). Waiting passively, 2 threads ran 43 alone and 37 beside it, as fast as
# one thread (39): a busy neighbour slows decoding in proportion instead. Set before torch loads OpenMP
# (import specdec_lab first, as the command line does); an OMP_WAIT_POLICY already set is kept.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from .api import (LookupThenModelDrafter, SpeculativeEngine, autoregressive_generate, compiled_twin,
                  load_default_pair, load_eagle3_draft, load_feature_draft, load_pair, make_drafter)
from .compiled import use_static_shapes
from .core.config import MAX_K, ModelConfig, SamplingConfig
from .core.engine import GenerationResult
from .core.kv_cache import KVCache
from .core.model import Transformer, init_weights
from .core.records import RunStats, StepRecord
from .core.verify import verify, verify_reference
from .cpu import SelfDraft, accelerate
from .drafters import Eagle3Draft, FeatureDraft, FeatureDrafter, ModelDrafter, NGramDrafter
from .drafters.eagle3 import shipped_eagle3_draft_dir
from .drafters.feature import default_feature_draft_dir, shipped_feature_draft_dir
from .io.pair import ModelPair, default_draft_dir, tiny_model
from .serve import BatchEngine, GoodputPolicy, KSchedule, Server
from .tree.draft import DynamicTree
from .tree.engine import TreeEngine

__all__ = [
    "MAX_K", "ModelConfig", "SamplingConfig", "GenerationResult", "SpeculativeEngine",
    "autoregressive_generate", "KVCache", "RunStats", "StepRecord", "Transformer", "init_weights",
    "ModelPair", "default_draft_dir", "load_default_pair", "load_pair", "tiny_model", "verify",
    "verify_reference", "ModelDrafter", "NGramDrafter", "LookupThenModelDrafter", "make_drafter",
    "FeatureDraft", "FeatureDrafter", "default_feature_draft_dir", "load_feature_draft", "shipped_feature_draft_dir",
    "Eagle3Draft", "load_eagle3_draft", "shipped_eagle3_draft_dir", "SelfDraft", "accelerate", "compiled_twin",
    "use_static_shapes", "Server", "BatchEngine", "KSchedule", "GoodputPolicy", "TreeEngine", "DynamicTree",
]
