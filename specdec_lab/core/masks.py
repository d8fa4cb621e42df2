"""Attention masks for T new tokens over a cache that holds L tokens.

The verification pass feeds [c, d1..dK] (T = K+1 tokens) at once. New position
i must see the whole cache and the new positions <= i, and nothing after it:
otherwise d_i's logits would depend on d_{i+1}, and p would no longer be the
distribution the target has at that point. That is the ordinary causal mask,
shifted right by L. The mask is additive: 0 where attention is allowed, -inf
where it is not, with shape (B, 1, T, L+T) so that it broadcasts over heads.
"""
import torch


def verification_mask(L: int, T: int, batch_size: int = 1, device="cpu",
                      dtype=torch.float32) -> torch.Tensor:
    """Additive mask (B, 1, T, L+T): row i is 0 on columns [0, L + i] and -inf after."""
    if L < 0 or T < 1:
        raise ValueError(f"need L >= 0 and T >= 1, got L={L}, T={T}")
    row = torch.arange(T, device=device).unsqueeze(1)  # (T, 1)
    col = torch.arange(L + T, device=device).unsqueeze(0)  # (1, L+T)
    allowed = col <= row + L  # (T, L+T)
    mask = torch.zeros(T, L + T, device=device, dtype=dtype).masked_fill(~allowed, float("-inf"))
    return mask.expand(batch_size, 1, T, L + T)  # (B, 1, T, L+T)


def verification_mask_reference(L: int, T: int) -> torch.Tensor:
    """The same mask written as a double loop, for reading and for testing."""
    mask = torch.full((1, 1, T, L + T), float("-inf"))
    for i in range(T):  # new token i sits at absolute position L + i
        for j in range(L + T):
            if j <= L + i:  # the cache, and the new tokens up to and including i
                mask[0, 0, i, j] = 0.0
    return mask
