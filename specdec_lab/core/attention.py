"""Attention over a cache's keys: what the contiguous and paged caches read with."""
import math

import torch.nn.functional as F

LONG_QUERY = 64  # more query rows than verification (MAX_K + 1) or a token tree feeds: a prefill


def grouped_attention(q, k, v, mask):
    """softmax(q k^T / sqrt(D) + mask) v with H/Hkv query heads per key/value head.
    q (B, H, T, D); k, v (B, Hkv, S, D); mask (B or 1, 1, T, S) additive or None. Past LONG_QUERY rows
    torch's fused kernel, which never holds the (T, S) scores: the two matmuls spent three quarters of
    a 1,786-token prefill there (docs/benchmarks.md, section 26). Decode and verification keep them."""
    if q.shape[2] <= LONG_QUERY:
        return grouped_attention_reference(q, k, v, mask)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=None if mask is None else mask.to(q.dtype),
                                          enable_gqa=True)


def grouped_attention_reference(q, k, v, mask):
    """The same in two matmuls, written out."""
    B, H, T, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    G = H // Hkv
    q = q.reshape(B, Hkv, G * T, D)  # (B, Hkv, G*T, D): head h uses key/value head h // G
    scores = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(D))  # (B, Hkv, G*T, S)
    if mask is not None:
        scores = (scores.view(B, Hkv, G, T, S) + mask.to(scores.dtype).unsqueeze(2)).view(B, Hkv, G * T, S)
    y = scores.softmax(-1) @ v  # (B, Hkv, G*T, D)
    return y.view(B, H, T, D)
