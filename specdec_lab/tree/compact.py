"""Compaction: after a tree step, the accepted path's keys and values move to consecutive slots.

A tree's nodes were written to the cache in node order, so the accepted path (the root,
then one node per depth) is scattered among its rejected siblings. EAGLE's
`update_inference_inputs` copies the path's keys and values to the slots right after the
committed prefix and drops the rest; the cache's length then says where the sequence ends,
as after a chain step's rollback. The source slots are a device tensor: nothing is read
back to the host, and the number of positions (a host int) comes from the step's one read.

A paged cache (paged/cache.py) keeps the same positions in blocks; `compact` moves the rows that
hold them, through the cache's own device index of each position's row (`position_rows`, which
it extends as blocks are added), and the rollback frees the blocks past the new length.

`compact` gathers every layer's rows at once (index_select makes a copy, so a source slot
overwritten by an earlier destination is read before it is written); `compact_reference`
moves one position at a time, in increasing order, which is safe for the same reason a
path is increasing: the i-th node of the path sits at or after slot start + i.
"""
import torch


def compact(cache, src, start: int):
    """Move positions src (n,) (device int64, increasing) of a contiguous cache (k, v: (L, B, Hkv, S, D))
    or a paged sequence to [start, start + n), and make start + n the cache's length."""
    n = src.shape[0]
    if n and hasattr(cache, "paged"):  # a PagedSequenceCache: rows of (L, N*Hkv*P, D) through its index
        rows = cache.position_rows  # (Hkv, S): the row of each position, on the device
        src_rows, dst_rows = rows.index_select(1, src).reshape(-1), rows[:, start:start + n].reshape(-1)
        for buf in (cache.paged.k_rows, cache.paged.v_rows):
            buf.index_copy_(1, dst_rows, buf.index_select(1, src_rows))  # (L, Hkv*n, D)
    elif n:
        for buf in (cache.k, cache.v):
            buf[:, :, :, start:start + n] = buf.index_select(3, src)  # (L, B, Hkv, n, D)
    cache.rollback(start + n)


def compact_reference(cache, src: list, start: int):
    """The same, one position at a time from a Python list."""
    for i, s in enumerate(src):
        cache.k[:, :, :, start + i] = cache.k[:, :, :, s]
        cache.v[:, :, :, start + i] = cache.v[:, :, :, s]
    cache.rollback(start + len(src))
