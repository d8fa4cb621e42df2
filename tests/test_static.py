"""Static shapes (gpt-fast's design) and torch.compile: the same tokens and logits as the eager
path, with one shape per forward kind for a whole generation."""
import pytest
import torch

from specdec_lab.api import SpeculativeEngine, autoregressive_generate
from specdec_lab.core.kv_cache import KVCache
from specdec_lab.core.masks import verification_mask
from specdec_lab.io.pair import tiny_model

PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]


def pair(static=False, compile=False):
    target = tiny_model(seed=0, vocab_size=64, dim=64, n_layers=2)
    draft = tiny_model(seed=1, vocab_size=64, dim=32, n_layers=1, n_heads=2, n_kv_heads=1)
    if static:
        target.use_static_shapes(compile=compile)
        draft.use_static_shapes(compile=compile)
    return target, draft


def test_static_cache_writes_by_index_and_masks_the_stale_slots():
    """After a rollback the slots beyond the length hold rejected keys; the static forward must
    give the logits of a cache that never saw them."""
    model = tiny_model(seed=0)
    plain = KVCache.for_model(model.cfg, 32)
    static = KVCache.for_model(model.cfg, 32, static=True)
    x = torch.tensor([PROMPT])
    with torch.inference_mode():
        for cache in (plain, static):
            model(x, cache=cache)
            model(torch.tensor([[7, 8, 9, 10, 11]]), cache=cache)  # a verification window ...
            cache.rollback(len(PROMPT) + 1)  # ... of which one position is kept
        assert static.k.shape[3] == 32  # the whole capacity, always
        a = model(torch.tensor([[12, 13, 14]]), cache=plain)
        b = model(torch.tensor([[12, 13, 14]]), cache=static)
    assert plain.length == static.length == len(PROMPT) + 4
    torch.testing.assert_close(b, a, atol=1e-4, rtol=1e-4)


def test_static_forward_with_an_explicit_mask_matches_the_eager_one():
    model = tiny_model(seed=2)
    plain, static = KVCache.for_model(model.cfg, 24), KVCache.for_model(model.cfg, 24, static=True)
    with torch.inference_mode():
        outs = []
        for cache in (plain, static):
            model(torch.tensor([PROMPT]), cache=cache)
            mask = verification_mask(cache.length, 3)
            mask[..., 0, cache.length + 1] = 0.0  # a leak: row 0 sees position 1
            outs.append(model(torch.tensor([[1, 2, 3]]), cache=cache, mask=mask))
    torch.testing.assert_close(outs[1], outs[0], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_static_engine_gives_the_eager_engines_tokens(temperature):
    target, draft = pair()
    s_target, s_draft = pair(static=True)
    want = SpeculativeEngine(target, draft, k=4).generate(PROMPT, 40, temperature=temperature, seed=3)
    got = SpeculativeEngine(s_target, s_draft, k=4).generate(PROMPT, 40, temperature=temperature, seed=3)
    # Near the budget the eager engine drafts fewer than K; with static shapes it drafts a full K
    # (one graph, not several). When sampling, those steps draw other random numbers, so only the
    # steps before the first shortened one must match.
    full = next((i for i, r in enumerate(want.steps) if r.k < 4), len(want.steps))
    n = sum(len(r.committed) for r in want.steps[:full])
    assert full > 3 and got.tokens[:n] == want.tokens[:n]
    assert [r.num_accepted for r in got.steps[:full]] == [r.num_accepted for r in want.steps[:full]]
    if temperature == 0:
        assert got.tokens == want.tokens
    assert autoregressive_generate(s_target, PROMPT, 40).tokens == autoregressive_generate(target, PROMPT, 40).tokens


def test_one_shape_per_forward_kind_for_a_whole_generation():
    """Every forward after the prompt sees the same cache tensors, and T is 1, 2 or K + 1."""
    target, draft = pair(static=True)
    seen = []
    for name, model in (("target", target), ("draft", draft)):
        inner = model.static_forward

        def record(tokens, input_pos, cache, *args, _inner=inner, _name=name, **kw):
            seen.append((_name, tokens.shape[1], cache.k.data_ptr(), tuple(cache.k.shape)))
            return _inner(tokens, input_pos, cache, *args, **kw)
        model.static_forward = record
    SpeculativeEngine(target, draft, k=4).generate(PROMPT, 48)
    for name in ("target", "draft"):
        rows = [s for s in seen if s[0] == name][1:]  # after the prompt's prefill
        assert len({s[2:] for s in rows}) == 1  # one cache, one shape
        assert {s[1] for s in rows} <= ({5} if name == "target" else {1, 2})


def test_use_static_shapes_checks_its_arguments():
    model = tiny_model()
    with pytest.raises(ValueError, match="mode must be"):
        model.use_static_shapes(compile=True, mode="fastest")


# torch.compile on the CPU (inductor, C++): compiles each forward once, about ten seconds apiece.
@pytest.mark.slow
def test_compiled_forwards_equal_eager_ones():
    """The target's verification forward (T = K + 1), the autoregressive forward (T = 1) and the
    draft's forward, compiled, against the same model eager: logits within 1e-4, tokens equal."""
    target, draft = pair(static=True)
    c_target, c_draft = pair(static=True, compile=True)
    with torch.inference_mode():
        for model, compiled, rows in ((target, c_target, (1, 5)), (draft, c_draft, (1, 2))):
            a = KVCache.for_model(model.cfg, 64, static=True)
            b = KVCache.for_model(model.cfg, 64, static=True)
            model(torch.tensor([PROMPT]), cache=a)
            compiled(torch.tensor([PROMPT]), cache=b)
            for step in range(3):
                for T in rows:
                    x = torch.randint(0, 64, (1, T), generator=torch.Generator().manual_seed(step * 10 + T))
                    want, got = model(x, cache=a), compiled(x, cache=b)
                    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
                    a.rollback(a.length - T + 1)
                    b.rollback(b.length - T + 1)
    want = SpeculativeEngine(target, draft, k=4).generate(PROMPT, 40)
    got = SpeculativeEngine(c_target, c_draft, k=4).generate(PROMPT, 40)
    assert got.tokens == want.tokens
    assert autoregressive_generate(c_target, PROMPT, 40).tokens == autoregressive_generate(target, PROMPT, 40).tokens


def test_a_feature_draft_reads_the_static_targets_states():
    """The target's hidden-state forward (a feature draft's input) takes the static path too."""
    from specdec_lab.drafters import FeatureDraft
    target, _ = pair()
    s_target, _ = pair(static=True)
    fd = FeatureDraft(target, seed=2).eval().requires_grad_(False)
    want = SpeculativeEngine(target, fd, k=3).generate(PROMPT, 32)
    got = SpeculativeEngine(s_target, fd, k=3).generate(PROMPT, 32)
    assert got.tokens == want.tokens
    assert [r.num_accepted for r in got.steps] == [r.num_accepted for r in want.steps]
