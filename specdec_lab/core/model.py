"""The project's own Llama-family decoder: the model a reader came to read.

Contract: `Transformer.forward(tokens, input_pos, cache, mask) -> logits`.
tokens (B, T) int64; input_pos (T,) the absolute positions of those tokens;
cache a KVCache (or None for a plain causal pass, as in training); mask an
additive (B, 1, T, L+T) mask or None. Logits are (B, T, V) in float32, or
(B, 1, V) with last_only=True.

RMSNorm, rotary embeddings (with Llama-3 rope scaling), grouped-query attention
with an explicit mask, and a SwiGLU MLP. q/k/v and gate/up are fused into one
matmul each: fewer, larger products, which is what batch-1 decode wants.

Nothing here is tuned for one processor. `cpu.accelerate(model)` makes the CPU
fast from outside: it swaps `Linear` and `RMSNorm` for modules with the same
interface, and sets `Transformer.fast_rows`, the one seam, to a forward over a
few rows in one call (cpu/fused.py). `load_pair` applies it on the CPU.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from .config import ModelConfig
from .masks import verification_mask


class Linear(nn.Module):
    """y = x W (+ b) with W stored (in, out), the transpose of nn.Linear.

    Batch-1 decode is a matrix-vector product bound by how fast W streams from
    memory; on the project's CPU the (in, out) layout streamed about twice as fast
    (docs/benchmarks.md)."""

    def __init__(self, d_in, d_out, bias=False):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(d_in, d_out))  # (in, out)
        self.bias = nn.Parameter(torch.zeros(d_out)) if bias else None

    def forward(self, x):
        y = x @ self.weight
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
        if x.dtype == torch.float32:
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        x32 = x.float()  # the sum of squares in float32 whatever the weights' precision
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


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        q_out, kv_out = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
        self.wqkv = Linear(cfg.dim, q_out + 2 * kv_out, bias=cfg.qkv_bias)
        self.wo = Linear(q_out, cfg.dim)

    def forward(self, x, cos, sin, layer, cache, mask, input_pos=None):
        B, T, _ = x.shape
        H, Hkv, D = self.cfg.n_heads, self.cfg.n_kv_heads, self.cfg.head_dim
        qkv = self.wqkv(x).view(B, T, H + 2 * Hkv, D)  # (B, T, H + 2 Hkv, D)
        qk = apply_rope(qkv[:, :, :H + Hkv], cos, sin)  # queries and keys rotated together
        q = qk[:, :, :H].transpose(1, 2)  # (B, H, T, D)
        k = qk[:, :, H:].transpose(1, 2)  # (B, Hkv, T, D)
        v = qkv[:, :, H + Hkv:].transpose(1, 2)  # (B, Hkv, T, D)
        if getattr(cache, "static", False):
            k, v = cache.write_at(layer, k, v, input_pos)  # (B, Hkv, S, D): the whole capacity, one shape
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        elif cache is not None:
            k, v = cache.write_layer(layer, k, v)  # (B, Hkv, L+T, D)
            y = grouped_attention(q, k, v, mask)
        elif mask is None:
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

    def forward(self, x, cos, sin, layer, cache, mask, input_pos=None):
        x = x + self.attn(self.attn_norm(x), cos, sin, layer, cache, mask, input_pos)
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
        # The seam for a faster forward over a few rows (cpu.accelerate sets it): an object with
        # logits(tokens, input_pos, cache, mask, last_only) and hidden(..., embeds), each returning
        # what this class returns, or None where it does not apply (the eager code below runs then).
        self.fast_rows = None
        # Static shapes (use_static_shapes): caches made for this model are static, and `compiled`,
        # when set, is torch.compile of static_forward, used for the few-row forwards of decoding.
        self.static_shapes = False
        self.compiled = None

    def use_static_shapes(self, compile=False, mode=None):
        """Run with fixed shapes from now on (gpt-fast's design): the engine, drafters and the
        autoregressive baseline make static caches for this model. With compile=True the forwards
        of up to COMPILED_ROWS rows after the prompt (decode, verification, the draft's step) go
        through torch.compile; mode defaults to "reduce-overhead" (CUDA graphs) on CUDA and
        inductor's default on the CPU. Each row count compiles once, on its first call."""
        if mode is not None and mode not in COMPILE_MODES:
            raise ValueError(f"mode must be None or one of {COMPILE_MODES}, got {mode!r}")
        if self.fast_rows is not None:
            raise ValueError("use_static_shapes needs a plain model, and this one has the CPU fast path "
                             "(load_pair(..., accelerate=False) or cpu.unaccelerate(model) gives one)")
        self.static_shapes = True
        if compile:
            mode = mode or ("reduce-overhead" if self.device.type == "cuda" else "default")
            # Each (model, row count, cache shape) is one graph of the one function static_forward,
            # and torch counts a function's graphs together against a limit of 8: a target and its
            # draft at a few K pass it. torch has no public setting for it; fullgraph=True below
            # turns reaching it into an error instead of a silent eager fallback.
            import torch._dynamo.config as dynamo_config
            dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, 64)
            self.compiled = torch.compile(self.static_forward, mode=mode, dynamic=False, fullgraph=True)
        else:
            self.compiled = None
        return self

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
        if getattr(cache, "static", False):
            return self._static(tokens, input_pos, cache, mask, None, True, last_only)
        if self.fast_rows is not None:
            logits = self.fast_rows.logits(tokens, input_pos, cache, mask, last_only)
            if logits is not None:
                return logits
        x = self.hidden(tokens, input_pos, cache, mask)
        if last_only:
            x = x[:, -1:]  # (B, 1, dim)
        return self.head(x).float()  # (B, T, V)

    def hidden(self, tokens, input_pos=None, cache=None, mask=None, embeds=None, layers=None):
        """The final normalised hidden states (B, T, dim), before the output head.
        `embeds` (B, T, dim) replaces the token embeddings (a feature draft builds its own).
        `layers`, increasing layer indices (i, j, ...): returns (final states, the residual stream
        after each of those layers, concatenated (B, T, len(layers) * dim)), for a draft that reads
        more of the target than its last layer (EAGLE-3, arXiv 2503.01840)."""
        if layers is not None:
            check_layers(layers, self.cfg.n_layers)
        if getattr(cache, "static", False):
            return self._static(tokens, input_pos, cache, mask, embeds, False, False, layers)
        if self.fast_rows is not None and layers is None:  # the one-call path gives the last layer only
            x = self.fast_rows.hidden(tokens, input_pos, cache, mask, embeds)
            if x is not None:
                return x
        B, T = tokens.shape
        start = cache.length if cache is not None else 0
        if input_pos is None:
            input_pos = torch.arange(start, start + T, device=tokens.device)
        if cache is not None:
            cache.reserve(T)  # raise before any layer writes
            if mask is None and T > 1:
                mask = verification_mask(start, T, device=tokens.device, dtype=self.dtype)
        x, taps = self._blocks(tokens, input_pos, cache, mask, embeds, layers)
        if cache is not None:
            cache.advance(T)
        return x if layers is None else (x, taps)

    def _blocks(self, tokens, input_pos, cache, mask, embeds, layers):
        """The embeddings (or `embeds`) through every block and the final norm: the normalised
        states (B, T, dim), and with `layers` the residual stream after each of those layers,
        concatenated (B, T, n * dim), else None. Shared by the eager and the static forward."""
        cos = self.rope_cos[input_pos].to(self.dtype)[:, None]  # (T, 1, D): broadcast over heads
        sin = self.rope_sin[input_pos].to(self.dtype)[:, None]  # (T, 1, D)
        x = self.embed_tokens(tokens) if embeds is None else embeds  # (B, T, dim)
        taps = []
        for i, block in enumerate(self.layers):
            x = block(x, cos, sin, i, cache, mask, input_pos)
            if layers is not None and i in layers:
                taps.append(x)
        return self.norm(x), (torch.cat(taps, -1) if layers is not None else None)

    def _static(self, tokens, input_pos, cache, mask, embeds, head, last_only, layers=None):
        """A forward over a static cache: the Python bookkeeping (the length, its check, the
        positions) stays out here, so static_forward sees the same shapes at every step."""
        T = tokens.shape[1]
        start = cache.length
        cache.reserve(T)  # raise before any layer writes
        if input_pos is None:
            input_pos = torch.arange(start, start + T, device=tokens.device)  # a kernel, not a copy
        if mask is not None:  # an explicit (B, 1, T, L+T) mask: extend it over the whole capacity
            mask = F.pad(mask.to(self.dtype), (0, cache.capacity - mask.shape[-1]), value=float("-inf"))
        if self.compiled is not None and start > 0 and embeds is None and mask is None and T <= COMPILED_ROWS:
            # CUDA graphs replay into the same output buffer each call: the clone keeps this one.
            out = self.compiled(tokens, input_pos, cache, None, None, head, last_only, layers)
            out = out.clone() if layers is None else tuple(o.clone() for o in out)
        else:
            out = self.static_forward(tokens, input_pos, cache, mask, embeds, head, last_only, layers)
        cache.advance(T)
        return out

    def static_forward(self, tokens, input_pos, cache, mask=None, embeds=None, head=True, last_only=False,
                       layers=None):
        """The fixed-shape forward that torch.compile traces: logits (B, T or 1, V) with head=True,
        else the normalised hidden states (B, T, dim), and with `layers` (head=False) also the
        chosen layers' states as `hidden` gives them. Writes the cache at input_pos; does not
        advance it."""
        if mask is None:
            mask = cache.mask_rows(input_pos)  # (1, 1, T, S) boolean, gathered from one mask
        x, taps = self._blocks(tokens, input_pos, cache, mask, embeds, layers)
        if not head:
            return x if layers is None else (x, taps)  # (B, T, dim), (B, T, n * dim)
        if last_only:
            x = x[:, -1:]  # (B, 1, dim)
        return self.head(x).float()


def check_layers(layers, n_layers):
    """Layer indices for Transformer.hidden(layers=...): a non-empty increasing tuple in [0, n_layers)."""
    if not (isinstance(layers, tuple) and layers and all(isinstance(i, int) and not isinstance(i, bool)
                                                         for i in layers)
            and list(layers) == sorted(set(layers)) and 0 <= layers[0] and layers[-1] < n_layers):
        raise ValueError(f"layers must be a non-empty increasing tuple of layer indices in [0, {n_layers}), "
                         f"got {layers!r}")


# Forwards of up to this many rows after the prompt are compiled: decode (1), the draft's first
# step after a fully accepted one (2) and verification (K + 1). The prompt's prefill runs uncompiled.
COMPILED_ROWS = 9
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


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
