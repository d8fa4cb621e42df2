"""A paged key/value cache: fixed-size blocks from a shared pool, one block table per sequence.

Contract. Keys and values live in two pools of shape (L, N, Hkv, P, D): N blocks
of P token slots each, for every layer. A sequence owns a list of block ids, its
block table, and a length; token position `pos` of a sequence lives in block
`table[pos // P]` at offset `pos % P`. A sequence holds exactly ceil(length / P)
blocks after any `append` or `rollback`, so the memory it reserves exceeds the
memory it uses by less than one block. This is the design of vLLM (Kwon et al.
2023, arXiv 2309.06180): a contiguous cache must reserve a sequence's maximum
length up front, a paged one grows a block at a time.

- `append(seq, k, v)` writes T positions to every layer, allocating the blocks
  it needs first; it is all-or-nothing, so a failed append (pool exhausted, bad
  shape or dtype) leaves the pool, the tables and the lengths as they were.
- `rollback(seq, length)` moves the length back and frees every whole block
  beyond it; the partial last block stays, and its stale slots are overwritten
  by the next append and never read before that. Rolling forward is an error.
- `gather(seq, layer)` is the attention read: the sequence's keys and values
  (Hkv, length, D) through the block table, in one index op per tensor;
  `gather_reference` is the same read as a loop over tokens, for reading and tests.

`PagedSequenceCache` adapts one paged sequence to the interface that
`core.model.Transformer.forward` uses (the one `core.kv_cache.KVCache` has, with
B = 1), so the decoder runs on paged memory unchanged. The block allocator is in
allocator.py; lab/fragmentation.py simulates why paging exists.

Shape letters: B batch, T new tokens, S capacity, L layers, Hkv kv heads,
D head dim, N blocks in the pool, P tokens per block.
"""
import torch

from ..core.attention import grouped_attention
from ..core.kv_cache import CacheOverflowError
from .allocator import BlockAllocator, PoolExhaustedError, _check_int, blocks_for  # noqa: F401


class PagedKVCache:
    """Keys and values for many sequences in one pool of (L, N, Hkv, P, D) blocks."""

    def __init__(self, n_layers, num_blocks, n_kv_heads, block_size, head_dim,
                 dtype=torch.float32, device="cpu"):
        for name, v in [("n_layers", n_layers), ("num_blocks", num_blocks), ("n_kv_heads", n_kv_heads),
                        ("block_size", block_size), ("head_dim", head_dim)]:
            _check_int(name, v, 1)
        shape = (n_layers, num_blocks, n_kv_heads, block_size, head_dim)  # (L, N, Hkv, P, D)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        # One row of D numbers per (block, head, offset): reads and writes are then a single
        # index_select / index_copy_ of rows, the fastest gather torch has on CPU.
        self.k_rows = self.k.view(n_layers, -1, head_dim)  # (L, N*Hkv*P, D)
        self.v_rows = self.v.view(n_layers, -1, head_dim)  # (L, N*Hkv*P, D)
        self.block_size = block_size
        self.allocator = BlockAllocator(num_blocks)
        self.tables: dict[int, list[int]] = {}  # seq id -> block ids, in position order
        self.lengths: dict[int, int] = {}  # seq id -> committed positions
        self._next_id = 0

    # -- bookkeeping --------------------------------------------------------------

    def add_sequence(self) -> int:
        """Start an empty sequence (it holds no blocks until it appends) and return its id."""
        seq, self._next_id = self._next_id, self._next_id + 1
        self.tables[seq], self.lengths[seq] = [], 0
        return seq

    def _check_seq(self, seq):
        if seq not in self.tables:
            raise ValueError(f"seq: no live sequence with id {seq!r} (live: {sorted(self.tables)})")

    def block_table(self, seq: int) -> list[int]:
        self._check_seq(seq)
        return list(self.tables[seq])

    def length_of(self, seq: int) -> int:
        self._check_seq(seq)
        return self.lengths[seq]

    @property
    def used_tokens(self) -> int:
        """Slots that hold committed positions."""
        return sum(self.lengths.values())

    @property
    def reserved_tokens(self) -> int:
        """Slots in blocks that some sequence owns."""
        return self.allocator.num_used * self.block_size

    # -- writes -------------------------------------------------------------------

    def reserve(self, seq: int, T: int) -> list[int]:
        """Make the block table cover length + T positions; return the new block ids.
        Allocates only when the write crosses a block boundary; all-or-nothing."""
        self._check_seq(seq)
        _check_int("T", T, 0)
        table = self.tables[seq]
        need = blocks_for(self.lengths[seq] + T, self.block_size) - len(table)
        if need <= 0:
            return []
        new = self.allocator.allocate(need)  # raises before anything changes
        table.extend(new)
        return new

    def rows(self, block: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
        """Rows of the (N*Hkv*P, D) view that hold the given (block, offset) slots, for
        every head: row = (block * Hkv + head) * P + offset. block, offset (T,) -> (Hkv, T)."""
        Hkv, P = self.k.shape[2], self.block_size
        head = torch.arange(Hkv, device=block.device).unsqueeze(1)  # (Hkv, 1)
        return (block.unsqueeze(0) * Hkv + head) * P + offset.unsqueeze(0)  # (Hkv, T)

    def slot_rows(self, seq: int, start: int, end: int) -> torch.Tensor:
        """Rows (Hkv, end-start) of positions [start, end) of `seq`, through its block table."""
        pos = torch.arange(start, end, device=self.k.device)  # (T,)
        table = torch.tensor(self.tables[seq], dtype=torch.long, device=self.k.device)  # (blocks,)
        return self.rows(table[pos // self.block_size], pos % self.block_size)  # (Hkv, T)

    def append(self, seq: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Append T positions to every layer of `seq`; k, v are (L, Hkv, T, D)."""
        self._check_seq(seq)
        L, _, Hkv, _, D = self.k.shape
        for name, x in [("k", k), ("v", v)]:
            if not isinstance(x, torch.Tensor) or x.dim() != 4 or (x.shape[0], x.shape[1], x.shape[3]) != (L, Hkv, D):
                got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
                raise ValueError(f"{name} must have shape (L, Hkv, T, D) = ({L}, {Hkv}, T, {D}), got {got}")
            if x.dtype != self.k.dtype:
                raise ValueError(f"{name} must have dtype {self.k.dtype}, got {x.dtype}")
        if k.shape != v.shape:
            raise ValueError(f"k and v shapes differ: {tuple(k.shape)} vs {tuple(v.shape)}")
        T, start = k.shape[2], self.lengths[seq]
        self.reserve(seq, T)
        rows = self.slot_rows(seq, start, start + T).reshape(-1)  # (Hkv*T,)
        self.k_rows.index_copy_(1, rows, k.reshape(k.shape[0], -1, k.shape[3]))  # (L, Hkv*T, D)
        self.v_rows.index_copy_(1, rows, v.reshape(v.shape[0], -1, v.shape[3]))  # (L, Hkv*T, D)
        self.lengths[seq] = start + T

    def rollback(self, seq: int, length: int) -> None:
        """Keep positions [0, length); free every block that holds none of them."""
        self._check_seq(seq)
        _check_int("length", length, 0)
        if length > self.lengths[seq]:
            raise ValueError(f"length: cannot roll forward, {length} > current length {self.lengths[seq]}")
        table, keep = self.tables[seq], blocks_for(length, self.block_size)
        self.allocator.free(table[keep:])
        del table[keep:]
        self.lengths[seq] = length

    def release(self, seq: int) -> None:
        """Free all of a finished sequence's blocks and forget it."""
        self._check_seq(seq)
        self.allocator.free(self.tables.pop(seq))
        del self.lengths[seq]

    # -- reads --------------------------------------------------------------------

    def gather(self, seq: int, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of `seq` at `layer`, each (Hkv, length, D): one index op each."""
        self._check_seq(seq)
        _check_int("layer", layer, 0)
        if layer >= self.k.shape[0]:
            raise ValueError(f"layer must be < n_layers={self.k.shape[0]}, got {layer}")
        Hkv, D, T = self.k.shape[2], self.k.shape[4], self.lengths[seq]
        rows = self.slot_rows(seq, 0, T).reshape(-1)  # (Hkv*length,)
        k = self.k_rows[layer].index_select(0, rows).view(Hkv, T, D)  # (Hkv, length, D)
        v = self.v_rows[layer].index_select(0, rows).view(Hkv, T, D)  # (Hkv, length, D)
        return k, v

    def gather_reference(self, seq: int, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The same read as `gather`, one token at a time through the block table."""
        self._check_seq(seq)
        ks, vs = [], []
        for pos in range(self.lengths[seq]):
            block = self.tables[seq][pos // self.block_size]
            offset = pos % self.block_size
            ks.append(self.k[layer, block, :, offset])  # (Hkv, D)
            vs.append(self.v[layer, block, :, offset])  # (Hkv, D)
        if not ks:
            _, _, Hkv, _, D = self.k.shape
            empty = self.k.new_zeros(Hkv, 0, D)  # (Hkv, 0, D)
            return empty, empty.clone()
        return torch.stack(ks, dim=1), torch.stack(vs, dim=1)  # (Hkv, length, D)


class PagedSequenceCache:
    """One paged sequence behind the decoder's cache interface (that of KVCache, B = 1).

    `Transformer.forward` calls reserve(T), then attend (write_layer and the read) per
    layer, then advance(T). Blocks are allocated in reserve (or in write_layer, if reserve was
    skipped), so a reserve that fails changes nothing. The cache keeps a (block,
    offset) row index for every position its table covers, extended only when a
    block is added, so a decode step runs no Python loop over tokens. Unlike KVCache,
    write_layer returns a gathered copy, not a view: O(length) work per layer and
    step, which a paged-attention kernel would avoid by reading blocks in place.
    """

    def __init__(self, paged: PagedKVCache, capacity: int):
        _check_int("capacity", capacity, 1)
        self.paged = paged
        self.seq = paged.add_sequence()
        self.capacity = capacity
        P, Hkv = paged.block_size, paged.k.shape[2]
        self._rows = torch.zeros(Hkv, blocks_for(capacity, P) * P, dtype=torch.long,
                                 device=paged.k.device)  # (Hkv, S rounded up to blocks): row of each position
        self._indexed = 0  # blocks of the table whose positions _rows holds
        zero = torch.zeros(P, dtype=torch.long, device=paged.k.device)
        self._block0 = paged.rows(zero, torch.arange(P, device=paged.k.device))  # (Hkv, P): block 0's rows

    @classmethod
    def for_model(cls, cfg, capacity, batch_size=1, dtype=torch.float32, device="cpu", block_size=16):
        """A pool with just enough blocks for one sequence of `capacity` positions."""
        if batch_size != 1:
            raise ValueError(f"batch_size must be 1 for PagedSequenceCache, got {batch_size!r}")
        _check_int("capacity", capacity, 1)
        _check_int("block_size", block_size, 1)
        paged = PagedKVCache(cfg.n_layers, blocks_for(capacity, block_size), cfg.n_kv_heads,
                             block_size, cfg.head_dim, dtype, device)
        return cls(paged, capacity)

    @property
    def length(self) -> int:
        return self.paged.lengths[self.seq]

    @property
    def n_layers(self) -> int:
        return self.paged.k.shape[0]

    @property
    def position_rows(self) -> torch.Tensor:
        """(Hkv, S): the pool row (of k_rows / v_rows) that holds each position, on the device;
        valid for the positions of the blocks the table holds (tree compaction moves rows by it)."""
        return self._rows

    def _check_fits(self, T: int):
        if self.length + T > self.capacity:
            raise CacheOverflowError(
                f"cache overflow: length {self.length} + {T} new positions > capacity {self.capacity}")

    def _index_new_blocks(self):
        """Extend the per-position row index over the blocks the table gained. Block b's rows are
        block 0's plus b * Hkv * P: the host's block id enters as a scalar operand, so a new block
        costs no copy from the host (a decode step crosses into one every P / (K + 1) steps or so)."""
        table, P = self.paged.tables[self.seq], self.paged.block_size
        stride = self.paged.k.shape[2] * P  # Hkv * P rows per block
        for j in range(self._indexed, len(table)):
            self._rows[:, j * P:(j + 1) * P] = self._block0 + table[j] * stride  # (Hkv, P)
        self._indexed = len(table)

    def reserve(self, T: int):
        """Raise before any write if T more positions do not fit; else hold their blocks."""
        self._check_fits(T)
        self.paged.reserve(self.seq, T)
        self._index_new_blocks()

    def write_layer(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        """Write one layer's new keys/values (1, Hkv, T, D) at [length, length+T);
        return that layer's keys and values for [0, length+T), each (1, Hkv, length+T, D)."""
        start, end = self.length, self.length + k.shape[2]
        if end > self._indexed * self.paged.block_size:
            self.reserve(k.shape[2])
        Hkv, D = k.shape[1], k.shape[3]
        kr, vr = self.paged.k_rows[layer], self.paged.v_rows[layer]  # (N*Hkv*P, D)
        new = self._rows[:, start:end].reshape(-1)  # (Hkv*T,)
        kr.index_copy_(0, new, k.reshape(-1, D))  # (Hkv*T, D)
        vr.index_copy_(0, new, v.reshape(-1, D))  # (Hkv*T, D)
        rows = self._rows[:, :end].reshape(-1)  # (Hkv*(length+T),)
        k_all = kr.index_select(0, rows).view(1, Hkv, end, D)  # (1, Hkv, length+T, D)
        v_all = vr.index_select(0, rows).view(1, Hkv, end, D)  # (1, Hkv, length+T, D)
        return k_all, v_all

    def attend(self, layer, q, k, v, mask, input_pos=None):
        """The model's attention read, as KVCache's: write the new positions, attend over them all."""
        k, v = self.write_layer(layer, k, v)
        return grouped_attention(q, k, v, mask)

    def advance(self, T: int):
        """Commit the T positions that the last forward wrote."""
        _check_int("T", T, 0)
        if self.length + T > self._indexed * self.paged.block_size:
            raise ValueError(f"T: cannot advance {T} positions past the {self._indexed} reserved blocks")
        self.paged.lengths[self.seq] += T

    def append(self, k: torch.Tensor, v: torch.Tensor):
        """Append T positions to every layer; k, v are (L, 1, Hkv, T, D), as for KVCache."""
        if k.dim() != 5 or k.shape[1] != 1 or v.dim() != 5 or v.shape[1] != 1:
            raise ValueError(f"k and v must have shape (L, 1, Hkv, T, D), got {tuple(k.shape)}, {tuple(v.shape)}")
        self._check_fits(k.shape[3])
        self.paged.append(self.seq, k[:, 0], v[:, 0])  # (L, Hkv, T, D); all-or-nothing
        self._index_new_blocks()

    def rollback(self, length: int):
        """Forget every position at or beyond `length` and free the blocks beyond it."""
        self.paged.rollback(self.seq, length)
        self._indexed = len(self.paged.tables[self.seq])

    def reset(self):
        self.rollback(0)

    def keys(self, layer: int) -> torch.Tensor:
        return self.paged.gather(self.seq, layer)[0].unsqueeze(0)  # (1, Hkv, length, D)

    def values(self, layer: int) -> torch.Tensor:
        return self.paged.gather(self.seq, layer)[1].unsqueeze(0)  # (1, Hkv, length, D)
