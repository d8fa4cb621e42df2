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

`static=True` keeps every forward's shapes fixed, as torch.compile and CUDA
graphs need (gpt-fast's model.py does the same): `write_at` writes the new
positions by index at `input_pos`, attention reads the whole capacity, and the
mask rows are gathered from one (S, S) causal mask made here once. Slots past
the committed length hold stale keys from rejected drafts; the mask hides them.
"""
import torch


class CacheOverflowError(ValueError):
    """An append would write beyond the cache's capacity."""


class KVCache:
    def __init__(self, n_layers, batch_size, n_kv_heads, capacity, head_dim,
                 dtype=torch.float32, device="cpu", static=False):
        for name, v in [("n_layers", n_layers), ("batch_size", batch_size),
                        ("n_kv_heads", n_kv_heads), ("capacity", capacity), ("head_dim", head_dim)]:
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:  # True is an int to Python
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        shape = (n_layers, batch_size, n_kv_heads, capacity, head_dim)  # (L, B, Hkv, S, D)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.capacity = capacity
        self.length = 0
        self.static = bool(static)
        # (S, S): row i allows columns 0..i. A forward at positions input_pos uses rows causal[input_pos].
        self.causal = torch.ones(capacity, capacity, dtype=torch.bool, device=device).tril() if static else None
        if static and self.k.device.type == "cuda":
            # CUDA graphs replay fixed addresses: a graph may write these buffers in place only if they
            # are marked as living at one address for good. torch has no public name for this yet;
            # transformers' StaticCache uses the same function.
            from torch._dynamo import mark_static_address
            for t in (self.k, self.v, self.causal):
                mark_static_address(t)

    @classmethod
    def for_model(cls, cfg, capacity, batch_size=1, dtype=torch.float32, device="cpu", static=False):
        return cls(cfg.n_layers, batch_size, cfg.n_kv_heads, capacity, cfg.head_dim, dtype, device, static)

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

    def write_at(self, layer: int, k: torch.Tensor, v: torch.Tensor, input_pos: torch.Tensor):
        """Static shapes: write one layer's new keys/values (B, Hkv, T, D) at positions input_pos (T,);
        return that layer's whole buffers (B, Hkv, S, D). Reads no Python length, so a compiled
        forward does not specialise on it."""
        self.k[layer].index_copy_(2, input_pos, k)
        self.v[layer].index_copy_(2, input_pos, v)
        return self.k[layer], self.v[layer]

    def mask_rows(self, input_pos: torch.Tensor) -> torch.Tensor:
        """Static shapes: the boolean mask (1, 1, T, S) for new tokens at input_pos (True = attend)."""
        return self.causal[input_pos].unsqueeze(0).unsqueeze(0)

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
