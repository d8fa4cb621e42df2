"""The decoder's forward over ragged rows: every row at its own positions, attention through a view.

`hidden(model, view, tokens)` runs `model` (a core.model.Transformer, weights untouched) over
tokens (B, T) with the view's positions (B, T) and mask (B, 1, T, S), and returns the final
normalised states (B, T, dim). It is the eager forward of core/model.py with two changes: the
rotary tables are indexed by a row of positions per sequence, and attention is the view's
`attend`, which stores the new keys and values in the sequence's own memory.
"""
import torch

from ..core.model import apply_rope


def hidden(model, view, tokens: torch.Tensor) -> torch.Tensor:
    """tokens (B, T) int64 on the model's device -> states (B, T, dim); commits the rows' real tokens."""
    B, T = tokens.shape
    cfg = model.cfg
    H, Hkv, D = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    input_pos = view.input_pos()  # (B, T)
    mask = view.mask(model.dtype)  # (B, 1, T, S)
    cos = model.rope_cos[input_pos].to(model.dtype).unsqueeze(2)  # (B, T, 1, D): broadcast over heads
    sin = model.rope_sin[input_pos].to(model.dtype).unsqueeze(2)  # (B, T, 1, D)
    view.reserve(T)  # raise before any layer writes
    x = model.embed_tokens(tokens)  # (B, T, dim)
    for layer, block in enumerate(model.layers):
        attn = block.attn
        qkv = attn.wqkv(block.attn_norm(x)).view(B, T, H + 2 * Hkv, D)  # (B, T, H + 2 Hkv, D)
        qk = apply_rope(qkv[:, :, :H + Hkv], cos, sin)  # queries and keys rotated together
        q = qk[:, :, :H].transpose(1, 2)  # (B, H, T, D)
        k = qk[:, :, H:].transpose(1, 2)  # (B, Hkv, T, D)
        v = qkv[:, :, H + Hkv:].transpose(1, 2)  # (B, Hkv, T, D)
        y = view.attend(layer, q, k, v, mask, input_pos)  # (B, H, T, D)
        x = x + attn.wo(y.transpose(1, 2).reshape(B, T, H * D))  # (B, T, dim)
        x = x + block.mlp(block.mlp_norm(x))
    view.advance(T)
    return model.norm(x)
