"""Exercise "blocks_to_take" (chapter 13): how many blocks a paged sequence takes from the pool to write.

The batched server keeps every sequence's keys and values in blocks of P positions from one pool
(serve/kv.py's PagedBatchKV, vLLM's design, arXiv 2309.06180). The n answers to one request share
their prompt's blocks, each block counting its holders, and a sequence about to write into a block
another one also holds copies it first (copy on write). Before a step the server adds up what every
row will take, and preempts a request when the pool does not hold it all (serve/scheduler.py).

A sequence with `length` committed positions holds ceil(length / P) blocks; `refs[j]` is how many
sequences hold its block j. Writing positions length .. length + new_tokens - 1 takes
  new blocks: ceil((length + new_tokens) / P) - len(refs), never below 0, and
  copies:     one for each block it holds from index length // P on (the one it writes into) whose count is above 1.
The full blocks before length // P are only read, so they stay shared. This is PagedBatchKV.blocks_to_grow.
"""
import operator

from ...paged import blocks_for
from .report import Exercise, Failure, grade_cases


def blocks_to_take(length, new_tokens, refs, block_size):
    """Blocks a sequence of `length` positions, holding blocks whose holder counts are `refs`, takes from
    the pool to write `new_tokens` more: the new blocks, plus a copy of each shared block it writes into."""
    new = max(0, blocks_for(length + new_tokens, block_size) - len(refs))
    copies = sum(1 for r in refs[length // block_size:] if r > 1)
    return new + copies


def _new(length, new_tokens, refs, block_size):
    return max(0, blocks_for(length + new_tokens, block_size) - len(refs))


def _copies(length, refs, block_size):
    return sum(1 for r in refs[length // block_size:] if r > 1)


BLOCKS_MISTAKES = [
    ("floor_not_ceil", lambda length, new_tokens, refs, block_size:
        max(0, (length + new_tokens) // block_size - len(refs)) + _copies(length, refs, block_size)),
    ("one_block_too_many_when_full", lambda length, new_tokens, refs, block_size:
        max(0, (length + new_tokens) // block_size + 1 - len(refs)) + _copies(length, refs, block_size)),
    ("new_tokens_alone", lambda length, new_tokens, refs, block_size:
        blocks_for(new_tokens, block_size) + _copies(length, refs, block_size)),
    ("new_tokens_alone", lambda length, new_tokens, refs, block_size: blocks_for(new_tokens, block_size)),
    ("no_copy_on_write", lambda length, new_tokens, refs, block_size: _new(length, new_tokens, refs, block_size)),
    ("copies_every_shared_block", lambda length, new_tokens, refs, block_size:
        _new(length, new_tokens, refs, block_size) + sum(1 for r in refs if r > 1)),
    ("copies_a_full_last_block", lambda length, new_tokens, refs, block_size:
        _new(length, new_tokens, refs, block_size) + int(bool(refs) and refs[-1] > 1)),
    ("one_copy_per_holder", lambda length, new_tokens, refs, block_size:
        _new(length, new_tokens, refs, block_size) + sum(r - 1 for r in refs[length // block_size:] if r > 1)),
]

BLOCKS_HINTS = {
    "floor_not_ceil": "You rounded the blocks down. A block that is only partly filled still has to be held, so "
                      "21 positions in blocks of 16 take ceil(21 / 16) = 2 blocks, not 1. Counting too few lets "
                      "the server start a step the pool cannot hold: it runs out when the forward asks for "
                      "the blocks, and the whole step fails.",
    "one_block_too_many_when_full": "You counted (length + new_tokens) // block_size + 1 blocks, one too many "
                                    "whenever the positions fill their last block exactly. The server then "
                                    "holds back a block nobody writes, and preempts a request it had room for.",
    "new_tokens_alone": "You counted blocks for the new tokens alone, as if they started a fresh block. They go "
                        "first into the room left in the sequence's last block: a sequence of 20 positions in "
                        "blocks of 16 writes 5 more into its second block and needs no new one.",
    "no_copy_on_write": "You left out the copies. A block that another sequence also holds must be copied before "
                        "this one writes into it. Without the copy, the n answers to one prompt write into each "
                        "other's keys and values, and the server counts fewer blocks than the step takes.",
    "copies_every_shared_block": "You counted a copy of every shared block. The full blocks before position "
                                 "length are only read: they stay shared (that is the memory sharing saves). Only "
                                 "the block the new positions are written into, index length // block_size, is "
                                 "copied.",
    "copies_a_full_last_block": "You copied the last block whenever it is shared, even when it is full. The "
                                "sequence writes from index length // block_size on: when length is a multiple of "
                                "block_size its last block is full, it is only read, and the new positions go into "
                                "a new block.",
    "one_copy_per_holder": "You counted one copy for every other holder of a shared block. Only the sequence "
                           "that writes copies the block; the others keep the original, and each one copies "
                           "for itself when it writes. Counting too many makes the server preempt requests it "
                           "had room for.",
}

P = 16
# (length, new_tokens, refs, block_size): between them they tell every mistake above from the reference
BLOCKS_CASES = [
    (0, 5, [], P),  # a fresh sequence: one new block
    (20, 5, [1, 1], P),  # room left in its own last block: nothing to take
    (28, 4, [1, 1], P),  # the new positions fill the last block exactly
    (32, 4, [1, 1], P),  # full blocks: the new positions start a new block
    (20, 5, [3, 3], P),  # the first step of three answers to one prompt: copy the shared last block
    (40, 4, [2, 2, 1], P),  # shared full blocks before the write, its own last block
    (32, 5, [2, 2], P),  # forked at a block boundary: no copy, one new block
    (5, 8, [2, 2], 4),  # crossing two boundaries after a copy of the shared partial block
    (13, 1, [1, 1, 1, 1], 4),  # one token (plain decoding) into the room left
]


def _whats_in_it(length, new_tokens, refs, block_size):
    """The right count in words: its new blocks, then its copy (at most one: only the block at index
    length // block_size is written into, and it is the last one the sequence holds)."""
    end, new = length + new_tokens, _new(length, new_tokens, refs, block_size)
    need = blocks_for(end, block_size)
    made = (f"{new} new (positions 0 .. {end - 1} need ceil({end} / {block_size}) = {need} "
            f"block{'s' * (need != 1)} and it holds {len(refs)})")
    if _copies(length, refs, block_size):
        j = length // block_size
        return made + f" + 1 copy (block {j}, which it writes into, is held by {refs[j]} sequences)"
    return made + " + 0 copies (no block it writes into is shared)"


def _read(out, case):
    if isinstance(out, bool) or not hasattr(out, "__index__"):
        raise Failure(f"Your function returned {type(out).__name__} {out!r} for {_describe(case)}: it should "
                      f"return an int, a number of blocks. math.ceil and // give an int, a division with / a float.")
    return operator.index(out)


def _describe(case):
    return f"length = {case[0]}, new_tokens = {case[1]}, refs = {case[2]}, block_size = {case[3]}"


def grade_blocks_to_take(fn):
    def explain(case, got, want):
        return (f"For {_describe(case)}, the sequence takes {want} block{'s' * (want != 1)}: "
                f"{_whats_in_it(*case)}. You returned {got}.")

    def theirs(length, new_tokens, refs, block_size):
        return fn(length, new_tokens, list(refs), block_size)  # a copy: a function that edits refs changes no case
    grade_cases(theirs, BLOCKS_CASES, blocks_to_take, BLOCKS_MISTAKES, describe=_describe, read=_read,
                explain=explain)
    return (f"Your counts equal the server's (PagedBatchKV.blocks_to_grow) on {len(BLOCKS_CASES)} sequences: a fresh "
            f"one, room left in the last block, full blocks, a shared block it writes into, shared full blocks it "
            f"only reads, and new tokens that cross two block boundaries.")


BLOCKS_TO_TAKE = Exercise("blocks_to_take", blocks_to_take, grade_blocks_to_take, BLOCKS_HINTS)
