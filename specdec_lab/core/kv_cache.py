"""A contiguous, preallocated key/value cache for all layers, with rollback by length.

Contract: keys and values live in two tensors of shape (L, B, Hkv, S, D). The
cache's whole state is `length`, the number of committed positions. A forward
pass writes its T new positions at [length, length + T) of every layer, then
`advance(T)` commits them. `rollback(n)` only moves `length` back: the slots
beyond it are overwritten by the next write and never read before that, so a
rollback copies nothing (the gpt-fast design).

Capacity S must leave room for the K+1 verification window beyond the longest
sequence the engine will commit; `reserve(T)` checks that before anything is
written, so a failed append changes nothing.

Attention goes through the cache (`attend`): it writes the new positions and reads
what it holds, so a cache of another layout (paged/, compiled/) plugs in unchanged.
"""
import torch

from .attention import grouped_attention


class CacheOverflowError(ValueError):
    """An append would write beyond the cache's capacity."""


class KVCache:
    def __init__(self, n_layers, batch_size, n_kv_heads, capacity, head_dim,
                 dtype=torch.float32, device="cpu"):
        for name, v in [("n_layers", n_layers), ("batch_size", batch_size),
                        ("n_kv_heads", n_kv_heads), ("capacity", capacity), ("head_dim", head_dim)]:
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:  # True is an int to Python
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        shape = (n_layers, batch_size, n_kv_heads, capacity, head_dim)  # (L, B, Hkv, S, D)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.capacity = capacity
        self.length = 0

    @classmethod
    def for_model(cls, cfg, capacity, batch_size=1, dtype=torch.float32, device="cpu"):
        return cls(cfg.n_layers, batch_size, cfg.n_kv_heads, capacity, cfg.head_dim, dtype, device)

    @property
    def n_layers(self) -> int:
        return self.k.shape[0]

    def reserve(self, T: int):
        """Raise before any write if T more positions do not fit."""
        if self.length + T > self.capacity:
            raise CacheOverflowError(
                f"cache overflow: length {self.length} + {T} new positions > capacity {self.capacity}")

    def write_layer(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        """Write one layer's new keys/values (B, Hkv, T, D) at [length, length+T);
        return that layer's keys and values for [0, length+T), views with no copy."""
        end = self.length + k.shape[2]
        self.k[layer, :, :, self.length:end] = k
        self.v[layer, :, :, self.length:end] = v
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]  # (B, Hkv, length+T, D)

    def attend(self, layer, q, k, v, mask, input_pos=None):
        """The model's attention read: write the new keys/values, attend over [0, length+T)."""
        k, v = self.write_layer(layer, k, v)
        return grouped_attention(q, k, v, mask)

    def advance(self, T: int):
        """Commit the T positions that the last forward wrote."""
        self.reserve(T)
        self.length += T

    def rollback(self, length: int):
        """Forget every position at or beyond `length`. Rolling forward is an error."""
        if isinstance(length, bool) or not isinstance(length, int) or length < 0:
            raise ValueError(f"length must be an int >= 0, got {length!r}")
        if length > self.length:
            raise ValueError(f"cannot roll forward: length {length} > current length {self.length}")
        self.length = length

    def reset(self):
        self.length = 0


def drop_rejected(cache, fed: int, kept: int):
    """A forward fed `fed` positions into `cache`, and only its first `kept` stay: roll the rest back.
    The engine keeps c, d_1..d_n of [c, d_1..d_k] (fed k + 1, kept n + 1); a draft keeps what the
    target accepted of what it fed itself."""
    if not 0 <= kept <= fed <= cache.length:
        raise ValueError(f"need 0 <= kept <= fed <= length, got kept={kept}, fed={fed}, length={cache.length}")
    cache.rollback(cache.length - fed + kept)
