"""The target as its own draft: the same weights, read as int8 or 4 bits (self-speculative decoding).

A distilled draft agrees with the default target's greedy choice on 53-61% of tokens
(specdec_lab/draft/, drafters/feature.py). The target's own weights rounded to int8, with a scale per
output column (build.pack), agree far more often, and one token through them reads a
quarter of the bytes: 134 MB instead of 540 MB for the default target. On a CPU whose
decode is bound by memory that is what a draft must be: likely to be right, and cheap to
read. QuantSpec (arXiv 2502.10424) drafts this way on GPUs, with the weights and the
keys and values in 4 bits. weights="int4" reads the layers in 4 bits (a half-precision scale and
offset per column and group of 32 inputs, build.pack(w, torch.uint4)) and the head in int8: 94 MB
a token for the default target, whose layers came as 4 bits (Q4_1) and so come back exactly.

The draft shares the target's KV cache. With c the last committed token, drafting
d_1..d_k runs c, d_1..d_{k-1} through the int8 forward (fused.OneTokenDecoder), which
writes their keys and values at the very positions where verification is about to write
[c, d_1..d_k]; the drafter then rolls the cache back to where it was, and verification
overwrites those entries with the target's own. So the draft attends to the target's
exact keys and values for everything committed, keeps no cache of its own, and needs no
catch-up forward after a step: each step costs exactly k draft forwards.

    draft = SelfDraft(target)                       # "int4": 4-bit layers; "float16": half the bytes
    engine = SpeculativeEngine(target, draft, k=6)  # contiguous cache only
    SelfDraft(target, lookup=True)                  # prompt lookup first, the int8 weights elsewhere

Unlike an int8 model decoding on its own, the output is still the float32 target's:
verification accepts a drafted token only where the target agrees (greedy), or keeps the
target's distribution exactly (sampling).
"""
import torch

from ..core.drafter import Verdict
from ..core.kv_cache import KVCache
from ..core.model import Transformer
from ..core.sampling import draft_token
from . import build as kernels
from .fused import FusedForward, OneTokenDecoder


class SelfDraft:
    """A handle that tells SpeculativeEngine to draft with `target`'s own weights at `weights`
    precision ("int8", "int4" or "float16"), through the target's KV cache; with lookup=True, only
    where prompt lookup finds nothing to copy (drafters.lookup.LookupThenModelDrafter). "int4" reads the
    layers in 4 bits (a scale and offset per column and group of 32 inputs) and the head in int8:
    `best_weights(target)` says whether the kernels and the model's shapes allow it."""

    def __init__(self, target: Transformer, weights: str = "int8", lookup: bool = False):
        if weights not in ("int8", "int4", "float16"):
            raise ValueError(f"weights must be 'int8', 'int4' or 'float16', got {weights!r}")
        if not isinstance(lookup, bool):
            raise ValueError(f"lookup must be True or False, got {lookup!r}")
        if not isinstance(target, Transformer):
            raise ValueError(f"target must be a specdec_lab Transformer, got {type(target).__name__}")
        if not FusedForward.supports(target, weights):
            raise ValueError(f"a {weights} self-draft needs a float32 CPU target without biases and the kernel "
                             f"library built for it (kernels.has_int8() / has_int4() / has_half()); int4 also "
                             f"needs every product's inputs in groups of {kernels.INT4_GROUP}")
        self.target, self.weights = target, weights
        # lookup=True: prompt lookup first (drafters.lookup.LookupThenModelDrafter), the rounded weights where
        # the context does not repeat. A copied proposal costs no draft forward, and a self-draft
        # forward costs a quarter of the target's where the shipped draft's costs a fiftieth.
        self.lookup = lookup
        self.cfg = target.cfg  # the engine reads the vocabulary and EOS from it
        # Input rows: a tied target's embedding is a column of its head; one contiguous copy.
        emb = target.embed.weight if target.embed is not None else target.head.weight.t()
        self.embedding = emb.detach().contiguous()  # (V, dim)

    def __repr__(self):
        return f"SelfDraft({self.weights}, {self.cfg.n_layers} layers{', after prompt lookup' if self.lookup else ''})"


def best_weights(target: Transformer) -> str:
    """The fewest bytes a self-draft of `target` can read here: "int4" where the kernel library has
    forward_rows_int4 and the model's shapes fit it, else "int8". The benchmark and the command line's
    --self-draft use it. SelfDraft's own default stays "int8"."""
    return "int4" if FusedForward.supports(target, "int4") else "int8"


class SelfDrafter:
    """Drafts through the target's own cache (see the module docstring); api.make_drafter builds it."""
    needs_hidden = False

    def __init__(self, draft: SelfDraft, cache):
        if type(cache) is not KVCache:
            raise ValueError("a self-draft shares the target's KV cache, which must be cache='contiguous'")
        self.draft, self.cache = draft, cache
        self.decoder = OneTokenDecoder(draft.target, cache, by_token=False, weights=draft.weights)
        self.pending = None  # (1,) the last committed token, in no cache yet
        self.host_syncs = 0  # it makes none: its tokens stay tensors

    def reset(self):
        self.pending = None

    def prefill(self, prompt_ids, hidden=None):
        self.pending = torch.tensor(prompt_ids[-1:])  # the engine has put prompt_ids[:-1] in the shared cache

    def propose(self, k, sampling, generator):
        base, tok = self.cache.length, self.pending
        ids, qs = [], []
        try:
            for i in range(k):
                row = self.draft.embedding.index_select(0, tok)[0]  # (dim,)
                logits = self.decoder.embedded(row)  # writes at cache.length, advances
                d, q = draft_token(logits, sampling, generator)
                ids.append(d)
                if q is not None:
                    qs.append(q)
                tok = d.view(1)
        finally:
            self.cache.rollback(base)  # verification writes the target's own entries there
        return torch.stack(ids), (torch.stack(qs) if qs else None)

    def commit(self, verdict: Verdict, hidden=None):
        self.pending = verdict.committed_ids(self.device)[-1:]

    def queue(self, tokens, hidden=None):
        """Committed tokens that someone else proposed (prompt lookup): verification has put all but
        the last in the shared cache already."""
        self.pending = tokens[-1:]

    @property
    def device(self):
        return self.draft.target.device


class QuantizedDecoding:
    """The target decoding on its own through the draft's rounded weights: what SelfDraft drafts
    with, with nothing verified. It is another model: its answers leave the float32 target's
    wherever a rounded weight tips an argmax. For comparison only (the bench's `int8_decode` or
    `int4_decode`):

        autoregressive_generate(QuantizedDecoding(SelfDraft(target)), prompt)

    The prompt but its last token runs through the float32 target, as the engine's prefill does;
    every token after that is one int8 call (OneTokenDecoder), like each of SelfDrafter's. Calls
    return the last position's logits, (1, 1, V): all that autoregressive_generate reads."""

    def __init__(self, draft: SelfDraft):
        t = draft.target
        self.draft, self.cfg, self.device, self.dtype = draft, t.cfg, t.device, t.dtype
        self.tokenizer = getattr(t, "tokenizer", None)
        self._decoder = None

    def new_cache(self, capacity, batch_size=1):
        return self.draft.target.new_cache(capacity, batch_size)  # the KVCache its decoder reads

    def __call__(self, tokens, cache=None, last_only=True):
        if cache is None:
            raise ValueError("QuantizedDecoding decodes through a KVCache: pass cache=")
        if tokens.shape[1] > 1:  # a prompt
            self.draft.target(tokens[:, :-1], cache=cache, last_only=True)
        if self._decoder is None or self._decoder.cache is not cache:
            self._decoder = OneTokenDecoder(self.draft.target, cache, by_token=False, weights=self.draft.weights)
        row = self.draft.embedding.index_select(0, tokens[0, -1:])[0]  # (dim,): no read to the host
        return self._decoder.embedded(row).view(1, 1, -1)
