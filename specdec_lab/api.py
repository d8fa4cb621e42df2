"""What `import specdec_lab as sl` offers: the engine for any kind of draft, and the model pairs.

`make_drafter` is the one place that looks at what kind of draft it was given:

    a specdec_lab Transformer         -> drafters.ModelDrafter (its own cache)
    a FeatureDraft (EAGLE-style)      -> drafters.FeatureDrafter (reads the target's states)
    an Eagle3Draft (EAGLE-3-style)    -> drafters.Eagle3Drafter (reads a few of the target's layers)
    a SelfDraft (the target, rounded) -> cpu.SelfDrafter (the target's own cache), behind prompt
                                         lookup with SelfDraft(lookup=True)
    anything with `propose`           -> used as it is (a drafter of core/drafter.py's protocol)

`load_pair` / `load_default_pair` load a target and a draft that share a tokenizer and, on
the CPU, give out their fast twins (cpu.accelerated; accelerate=False gives the plain models).
"""
import copy

import torch

from .compiled import compiled_twin
from .core.config import MAX_K
from .core.engine import Engine, autoregressive_generate  # noqa: F401 (re-exported)
from .core.model import Transformer
from .cpu import SelfDraft, SelfDrafter, accelerated, fast_modules
from .cpu import accelerate as accelerate_in_place
from .drafters import Eagle3Draft, Eagle3Drafter, FeatureDraft, FeatureDrafter, LookupDrafter, ModelDrafter
from .drafters.eagle3 import load_eagle3_draft as _load_eagle3_draft
from .drafters.vocab_subset import VocabSubsetHead, restrict_vocab
from .drafters.feature import load_feature_draft as _load_feature_draft
from .io.assets import ensure_default_target
from .io.pair import (ModelPair, _CACHE, check_device, check_source, default_draft_dir, load_model_cached,
                      vocab_subset)
from .options import Logprobs, request_processor
from .paged import PagedSequenceCache
from .policies.adaptive import AUTO_K_MAX, auto_controller
from .verification import verify_block, verify_block_reference, verify_match, verify_match_reference

CACHES = ("contiguous", "paged")
PROPOSALS = ("sample", "argmax")  # propose= names: a draw from the draft's q, or its top token
# verifier= names: core's token rule ("device", and its loop "reference"), and verification/'s rules
VERIFIERS = {"device": "device", "reference": "reference", "block": verify_block,
             "block-reference": verify_block_reference, "match": verify_match, "match-reference": verify_match_reference}


def verifier_rule(verifier):
    """A verifier= name as Engine takes it (a name of its own, or a function like core.verify.verify)."""
    if callable(verifier):
        return verifier
    if not isinstance(verifier, str) or verifier not in VERIFIERS:
        raise ValueError(f"verifier must be one of {', '.join(map(repr, VERIFIERS))} or a function like "
                         f"core.verify.verify, got {verifier!r}")
    return VERIFIERS[verifier]


def cache_factory(kind, block_size=16):
    """A function (cfg, capacity, dtype=, device=) -> an empty cache of that kind, or None for
    "contiguous": then each model makes its own (Transformer.new_cache: a KVCache, or the static
    cache of a compiled model)."""
    if kind not in CACHES:
        raise ValueError(f"cache must be one of {CACHES}, got {kind!r}")
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be an int >= 1, got {block_size!r}")
    if kind == "contiguous":
        return None
    return lambda cfg, cap, **kw: PagedSequenceCache.for_model(cfg, cap, block_size=block_size, **kw)


def _model_drafter(draft, capacity, factory=None, stop_below=None):
    """The drafter behind prompt lookup: for a draft model, or a drafter built already."""
    if isinstance(draft, Eagle3Draft):
        return Eagle3Drafter(draft, capacity, factory, stop_below=stop_below)
    if isinstance(draft, FeatureDraft):
        return FeatureDrafter(draft, capacity, factory, stop_below=stop_below)
    if isinstance(draft, Transformer):
        return ModelDrafter(draft, capacity, factory, stop_below=stop_below)
    if callable(getattr(draft, "propose", None)):
        if stop_below is not None:
            raise ValueError("stop_below applies to a draft model, not to a drafter built already")
        return draft
    raise TypeError(f"draft must be a Transformer, a FeatureDraft, a SelfDraft or a drafter with propose and "
                    f"commit, got {type(draft).__name__}")


def make_drafter(target, draft, capacity, factory=None, target_cache=None):
    """The drafter the engine runs for `draft` (see the module docstring), with caches of `capacity`."""
    if isinstance(draft, SelfDraft):
        if draft.target is not target:
            raise ValueError("a SelfDraft drafts with the target's own weights and cache: build it from this "
                             "engine's target")
        drafter = SelfDrafter(draft, target_cache)
        return LookupDrafter(drafter) if draft.lookup else drafter
    if isinstance(draft, FeatureDraft) and draft.state_width != target.cfg.dim:
        raise ValueError(f"the feature draft reads states of width {draft.state_width}; the target's are "
                         f"{target.cfg.dim}: build the draft for this target")
    if isinstance(draft, Eagle3Draft) and draft.hidden_layers[-1] >= target.cfg.n_layers:
        raise ValueError(f"the draft reads target layers {draft.hidden_layers}; the target has "
                         f"{target.cfg.n_layers}: build the draft for this target")
    if isinstance(draft, Transformer) and draft.cfg.vocab_size != target.cfg.vocab_size:
        raise ValueError(f"draft vocabulary ({draft.cfg.vocab_size}) differs from the target's "
                         f"({target.cfg.vocab_size}); the draft must share the target's tokenizer")
    return _model_drafter(draft, capacity, factory)


class SpeculativeEngine(Engine):
    """Speculative decoding with a draft model (arXiv 2211.17192, 2302.01318).

    engine = SpeculativeEngine(target, draft); engine.generate(prompt, ...)
    `k`: "auto" (the default) chooses K from 0 (plain decoding) to 4 each step from the acceptance so
    far (policies.auto_controller: it stops drafting where drafts are not accepted, and probes to come
    back); an int drafts that K every step, as does `generate(..., k=K)`.
    `draft`: see make_drafter. `cache="paged"` keeps the target's and the draft's keys and values
    in blocks of `block_size` (paged/). The loop itself is core/engine.py's Engine. `verifier`:
    "device" (token by token, arXiv 2211.17192), "block" (arXiv 2403.10444) or "match" (exact
    match), each with its readable loop as "reference", "block-reference", "match-reference"
    (verification/), or a function with core.verify.verify's signature. `propose`: "sample" (a draw
    from the draft's q) or "argmax" (its top token at any temperature, as llama.cpp and vLLM draft):
    q is one-hot then, the true q of a deterministic draft, so every rule stays lossless with it
    (docs/design.md, "Verification rules"; the bug is the soft q, pitfalls.GreedyDraftSampledQ).
    """

    def __init__(self, target, draft, k="auto", max_seq_len=2048, cache="contiguous", block_size=16,
                 verifier="device", tokenizer=None, propose="sample"):
        verifier = verifier_rule(verifier)
        if k != "auto" and (isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K):
            raise ValueError(f"k must be 'auto' or an int in [1, {MAX_K}], got {k!r}")
        if propose not in PROPOSALS:
            raise ValueError(f"propose must be one of {', '.join(map(repr, PROPOSALS))}, got {propose!r}")
        if isinstance(max_seq_len, bool) or not isinstance(max_seq_len, int) or max_seq_len < 2:
            raise ValueError(f"max_seq_len must be an int >= 2, got {max_seq_len!r}")
        if not (callable(target) and all(hasattr(target, a) for a in ("cfg", "device", "dtype", "new_cache"))):
            raise TypeError(f"target must be a specdec_lab Transformer (or a model with its cfg, device, dtype, "
                            f"new_cache and forward), got {type(target).__name__}")
        factory = cache_factory(cache, block_size)
        capacity = min(max_seq_len, target.cfg.max_seq_len)
        if isinstance(draft, SelfDraft) and cache != "contiguous":
            raise ValueError("a self-draft shares the target's KV cache, which must be cache='contiguous'")
        if cache != "contiguous" and any(getattr(m, "fixed_shapes", False) for m in (target, draft)):
            raise ValueError(f"cache={cache!r} cannot hold a model with fixed shapes (compiled.use_static_shapes): "
                             f"they need cache='contiguous'")
        target_cache = target.new_cache(capacity) if factory is None else factory(
            target.cfg, capacity, dtype=target.dtype, device=target.device)
        drafter = make_drafter(target, draft, capacity, factory, target_cache)
        if callable(getattr(drafter, "fit", None)) and (drafter.max_seq_len or capacity) < capacity:
            drafter.fit(capacity)  # a drafter built before its engine (LookupThenModelDrafter) takes the engine's size
        controller = auto_controller(target, draft) if k == "auto" else None
        super().__init__(target, drafter, k=AUTO_K_MAX if k == "auto" else k, cache=target_cache, verifier=verifier,
                         tokenizer=tokenizer, propose=propose)
        self.controller = controller  # generate(k=...) drafts that K instead
        self.cache_kind, self.block_size = cache, block_size

    def generate(self, prompt, max_new_tokens=128, temperature=0.0, top_p=1.0, seed=None, top_k=0, k=None,
                 on_step=None, processor=None, grammar=None, presence_penalty=0.0, frequency_penalty=0.0,
                 repetition_penalty=1.0, logprobs=False, top_logprobs=0):
        """Engine.generate with a request's options, each exact under speculation (options/):
        `grammar` ("json", a JSON Schema, {"regex": ...}, {"lark": ...} or {"gbnf": ...}) constrains
        the output; presence, frequency and repetition penalties as OpenAI and vLLM define them;
        `logprobs` (and `top_logprobs`, 0 to 20) fills the result's `logprobs` with the target's
        log-probability of each token, read from the verification pass."""
        options = request_processor(self.tokenizer, self.target.cfg.vocab_size, grammar, presence_penalty,
                                    frequency_penalty, repetition_penalty, logprobs, top_logprobs,
                                    self.target.cfg.eos_token_ids)
        if processor is not None and options is not None:
            raise ValueError("pass either processor or the request options (grammar, penalties, logprobs), not both")
        result = super().generate(prompt, max_new_tokens, temperature, top_p, seed, top_k, k, on_step,
                                  processor if processor is not None else options)
        recorded = options.find(Logprobs) if options is not None else None
        if recorded is not None:
            result.logprobs = recorded.entries[:len(result.tokens)]
        return result


class LookupThenModelDrafter(LookupDrafter):
    """Prompt lookup where the context repeats itself, the draft model everywhere else
    (drafters/lookup.py). `draft`: a Transformer or a FeatureDraft; `stop_below`: the model
    drafter's early stop (drafters.ModelDrafter). `capacity`: the draft cache's positions until an
    engine takes the drafter: SpeculativeEngine re-sizes it to its own max_seq_len."""

    def __init__(self, draft, capacity=2048, min_match=2, max_ngram=4, stop_below=None):
        super().__init__(_model_drafter(draft, capacity, stop_below=stop_below), min_match, max_ngram)


def _check_accelerate(accelerate, device):
    if accelerate is not None and not isinstance(accelerate, bool):
        raise TypeError(f"accelerate must be None (on the CPU), True or False, got {accelerate!r}")
    return check_device(device).type == "cpu" if accelerate is None else accelerate


def _fast_twin(key, model, weights):
    """The cached model's fast twin (cpu.accelerated: the same weights), made once per process."""
    key = key + ("accelerated", weights)
    if key not in _CACHE:
        _CACHE[key] = accelerated(model, weights=weights)
    return _CACHE[key]


def default_dtype(device) -> torch.dtype:
    """bfloat16 on CUDA (half the bytes per token, and tensor cores), float32 on the CPU (where
    greedy speculative decoding matches autoregressive decoding token for token)."""
    return torch.bfloat16 if check_device(device).type == "cuda" else torch.float32


def check_dtype(dtype, device) -> torch.dtype:
    if dtype is None:
        return default_dtype(device)
    if dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"dtype must be None (bfloat16 on CUDA, float32 on the CPU), torch.float32, "
                         f"torch.bfloat16 or torch.float16, got {dtype!r}")
    return dtype


def with_vocab_subset(model, draft_source):
    """`model` with its head restricted to draft_source's vocab_subset.json, in place; unchanged
    when the folder has none or the head is restricted already."""
    ids = vocab_subset(draft_source)
    if ids is None or isinstance(model.head, VocabSubsetHead):
        return model
    return restrict_vocab(model, ids)


def load_pair(target, draft, device="cpu", dtype=None, accelerate=None, vocab_subset_head=True,
              compile=False) -> ModelPair:
    """A target and a draft (hub ids, local folders or .gguf files) that share a tokenizer.

    dtype: None is bfloat16 on CUDA and float32 on the CPU. accelerate: None makes both fast on
    the CPU (cpu.accelerated: fast twins that share the plain models' weights; the draft's
    one-call forward reads half precision), False gives the plain models. compile: True gives
    twins with static shapes whose decode, verification and draft forwards go through
    torch.compile (compiled.compiled_twin; CUDA graphs on CUDA; the draft always one row); it
    replaces the CPU fast path. vocab_subset_head: a draft folder's vocab_subset.json restricts
    the draft's head to those tokens (outputs unchanged: verification is lossless for any q).

    The models are shared: weights are loaded once per process, and every call with the same
    arguments gets the same objects. load_pair never changes an object once it has handed it
    out; a caller that wants to change one (its modules, its runner) takes a copy first
    (copy.copy shares the weights; cpu.accelerated and compiled.compiled_twin make twins)."""
    check_source("target", target)
    check_source("draft", draft)
    dtype = check_dtype(dtype, device)
    if not isinstance(compile, bool):
        raise TypeError(f"compile must be True or False, got {compile!r}")
    if compile and accelerate:
        raise ValueError("compile=True and accelerate=True are two different fast paths; choose one")
    fast = _check_accelerate(accelerate, device) and not compile
    if not isinstance(vocab_subset_head, bool):
        raise TypeError(f"vocab_subset_head must be True or False, got {vocab_subset_head!r}")
    t = load_model_cached(target, device, dtype)
    d = load_model_cached(draft, device, dtype)
    t_key, d_key = (str(target), str(device), dtype), (str(draft), str(device), dtype)
    if vocab_subset_head and vocab_subset(draft) is not None:
        d_key = d_key + ("vocab_subset",)
        if d_key not in _CACHE:
            # a twin whose head is replaced (the cached draft stays whole) and that shares every weight
            twin = copy.copy(d)
            twin._modules = dict(d._modules)
            _CACHE[d_key] = with_vocab_subset(twin, draft)
        d = _CACHE[d_key]
    if d.cfg.vocab_size != t.cfg.vocab_size:
        raise ValueError(f"draft vocabulary ({d.cfg.vocab_size}) differs from the target's "
                         f"({t.cfg.vocab_size}); the draft must share the target's tokenizer")
    if getattr(d, "tokenizer", None) is not t.tokenizer:  # the draft reads the target's tokenizer:
        d_key = d_key + ("tokenizer", t_key)              # a shallow twin that says so, made once
        if d_key not in _CACHE:
            _CACHE[d_key] = copy.copy(d)
            _CACHE[d_key].tokenizer = t.tokenizer
        d = _CACHE[d_key]
    if fast:
        t, d = _fast_twin(t_key, t, "float32"), _fast_twin(d_key, d, "float16")
    elif compile:
        t, d = _compiled_twin(t_key, t), _compiled_twin(d_key, d, rows=(1,))  # the draft runs one row
    return ModelPair(t, d, t.tokenizer)


def _compiled_twin(key, model, rows=None):
    """compiled_twin of a cached model, made once per process."""
    key = key + ("compiled", rows)
    if key not in _CACHE:
        _CACHE[key] = compiled_twin(model, rows=rows)
    return _CACHE[key]


def load_default_pair(device="cpu", dtype=None, accelerate=None, compile=False) -> ModelPair:
    """SmolLM2-135M-Instruct and the project's distilled draft (specdec_lab/draft/)."""
    check_device(device)
    draft = default_draft_dir()
    if not (draft / "model.safetensors").exists():
        raise FileNotFoundError(f"the shipped draft is missing from {draft}; "
                                "make it with `python -m specdec_lab distill`")
    return load_pair(ensure_default_target(), draft, device, dtype, accelerate=accelerate, compile=compile)


def load_feature_draft(target, folder=None, accelerate=None):
    """drafters.load_feature_draft, made fast on the CPU like load_pair's draft (accelerate=None)."""
    model = _load_feature_draft(target, folder)
    if _check_accelerate(accelerate, target.device):
        accelerate_in_place(model.body, weights="float16")
    return model


def load_eagle3_draft(target, folder=None, accelerate=None):
    """drafters.load_eagle3_draft (default: the shipped draft), its products and norms swapped for
    the CPU's fast twins (accelerate=None: on the CPU). Its layer is the engines' EAGLE-3 layer,
    not the decoder's block, so no one-call forward: that is fused.FusedForward's shape."""
    model = _load_eagle3_draft(target, folder)
    if _check_accelerate(accelerate, target.device) and model.device.type == "cpu":
        fast_modules(model)
    return model
