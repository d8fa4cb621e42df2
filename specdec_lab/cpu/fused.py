"""A model's forward over a few rows in one call into the kernel library (build.py).

FusedForward runs decode's one token or verification's K+1 rows through every layer
in one ctypes call; OneTokenDecoder feeds it one row at a time into a fixed cache;
FusedRows is what `accelerate` installs as a Transformer's `runner` (the seam of core/model.py), so that the
model's own forward takes the one call wherever it applies and its eager code elsewhere.
"""
import ctypes
import threading

import torch

from ..core.kv_cache import KVCache
from ..core.model import Linear
from . import build as kernels
from .linear import panel_weight
from .prefill import chunk_applies, chunked_hidden, chunked_logits


def is_subset_head(head) -> bool:
    """A head over a subset of the vocabulary (drafters.VocabSubsetHead): a product `proj` over the
    columns `ids`, the rest -inf. Read by its parts, as cpu/ does not import the drafters."""
    return hasattr(head, "proj") and hasattr(head, "ids") and hasattr(head, "vocab_size")


class FusedForward:
    """A model's forward over a few rows (decode's one token, verification's K+1) as one call
    into the kernel library (build.py, `forward_rows`), writing their keys and values into a
    contiguous batch-1 KVCache at its length and advancing it.

    The eager forward of the default target is some 450 operator calls a token; this runs the
    same arithmetic with none in between (docs/benchmarks.md has what that bought). Each row's
    result is bit-for-bit the same whatever the number of rows, so a token decoded alone and the
    same token inside a verification pass get the same logits; both agree with the eager path
    to rounding in attention. `FusedForward.supports` says which models it takes: float32 on the
    CPU, no biases, and the kernel library.

    weights="float16" reads the products' weights rounded to half precision (`forward_rows_half`),
    weights="int8" rounded to int8 against a scale per output column (`forward_rows_int8`): half or
    a quarter of the bytes, the arithmetic still in float32, the logits no longer the eager
    path's. weights="int4" reads the layers' weights in 4 bits with a scale and offset per column
    and group of 32 inputs, and the head in int8 with a scale per group (`forward_rows_int4`): a
    sixth of the bytes. For a draft whose weights stream from memory for every token, or the target itself as its
    own draft (self_draft.py). A draft's
    proposals only need to be likely; verification keeps the output the target's.
    Weights are re-read on every call, so a model trained after this was built is seen as it is.
    Threads may share one: each has its own scratch memory, so two engines over one target can
    decode at once, each with its own cache."""

    WEIGHTS = {"float32": torch.float32, "float16": torch.float16, "int8": torch.int8, "int4": torch.uint4}
    HEAD = {"int4": torch.qint8}  # the head's precision where it is not the layers'; see forward_rows_int4

    @staticmethod
    def supports(model, weights="float32") -> bool:
        """The model and the kernel library: float32 on the CPU, no biases, and for weights="float16"
        / "int8" / "int4" the library's forward for them (kernels.has_half(), kernels.has_int8(),
        kernels.has_int4()); "int4" also needs every product's inputs (the head's too) in groups of 32."""
        if weights not in FusedForward.WEIGHTS:
            raise ValueError(f"weights must be one of {sorted(FusedForward.WEIGHTS)}, got {weights!r}")
        head = model.head.proj if is_subset_head(model.head) else model.head
        linears = [head] + [m for b in model.layers for m in (b.attn.wqkv, b.attn.wo, b.mlp.w13, b.mlp.w2)]
        built = {"float32": kernels.available, "float16": kernels.has_half, "int8": kernels.has_int8,
                 "int4": kernels.has_int4}[weights]
        grouped = weights != "int4" or all(m.weight.shape[0] % kernels.INT4_GROUP == 0
                                           and m.weight.shape[0] <= kernels.INT4_MAX_K for m in linears)
        # The device first: on CUDA the kernel library is never built
        return (model.device.type == "cpu" and model.dtype == torch.float32 and built()
                and all(m.bias is None and m.weight.is_contiguous() for m in linears) and grouped)

    @staticmethod
    def supports_cache(cache) -> bool:
        """A contiguous batch-1 float32 KVCache (not a paged one)."""
        return (type(cache) is KVCache and cache.k.shape[1] == 1 and cache.k.dtype == torch.float32
                and cache.k.is_contiguous() and cache.v.is_contiguous())

    def __init__(self, model, weights="float32"):
        if not FusedForward.supports(model, weights):
            raise ValueError("FusedForward needs a float32 CPU model without biases and the kernel library "
                             "(kernels.available(); weights='float16' needs kernels.has_half(), 'int8' "
                             "kernels.has_int8(), 'int4' kernels.has_int4() and inputs in groups of 32)")
        self.model, self.weights = model, weights
        # Scratch memory is each thread's own: the kernel runs without the GIL, and two engines may
        # share a model. `work` holds a call's hidden states and attention scores, `rows` its row count.
        self._scratch = threading.local()
        self._built = (None, None)  # (freshness key, pointer arrays with the panels they point into)
        self._forward = {"float32": kernels.forward_rows, "float16": kernels.forward_rows_half,
                         "int8": kernels.forward_rows_int8, "int4": kernels.forward_rows_int4}[weights]
        self.padded = lambda n, pw=kernels.panel_width(): -(-n // pw) * pw

    def _parts(self):
        """The norms and products the call reads, in forward order (attn_norm, wqkv, wo, mlp_norm, w13,
        w2 per layer, then the final norm and the head), found through the modules' own dictionaries.
        Private nn.Module dictionaries, not attribute access: nn.Module.__getattr__ made this walk
        up to a tenth of an int8 self-draft token (docs/benchmarks.md)."""
        mods = self.model._modules
        head = mods["head"]
        if is_subset_head(head):
            head = head._modules["proj"]
        out = []
        for b in mods["layers"]._modules.values():
            bm = b._modules
            am, mm = bm["attn"]._modules, bm["mlp"]._modules
            out += (bm["attn_norm"], am["wqkv"], am["wo"], bm["mlp_norm"], mm["w13"], mm["w2"])
        return out + [mods["norm"], head]

    def _build(self, parts):
        """The pointer arrays the kernel reads: one per kind of layer weight, then the final norm,
        the head's panels, the head's width and the layer count. Norms are read as they are,
        products from their panels at this forward's precision."""
        dt = FusedForward.WEIGHTS[self.weights]
        held = [panel_weight(m, dt) if isinstance(m, Linear) else m._parameters["weight"] for m in parts[:-1]]
        held.append(panel_weight(parts[-1], self.HEAD.get(self.weights, dt)))
        n_layers = (len(parts) - 2) // 6
        groups = [(ctypes.c_void_p * n_layers)(*[t.data_ptr() for t in held[i:-2:6]]) for i in range(6)]
        # `held` keeps what the pointers point into alive while any call still reads them
        return groups, held[-2].data_ptr(), held[-1].data_ptr(), parts[-1].weight.shape[1], n_layers, held

    def __call__(self, rows: torch.Tensor, cache: KVCache, head: bool = True):
        """rows (R, dim) float32: input rows (token embeddings, or a feature draft's own) at positions
        cache.length .. + R - 1. Returns the logits (R, V), or None with head=False (a row whose
        logits nobody reads costs only the layers); `hidden_states()` gives the final normalised
        hidden states either way."""
        m, cfg = self.model, self.model.cfg
        if rows.dim() != 2 or rows.shape[1] != cfg.dim or rows.dtype != torch.float32 or not rows.is_contiguous():
            raise ValueError(f"rows must be a contiguous float32 tensor of shape (R, {cfg.dim}), "
                             f"got {tuple(rows.shape)} {rows.dtype}")
        R = rows.shape[0]
        if not 1 <= R <= kernels.MAX_ROWS:
            raise ValueError(f"rows must hold 1 to {kernels.MAX_ROWS} rows, got {R}")
        if not FusedForward.supports_cache(cache):
            raise ValueError("cache must be a contiguous batch-1 float32 KVCache")
        cache.reserve(R)
        pos = cache.length
        if pos + R > m.rope_cos.shape[0]:
            raise ValueError(f"positions up to {pos + R} exceed the rotary table ({m.rope_cos.shape[0]})")
        # Panels and pointer arrays are rebuilt only when a weight changed: another tensor, or written
        parts = self._parts()
        key = [(w.data_ptr(), w._version) for w in (m._parameters["weight"] for m in parts)]
        built_key, pointers = self._built
        if key != built_key:
            pointers = self._build(parts)
            self._built = (key, pointers)  # one assignment: another thread sees the old pair or the new
        groups, norm_ptr, head_ptr, n, n_layers, _held = pointers
        H, Hkv, D = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        need = kernels.forward_work(R, cfg.dim, H, Hkv, D, cfg.intermediate_size, cache.capacity)
        scratch = self._scratch
        if getattr(scratch, "work", None) is None or scratch.work.numel() < need:
            scratch.work = torch.empty(need)
        n_out = self.padded(n) if head else 0
        logits = torch.empty(R, n_out)
        cos, sin = m.rope_cos[pos:pos + R], m.rope_sin[pos:pos + R]  # (R, D), the rotate-half layout
        self._forward(
            rows.data_ptr(), R, n_layers, *groups, norm_ptr, head_ptr,
            n_out, cache.k.data_ptr(), cache.v.data_ptr(), cache.capacity, pos, cos.data_ptr(),
            sin.data_ptr(), cfg.dim, H, Hkv, D, cfg.intermediate_size, cfg.norm_eps, scratch.work.data_ptr(),
            logits.data_ptr())
        cache.advance(R)
        scratch.rows = R
        if not head:
            return None
        y = logits[:, :n]
        if is_subset_head(m.head):
            return y.new_full((R, m.head.vocab_size), float("-inf")).index_copy_(1, m.head.ids, y)
        return y

    def hidden_states(self) -> torch.Tensor:
        """This thread's last call's final normalised hidden states (R, dim): what Transformer.hidden
        returns for those rows. A view of the thread's work buffer, overwritten by its next call."""
        dim, R = self.model.cfg.dim, getattr(self._scratch, "rows", 0)
        if R == 0:
            raise RuntimeError("hidden_states() reads the last call's rows: this thread has made no call yet")
        return self._scratch.work[R * dim:2 * R * dim].view(R, dim)


class OneTokenDecoder:
    """One token at a time through FusedForward, into a cache fixed at construction: how the
    self-draft runs (self_draft.py). A draft of a few narrow
    layers spends its eager forward launching some 200 small operator calls, not reading its few
    megabytes of weights. `OneTokenDecoder(model, cache)(token)` returns what
    `model(token, cache=cache, last_only=True)[0, -1]` returns (to rounding in attention) and
    advances the cache by one; `embedded(row)` takes an input row in place of a token.
    `OneTokenDecoder.supports` says which models and caches it takes: FusedForward's, with a
    contiguous embedding table of the model's own for by_token calls (not a tied one)."""

    WEIGHTS = FusedForward.WEIGHTS

    @staticmethod
    def supports(model, cache, by_token=True, weights="float32") -> bool:
        """by_token=False: only `embedded` calls, which need no embedding table of the model's own.
        weights="float16" / "int8" / "int4": also the kernel library's forward for them
        (kernels.has_half(), kernels.has_int8(), kernels.has_int4())."""
        return (FusedForward.supports(model, weights) and FusedForward.supports_cache(cache)
                and (not by_token or (model.embed is not None and model.embed.weight.is_contiguous()
                                      and model.embed.weight.dtype == torch.float32)))

    def __init__(self, model, cache, by_token=True, weights="float32"):
        if not OneTokenDecoder.supports(model, cache, by_token, weights):
            raise ValueError("OneTokenDecoder needs a float32 CPU model with untied embeddings (or by_token=False) "
                             "and no biases, a contiguous batch-1 float32 KVCache, and the kernel library "
                             "(kernels.available(); weights='float16' needs kernels.has_half(), 'int8' "
                             "kernels.has_int8(), 'int4' kernels.has_int4())")
        self.model, self.cache, self.by_token, self.weights = model, cache, by_token, weights
        self.fused = FusedForward(model, weights)

    def __call__(self, token: int) -> torch.Tensor:
        if not self.by_token:
            raise ValueError("this OneTokenDecoder was built with by_token=False: call embedded(row)")
        if not 0 <= token < self.model.cfg.vocab_size:
            raise ValueError(f"token must be in [0, {self.model.cfg.vocab_size}), got {token}")
        return self.embedded(self.model.embed.weight[token])

    @property
    def state(self) -> torch.Tensor:
        """The last call's final normalised hidden state (dim,): what Transformer.hidden returns
        for that row. A view of the work buffer, overwritten by the next call."""
        return self.fused.hidden_states()[0]

    def embedded(self, row: torch.Tensor, head: bool = True):
        """The same forward from an input row (dim,) float32 in place of a token's embedding
        (a feature draft builds its own). head=False skips the output head and returns None:
        a row whose logits nobody reads costs only the layers."""
        dim = self.model.cfg.dim
        if row.shape != (dim,) or row.dtype != torch.float32 or not row.is_contiguous():
            raise ValueError(f"row must be a contiguous float32 tensor of shape ({dim},), "
                             f"got {tuple(row.shape)} {row.dtype}")
        y = self.fused(row.view(1, dim), self.cache, head)
        return None if y is None else y[0]


class FusedRows:
    """The `runner` seam of a Transformer (core/model.py): its forward through FusedForward where
    that applies (batch 1, 1..MAX_ROWS tokens, a contiguous float32 cache, the default causal mask
    and positions, nothing to differentiate), a long prompt in chunks of rows (prefill.py), None
    elsewhere, so the model runs its eager code."""

    name = "cpu-fused"

    def __init__(self, model, weights="float32"):
        self.model, self.weights = model, weights
        self.fused = FusedForward(model, weights)

    def __deepcopy__(self, memo):  # a copied model gets its own: the copy's weights, not these
        model = memo.get(id(self.model))
        return FusedRows(model, self.weights) if model is not None else None

    def _applies(self, tokens, input_pos, cache, mask, embeds) -> bool:
        m = self.model
        if not (mask is None and tokens.shape[0] == 1 and 1 <= tokens.shape[1] <= kernels.MAX_ROWS
                and FusedForward.supports_cache(cache)
                and not (torch.is_grad_enabled() and m.head.weight.requires_grad)
                and (embeds is None or (embeds.dtype == torch.float32 and embeds.shape[0] == 1))
                and m.dtype == torch.float32 and m.device.type == "cpu"
                and (kernels.threaded() or torch.get_num_threads() == 1)):
            return False
        T = tokens.shape[1]
        return input_pos is None or input_pos.tolist() == list(range(cache.length, cache.length + T))  # sync: CPU

    def _run(self, tokens, cache, embeds, head):
        x = self.model.embed_tokens(tokens) if embeds is None else embeds  # (1, T, dim)
        return self.fused(x[0].contiguous(), cache, head=head)

    def logits(self, tokens, input_pos, cache, mask, last_only):
        if chunk_applies(self.model, tokens, input_pos, cache, mask):  # a long prompt: in chunks
            return chunked_logits(self.model, tokens, cache, last_only)  # (B, T or 1, V)
        if not self._applies(tokens, input_pos, cache, mask, None):
            return None
        y = self._run(tokens, cache, None, head=True)  # (T, V)
        return (y[-1:] if last_only else y).float().unsqueeze(0)  # (1, T or 1, V)

    def hidden(self, tokens, input_pos, cache, mask, embeds, layers=None):
        if chunk_applies(self.model, tokens, input_pos, cache, mask):
            return chunked_hidden(self.model, tokens, cache, embeds, layers)  # every prompt position's states
        if layers is not None or not self._applies(tokens, input_pos, cache, mask, embeds):
            return None
        self._run(tokens, cache, embeds, head=False)
        return self.fused.hidden_states().clone().unsqueeze(0)  # (1, T, dim)
