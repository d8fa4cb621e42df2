"""The target as its own draft: int8 and 4-bit panels, their one-token forwards, and lossless
decoding through the shared KV cache."""
import pytest
import torch

import specdec_lab as sl
from specdec_lab.cpu import build as kernels
from specdec_lab.core.config import SamplingConfig
from specdec_lab.core.kv_cache import KVCache
from specdec_lab.cpu import OneTokenDecoder
from specdec_lab.core.model import Linear, Transformer
from specdec_lab.cpu import QuantizedDecoding, SelfDraft, SelfDrafter, best_weights
from specdec_lab.cpu.linear import panel_weight

pytestmark = pytest.mark.skipif(not kernels.has_int8(),
                                reason="the kernel library was built without AVX2 (kernels.has_int8() is False)")

needs_int4 = pytest.mark.skipif(not kernels.has_int4(), reason="the kernel library was built without AVX2 and "
                                "F16C (kernels.has_int4() is False)")

PROMPTS = [[1, 2, 3], [5], [7, 7, 7, 7, 2, 9], [3, 4]]


@pytest.fixture(scope="module")
def target():
    return sl.tiny_model(0)  # tied embeddings, like the default target


def test_int8_panels_stand_for_the_weight_to_half_a_step_per_column():
    torch.manual_seed(0)
    w = torch.randn(40, 70)
    w[:, 5] = 0.0  # an all-zero column must stay zero, not divide by a zero scale
    packed = kernels.pack(w, torch.int8)
    pw = kernels.panel_width()
    assert packed.dtype == torch.int8 and packed.data_ptr() % 64 == 0
    assert packed.shape == (-(-70 // pw), 40 * pw + 4 * pw)
    back = kernels.unpack_int8(packed, 40, 70)
    step = w.abs().amax(0) / 127  # one int8 step per column
    assert ((back - w).abs() <= step / 2 + 1e-7).all()
    assert torch.equal(back[:, 5], torch.zeros(40))
    with pytest.raises(ValueError, match="dtype"):
        kernels.pack(w, torch.bfloat16)


def _q4_1_like(K, N, seed=0):
    """Weights stored the way the default target's layers came (Q4_1): per column and group of 32
    inputs, d * Q + m with Q in 0..15 and d, m in half precision; each group uses both 0 and 15."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (K // 32, 32, N), generator=g)
    q[:, 0], q[:, 1] = 0, 15
    d = (torch.rand(K // 32, 1, N, generator=g) * 0.05 + 1e-3).half().float()
    m = (torch.randn(K // 32, 1, N, generator=g) * 0.1).half().float()
    return (d * q + m).reshape(K, N)


@needs_int4
def test_4bit_panels_stand_for_the_weight_to_half_a_step_per_group():
    torch.manual_seed(0)
    w = torch.randn(64, 70)
    w[:32, 5] = 0.25  # a constant group must come back as it is, not divide by a zero range
    packed = kernels.pack(w, torch.uint4)
    pw = kernels.panel_width()
    assert packed.dtype == torch.uint8 and packed.data_ptr() % 64 == 0
    assert packed.shape == (-(-70 // pw), 2 * 640)  # two groups of 32 inputs: 5 bits a weight
    back = kernels.unpack_int4(packed, 64, 70)
    groups = w.view(2, 32, 70)
    step = ((groups.amax(1) - groups.amin(1)) / 15).repeat_interleave(32, 0)  # one 4-bit step per group
    assert ((back - w).abs() <= step / 2 + 2e-3 * w.abs().amax()).all()
    assert torch.equal(back[:32, 5], torch.full((32,), 0.25))
    # stored as Q4_1 is stored, the weight comes back exactly
    q41 = _q4_1_like(96, 64)
    assert torch.equal(kernels.unpack_int4(kernels.pack(q41, torch.uint4), 96, 64), q41)
    with pytest.raises(ValueError, match="multiple of 32"):
        kernels.pack(torch.randn(40, 8), torch.uint4)


@pytest.mark.parametrize("weights", ["int8", pytest.param("int4", marks=needs_int4)])
def test_the_rounded_forward_is_the_float32_forward_of_the_weights_it_stands_for(target, weights):
    # forward_rows_int8 reads the int8 panels and scales each sum once; forward_rows_int4 reads the
    # layers' 4-bit panels and the head's int8 ones with a scale per group of 32, with x rounded to
    # int16 per group. Each is
    # the same function, to rounding, as the float32 forward of a copy whose weights were replaced by
    # what the panels stand for.
    rounded = Transformer(target.cfg)
    rounded.load_state_dict(target.state_dict())
    rounded.eval().requires_grad_(False)
    with torch.no_grad():
        for name, mod in rounded.named_modules():
            if isinstance(mod, Linear) and mod.weight.dim() == 2:
                K, N = mod.weight.shape
                if weights == "int4" and name != "head":
                    mod.weight.copy_(kernels.unpack_int4(kernels.pack(mod.weight, torch.uint4), K, N))
                elif weights == "int4":  # the head: int8 with a scale per group of 32 inputs
                    mod.weight.copy_(kernels.unpack_q8(kernels.pack(mod.weight, torch.qint8), K, N))
                else:
                    mod.weight.copy_(kernels.unpack_int8(kernels.pack(mod.weight, torch.int8), K, N))
    emb = SelfDraft(target).embedding  # the tied head's columns, as the drafter feeds them
    a, b = KVCache.for_model(target.cfg, 16), KVCache.for_model(target.cfg, 16)
    low = OneTokenDecoder(target, a, by_token=False, weights=weights)
    f32 = OneTokenDecoder(rounded, b, by_token=False)
    for t in (3, 9, 4, 4):  # the same input rows: the original embedding, as SelfDraft feeds them
        y8, y32 = low.embedded(emb[t].contiguous()), f32.embedded(emb[t].contiguous())
    tol = 1e-4 if weights == "int8" else 2e-3  # int16 inputs: 2^-15 of each group's largest
    assert torch.allclose(y8, y32, rtol=tol, atol=tol * y32.abs().max())
    assert torch.allclose(a.k[..., :4, :], b.k[..., :4, :], rtol=tol, atol=tol * b.k.abs().max())
    exact = target(torch.tensor([[3, 9, 4, 4]]))[0, -1]
    assert not torch.equal(y8, exact) and (y8 - exact).abs().max() < 0.5 * exact.abs().max()


def _q8_0_like(K, N, seed=0):
    """Weights stored as the default target's embedding came (Q8_0): per column and group of 32 inputs,
    d * Q with Q in -127..127 and d in half precision; each group reaches 127."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(-127, 128, (K // 32, 32, N), generator=g)
    q[:, 0] = 127
    d = (torch.rand(K // 32, 1, N, generator=g) * 0.01 + 1e-3).half().float()
    return (d * q).reshape(K, N)


@needs_int4
def test_int8_panels_with_a_scale_per_group_give_q8_0_weights_back():
    w = _q8_0_like(64, 70)
    packed = kernels.pack(w, torch.qint8)
    assert packed.dtype == torch.int8 and packed.data_ptr() % 64 == 0
    assert packed.shape == (-(-70 // kernels.panel_width()), 2 * 1088)
    assert torch.equal(kernels.unpack_q8(packed, 64, 70), w)
    r = torch.randn(64, 70)  # any other weight: within half a step of its group
    step = r.view(2, 32, 70).abs().amax(1).repeat_interleave(32, 0) / 127
    assert ((kernels.unpack_q8(kernels.pack(r, torch.qint8), 64, 70) - r).abs() <= step / 2 + 1e-3 * step).all()


@needs_int4
def test_a_4bit_forward_of_q4_1_and_q8_0_weights_is_the_float32_forward():
    # The default target's layers came as Q4_1 and its head as Q8_0: read that way they lose nothing,
    # and the forward differs from float32 only by the rounding of x to int16 per group.
    model = sl.tiny_model(5, dim=64, vocab_size=64)
    with torch.no_grad():
        for name, mod in model.named_modules():
            if isinstance(mod, Linear) and mod.weight.dim() == 2:
                like = _q8_0_like if name == "head" else _q4_1_like
                mod.weight.copy_(like(*mod.weight.shape, seed=len(name)))
    a, b = KVCache.for_model(model.cfg, 16), KVCache.for_model(model.cfg, 16)
    low, f32 = (OneTokenDecoder(model, a, by_token=False, weights="int4"),
                OneTokenDecoder(model, b, by_token=False))
    emb = SelfDraft(model).embedding
    for t in (3, 9, 4, 4):
        y4, y32 = low.embedded(emb[t].contiguous()), f32.embedded(emb[t].contiguous())
    assert torch.allclose(y4, y32, rtol=1e-3, atol=1e-3 * y32.abs().max())
    assert torch.allclose(a.k[..., :4, :], b.k[..., :4, :], rtol=1e-3, atol=1e-3 * b.k.abs().max())
    assert not torch.equal(y4, y32)  # x in int16: close, not bit-for-bit


@pytest.mark.parametrize("weights", ["int8", pytest.param("int4", marks=needs_int4), "float16"])
@pytest.mark.parametrize("k", [1, 3, 6])
def test_greedy_with_a_self_draft_equals_autoregressive(target, weights, k):
    engine = sl.SpeculativeEngine(target, SelfDraft(target, weights), k=k)
    assert isinstance(engine.drafter, SelfDrafter) and engine.drafter.cache is engine.cache
    for prompt in PROMPTS:
        base = sl.autoregressive_generate(target, prompt, max_new_tokens=30).tokens
        res = engine.generate(prompt, max_new_tokens=30)
        assert res.tokens == base
        if weights == "int4":  # 4 bits of a random Gaussian weight lose far more than the default
            # target's layers do (they came as 4 bits): the first drafted token still agrees far more
            # often than chance (1 in 64)
            assert res.stats.accepted_per_position[0] > 0.4 * res.stats.steps
        else:
            assert res.stats.accepted > 0.5 * res.stats.drafted, "the target's own weights must agree with it"


def test_a_self_draft_behind_prompt_lookup_copies_where_the_context_repeats(target):
    from specdec_lab import LookupThenModelDrafter
    from specdec_lab.drafters import LookupDrafter
    engine = sl.SpeculativeEngine(target, SelfDraft(target, lookup=True), k=4)
    drafter = engine.drafter
    assert isinstance(drafter, LookupDrafter) and isinstance(drafter.model, SelfDrafter)
    assert drafter.model.cache is engine.cache
    prompts = PROMPTS + [[1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2]]  # the last one repeats itself
    def pending_is_the_next_token(rec, out):  # after copied steps too: the next draft starts there
        assert drafter.model.pending == rec.next_token

    for prompt in prompts:
        base = sl.autoregressive_generate(target, prompt, max_new_tokens=40).tokens
        assert engine.generate(prompt, max_new_tokens=40, on_step=pending_is_the_next_token).tokens == base
    assert drafter.lookup_steps > 0 and drafter.model_steps > 0, (drafter.lookup_steps, drafter.model_steps)
    with pytest.raises(ValueError, match="lookup"):
        SelfDraft(target, lookup=1)
    with pytest.raises(ValueError, match="stop_below"):
        LookupThenModelDrafter(drafter.model, stop_below=0.2)


@pytest.mark.parametrize("temperature", [0.8])
def test_sampling_with_a_self_draft_behind_lookup_is_distributed_as_the_target(temperature):
    from test_engine import _tiny_pair, chi_square_pvalue, exact_distribution
    target, _ = _tiny_pair()
    engine = sl.SpeculativeEngine(target, SelfDraft(target, lookup=True), k=3)
    pvalue = chi_square_pvalue(engine, exact_distribution(target, temperature, 1.0), 2500, temperature, 1.0, 3)
    assert pvalue > 0.001, f"samples with lookup and a self-draft are not distributed as the target (p = {pvalue:.2e})"


def test_the_shared_cache_ends_as_the_target_alone_would_have_written_it(target):
    # The draft writes its own keys and values beyond the committed length; verification must
    # overwrite every one of them, so the committed cache is what a plain prefill computes.
    engine = sl.SpeculativeEngine(target, SelfDraft(target), k=4)
    prompt = [7, 7, 7, 7, 2, 9]

    def check(rec, out):
        assert engine.cache.length == len(prompt) + len(out) - 1  # the last token is pending

    res = engine.generate(prompt, max_new_tokens=24, on_step=check)
    seq = prompt + res.tokens[:-1]
    fresh = KVCache.for_model(target.cfg, 64)
    target(torch.tensor([seq]), cache=fresh)
    L = len(seq)  # verification and prefill differ by float rounding only
    assert torch.allclose(engine.cache.k[..., :L, :], fresh.k[..., :L, :], atol=1e-4)
    assert torch.allclose(engine.cache.v[..., :L, :], fresh.v[..., :L, :], atol=1e-4)
    # What the int8 draft writes differs by far more: an entry left unverified would show.
    drafted, _ = engine.drafter.propose(3, SamplingConfig(), None)  # writes at L..L+2, then rolls back
    assert engine.cache.length == L
    target(torch.tensor([[res.tokens[-1]] + drafted[:2].tolist()]), cache=fresh)
    assert (engine.cache.k[..., L:L + 3, :] - fresh.k[..., L:L + 3, :]).abs().max() > 1e-3


def test_a_proposal_leaves_the_cache_where_it_was_even_when_it_fails(target, monkeypatch):
    engine = sl.SpeculativeEngine(target, SelfDraft(target), k=4)
    drafter = engine.drafter
    target(torch.tensor([[1, 2, 3]]), cache=engine.cache)
    drafter.prefill([1, 2, 3, 4])
    k_before = engine.cache.k.clone()
    ids, q = drafter.propose(4, SamplingConfig(), None)
    assert len(ids) == 4 and q is None and engine.cache.length == 3
    assert torch.equal(engine.cache.k[..., :3, :], k_before[..., :3, :])
    ids2, q2 = drafter.propose(4, SamplingConfig(temperature=0.8), torch.Generator().manual_seed(0))
    assert q2.shape == (4, target.cfg.vocab_size) and torch.allclose(q2.sum(-1), torch.ones(4))
    calls = {"n": 0}
    real = drafter.decoder.embedded

    def fail_second(row, head=True):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("boom")
        return real(row, head)

    monkeypatch.setattr(drafter.decoder, "embedded", fail_second)
    with pytest.raises(RuntimeError, match="boom"):
        drafter.propose(4, SamplingConfig(), None)
    assert engine.cache.length == 3


def test_quantized_decoding_is_the_draft_decoding_alone(target):
    # Each new token is one int8 forward through the float32 target's prefilled cache: the same
    # argmax as the drafter's own proposal chain, and not (in general) the float32 target's answer.
    draft = SelfDraft(target)
    prompt = [7, 7, 7, 7, 2, 9]
    alone = sl.autoregressive_generate(QuantizedDecoding(draft), prompt, max_new_tokens=6).tokens
    engine = sl.SpeculativeEngine(target, draft, k=6)
    target(torch.tensor([prompt[:-1]]), cache=engine.cache)
    engine.drafter.prefill(prompt)
    chain, _ = engine.drafter.propose(6, SamplingConfig(), None)
    assert alone == chain.tolist()
    sampled = sl.autoregressive_generate(QuantizedDecoding(draft), prompt, max_new_tokens=20, temperature=0.8,
                                         seed=3).tokens
    assert sampled == sl.autoregressive_generate(QuantizedDecoding(draft), prompt, max_new_tokens=20,
                                                 temperature=0.8, seed=3).tokens and len(sampled) >= 1


@pytest.mark.parametrize("k,temperature,weights", [(2, 1.0, "int8"), (4, 0.7, "int8"),
                                                   pytest.param(4, 0.7, "int4", marks=needs_int4)])
def test_sampling_with_a_self_draft_is_distributed_as_the_target(k, temperature, weights):
    from test_engine import V, _tiny_pair, chi_square_pvalue, exact_distribution
    target, _ = _tiny_pair()
    if weights == "int4":  # 4-bit panels take inputs in groups of 32: the same tiny shape, twice as wide
        target = sl.tiny_model(3, vocab_size=V, dim=32, n_heads=2, n_kv_heads=1, eos_token_ids=(10 ** 6,))
    engine = sl.SpeculativeEngine(target, SelfDraft(target, weights), k=k)
    pvalue = chi_square_pvalue(engine, exact_distribution(target, temperature, 1.0), 2500, temperature, 1.0, k)
    assert pvalue > 0.001, f"samples with a self-draft are not distributed as the target (p = {pvalue:.2e})"


def test_what_a_self_draft_refuses(target):
    with pytest.raises(ValueError, match="weights"):
        SelfDraft(target, "int2")
    narrow = sl.tiny_model(0, dim=16, n_heads=2, n_kv_heads=1)  # inputs not in groups of 32
    assert best_weights(narrow) == "int8" and best_weights(target) == ("int4" if kernels.has_int4() else "int8")
    with pytest.raises(ValueError, match="groups of 32"):
        SelfDraft(narrow, "int4")
    with pytest.raises(ValueError, match="target"):
        SelfDraft("SmolLM2")
    with pytest.raises(ValueError, match="float32 CPU target"):
        SelfDraft(sl.tiny_model(0).to(torch.bfloat16))
    with pytest.raises(ValueError, match="contiguous"):
        sl.SpeculativeEngine(target, SelfDraft(target), cache="paged")
    with pytest.raises(ValueError, match="this engine's target"):
        sl.SpeculativeEngine(sl.tiny_model(1), SelfDraft(target))
    with pytest.raises(ValueError, match="weights must be one of"):
        OneTokenDecoder.supports(target, KVCache.for_model(target.cfg, 4), by_token=False, weights="int2")


@pytest.mark.slow
def test_the_default_target_drafts_for_itself_in_int8(default_target):
    """On the real model: the output stays the target's own, and the int8 copy agrees with it on
    most drafted tokens (a distilled draft: 55-61%)."""
    from test_engine import greedy_acceptance
    engine = sl.SpeculativeEngine(default_target, SelfDraft(default_target), k=6)
    assert greedy_acceptance(engine, ("Why is the sky blue?", "Write a Python function that reverses a string.")) > 0.8


@pytest.mark.slow
@needs_int4
def test_the_default_target_drafts_for_itself_in_4_bits(default_target):
    """On the real model: its layers came as Q4_1 and its head as Q8_0, so the 4-bit self-draft reads
    them back exactly; it agrees with the target at least as often as the int8 draft does, and the
    output stays the target's own."""
    from test_engine import greedy_acceptance
    layer = default_target.layers[3]
    for mod in (layer.attn.wqkv, layer.attn.wo, layer.mlp.w13, layer.mlp.w2):
        K, N = mod.weight.shape
        assert torch.equal(kernels.unpack_int4(panel_weight(mod, torch.uint4), K, N), mod.weight)
    K, N = default_target.head.weight.shape
    assert torch.equal(kernels.unpack_q8(panel_weight(default_target.head, torch.qint8), K, N),
                       default_target.head.weight)
    assert best_weights(default_target) == "int4"
    prompts = ("Why is the sky blue?", "Write a Python function that reverses a string.")
    a4 = greedy_acceptance(sl.SpeculativeEngine(default_target, SelfDraft(default_target, "int4"), k=6), prompts)
    a8 = greedy_acceptance(sl.SpeculativeEngine(default_target, SelfDraft(default_target, "int8"), k=6), prompts)
    assert a4 > 0.9 and a4 >= a8 - 0.02, (a4, a8)
