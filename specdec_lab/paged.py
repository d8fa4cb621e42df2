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
`model.Transformer.forward` uses (the one `kv_cache.KVCache` has, with B = 1), so
the decoder runs on paged memory unchanged. `simulate_fragmentation` is the
experiment that shows why paging exists: reserved vs used memory and the number
of concurrent requests that fit, for both designs, on one simulated workload.

Shape letters: B batch, T new tokens, S capacity, L layers, Hkv kv heads,
D head dim, N blocks in the pool, P tokens per block.
"""
import math
import random
from dataclasses import dataclass, field

import torch

from .kv_cache import CacheOverflowError


class PoolExhaustedError(ValueError):
    """The block pool has fewer free blocks than a request needs; nothing was allocated."""


def blocks_for(length: int, block_size: int) -> int:
    """Blocks needed to hold `length` token positions: ceil(length / P)."""
    return -(-length // block_size)


def _check_int(name, value, low):
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")


class BlockAllocator:
    """A free list of block ids 0..num_blocks-1. Allocation is all-or-nothing and
    hands out the most recently freed blocks first (they are warm in cache)."""

    def __init__(self, num_blocks: int):
        _check_int("num_blocks", num_blocks, 1)
        self.num_blocks = num_blocks
        self._free = list(range(num_blocks - 1, -1, -1))  # a stack: pop() yields 0, 1, 2, ...
        self._is_free = [True] * num_blocks

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    def allocate(self, n: int) -> list[int]:
        """Take n blocks, or raise PoolExhaustedError and take none."""
        _check_int("n", n, 0)
        if n > len(self._free):
            raise PoolExhaustedError(
                f"block pool exhausted: asked for {n} blocks, {len(self._free)} of {self.num_blocks} free")
        blocks = [self._free.pop() for _ in range(n)]
        for b in blocks:
            self._is_free[b] = False
        return blocks

    def free(self, blocks) -> None:
        """Return blocks to the pool. Checks all of them first: an unknown id, a block
        that is already free or one listed twice raises ValueError and frees nothing."""
        blocks = list(blocks)
        for b in blocks:
            if not isinstance(b, int) or not 0 <= b < self.num_blocks:
                raise ValueError(f"blocks: id {b!r} is not in [0, {self.num_blocks})")
            if self._is_free[b]:
                raise ValueError(f"blocks: double free of block {b}, which is already free")
        if len(set(blocks)) != len(blocks):
            raise ValueError(f"blocks: double free, a block is listed twice in {blocks}")
        for b in blocks:
            self._is_free[b] = True
        self._free.extend(reversed(blocks))


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

    `Transformer.forward` calls reserve(T), then write_layer per layer, then
    advance(T). Blocks are allocated in reserve (or in write_layer, if reserve was
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

    def _check_fits(self, T: int):
        if self.length + T > self.capacity:
            raise CacheOverflowError(
                f"cache overflow: length {self.length} + {T} new positions > capacity {self.capacity}")

    def _index_new_blocks(self):
        """Extend the per-position row index over the blocks the table gained."""
        table, P = self.paged.tables[self.seq], self.paged.block_size
        if len(table) > self._indexed:
            ids = torch.tensor(table[self._indexed:], dtype=torch.long, device=self._rows.device)  # (new,)
            offset = torch.arange(P, device=ids.device).repeat(len(ids))  # (new * P,)
            self._rows[:, self._indexed * P:len(table) * P] = self.paged.rows(ids.repeat_interleave(P), offset)
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


# -- the fragmentation experiment ----------------------------------------------------

@dataclass
class Request:
    arrival: int  # step at which the request arrives
    prompt_len: int  # positions written by its prefill
    max_new_tokens: int  # the cap it declares: a contiguous cache reserves for it up front
    increments: list[int]  # positions each speculative step commits (a + 1), until its output ends


@dataclass
class DesignTrace:
    """One design's run of the workload. Series hold one value per engine step,
    taken at the step's peak: after the K+1 lookahead is written, before rollback."""
    design: str  # "contiguous" or "paged"
    reserved: list[int] = field(default_factory=list)  # KV slots held by running requests
    used: list[int] = field(default_factory=list)  # KV slots holding keys that this step's attention reads
    running: list[int] = field(default_factory=list)  # requests in the batch
    waiting: list[int] = field(default_factory=list)  # requests that arrived and wait for memory
    preemptions: int = 0  # paged only: requests evicted (and later recomputed) when a block was missing
    utilisation: float = 0.0  # sum(used) / sum(reserved) over the run
    mean_concurrent: float = 0.0  # mean of `running` over the steps where requests were waiting
    max_concurrent: int = 0
    steps: int = 0  # engine steps until the last request finished


@dataclass
class FragmentationResult:
    params: dict  # the arguments of simulate_fragmentation
    contiguous: DesignTrace
    paged: DesignTrace

    def summary(self) -> dict:
        keys = ("utilisation", "mean_concurrent", "max_concurrent", "steps", "preemptions")
        return {d.design: {k: getattr(d, k) for k in keys} for d in (self.contiguous, self.paged)}


def make_workload(num_requests, max_len, k, acceptance, arrival_rate, seed) -> list[Request]:
    """Requests with log-normal prompts (median 256), a declared cap of 128..1024 new
    tokens, and an actual output that ends before the cap (end of sequence). Each step
    accepts a ~ truncated Geometric(acceptance) draft tokens and commits a + 1."""
    rng = random.Random(seed)
    t, requests = 0.0, []
    for _ in range(num_requests):
        t += rng.expovariate(arrival_rate)
        prompt = min(max(int(rng.lognormvariate(math.log(256), 0.8)), 8), max_len // 2)
        cap = min(rng.choice([128, 256, 512, 1024]), max_len - prompt - (k + 1))
        out = max(1, round(cap * rng.betavariate(1.5, 2.0)))
        increments, done = [], 0
        while done < out:
            a = 0
            while a < k and rng.random() < acceptance:
                a += 1
            increments.append(min(a + 1, out - done))
            done += increments[-1]
        requests.append(Request(int(t), prompt, cap, increments))
    return requests


@dataclass(eq=False)
class _Active:
    i: int  # request index
    length: int  # committed positions
    step: int  # speculative steps done
    held: object  # contiguous: reserved slots (int); paged: block ids (list)
    fresh: bool = True  # prefilled this step, decodes from the next


class _ContiguousMemory:
    """Each admitted request reserves prompt + max_new_tokens + K + 1 slots at once."""

    def __init__(self, memory_tokens, block_size, k):
        self.total, self.free, self.k = memory_tokens, memory_tokens, k

    def admit(self, i, req, length):
        need = req.prompt_len + req.max_new_tokens + self.k + 1
        if need > self.free:
            return None
        self.free -= need
        return _Active(i, length, 0, need)

    def grow(self, r, length):  # the reservation already covers every length
        return True

    def shrink(self, r):
        pass

    def release(self, r):
        self.free += r.held

    @property
    def reserved(self):
        return self.total - self.free


class _PagedMemory:
    """Requests hold ceil(length / P) blocks, one more when a write crosses a boundary."""

    def __init__(self, memory_tokens, block_size, k):
        self.alloc, self.P, self.k = BlockAllocator(max(memory_tokens // block_size, 1)), block_size, k

    def admit(self, i, req, length):
        if blocks_for(length + self.k + 1, self.P) > self.alloc.num_free:
            return None  # the prompt and its first lookahead must fit
        return _Active(i, length, 0, self.alloc.allocate(blocks_for(length, self.P)))

    def grow(self, r, length):
        need = blocks_for(length, self.P) - len(r.held)
        if need > self.alloc.num_free:
            return False
        r.held += self.alloc.allocate(max(need, 0))
        return True

    def shrink(self, r):  # rollback: free whole blocks beyond the committed length
        keep = blocks_for(r.length, self.P)
        self.alloc.free(r.held[keep:])
        del r.held[keep:]

    def release(self, r):
        self.alloc.free(r.held)

    @property
    def reserved(self):
        return self.alloc.num_used * self.P


def _run_design(design, requests, memory_tokens, block_size, k) -> DesignTrace:
    """Serve `requests` first come, first served. Paged memory can run out mid-request:
    then the latest admitted request is evicted and later recomputed (vLLM's policy)."""
    mem = (_PagedMemory if design == "paged" else _ContiguousMemory)(memory_tokens, block_size, k)
    trace = DesignTrace(design)
    pending = sorted(range(len(requests)), key=lambda i: requests[i].arrival)[::-1]  # pop() = next
    waiting, running, progress, t = [], [], {}, 0
    while pending or waiting or running:
        while pending and requests[pending[-1]].arrival <= t:
            waiting.append(pending.pop())
        evicted = False
        for r in list(running):  # decode: write the K+1 lookahead at [length, length + K + 1)
            while r in running and not mem.grow(r, r.length + k + 1):
                victim = running.pop()
                mem.release(victim)
                progress[victim.i] = victim.step
                waiting.insert(0, victim.i)
                trace.preemptions, evicted = trace.preemptions + 1, True
        while waiting and not evicted:  # admit and prefill (evicted requests come back first)
            req = requests[waiting[0]]
            step = progress.get(waiting[0], 0)
            r = mem.admit(waiting[0], req, req.prompt_len + sum(req.increments[:step]))
            if r is None:
                if not running:
                    raise ValueError(f"memory_tokens={memory_tokens} cannot hold request {waiting[0]} "
                                     f"(prompt {req.prompt_len}, max_new_tokens {req.max_new_tokens})")
                break
            r.step = step
            waiting.pop(0)
            running.append(r)
        trace.reserved.append(mem.reserved)
        trace.used.append(sum(r.length + (0 if r.fresh else k + 1) for r in running))
        trace.running.append(len(running))
        trace.waiting.append(len(waiting))
        for r in list(running):  # commit a + 1 positions, roll back the rest
            if r.fresh:
                r.fresh = False
                continue
            r.length += requests[r.i].increments[r.step]
            r.step += 1
            if r.step == len(requests[r.i].increments):
                running.remove(r)
                mem.release(r)
            else:
                mem.shrink(r)
        t += 1
    return _summarise(trace)


def _summarise(trace: DesignTrace) -> DesignTrace:
    busy = [n for n, w in zip(trace.running, trace.waiting) if w > 0] or trace.running
    trace.utilisation = sum(trace.used) / max(sum(trace.reserved), 1)
    trace.mean_concurrent = sum(busy) / len(busy)
    trace.max_concurrent = max(trace.running)
    trace.steps = len(trace.running)
    return trace


def simulate_fragmentation(num_requests=200, max_len=2048, block_size=16, memory_tokens=32768,
                           seed=0, k=4, acceptance=0.7, arrival_rate=4.0) -> FragmentationResult:
    """Serve one simulated workload twice in `memory_tokens` KV slots: with a contiguous
    cache (each request reserves its maximum length when admitted) and with a paged one
    (blocks of `block_size` taken as it grows, whole blocks freed on rollback). Every
    step writes K+1 lookahead positions and keeps a + 1 of them, a ~ Geometric(acceptance)
    truncated at K. `arrival_rate` is requests per step; the default floods the server,
    so memory, not arrivals, bounds how many requests run at once. Seeded and deterministic."""
    for name, v, low in [("num_requests", num_requests, 1), ("max_len", max_len, 64),
                         ("block_size", block_size, 1), ("memory_tokens", memory_tokens, 1), ("k", k, 1)]:
        _check_int(name, v, low)
    if k > max_len // 4:
        raise ValueError(f"k must be <= max_len // 4 = {max_len // 4}, got {k}")
    if not 0.0 <= acceptance <= 1.0:
        raise ValueError(f"acceptance must be in [0, 1], got {acceptance!r}")
    if not arrival_rate > 0:
        raise ValueError(f"arrival_rate must be > 0 requests per step, got {arrival_rate!r}")
    params = dict(num_requests=num_requests, max_len=max_len, block_size=block_size,
                  memory_tokens=memory_tokens, seed=seed, k=k, acceptance=acceptance, arrival_rate=arrival_rate)
    requests = make_workload(num_requests, max_len, k, acceptance, arrival_rate, seed)
    return FragmentationResult(params, *(_run_design(d, requests, memory_tokens, block_size, k)
                                         for d in ("contiguous", "paged")))
