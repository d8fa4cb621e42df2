"""Attention over a cache's keys: the plain two-matmul form that the contiguous and paged caches read with."""
import math


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
