"""The project's own Llama-family decoder: the model a reader came to read.

Contract: `Transformer.forward(tokens, input_pos, cache, mask) -> logits`. tokens (B, T) int64;
input_pos (T,) the absolute positions of those tokens; cache a KVCache (or None for a plain causal
pass, as in training); mask an additive (B, 1, T, L+T) mask or None. Logits are (B, T, V) in float32,
or (B, 1, V) with last_only=True.

RMSNorm, rotary embeddings (with Llama-3 rope scaling), grouped-query attention with an explicit mask,
and a SwiGLU MLP. q/k/v and gate/up are fused into one matmul each: fewer, larger products, which is
what batch-1 decode wants.

Which forward runs is decided in one place, `Transformer.runner` (`forward_kind` names it): None runs the
eager code below; a runner installed from outside (cpu/ and compiled/ install theirs) returns a forward's
result, or None to leave it to the eager code. Keys and values go through the cache (`cache.attend`).
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from .attention import grouped_attention
from .config import ModelConfig
from .kv_cache import KVCache
from .masks import verification_mask


class Linear(nn.Module):
    """y = x W (+ b) with W stored (in, out), the transpose of nn.Linear. Batch-1 decode is a matrix-vector
    product bound by how fast W streams from memory; on the project's CPU the (in, out) layout streamed
    about twice as fast (docs/benchmarks.md)."""

    def __init__(self, d_in, d_out, bias=False):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(d_in, d_out))  # (in, out)
        self.bias = nn.Parameter(torch.zeros(d_out)) if bias else None

    def forward(self, x):
        y = x @ self.weight
        return y + self.bias if self.bias is not None else y

    def columns(self, idx):  # W's columns at idx, each a row (*idx.shape, in): a tied model's embeddings
        return F.embedding(idx, self.weight.t())


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
        if cache is not None:
            y = cache.attend(layer, q, k, v, mask, input_pos)  # writes k, v; reads what the cache holds
        elif mask is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=T > 1, enable_gqa=True)  # training
        else:
            y = grouped_attention(q, k, v, mask)
        y = y.transpose(1, 2).reshape(B, T, H * D)  # (B, T, H*D)
        return self.wo(y)


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
        # The seam (module docstring): `name`, logits(tokens, input_pos, cache, mask, last_only) and
        # hidden(tokens, input_pos, cache, mask, embeds, layers), each returning this class's result
        # or None; optionally new_cache(capacity, batch_size) and `fixed_shapes`.
        self.runner = None

    @property
    def forward_kind(self) -> str:
        """Which forward runs: "eager", or the installed runner's name."""
        return "eager" if self.runner is None else self.runner.name

    @property
    def fixed_shapes(self) -> bool:
        """The runner needs one shape for every forward (the engine then keeps K to the very end)."""
        return bool(getattr(self.runner, "fixed_shapes", False))

    def new_cache(self, capacity, batch_size=1):
        """An empty cache for this model: the installed runner's kind where it has one, else a KVCache."""
        make = getattr(self.runner, "new_cache", None)
        if make is not None:
            return make(capacity, batch_size)
        return KVCache.for_model(self.cfg, capacity, batch_size, dtype=self.dtype, device=self.device)

    @property
    def device(self):
        return self.head.weight.device

    @property
    def dtype(self):
        return self.head.weight.dtype

    def embed_tokens(self, tokens):
        if self.embed is None:
            return self.head.columns(tokens)  # (B, T, dim): columns of the head (a fast twin reads its panels)
        return self.embed(tokens)

    def forward(self, tokens, input_pos=None, cache=None, mask=None, last_only=False):
        logits = None if self.runner is None else self.runner.logits(tokens, input_pos, cache, mask, last_only)
        if logits is not None:
            return logits
        x = self.eager_hidden(tokens, input_pos, cache, mask)
        return self.head(x[:, -1:] if last_only else x).float()  # (B, 1 or T, V)

    def hidden(self, tokens, input_pos=None, cache=None, mask=None, embeds=None, layers=None):
        """The final normalised hidden states (B, T, dim), before the output head. `embeds` (B, T, dim)
        replaces the token embeddings (a feature draft builds its own). `layers`, increasing layer indices
        (i, j, ...): returns (final states, the residual stream after each of those layers, concatenated
        (B, T, len(layers) * dim)), for a draft that reads more of the target (EAGLE-3, arXiv 2503.01840)."""
        if layers is not None:
            check_layers(layers, self.cfg.n_layers)
        out = None if self.runner is None else self.runner.hidden(tokens, input_pos, cache, mask, embeds, layers)
        if out is not None:
            return out
        return self.eager_hidden(tokens, input_pos, cache, mask, embeds, layers)

    def eager_hidden(self, tokens, input_pos=None, cache=None, mask=None, embeds=None, layers=None):
        """`hidden` in plain PyTorch. input_pos: (T,) shared by every row, or (B, T); by default the positions
        after the cache's length. With a cache and no mask, T > 1 rows get the causal mask after its length."""
        B, T = tokens.shape
        start = cache.length if cache is not None else 0
        if input_pos is None:
            input_pos = torch.arange(start, start + T, device=tokens.device)
        if cache is not None:
            cache.reserve(T)  # raise before any layer writes
            if mask is None and T > 1:
                mask = verification_mask(start, T, device=tokens.device, dtype=self.dtype)
        x, taps = self.run_blocks(tokens, input_pos, cache, mask, embeds, layers)
        if cache is not None:
            cache.advance(T)
        return x if layers is None else (x, taps)

    def run_blocks(self, tokens, input_pos, cache, mask, embeds=None, layers=None):
        """The embeddings (or `embeds`) through every block and the final norm: the normalised states (B, T, dim),
        and with `layers` the residual stream after each of those layers, concatenated (B, T, n * dim), else
        None. Writes the cache; does not advance it. Shared by the eager forward and the runners."""
        cos = self.rope_cos[input_pos].to(self.dtype).unsqueeze(-2)  # (T, 1, D) or (B, T, 1, D): over heads
        sin = self.rope_sin[input_pos].to(self.dtype).unsqueeze(-2)
        x = self.embed_tokens(tokens) if embeds is None else embeds  # (B, T, dim)
        taps = []
        for i, block in enumerate(self.layers):
            x = block(x, cos, sin, i, cache, mask, input_pos)
            if layers is not None and i in layers:
                taps.append(x)
        return self.norm(x), (torch.cat(taps, -1) if layers is not None else None)


def check_layers(layers, n_layers):
    """Layer indices for Transformer.hidden(layers=...): a non-empty increasing tuple in [0, n_layers)."""
    ints = isinstance(layers, tuple) and all(isinstance(i, int) and not isinstance(i, bool) for i in layers)
    if not (ints and layers and list(layers) == sorted(set(layers)) and 0 <= layers[0] and layers[-1] < n_layers):
        raise ValueError(f"layers must be a non-empty increasing tuple of layer indices in [0, {n_layers}), "
                         f"got {layers!r}")


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
