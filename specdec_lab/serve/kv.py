"""Keys and values for a batch of ragged sequences: paged (the engine's) and padded (its twin).

Both hold many sequences, each with its own length, and hand the decoder a *view* of the
rows one forward runs over: `kv.view(seqs, real)` binds sequences `seqs` with `real[b]` new
tokens each. The forward's tokens are (B, T) with T = max(real): row b's real tokens come
first and the rest is padding. The view is a cache to the decoder (reserve(T), attend(...)
once per layer, advance(T)), and it makes the forward's positions and mask:

  input_pos (B, T)   row b's token t sits at L_b + min(t, real_b - 1)
  mask (B, 1, T, S)  additive; query t of row b sees keys j <= L_b + min(t, real_b - 1),
                     S = max(L_b + real_b). Real queries see their row's cache and the new
                     tokens before them; padded queries repeat the last real one's view.

Padding never reaches a real query: a padded slot sits after its row's real tokens, and the
mask hides everything after a query. `advance(T)` commits real_b positions per row.

`PagedBatchKV` keeps every sequence in fixed-size blocks of one pool (vLLM's design, arXiv
2309.06180): one block table per sequence, blocks from paged.BlockAllocator, a sequence holds
ceil(length / P) blocks after every forward and rollback, and padded slots are written into a
scratch block that no sequence owns. Attention gathers each row's keys through its table in
one index op per layer. Sequences with the same context (the n answers to one request) share its
blocks: `fork` gives a new sequence another's table, each block with one more holder, and a
sequence about to write into a block another one holds copies it first (copy on write).
`PaddedBatchKV` is the readable twin: one contiguous row of a (L, R, Hkv, S, D) tensor per sequence, written and read with a loop over rows. The tests
hold the two equal.

Shape letters: B rows in the forward, T new tokens per row, S keys per row (padded),
L layers, R sequence slots, N blocks, P tokens per block, Hkv key/value heads, D head dim.
"""
import torch

from ..core.kv_cache import CacheOverflowError
from ..core.attention import grouped_attention
from ..cpu.fused import Layout
from ..paged import BlockAllocator, PoolExhaustedError, blocks_for


class _BatchKV:
    """What both layouts share: per-sequence lengths, and views for a forward."""

    def __init__(self, cfg, max_seq_len, dtype, device):
        self.n_layers, self.n_kv_heads, self.head_dim = cfg.n_layers, cfg.n_kv_heads, cfg.head_dim
        self.max_seq_len, self.dtype, self.device = max_seq_len, dtype, torch.device(device)
        self.lengths: dict[int, int] = {}  # seq id -> committed positions

    def _check_seq(self, seq):
        if seq not in self.lengths:
            raise ValueError(f"seq: no live sequence with id {seq!r} (live: {sorted(self.lengths)})")

    def length(self, seq: int) -> int:
        self._check_seq(seq)
        return self.lengths[seq]

    def view(self, seqs, real) -> "BatchView":
        """The rows `seqs` with real[b] >= 1 new tokens each, for one forward."""
        if len(seqs) == 0 or len(seqs) != len(real) or len(set(seqs)) != len(seqs):
            raise ValueError(f"seqs must be distinct live sequences, one per entry of real; got {seqs}, {real}")
        for s, r in zip(seqs, real):
            self._check_seq(s)
            if isinstance(r, bool) or not isinstance(r, int) or r < 1:
                raise ValueError(f"real: every row needs an int >= 1 of new tokens, got {r!r} for seq {s}")
        return BatchView(self, list(seqs), list(real))

    def rollback(self, seq: int, length: int):
        """Forget every position of `seq` at or beyond `length`."""
        self._check_seq(seq)
        if isinstance(length, bool) or not isinstance(length, int) or not 0 <= length <= self.lengths[seq]:
            raise ValueError(f"length must be an int in [0, {self.lengths[seq]}] for seq {seq}, got {length!r}")
        self.lengths[seq] = length

    def fork(self, src: int, dst: int):
        """A new sequence `dst` holding what `src` holds (its length and its keys and values)."""
        self._check_seq(src)
        self.add(dst)
        self.lengths[dst] = self.lengths[src]
        self._copy(src, dst)

    def row(self, seq: int) -> "RowCache":
        """Sequence `seq` as a one-sequence cache (length, rollback), for core's rollback helpers."""
        self._check_seq(seq)
        return RowCache(self, seq)


class RowCache:
    """One sequence of a _BatchKV seen as a single cache: core.kv_cache.drop_rejected and
    drafters.model.commit_draft roll it back as they roll back the single engine's caches."""

    def __init__(self, kv, seq):
        self.kv, self.seq = kv, seq

    @property
    def length(self) -> int:
        return self.kv.lengths[self.seq]

    def rollback(self, length: int):
        self.kv.rollback(self.seq, length)


class BatchView:
    """One forward's rows over a _BatchKV: the cache the decoder sees (reserve, attend, advance)."""

    def __init__(self, kv, seqs, real):
        self.kv, self.seqs, self.real = kv, seqs, real
        self.starts = [kv.lengths[s] for s in seqs]  # L_b before the forward
        self.T = max(real)
        self.S = max(L + r for L, r in zip(self.starts, real))
        self._index = None  # the layout's per-forward read/write index, made in reserve

    @property
    def length(self) -> int:
        """The shortest row's length. The decoder needs no shared length: this view always comes
        with explicit positions and mask (input_pos, mask)."""
        return min(self.starts)

    def input_pos(self) -> torch.Tensor:
        """(B, T) positions: row b's token t at L_b + min(t, real_b - 1). Scalar operands only, so
        no host data is copied to the device."""
        t = torch.arange(self.T, device=self.kv.device)  # (T,)
        return torch.stack([t.clamp(max=r - 1) + L for L, r in zip(self.starts, self.real)])  # (B, T)

    def mask(self, dtype=torch.float32) -> torch.Tensor:
        """(B, 1, T, S) additive: 0 where query t of row b may see key j, -inf elsewhere."""
        col = torch.arange(self.S, device=self.kv.device)  # (S,)
        allowed = torch.stack([col <= p.unsqueeze(1) for p in self.input_pos()])  # (B, T, S)
        zero = torch.zeros((), dtype=dtype, device=self.kv.device)
        return torch.where(allowed, zero, float("-inf")).unsqueeze(1)  # (B, 1, T, S)

    def reserve(self, T: int):
        """Raise before any write if a row's new tokens do not fit; else hold their memory."""
        if T != self.T:
            raise ValueError(f"T: this view was made for {self.T} tokens per row, got {T}")
        self._index = self.kv._reserve(self)

    def attend(self, layer, q, k, v, mask, input_pos=None):
        """Write the rows' new keys/values k, v (B, Hkv, T, D); attention of q (B, H, T, D) over
        each row's keys (the mask hides other rows' padding): y (B, H, T, D)."""
        if self._index is None:
            self.reserve(k.shape[2])
        keys, values = self.kv._write_read(self, layer, k, v)  # (B, Hkv, S, D)
        return grouped_attention(q, keys, values, mask)

    def fused_layout(self, T: int):
        """The view's real rows for the CPU's one-call forward (cpu/fused.py, `Layout`), padding left out:
        (layout, where those rows sit in the (B, T) grid, how to commit them). Reserves every
        sequence's memory first, all or none, as `reserve` does."""
        if T != self.T:
            raise ValueError(f"T: this view was made for {self.T} tokens per row, got {T}")
        self.kv._allocate(self)
        parts, off = [], 0
        for b, (s, L, r) in enumerate(zip(self.seqs, self.starts, self.real)):
            rows = self.kv._key_rows(s, L + r)  # (L + r,): where each position's key lives
            new = torch.arange(L, L + r)
            parts.append((new, rows[L:], torch.full((r,), off), new + 1, rows, torch.arange(b * T, b * T + r)))
            off += L + r
        pos, write, start, count, keys, flat = (torch.cat(c) for c in zip(*parts))
        layout = Layout(self.kv.k, self.kv.v, self.kv._head_stride(), pos, write, start, count, keys,
                        max(L + r for L, r in zip(self.starts, self.real)))
        return layout, (None if min(self.real) == T else flat), lambda: self.advance(T)

    def advance(self, T: int):
        """Commit each row's real tokens (padding is never committed)."""
        for s, L, r in zip(self.seqs, self.starts, self.real):
            self.kv.lengths[s] = L + r


class PagedBatchKV(_BatchKV):
    """Sequences in blocks of `block_size` positions from one pool of `num_blocks` (plus one
    scratch block for padding). The allocator only counts and hands out block ids."""

    def __init__(self, cfg, num_blocks, block_size=16, max_seq_len=2048, dtype=torch.float32, device="cpu"):
        super().__init__(cfg, max_seq_len, dtype, device)
        for name, v in (("num_blocks", num_blocks), ("block_size", block_size), ("max_seq_len", max_seq_len)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an int >= 1, got {v!r}")
        L, Hkv, D, P = cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, block_size
        shape = (L, num_blocks + 1, Hkv, P, D)  # (L, N + 1, Hkv, P, D); block N is the scratch block
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.k_rows = self.k.view(L, -1, D)  # (L, (N+1)*Hkv*P, D): one row per (block, head, offset)
        self.v_rows = self.v.view(L, -1, D)
        self.block_size, self.num_blocks = P, num_blocks
        self.allocator = BlockAllocator(num_blocks)
        self.tables: dict[int, list[int]] = {}  # seq id -> block ids in position order
        self._rows: dict[int, torch.Tensor] = {}  # seq id -> (Hkv, positions) pool row of each position
        head = torch.arange(Hkv, device=device).unsqueeze(1)  # (Hkv, 1)
        self._block0 = head * P + torch.arange(P, device=device)  # (Hkv, P): rows of block 0
        self._scratch = (num_blocks * Hkv + head) * P  # (Hkv, 1): offset 0 of the scratch block, per head

    @property
    def free_blocks(self) -> int:
        return self.allocator.num_free

    @property
    def used_blocks(self) -> int:
        return self.allocator.num_used

    def blocks_to_grow(self, seq: int, new_tokens: int) -> int:
        """Blocks `seq` must gain to hold `new_tokens` more positions (its copies of shared blocks included)."""
        return self._growth(seq, new_tokens) + len(self._shared_from(seq, self.lengths[seq]))

    def _growth(self, seq, new_tokens):
        return max(0, blocks_for(self.lengths[seq] + new_tokens, self.block_size) - len(self.tables[seq]))

    def add(self, seq: int):
        if seq in self.lengths:
            raise ValueError(f"seq: {seq} is already live")
        self.lengths[seq], self.tables[seq] = 0, []
        positions = blocks_for(self.max_seq_len, self.block_size) * self.block_size
        self._rows[seq] = torch.zeros(self.n_kv_heads, positions, dtype=torch.long, device=self.device)

    def free(self, seq: int):
        """Forget `seq` and return all its blocks to the pool."""
        self._check_seq(seq)
        self.allocator.free(self.tables.pop(seq))
        del self.lengths[seq], self._rows[seq]

    def rollback(self, seq: int, length: int):
        super().rollback(seq, length)
        self._trim(seq)

    def _trim(self, seq):
        table, keep = self.tables[seq], blocks_for(self.lengths[seq], self.block_size)
        self.allocator.free(table[keep:])
        del table[keep:]

    def _copy(self, src, dst):
        """dst shares src's blocks: the same table, one more holder for each block."""
        self.allocator.share(self.tables[src])
        self.tables[dst] = list(self.tables[src])
        self._rows[dst].copy_(self._rows[src])

    def _shared_from(self, seq, start):
        """Indices in seq's table of the blocks it would write from position `start` on that
        another sequence also holds."""
        table = self.tables[seq]
        return [j for j in range(start // self.block_size, len(table)) if self.allocator.refs(table[j]) > 1]

    def _reserve(self, view):
        """Allocate every row's blocks for its real tokens (all rows or none), then the forward's
        write index (B*Hkv*T,) and read index (B*Hkv*S,) into the pool's rows."""
        self._allocate(view)
        write, read = [], []
        for s, L, r in zip(view.seqs, view.starts, view.real):
            rows = self._rows[s]
            write.append(torch.cat([rows[:, L:L + r], self._scratch.expand(-1, view.T - r)], 1))  # (Hkv, T)
            read.append(torch.cat([rows[:, :L + r], self._scratch.expand(-1, view.S - L - r)], 1))  # (Hkv, S)
        return torch.stack(write).reshape(-1), torch.stack(read).reshape(-1)

    def _key_rows(self, seq, n):
        """(n,) the pool row of head 0 for positions 0..n - 1 of `seq` (head g's is g * P further)."""
        return self._rows[seq][0, :n]

    def _head_stride(self):
        return self.block_size

    def _allocate(self, view):
        """Every row's blocks for its real tokens, all rows or none."""
        P = self.block_size
        for s, L, r in zip(view.seqs, view.starts, view.real):
            if L + r > self.max_seq_len:
                raise CacheOverflowError(f"cache overflow: seq {s} length {L} + {r} new positions > "
                                         f"max_seq_len {self.max_seq_len}")
        need = [self._growth(s, r) for s, r in zip(view.seqs, view.real)]
        shared = [self._shared_from(s, L) for s, L in zip(view.seqs, view.starts)]
        if sum(need) + sum(map(len, shared)) > self.allocator.num_free:
            raise PoolExhaustedError(f"block pool exhausted: the forward needs {sum(need) + sum(map(len, shared))} "
                                     f"new blocks, {self.allocator.num_free} of {self.num_blocks} free")
        stride = self.n_kv_heads * P  # pool rows per block
        for s, js in zip(view.seqs, shared):  # copy on write: a block another sequence holds is copied first
            table = self.tables[s]
            for j, b in zip(js, self.allocator.allocate(len(js))):
                self.k[:, b], self.v[:, b] = self.k[:, table[j]], self.v[:, table[j]]
                self.allocator.free([table[j]])
                self._rows[s][:, j * P:(j + 1) * P] = self._block0 + b * stride
                table[j] = b
        for s, n in zip(view.seqs, need):
            table = self.tables[s]
            for b in self.allocator.allocate(n):
                j = len(table)
                self._rows[s][:, j * P:(j + 1) * P] = self._block0 + b * stride  # block id as a scalar operand
                table.append(b)

    def _write_read(self, view, layer, k, v):
        write, read = view._index
        B, Hkv, T, D = k.shape
        kr, vr = self.k_rows[layer], self.v_rows[layer]  # ((N+1)*Hkv*P, D)
        kr.index_copy_(0, write, k.reshape(-1, D))  # (B*Hkv*T, D); padded slots land in the scratch block
        vr.index_copy_(0, write, v.reshape(-1, D))
        keys = kr.index_select(0, read).view(B, Hkv, view.S, D)  # (B, Hkv, S, D)
        values = vr.index_select(0, read).view(B, Hkv, view.S, D)
        return keys, values

    def row_keys(self, seq: int, layer: int) -> torch.Tensor:
        """(Hkv, length, D) keys of `seq` at `layer`, read block by block (for tests)."""
        table, n = self.tables[seq], self.lengths[seq]
        if n == 0:
            return self.k.new_zeros(self.n_kv_heads, 0, self.head_dim)
        return torch.cat([self.k[layer, b] for b in table], 1)[:, :n]  # (Hkv, blocks*P, D) -> (Hkv, length, D)


class PaddedBatchKV(_BatchKV):
    """The readable twin: sequence slot r is row r of contiguous (L, R, Hkv, S, D) tensors."""

    def __init__(self, cfg, max_rows, max_seq_len=2048, dtype=torch.float32, device="cpu"):
        super().__init__(cfg, max_seq_len, dtype, device)
        for name, v in (("max_rows", max_rows), ("max_seq_len", max_seq_len)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an int >= 1, got {v!r}")
        shape = (cfg.n_layers, max_rows, cfg.n_kv_heads, max_seq_len, cfg.head_dim)  # (L, R, Hkv, S, D)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.slots: dict[int, int] = {}  # seq id -> its row
        self._free = list(range(max_rows - 1, -1, -1))

    def add(self, seq: int):
        if seq in self.lengths:
            raise ValueError(f"seq: {seq} is already live")
        if not self._free:
            raise PoolExhaustedError(f"all {self.k.shape[1]} rows of the padded cache are in use")
        self.lengths[seq], self.slots[seq] = 0, self._free.pop()

    def free(self, seq: int):
        self._check_seq(seq)
        self._free.append(self.slots.pop(seq))
        del self.lengths[seq]

    def _copy(self, src, dst):
        """dst's row becomes a copy of src's (this twin shares nothing)."""
        n, a, b = self.lengths[src], self.slots[src], self.slots[dst]
        self.k[:, b, :, :n], self.v[:, b, :, :n] = self.k[:, a, :, :n], self.v[:, a, :, :n]

    def _reserve(self, view):
        self._allocate(view)
        return True

    def _allocate(self, view):
        for s, L, r in zip(view.seqs, view.starts, view.real):
            if L + r > self.max_seq_len:
                raise CacheOverflowError(f"cache overflow: seq {s} length {L} + {r} new positions > "
                                         f"max_seq_len {self.max_seq_len}")

    def _key_rows(self, seq, n):
        """(n,) the row of head 0 for positions 0..n - 1 of `seq` in (L, R, Hkv, S, D)'s rows of D."""
        return torch.arange(n) + self.slots[seq] * self.n_kv_heads * self.max_seq_len

    def _head_stride(self):
        return self.max_seq_len

    def _write_read(self, view, layer, k, v):
        for b, (s, L, r) in enumerate(zip(view.seqs, view.starts, view.real)):
            row = self.slots[s]
            self.k[layer, row, :, L:L + r] = k[b, :, :r]  # real tokens only; padding is never stored
            self.v[layer, row, :, L:L + r] = v[b, :, :r]
        keys = torch.stack([self.k[layer, self.slots[s], :, :view.S] for s in view.seqs])  # (B, Hkv, S, D)
        values = torch.stack([self.v[layer, self.slots[s], :, :view.S] for s in view.seqs])
        return keys, values

    def row_keys(self, seq: int, layer: int) -> torch.Tensor:
        return self.k[layer, self.slots[seq], :, :self.lengths[seq]]  # (Hkv, length, D)
