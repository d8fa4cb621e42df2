"""The contiguous KV cache: its state is a length; rollback moves it, a failed append writes nothing.

Every key/value written here encodes (token, layer, batch row, head, dim), so a
comparison of contents shows exactly which slot went wrong.
"""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec_lab.core.kv_cache import CacheOverflowError, KVCache
from specdec_lab.io.pair import tiny_model

L, B, HKV, S, D = 3, 2, 2, 12, 4


def kv_for(tokens):
    """(L, B, Hkv, T, D) keys whose every number names its token, layer, row, head and dim; values = -keys."""
    t = torch.tensor(tokens, dtype=torch.float32).view(1, 1, 1, -1, 1) * 10000
    k = (t + torch.arange(L).view(L, 1, 1, 1, 1) * 1000 + torch.arange(B).view(1, B, 1, 1, 1) * 100
         + torch.arange(HKV).view(1, 1, HKV, 1, 1) * 10 + torch.arange(D).view(1, 1, 1, 1, D))
    return k, -k


def new_cache(capacity=S):
    return KVCache(L, B, HKV, capacity, D)


def append(cache, k, v):
    """Write T positions the way a forward does: reserve, write every layer, advance."""
    T = k.shape[3]
    cache.reserve(T)
    for layer in range(cache.k.shape[0]):
        cache.write_layer(layer, k[layer], v[layer])
    cache.advance(T)


def keys(cache, layer):
    return cache.k[layer, :, :, :cache.length]  # (B, Hkv, length, D)


def values(cache, layer):
    return cache.v[layer, :, :, :cache.length]  # (B, Hkv, length, D)


def assert_holds(cache, tokens, why):
    """The cache's visible contents are exactly the keys/values of `tokens`, in every layer."""
    assert cache.length == len(tokens), f"{why}: length {cache.length}, expected {len(tokens)}"
    k, v = kv_for(tokens) if tokens else (torch.zeros(L, B, HKV, 0, D),) * 2
    for layer in range(L):
        assert torch.equal(keys(cache, layer), k[layer]), f"{why}: keys of layer {layer} differ"
        assert torch.equal(values(cache, layer), -k[layer] if tokens else v[layer]), \
            f"{why}: values of layer {layer} differ"


def test_new_cache_is_empty_with_one_tensor_pair_for_all_layers():
    cache = new_cache()
    assert cache.length == 0 and cache.capacity == S and cache.k.shape[0] == L
    assert cache.k.shape == cache.v.shape == (L, B, HKV, S, D), "one layer allocated instead of all (seed defect)"
    assert keys(cache, L - 1).shape == (B, HKV, 0, D)


def test_append_then_rollback_then_append_keeps_the_prefix_and_the_new_tokens():
    cache = new_cache()
    append(cache, *kv_for([1, 2, 3]))
    append(cache, *kv_for([4, 5]))
    assert_holds(cache, [1, 2, 3, 4, 5], "two appends")
    cache.rollback(3)
    assert_holds(cache, [1, 2, 3], "rollback to 3")
    append(cache, *kv_for([6, 7, 8]))
    assert_holds(cache, [1, 2, 3, 6, 7, 8], "append after rollback must overwrite the rejected slots")


def test_rollback_to_the_current_length_and_to_zero():
    cache = new_cache()
    append(cache, *kv_for([1, 2]))
    cache.rollback(2)
    assert_holds(cache, [1, 2], "rollback to the current length is a no-op")
    cache.rollback(0)
    assert_holds(cache, [], "rollback to 0 empties the cache")
    append(cache, *kv_for([3]))
    assert_holds(cache, [3], "refill after emptying")


def test_rollback_copies_nothing():
    cache = new_cache()
    append(cache, *kv_for([1, 2, 3]))
    k_before, v_before = cache.k.clone(), cache.v.clone()
    cache.rollback(1)
    assert torch.equal(cache.k, k_before) and torch.equal(cache.v, v_before), \
        "rollback touched the storage; it should only move the length"


def test_filling_to_exact_capacity_works():
    cache = new_cache()
    append(cache, *kv_for(list(range(S))))
    assert_holds(cache, list(range(S)), "fill to capacity")


def test_overflow_raises_cache_overflow_error_which_is_a_value_error():
    cache = new_cache()
    append(cache, *kv_for(list(range(S - 2))))
    with pytest.raises(CacheOverflowError, match="capacity"):
        append(cache, *kv_for([100, 101, 102]))
    assert issubclass(CacheOverflowError, ValueError), "callers catching ValueError would miss overflows"


def test_failed_append_leaves_contents_and_length_unchanged():
    cache = new_cache()
    append(cache, *kv_for(list(range(S - 2))))
    k_before, v_before = cache.k.clone(), cache.v.clone()
    for k, v in [kv_for([100, 101, 102]), kv_for([100, 101, 102, 103])]:  # overflows
        with pytest.raises(ValueError):
            append(cache, k, v)
        assert cache.length == S - 2, "a failed append moved the length"
        assert torch.equal(cache.k, k_before) and torch.equal(cache.v, v_before), "a failed append wrote data"


def test_failed_forward_through_the_model_leaves_the_cache_unchanged():
    model = tiny_model(0)
    cache = KVCache.for_model(model.cfg, 8)
    ids = torch.arange(10).view(1, 10)
    with torch.no_grad():
        model(ids[:, :6], cache=cache)
        k_before, v_before = cache.k.clone(), cache.v.clone()
        with pytest.raises(CacheOverflowError):
            model(ids[:, 6:], cache=cache)  # 6 + 4 > 8
    assert cache.length == 6, "an overflowing forward moved the length"
    assert torch.equal(cache.k, k_before) and torch.equal(cache.v, v_before), \
        "an overflowing forward wrote some layers before failing"


def test_rolling_forward_raises_and_changes_nothing():
    cache = new_cache()
    append(cache, *kv_for([1, 2, 3]))
    cache.rollback(1)
    with pytest.raises(ValueError, match="roll forward"):
        cache.rollback(3)  # the slots still hold 2 and 3, but they were forgotten
    assert_holds(cache, [1], "a refused roll-forward must leave the length alone")


@pytest.mark.parametrize("bad", [-1, 1.0, "1", None, True])
def test_rollback_rejects_a_length_that_is_not_a_non_negative_int(bad):
    cache = new_cache()
    append(cache, *kv_for([1, 2]))
    with pytest.raises(ValueError, match="length"):
        cache.rollback(bad)
    assert cache.length == 2


def test_reset_empties_the_cache():
    cache = new_cache()
    append(cache, *kv_for([1, 2]))
    cache.reset()
    assert_holds(cache, [], "reset")


@pytest.mark.parametrize("name", ["n_layers", "batch_size", "n_kv_heads", "capacity", "head_dim"])
@pytest.mark.parametrize("bad", [0, -3, 2.0, "4", None, True])
def test_constructor_rejects_a_bad_dimension_naming_it(name, bad):
    args = dict(n_layers=L, batch_size=B, n_kv_heads=HKV, capacity=S, head_dim=D)
    args[name] = bad
    with pytest.raises(ValueError, match=name):
        KVCache(**args)


def test_for_model_takes_the_model_shape_and_dtype():
    model = tiny_model(0)
    cache = KVCache.for_model(model.cfg, 32, dtype=torch.bfloat16)
    cfg = model.cfg
    assert cache.k.shape == (cfg.n_layers, 1, cfg.n_kv_heads, 32, cfg.head_dim)
    assert cache.k.dtype == cache.v.dtype == torch.bfloat16


# ---------------------------------------------------------------- against a plain list

ops = st.lists(
    st.one_of(st.tuples(st.just("append"), st.integers(0, 6)),
              st.tuples(st.just("rollback"), st.integers(0, S + 2))),
    min_size=1, max_size=25)


@settings(max_examples=50, deadline=None)
@given(ops)
def test_random_appends_and_rollbacks_match_a_python_list(sequence):
    cache, model, next_token = new_cache(), [], 1
    for op, n in sequence:
        if op == "append":
            tokens = list(range(next_token, next_token + n))
            next_token += n
            if len(model) + n > S:
                with pytest.raises(CacheOverflowError):
                    append(cache, *kv_for(tokens))
            else:
                append(cache, *kv_for(tokens) if tokens else (torch.zeros(L, B, HKV, 0, D),) * 2)
                model += tokens
        else:
            if n > len(model):
                with pytest.raises(ValueError):
                    cache.rollback(n)
            else:
                cache.rollback(n)
                del model[n:]
        assert_holds(cache, model, f"after {op} {n}")
