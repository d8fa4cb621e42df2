"""lab/exercises "blocks_to_take": the blocks a paged sequence takes to write. The reference passes and is
the server's own count (PagedBatchKV.blocks_to_grow, and the blocks a real forward takes from the pool);
each mistake, written as a learner would write it, fails with its own diagnosis; a correct count written
another way passes."""
import math
import time

import pytest

from specdec_lab.core.config import ModelConfig
from specdec_lab.lab import exercises
from specdec_lab.lab.exercises.blocks import BLOCKS_CASES, BLOCKS_MISTAKES
from specdec_lab.serve import PagedBatchKV
from test_exercises import assert_diagnosed

NAME = "blocks_to_take"
reference = exercises.solution(NAME)


def copies(length, refs, block_size):
    return sum(r > 1 for r in refs[length // block_size:])


def floor_blocks(length, new_tokens, refs, block_size):
    return max(0, (length + new_tokens) // block_size - len(refs)) + copies(length, refs, block_size)


def floor_plus_one(length, new_tokens, refs, block_size):
    blocks = (length + new_tokens) // block_size + 1  # the index of the last block, plus one
    return max(0, blocks - len(refs)) + copies(length, refs, block_size)


def new_tokens_only(length, new_tokens, refs, block_size):
    return math.ceil(new_tokens / block_size) + copies(length, refs, block_size)


def no_copies(length, new_tokens, refs, block_size):
    return max(0, math.ceil((length + new_tokens) / block_size) - len(refs))


def every_shared_block(length, new_tokens, refs, block_size):
    return no_copies(length, new_tokens, refs, block_size) + sum(r > 1 for r in refs)


def shared_last_block(length, new_tokens, refs, block_size):
    return no_copies(length, new_tokens, refs, block_size) + (1 if refs and refs[-1] > 1 else 0)


def copy_per_holder(length, new_tokens, refs, block_size):
    return no_copies(length, new_tokens, refs, block_size) + sum(r - 1 for r in refs[length // block_size:])


MISTAKES = [(floor_blocks, "floor_not_ceil"), (floor_plus_one, "one_block_too_many_when_full"),
            (new_tokens_only, "new_tokens_alone"), (no_copies, "no_copy_on_write"),
            (every_shared_block, "copies_every_shared_block"), (shared_last_block, "copies_a_full_last_block"),
            (copy_per_holder, "one_copy_per_holder")]


def by_positions(length, new_tokens, refs, block_size):
    """Correct, written another way: walk the blocks the new positions land in; one past the table is a new
    block, one in it that another sequence holds is a copy. It also edits refs, which the check allows."""
    taken = 0
    for j in sorted({p // block_size for p in range(length, length + new_tokens)}):
        taken += j >= len(refs) or refs[j] > 1
    refs.clear()
    return taken


def test_the_reference_passes():
    report = exercises.check(NAME, reference)
    assert report.passed and report.diagnosis is None, repr(report)


@pytest.mark.parametrize("fn, diagnosis", MISTAKES, ids=[d for _, d in MISTAKES])
def test_each_mistake_fails_with_its_own_diagnosis(fn, diagnosis):
    report = exercises.check(NAME, fn)
    assert_diagnosed(report, diagnosis)
    assert "new (positions" in report.message and "You returned" in report.message, "the count is not explained"


def test_the_cases_tell_every_mistake_apart():
    want = [reference(*case) for case in BLOCKS_CASES]
    outputs = {name: [fn(*case) for case in BLOCKS_CASES] for name, fn in BLOCKS_MISTAKES}
    assert all(out != want for out in outputs.values()), "a mistake agrees with the reference on every case"
    assert len(set(map(tuple, outputs.values()))) == len(outputs) == len({n for n, _ in BLOCKS_MISTAKES}), \
        "two mistakes give the same counts on every case, so the check cannot tell which one a learner made"


def test_a_correct_count_written_another_way_passes():
    report = exercises.check(NAME, by_positions)
    assert report.passed, repr(report)


@pytest.mark.parametrize("result", [2.0, True, None, "1"])
def test_a_result_that_is_not_an_int_is_told_so(result):
    report = exercises.check(NAME, lambda length, new_tokens, refs, block_size: result)
    assert not report.passed and report.diagnosis is None
    assert "should return an int" in report.message and "length = 0, new_tokens = 5" in report.message


def test_the_reference_is_the_servers_count_on_real_states():
    """Grow, fork and write sequences of a real paged pool (blocks of 4). Before every write the reference,
    given the holder counts of the sequence's table, equals PagedBatchKV.blocks_to_grow for 1 to 9 new
    tokens, and the write takes exactly that many blocks from the pool."""
    cfg = ModelConfig(vocab_size=16, dim=8, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=4,
                      intermediate_size=16, max_seq_len=64)
    kv = PagedBatchKV(cfg, num_blocks=32, block_size=4, max_seq_len=64)
    seen = set()

    def write(seq, n):
        length, refs = kv.length(seq), [kv.allocator.refs(b) for b in kv.tables[seq]]
        for new in range(1, 10):
            assert reference(length, new, refs, 4) == kv.blocks_to_grow(seq, new), (length, new, refs)
        want, free = reference(length, n, refs, 4), kv.free_blocks
        view = kv.view([seq], [n])
        view.reserve(n)
        view.advance(n)
        assert free - kv.free_blocks == want, f"writing {n} after {length} with counts {refs} took another count"
        seen.add((length % 4 == 0, any(r > 1 for r in refs)))

    kv.add(0)
    write(0, 10)  # a fresh sequence: 3 blocks, the last with room for 2
    kv.fork(0, 1)
    kv.fork(0, 2)  # three answers share 3 blocks, each held 3 times
    write(1, 5)  # copies the shared partial block, and one new block
    write(0, 2)  # copies it too (still held by 0 and 2), and fills it exactly
    write(2, 1)  # the last holder writes in place
    kv.fork(0, 3)  # forked at a block boundary: every block shared and full
    write(3, 3)  # no copy, one new block
    write(2, 9)  # from the room in its own last block across two boundaries, its first blocks shared
    kv.add(4)
    write(4, 6)
    write(4, 3)  # its own partial block, shared with no one
    assert seen == {(True, False), (True, True), (False, True), (False, False)}, "a kind of state was not reached"


def test_the_check_is_quick():
    start = time.perf_counter()
    for fn in [reference] + [fn for fn, _ in MISTAKES]:
        exercises.check(NAME, fn)
    assert time.perf_counter() - start < 2.0, "grading a count should take well under a second"
