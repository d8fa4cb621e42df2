"""The block allocator of the paged cache: a free list of block ids, all-or-nothing, and a reference
count per block, so that sequences can share the blocks of a prompt they have in common."""


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
    hands out the most recently freed blocks first (they are warm in cache). A block in use
    has a reference count: `share` adds a holder, `free` takes one away, and the block goes
    back to the pool when its last holder frees it."""

    def __init__(self, num_blocks: int):
        _check_int("num_blocks", num_blocks, 1)
        self.num_blocks = num_blocks
        self._free = list(range(num_blocks - 1, -1, -1))  # a stack: pop() yields 0, 1, 2, ...
        self._refs = [0] * num_blocks  # holders of each block; 0: free

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
            self._refs[b] = 1
        return blocks

    def refs(self, block: int) -> int:
        """How many holders `block` has (0: free)."""
        return self._refs[block]

    def share(self, blocks) -> None:
        """One more holder for each of `blocks`, all in use (checked first; nothing changes on an error)."""
        blocks = self._checked(list(blocks), "share")
        for b in blocks:
            self._refs[b] += 1

    def free(self, blocks) -> None:
        """One holder fewer for each of `blocks`; a block whose last holder frees it returns to the
        pool. Checks all of them first: an unknown id, a block that is already free or one listed
        twice raises ValueError and frees nothing."""
        blocks = self._checked(list(blocks), "free")
        for b in blocks:
            self._refs[b] -= 1
        self._free.extend(b for b in reversed(blocks) if self._refs[b] == 0)

    def _checked(self, blocks, what):
        for b in blocks:
            if not isinstance(b, int) or isinstance(b, bool) or not 0 <= b < self.num_blocks:
                raise ValueError(f"blocks: id {b!r} is not in [0, {self.num_blocks})")
            if self._refs[b] == 0:
                raise ValueError(f"blocks: {'double free' if what == 'free' else 'cannot share'} of block {b}, "
                                 f"which is already free")
        if len(set(blocks)) != len(blocks):
            raise ValueError(f"blocks: {'double free' if what == 'free' else 'cannot share'}, a block is listed "
                             f"twice in {blocks}")
        return blocks
