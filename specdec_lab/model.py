"""The project's own Llama-family decoder.

Contract: `Transformer.forward(tokens, input_pos, cache, mask) -> logits`.
tokens (B, T) int64; input_pos (T,) the absolute positions of those tokens;
cache a KVCache (or None for a plain causal pass, as in training); mask an
additive (B, 1, T, L+T) mask or None. Logits are (B, T, V) in float32, or
(B, 1, V) with last_only=True.

RMSNorm, rotary embeddings (with Llama-3 rope scaling), grouped-query attention
through scaled_dot_product_attention with an explicit mask, and a SwiGLU MLP.
q/k/v and gate/up are fused into one matmul each: fewer, larger kernels,
which is what batch-1 decode on a CPU wants. Weight matrices are stored
(in, out), the transpose of nn.Linear: see `Linear`.
"""
import ctypes
import math
import threading
import weakref

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import kernels
from .config import ModelConfig
from .kv_cache import KVCache
from .masks import verification_mask


# Products over a few float32 rows (decode's one, verification's K+1) go through the
# project's own kernel (kernels.py, csrc/panel_matmul.cpp), which reads a copy of W laid out
# as contiguous column panels. On this project's CPU, one thread, it streamed every kind
# of the default target's products faster than PyTorch's and oneDNN's kernels, for one row
# and for five (`python -m specdec_lab bench --kernels`), and a whole one-token forward went
# from 39 to 29 ms (acceptance.measure_step_costs, the two interleaved). It splits over torch's own
# threads; a serial build of it (where linking against torch failed) is used only when
# torch runs one thread. RMSNorm over the same few rows goes through the same library.
# Set PANEL_MATMUL = False to compare: both then run PyTorch's kernels.
PANEL_MATMUL = True

# Other multi-row products (prefill, and verification when the panel kernel is not in use)
# go through a oneDNN copy of the weight, prepacked once into the blocked layout its kernels
# read. On this project's CPU, torch's default GEMM ran a 5-row product over the
# 576 x 49152 head 4.7x slower than the one-row product (2-row: 2.0x); the prepacked oneDNN
# kernel ran it at 1.3x, and a whole 5-token forward of the default target went from
# 2.34x to 1.04x the cost of a one-token forward (acceptance.measure_verify_cost).
# That ratio is what speculative decoding lives on. In bfloat16 the packed kernel also
# wins at one row (a one-token forward of the default target: 35 ms, against 52 ms
# through the default kernel and 44 ms in float32), so bfloat16 weights take it always, on
# processors whose oneDNN packs bfloat16 (CAN_PACK_BF16).
# Set to False to compare.
PACKED_MATMUL = True
_PACK_ROWS_HINT = 5  # the row count oneDNN tunes the layout for; it serves any row count

# A float32 forward over a few rows with a contiguous cache (decode's one token, verification's
# K+1) runs as one call into the kernel library: FusedForward, the same products with none of
# the eager forward's operator calls between them. On this project's CPU, one thread, 150 cached
# tokens, a one-token forward of the default target went from 67.1 to 51.3 ms and a 5-token one
# from 71.6 to 52.5 ms (eight interleaved rounds; `bench --profile` times both ways).
# Set to False to compare.
FUSED_FORWARD = True


_HAVE_PACKING = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
# oneDNN packs bfloat16 only on processors with bfloat16 instructions (AVX-512 BF16 or AVX-NE-CONVERT);
# on an AVX2-only processor the reorder raises, and bfloat16 products take PyTorch's kernel.
CAN_PACK_BF16 = (_HAVE_PACKING and hasattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported")
                 and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()))


def _use_kernels(x: torch.Tensor, w: torch.Tensor) -> bool:
    """The project's CPU kernels (kernels.py) take this call: float32 on the CPU, a few rows,
    nothing to differentiate, and a kernel library that built."""
    return (PANEL_MATMUL and x.dtype == torch.float32 and w.dtype == torch.float32 and w.device.type == "cpu"
            and 0 < x.numel() <= kernels.MAX_ROWS * x.shape[-1]
            and not (w.requires_grad and torch.is_grad_enabled()) and kernels.available())


def _can_pack(w: torch.Tensor) -> bool:
    return (_HAVE_PACKING and w.device.type == "cpu"
            and (w.dtype == torch.float32 or (w.dtype == torch.bfloat16 and CAN_PACK_BF16)))


class Linear(nn.Module):
    """y = x W (+ b) with W stored (in, out).

    nn.Linear stores (out, in) and computes x W^T. At batch 1 that is a
    matrix-vector product, and decode is bound by how fast it streams W from
    memory; with W laid out (in, out) PyTorch's CPU kernel streamed it at
    27 GB/s on this project's 2-core machine, against 12 GB/s for the (out, in)
    layout (both measured with a 49152 x 576 matrix).

    Products over a few float32 rows use the panel kernel's copy of W (see
    PANEL_MATMUL); other products over several rows, and all products in bfloat16,
    a prepacked oneDNN copy (see PACKED_MATMUL). Each copy is built on first use and
    rebuilt whenever W changes. Never while W is being trained: neither has a backward."""

    def __init__(self, d_in, d_out, bias=False):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(d_in, d_out))  # (in, out)
        self.bias = nn.Parameter(torch.zeros(d_out)) if bias else None
        self._packed, self._packed_key = None, None
        self._panels = {}  # dtype -> ((data_ptr, version) of W, its panels)

    def panel_weight(self, dtype=torch.float32):
        """The panel kernel's copy of W (kernels.pack): float32, or rounded to float16, int8, 4 bits
        (torch.uint4) or int8 per group (torch.qint8) for OneTokenDecoder(weights=...). Each copy is
        rebuilt when W changes."""
        w = self.weight
        key = (w.data_ptr(), w._version)
        cached = self._panels.get(dtype)
        if cached is None or cached[0] != key:
            cached = self._panels[dtype] = (key, kernels.pack(w, dtype))
        return cached[1]

    def packed_weight(self):
        w = self.weight
        key = (w.data_ptr(), w._version, w.dtype)
        if self._packed_key != key:
            self._packed = torch.ops.mkldnn._reorder_linear_weight(w.detach().t().contiguous(), _PACK_ROWS_HINT)
            self._packed_key = key
        return self._packed

    def forward(self, x):
        w = self.weight
        rows = x.numel() // max(x.shape[-1], 1)
        if _use_kernels(x, w) and (kernels.threaded() or torch.get_num_threads() == 1):
            y = kernels.matmul(x, self.panel_weight(), w.shape[1])
            return y + self.bias if self.bias is not None else y
        if (PACKED_MATMUL and (rows > 1 or w.dtype == torch.bfloat16) and _can_pack(w) and x.dtype == w.dtype
                and not (w.requires_grad and torch.is_grad_enabled())):
            bias = None if self.bias is None else self.bias.detach()
            return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight(), bias, "none", [None], "")
        y = x @ w
        return y + self.bias if self.bias is not None else y


class VocabSubsetHead(nn.Module):
    """A draft's output head restricted to a subset of the vocabulary (FR-Spec, arXiv 2502.14856):
    logits for the `ids` columns only, -inf for every other token, so the draft proposes from the
    subset and gives the rest q = 0. Speculative sampling stays lossless for any q: a token the
    draft never proposes is reached through the residual max(p - q, 0) = p. The product reads
    len(ids) columns instead of V; for a small draft the head is the largest single cost."""

    def __init__(self, head: Linear, ids: torch.Tensor):
        super().__init__()
        ids = torch.as_tensor(ids, dtype=torch.long, device=head.weight.device)
        vocab_size = head.weight.shape[1]
        if ids.dim() != 1 or len(ids) == 0 or ids.unique().numel() != len(ids) \
                or int(ids.min()) < 0 or int(ids.max()) >= vocab_size:
            raise ValueError(f"ids must be distinct token ids in [0, {vocab_size}), got {len(ids)} of them")
        self.vocab_size = vocab_size
        self.proj = Linear(head.weight.shape[0], len(ids), bias=head.bias is not None)
        with torch.no_grad():
            self.proj.weight = nn.Parameter(head.weight.detach()[:, ids].contiguous(), requires_grad=False)
            if head.bias is not None:
                self.proj.bias = nn.Parameter(head.bias.detach()[ids].clone(), requires_grad=False)
        self.register_buffer("ids", ids, persistent=False)

    @property
    def weight(self):  # Transformer.device and .dtype read the head's weight
        return self.proj.weight

    def forward(self, x):
        y = self.proj(x)  # (..., N)
        return y.new_full(y.shape[:-1] + (self.vocab_size,), float("-inf")).index_copy_(-1, self.ids, y)


def restrict_vocab(model, ids):
    """Give `model` (a draft with untied embeddings) a VocabSubsetHead over `ids`, in place."""
    if model.embed is None:
        raise ValueError("restrict_vocab needs untied embeddings: a tied head is also the input embedding")
    if isinstance(model.head, VocabSubsetHead):
        raise ValueError("the model's head is already restricted")
    model.head = VocabSubsetHead(model.head, ids)
    return model


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        if _use_kernels(x, self.weight):  # decode and verification rows: one call (kernels.py)
            return kernels.rms_norm(x, self.weight, self.eps)
        if x.dtype == torch.float32:  # one fused op; the same sums as below
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def rope_frequencies(cfg: ModelConfig) -> torch.Tensor:
    """Inverse frequencies (D/2,), with Llama-3's piecewise scaling when configured."""
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float64) / cfg.head_dim))
    rs = cfg.rope_scaling or {}
    if rs.get("rope_type", rs.get("type")) == "llama3":
        factor, lo, hi = rs["factor"], rs.get("low_freq_factor", 1.0), rs.get("high_freq_factor", 4.0)
        old_len = rs["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv
        smooth = (old_len / wavelen - lo) / (hi - lo)  # 0 at the low-frequency edge, 1 at the high one
        scaled = torch.where(wavelen > old_len / lo, inv / factor, inv)
        mid = (wavelen <= old_len / lo) & (wavelen >= old_len / hi)
        inv = torch.where(mid, (1 - smooth) * inv / factor + smooth * inv, scaled)
    elif rs.get("rope_type", rs.get("type", "default")) not in ("default", None):
        raise ValueError(f"rope_scaling type {rs!r} is not supported (supported: default, llama3)")
    return inv.float()


def rope_table(cfg: ModelConfig) -> tuple[torch.Tensor, torch.Tensor]:
    pos = torch.arange(cfg.max_seq_len, dtype=torch.float32)
    angles = torch.outer(pos, rope_frequencies(cfg))  # (max_seq_len, D/2)
    angles = torch.cat([angles, angles], dim=-1)  # (max_seq_len, D): the rotate-half layout
    return angles.cos(), angles.sin()


def apply_rope(x, cos, sin):
    """x (..., D); cos, sin broadcast to it. Rotate pairs (x_i, x_{i+D/2}):
    (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin)."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def apply_rope_signed(x, cos, sin_signed):
    """apply_rope in three ops: rolling x by D/2 gives (x2, x1), and the sign of the
    first half lives in sin_signed = (-sin, sin). Decode calls it 30 times a token."""
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, dims=-1), sin_signed)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        q_out, kv_out = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
        self.wqkv = Linear(cfg.dim, q_out + 2 * kv_out, bias=cfg.qkv_bias)
        self.wo = Linear(q_out, cfg.dim)

    def forward(self, x, cos, sin, layer, cache, mask):
        B, T, _ = x.shape
        H, Hkv, D = self.cfg.n_heads, self.cfg.n_kv_heads, self.cfg.head_dim
        qkv = self.wqkv(x).view(B, T, H + 2 * Hkv, D)
        qk = apply_rope_signed(qkv[:, :, :H + Hkv], cos, sin)  # queries and keys rotated together
        q = qk[:, :, :H].transpose(1, 2)  # (B, H, T, D)
        k = qk[:, :, H:].transpose(1, 2)  # (B, Hkv, T, D)
        v = qkv[:, :, H + Hkv:].transpose(1, 2)  # (B, Hkv, T, D)
        if cache is not None:
            k, v = cache.write_layer(layer, k, v)  # (B, Hkv, L+T, D)
        if cache is None and mask is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=T > 1, enable_gqa=True)  # training
        else:
            y = grouped_attention(q, k, v, mask)
        y = y.transpose(1, 2).reshape(B, T, H * D)  # (B, T, H*D)
        return self.wo(y)


def grouped_attention(q, k, v, mask):
    """softmax(q k^T / sqrt(D) + mask) v with H/Hkv query heads per key/value head.
    q (B, H, T, D); k, v (B, Hkv, S, D); mask (B or 1, 1, T, S) additive or None.
    Written out with two matmuls: for the few query tokens of decode and verification
    on a CPU this beats the fused kernel, which is tuned for long queries."""
    B, H, T, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    G = H // Hkv
    q = q.reshape(B, Hkv, G * T, D)  # (B, Hkv, G*T, D): head h uses key/value head h // G
    scores = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(D))  # (B, Hkv, G*T, S)
    if mask is not None:
        scores = (scores.view(B, Hkv, G, T, S) + mask.to(scores.dtype).unsqueeze(2)).view(B, Hkv, G * T, S)
    y = scores.softmax(-1) @ v  # (B, Hkv, G*T, D)
    return y.view(B, H, T, D)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.w13 = Linear(cfg.dim, 2 * cfg.intermediate_size)  # gate and up, fused
        self.w2 = Linear(cfg.intermediate_size, cfg.dim)

    def forward(self, x):
        gate, up = self.w13(x).chunk(2, dim=-1)
        return self.w2(F.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.mlp_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, layer, cache, mask):
        x = x + self.attn(self.attn_norm(x), cos, sin, layer, cache, mask)
        return x + self.mlp(self.mlp_norm(x))


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        # With tied embeddings the one matrix is the head's (dim, V); a token's embedding is its column.
        self.embed = None if cfg.tie_embeddings else nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.head = Linear(cfg.dim, cfg.vocab_size)
        cos, sin = rope_table(cfg)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    @property
    def device(self):
        return self.head.weight.device

    @property
    def dtype(self):
        return self.head.weight.dtype

    def embed_tokens(self, tokens):
        if self.embed is None:
            return F.embedding(tokens, self.head.weight.t())  # (B, T, dim): columns of the head
        return self.embed(tokens)

    def forward(self, tokens, input_pos=None, cache=None, mask=None, last_only=False):
        x = self.hidden(tokens, input_pos, cache, mask)
        if last_only:
            x = x[:, -1:]  # (B, 1, dim)
        return self.head(x).float()  # (B, T, V)

    def hidden(self, tokens, input_pos=None, cache=None, mask=None, embeds=None):
        """The final normalised hidden states (B, T, dim), before the output head.
        `embeds` (B, T, dim) replaces the token embeddings (feature_draft.py builds its own)."""
        B, T = tokens.shape
        fused = fused_forward(self, tokens, cache, mask, input_pos, embeds)
        if fused is not None:  # a few rows of decode or verification: one call (FUSED_FORWARD)
            x = self.embed_tokens(tokens) if embeds is None else embeds
            fused(x[0].contiguous(), cache, head=False)
            return fused.hidden_states().clone().view(1, T, -1)
        start = cache.length if cache is not None else 0
        if input_pos is None:
            input_pos = torch.arange(start, start + T, device=tokens.device)
        if cache is not None:
            cache.reserve(T)  # raise before any layer writes
            if mask is None and T > 1:
                mask = verification_mask(start, T, device=tokens.device, dtype=self.dtype)
        cos, sin = self.rope_cos[input_pos].to(self.dtype), self.rope_sin[input_pos].to(self.dtype)  # (T, D)
        half = sin.shape[-1] // 2
        cos, sin = cos[:, None], torch.cat([-sin[:, :half], sin[:, half:]], -1)[:, None]  # (T, 1, D): see apply_rope_signed
        x = self.embed_tokens(tokens) if embeds is None else embeds  # (B, T, dim)
        for i, block in enumerate(self.layers):
            x = block(x, cos, sin, i, cache, mask)
        if cache is not None:
            cache.advance(T)
        return self.norm(x)


def init_weights(model: Transformer, seed: int = 0, std: float = 0.02) -> Transformer:
    """Random weights for tests and for a draft's starting point."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif p.dim() >= 1:
                p.copy_(torch.randn(p.shape, generator=g) * std)
    return model


class FusedForward:
    """A model's forward over a few rows (decode's one token, verification's K+1) as one call
    into the kernel library (kernels.py, `forward_rows`), writing their keys and values into a
    contiguous batch-1 KVCache at its length and advancing it.

    The eager forward of the default target is some 450 operator calls a token; this runs the
    same arithmetic with none in between (FUSED_FORWARD has what that bought). Each row's
    result is bit-for-bit the same whatever the number of rows, so a token decoded alone and the
    same token inside a verification pass get the same logits; both agree with the eager path
    to rounding in attention. `FusedForward.supports` says which models it takes: float32 on the
    CPU, no biases, and the kernel library.

    weights="float16" reads the products' weights rounded to half precision (`forward_rows_half`),
    weights="int8" rounded to int8 against a scale per output column (`forward_rows_int8`): half or
    a quarter of the bytes, the arithmetic still in float32, the logits no longer the eager
    path's. weights="int4" reads the layers' weights in 4 bits with a scale and offset per column
    and group of 32 inputs, and the head in int8 with a scale per group (`forward_rows_int4`): a
    sixth of the bytes. For a draft whose weights stream from memory for every token: feature_draft.py's
    (36 MB in float32), or the target itself as its own draft (self_draft.py). A draft's
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
        head = model.head.proj if isinstance(model.head, VocabSubsetHead) else model.head
        linears = [head] + [m for b in model.layers for m in (b.attn.wqkv, b.attn.wo, b.mlp.w13, b.mlp.w2)]
        built = {"float32": kernels.available, "float16": kernels.has_half, "int8": kernels.has_int8,
                 "int4": kernels.has_int4}[weights]
        grouped = weights != "int4" or all(m.weight.shape[0] % kernels.INT4_GROUP == 0
                                           and m.weight.shape[0] <= kernels.INT4_MAX_K for m in linears)
        return (PANEL_MATMUL and built() and model.dtype == torch.float32 and model.device.type == "cpu"
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
        With the (pointer, version) check on their weights this took about 0.1 ms for the default
        target, where attribute access (nn.Module.__getattr__) took 0.5-1.2 ms, up to a tenth of an
        int8 self-draft token."""
        mods = self.model._modules
        head = mods["head"]
        if isinstance(head, VocabSubsetHead):
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
        held = [m.panel_weight(dt) if isinstance(m, Linear) else m._parameters["weight"] for m in parts[:-1]]
        held.append(parts[-1].panel_weight(self.HEAD.get(self.weights, dt)))
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
        if isinstance(m.head, VocabSubsetHead):
            return y.new_full((R, m.head.vocab_size), float("-inf")).index_copy_(1, m.head.ids, y)
        return y

    def hidden_states(self) -> torch.Tensor:
        """This thread's last call's final normalised hidden states (R, dim): what Transformer.hidden
        returns for those rows. A view of the thread's work buffer, overwritten by its next call."""
        dim, R = self.model.cfg.dim, getattr(self._scratch, "rows", 0)
        if R == 0:
            raise RuntimeError("hidden_states() reads the last call's rows: this thread has made no call yet")
        return self._scratch.work[R * dim:2 * R * dim].view(R, dim)


# Each model's FusedForward (Transformer.hidden builds it on first use; False where the model is not
# supported). Kept outside the model, so that copying a model copies no ctypes state.
_FUSED = weakref.WeakKeyDictionary()


def fused_forward(model, tokens, cache, mask, input_pos, embeds):
    """model's FusedForward where Transformer.hidden may use it for this call, else None: batch 1,
    1..kernels.MAX_ROWS tokens, a contiguous cache, the default causal mask and positions, and
    nothing to differentiate."""
    if not (FUSED_FORWARD and PANEL_MATMUL and mask is None and tokens.shape[0] == 1
            and 1 <= tokens.shape[1] <= kernels.MAX_ROWS and FusedForward.supports_cache(cache)
            and not (torch.is_grad_enabled() and model.head.weight.requires_grad)
            and (embeds is None or (embeds.dtype == torch.float32 and embeds.shape[0] == 1))
            and model.dtype == torch.float32 and model.device.type == "cpu"
            and (kernels.threaded() or torch.get_num_threads() == 1)):
        return None
    if input_pos is not None and input_pos.tolist() != list(range(cache.length, cache.length + tokens.shape[1])):
        return None
    fused = _FUSED.get(model)
    if fused is None:
        fused = _FUSED[model] = FusedForward(model) if FusedForward.supports(model) else False
    return fused or None


class OneTokenDecoder:
    """One token at a time through FusedForward, into a cache fixed at construction: how the
    drafters run a draft (drafters.py, feature_draft.py, self_draft.py). A draft of a few narrow
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
        (feature_draft.py builds its own). head=False skips the output head and returns None:
        a row whose logits nobody reads costs only the layers."""
        dim = self.model.cfg.dim
        if row.shape != (dim,) or row.dtype != torch.float32 or not row.is_contiguous():
            raise ValueError(f"row must be a contiguous float32 tensor of shape ({dim},), "
                             f"got {tuple(row.shape)} {row.dtype}")
        y = self.fused(row.view(1, dim), self.cache, head)
        return None if y is None else y[0]
