"""Tests for the paged KV cache: allocator, pool, the decoder adapter, and the experiment."""
import time

import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from specdec_lab.core.config import ModelConfig
from specdec_lab.core.kv_cache import CacheOverflowError, KVCache
from specdec_lab.core.model import Transformer, init_weights
from specdec_lab.paged import BlockAllocator, PagedKVCache, PagedSequenceCache, PoolExhaustedError, blocks_for
from specdec_lab.lab.fragmentation import simulate_fragmentation

L, N, HKV, P, D = 2, 6, 2, 3, 2  # a pool of 18 token slots per layer: small enough to run out


def token_kv(token_ids):
    """Keys and values (L, Hkv, T, D) whose every number says which token, layer, head, dim it is."""
    t = torch.tensor(token_ids, dtype=torch.float32).view(1, 1, -1, 1)  # (1, 1, T, 1)
    layer = torch.arange(L).view(L, 1, 1, 1) * 100
    head = torch.arange(HKV).view(1, HKV, 1, 1) * 10
    dim = torch.arange(D).view(1, 1, 1, D)
    k = t * 1000 + layer + head + dim  # (L, Hkv, T, D)
    return k, -k


def snapshot(cache):
    return ({s: list(t) for s, t in cache.tables.items()}, dict(cache.lengths),
            list(cache.allocator._free), cache.k.clone(), cache.v.clone())


def assert_same_state(before, after):
    assert before[:3] == after[:3], "a failed call changed the block tables, lengths or free list"
    assert torch.equal(before[3], after[3]) and torch.equal(before[4], after[4]), "a failed call wrote to the pool"


def assert_invariants(cache, model):
    alloc = cache.allocator
    assert alloc.num_free + alloc.num_used == alloc.num_blocks, "free + used != total"
    owned = [b for table in cache.tables.values() for b in table]
    assert len(owned) == len(set(owned)), f"a block is owned twice: {cache.tables}"
    assert len(owned) == alloc.num_used, "a used block belongs to no sequence: a leak"
    assert not set(owned) & set(alloc._free), "a block is both owned and free"
    assert set(cache.tables) == set(model), "live sequences differ from the model's"
    for seq, tokens in model.items():
        assert cache.length_of(seq) == len(tokens)
        assert len(cache.tables[seq]) == blocks_for(len(tokens), P), "a sequence holds blocks beyond its length"
        k_want, v_want = token_kv(tokens) if tokens else (torch.zeros(L, HKV, 0, D),) * 2
        for layer in range(L):
            k, v = cache.gather(seq, layer)
            assert torch.equal(k, k_want[layer]) and torch.equal(v, v_want[layer]), \
                f"seq {seq} layer {layer} reads back other contents than were appended"


# -- BlockAllocator -----------------------------------------------------------------

def test_allocator_allocate_is_all_or_nothing():
    alloc = BlockAllocator(4)
    assert alloc.allocate(3) == [0, 1, 2]
    with pytest.raises(PoolExhaustedError, match="asked for 2 blocks, 1 of 4 free"):
        alloc.allocate(2)
    assert (alloc.num_free, alloc.num_used) == (1, 3), "a failed allocate took blocks"
    assert isinstance(PoolExhaustedError("x"), ValueError)


def test_allocator_detects_double_free_and_frees_nothing_then():
    alloc = BlockAllocator(4)
    blocks = alloc.allocate(2)
    alloc.free(blocks[:1])
    with pytest.raises(ValueError, match="double free"):
        alloc.free(blocks)  # blocks[0] is already free
    assert alloc.num_used == 1, "a rejected free released the valid block in the same call"
    with pytest.raises(ValueError, match="double free"):
        alloc.free([blocks[1], blocks[1]])
    with pytest.raises(ValueError, match="blocks"):
        alloc.free([7])
    alloc.free([blocks[1]])
    assert alloc.num_free == 4


def test_a_shared_block_returns_to_the_pool_when_its_last_holder_frees_it():
    alloc = BlockAllocator(4)
    a, b = alloc.allocate(2)
    alloc.share([a])
    alloc.share([a])
    assert (alloc.refs(a), alloc.refs(b)) == (3, 1)
    alloc.free([a, b])
    assert (alloc.refs(a), alloc.num_used) == (2, 1), "a block another holder has went back to the pool"
    alloc.free([a])
    alloc.free([a])
    assert (alloc.refs(a), alloc.num_free) == (0, 4)
    with pytest.raises(ValueError, match="double free"):
        alloc.free([a])
    with pytest.raises(ValueError, match="cannot share.*already free"):
        alloc.share([a])
    c = alloc.allocate(1)[0]
    with pytest.raises(ValueError, match="listed twice"):
        alloc.share([c, c])
    assert alloc.refs(c) == 1, "a rejected share changed a count"


@pytest.mark.parametrize("bad", [0, -1, 2.0, "3"])
def test_allocator_rejects_bad_num_blocks(bad):
    with pytest.raises(ValueError, match="num_blocks"):
        BlockAllocator(bad)


# -- PagedKVCache: a property test against a plain list model ---------------------------

@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_random_add_append_rollback_release_keeps_blocks_consistent_and_contents_equal_a_list_model(data):
    cache, model, next_token = PagedKVCache(L, 4, HKV, P, D), {}, 1  # 12 slots: appends run out often
    for _ in range(data.draw(st.integers(1, 30), label="ops")):
        op = data.draw(st.sampled_from(["add", "append", "append", "append", "rollback", "release"]) if model
                       else st.just("add"), label="op")
        if op == "add":
            model[cache.add_sequence()] = []
        else:
            seq = data.draw(st.sampled_from(sorted(model)), label="seq")
        if op == "append":
            T = data.draw(st.integers(0, 8), label="T")
            tokens = list(range(next_token, next_token + T))
            next_token += T
            need = blocks_for(len(model[seq]) + T, P) - len(cache.tables[seq])
            if need > cache.allocator.num_free:
                event("pool exhausted")
                before = snapshot(cache)
                with pytest.raises(PoolExhaustedError):
                    cache.append(seq, *token_kv(tokens))
                assert_same_state(before, snapshot(cache))
            else:
                cache.append(seq, *token_kv(tokens))
                model[seq] += tokens
        elif op == "rollback":
            length = data.draw(st.integers(0, len(model[seq])), label="length")
            cache.rollback(seq, length)
            del model[seq][length:]
        elif op == "release":
            cache.release(seq)
            del model[seq]
        assert_invariants(cache, model)


@settings(max_examples=25, deadline=None)
@given(lengths=st.lists(st.integers(0, 9), min_size=1, max_size=4), block_size=st.integers(1, 5),
       seed=st.integers(0, 2**16))
def test_gather_agrees_with_gather_reference(lengths, block_size, seed):
    g = torch.Generator().manual_seed(seed)
    cache = PagedKVCache(L, 40, HKV, block_size, D)
    seqs = [cache.add_sequence() for _ in lengths]
    for i in range(2):  # interleave the sequences so their blocks are not contiguous
        for seq, n in zip(seqs, lengths):
            part = n // 2 if i == 0 else n - n // 2
            cache.append(seq, torch.randn(L, HKV, part, D, generator=g), torch.randn(L, HKV, part, D, generator=g))
    for seq in seqs:
        for layer in range(L):
            for fast, slow in zip(cache.gather(seq, layer), cache.gather_reference(seq, layer)):
                assert torch.equal(fast, slow), "the vectorised gather reads other slots than the token loop"


def test_failed_append_with_bad_shape_or_dtype_changes_nothing():
    cache = PagedKVCache(L, N, HKV, P, D)
    seq = cache.add_sequence()
    cache.append(seq, *token_kv([1, 2]))
    before = snapshot(cache)
    k, v = token_kv([3, 4])
    for bad_k, bad_v, match in [(k[:, :1], v, "k must have shape"), (k, v[..., :1], "v must have shape"),
                                (k, v[:, :, :1], "shapes differ"), (k.double(), v, "dtype")]:
        with pytest.raises(ValueError, match=match):
            cache.append(seq, bad_k, bad_v)
        assert_same_state(before, snapshot(cache))


def test_rollback_frees_whole_blocks_beyond_length_and_keeps_the_partial_one():
    cache = PagedKVCache(L, N, HKV, P, D)
    seq = cache.add_sequence()
    cache.append(seq, *token_kv(list(range(1, 9))))  # 8 positions: blocks of 3, 3, 2
    first = cache.block_table(seq)[0]
    cache.rollback(seq, 4)  # keeps block 0 whole and 1 position of block 1
    assert len(cache.block_table(seq)) == 2 and cache.allocator.num_used == 2
    cache.rollback(seq, 3)
    assert cache.block_table(seq) == [first]
    cache.append(seq, *token_kv([20, 21]))  # overwrites the freed tail, reads back the new tokens
    assert torch.equal(cache.gather(seq, 1)[0], token_kv([1, 2, 3, 20, 21])[0][1])
    with pytest.raises(ValueError, match="roll forward"):
        cache.rollback(seq, 6)
    cache.rollback(seq, 0)
    assert cache.allocator.num_used == 0 and cache.length_of(seq) == 0


def test_bad_arguments_raise_value_errors_naming_the_parameter():
    cache = PagedKVCache(L, N, HKV, P, D)
    seq = cache.add_sequence()
    with pytest.raises(ValueError, match="seq"):
        cache.append(99, *token_kv([1]))
    with pytest.raises(ValueError, match="length"):
        cache.rollback(seq, -1)
    with pytest.raises(ValueError, match="layer"):
        cache.gather(seq, L)
    with pytest.raises(ValueError, match="block_size"):
        PagedKVCache(L, N, HKV, 0, D)
    cache.release(seq)
    with pytest.raises(ValueError, match="seq"):
        cache.release(seq)


# -- PagedSequenceCache: the decoder runs on paged memory unchanged ----------------------

CFG = ModelConfig(vocab_size=128, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16,
                  intermediate_size=128, max_seq_len=128)


@pytest.fixture(scope="module")
def tiny_model():
    return init_weights(Transformer(CFG).eval(), seed=0, std=0.2)


def decode_script(model, cache, tokens):
    """Prefill, decode steps of one and of K+1 tokens, rollbacks, and decoding again."""
    out = []
    with torch.no_grad():
        out.append(model(tokens[:, :10], cache=cache))  # prefill
        out.append(model(tokens[:, 10:11], cache=cache))  # one token
        out.append(model(tokens[:, 11:16], cache=cache))  # a K+1 = 5 verification window
        cache.rollback(13)  # kept c, d1, d2
        out.append(model(tokens[:, 16:21], cache=cache))
        cache.rollback(4)  # back across several blocks
        out.append(model(tokens[:, 21:22], cache=cache))
        out.append(model(tokens[:, 22:40], cache=cache))
    return out


@pytest.mark.parametrize("block_size", [1, 3, 16, 64])
def test_paged_sequence_cache_gives_the_same_logits_as_kv_cache(tiny_model, block_size):
    tokens = torch.randint(0, CFG.vocab_size, (1, 40), generator=torch.Generator().manual_seed(1))
    contiguous = decode_script(tiny_model, KVCache.for_model(CFG, 48), tokens)
    paged_cache = PagedSequenceCache.for_model(CFG, 48, block_size=block_size)
    paged = decode_script(tiny_model, paged_cache, tokens)
    for i, (a, b) in enumerate(zip(contiguous, paged)):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=0, msg=f"call {i} differs with P={block_size}")
    assert paged_cache.length == 23
    assert paged_cache.paged.allocator.num_used == blocks_for(23, block_size), "rollback leaked blocks"


def test_paged_sequence_cache_failed_reserve_changes_nothing(tiny_model):
    cache = PagedSequenceCache.for_model(CFG, 12, block_size=4)
    with torch.no_grad():
        tiny_model(torch.zeros(1, 10, dtype=torch.long), cache=cache)
        before = snapshot(cache.paged)
        with pytest.raises(CacheOverflowError):
            tiny_model(torch.zeros(1, 3, dtype=torch.long), cache=cache)
    assert_same_state(before, snapshot(cache.paged))
    assert cache.length == 10


def test_paged_sequence_cache_allocates_only_when_crossing_a_block_boundary():
    cache = PagedSequenceCache.for_model(CFG, 32, block_size=4)
    used = []
    for _ in range(9):
        cache.reserve(1)
        cache.advance(1)
        used.append(cache.paged.allocator.num_used)
    assert used == [1, 1, 1, 1, 2, 2, 2, 2, 3]
    cache.reset()
    assert cache.length == 0 and cache.paged.allocator.num_used == 0


def test_paged_sequence_cache_rejects_batch_size_other_than_one():
    with pytest.raises(ValueError, match="batch_size"):
        PagedSequenceCache.for_model(CFG, 32, batch_size=2)


# -- the fragmentation experiment -----------------------------------------------------

@pytest.fixture(scope="module")
def fragmentation():
    start = time.perf_counter()
    result = simulate_fragmentation()
    return result, time.perf_counter() - start


def test_paged_design_uses_reserved_memory_better_than_contiguous(fragmentation):
    result, _ = fragmentation
    assert result.paged.utilisation > result.contiguous.utilisation + 0.2
    assert result.paged.utilisation > 0.9, "paging should waste less than a block per request"


def test_paged_design_fits_more_concurrent_requests_in_the_same_memory(fragmentation):
    result, _ = fragmentation
    assert result.paged.mean_concurrent > 1.5 * result.contiguous.mean_concurrent
    assert result.paged.max_concurrent > result.contiguous.max_concurrent
    assert max(result.paged.reserved) <= result.params["memory_tokens"]
    assert max(result.contiguous.reserved) <= result.params["memory_tokens"]


def test_fragmentation_result_is_deterministic_for_a_seed_and_fast(fragmentation):
    result, seconds = fragmentation
    assert simulate_fragmentation() == result
    assert simulate_fragmentation(seed=1) != result
    assert seconds < 2.0


def test_fragmentation_figure_is_a_pure_function_of_the_result(fragmentation):
    from specdec_lab.lab.viz import fragmentation_figure
    result, _ = fragmentation
    fig = fragmentation_figure(result)
    assert {t.name.split(":")[0] for t in fig.data} == {"contiguous", "paged"}
    assert fig.to_json() == fragmentation_figure(result).to_json()
