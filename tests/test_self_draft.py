"""The target as its own draft: int8 panels, the int8 one-token forward, and lossless decoding
through the shared KV cache."""
import pytest
import torch

import specdec_lab as sl
from specdec_lab import kernels
from specdec_lab.config import SamplingConfig
from specdec_lab.kv_cache import KVCache
from specdec_lab.model import OneTokenDecoder, Transformer
from specdec_lab.self_draft import QuantizedDecoding, SelfDraft, SelfDrafter

pytestmark = pytest.mark.skipif(not kernels.has_int8(),
                                reason="the kernel library was built without AVX2 (kernels.has_int8() is False)")

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


def test_the_int8_forward_is_the_float32_forward_of_the_weights_it_stands_for(target):
    # forward_rows_int8 reads the int8 panels and scales each sum once: the same function, to float
    # rounding, as the float32 forward of a copy whose weights were replaced by what the panels stand for.
    rounded = Transformer(target.cfg)
    rounded.load_state_dict(target.state_dict())
    rounded.eval().requires_grad_(False)
    with torch.no_grad():
        for name, mod in rounded.named_modules():
            if hasattr(mod, "panel_weight") and mod.weight.dim() == 2:
                K, N = mod.weight.shape
                mod.weight.copy_(kernels.unpack_int8(kernels.pack(mod.weight, torch.int8), K, N))
    emb = SelfDraft(target).embedding  # the tied head's columns, as the drafter feeds them
    a, b = KVCache.for_model(target.cfg, 16), KVCache.for_model(target.cfg, 16)
    int8 = OneTokenDecoder(target, a, by_token=False, weights="int8")
    f32 = OneTokenDecoder(rounded, b, by_token=False)
    for t in (3, 9, 4, 4):  # the same input rows: the original embedding, as SelfDraft feeds them
        y8, y32 = int8.embedded(emb[t].contiguous()), f32.embedded(emb[t].contiguous())
    assert torch.allclose(y8, y32, rtol=1e-4, atol=1e-4)
    assert torch.allclose(a.k[..., :4, :], b.k[..., :4, :], rtol=1e-4, atol=1e-5)
    exact = target(torch.tensor([[3, 9, 4, 4]]))[0, -1]
    assert not torch.equal(y8, exact) and (y8 - exact).abs().max() < 0.1 * exact.abs().max()


@pytest.mark.parametrize("weights", ["int8", "float16"])
@pytest.mark.parametrize("k", [1, 3, 6])
def test_greedy_with_a_self_draft_equals_autoregressive(target, weights, k):
    engine = sl.SpeculativeEngine(target, SelfDraft(target, weights), k=k)
    assert isinstance(engine.drafter, SelfDrafter) and engine.drafter.cache is engine.cache
    for prompt in PROMPTS:
        base = sl.autoregressive_generate(target, prompt, max_new_tokens=30).tokens
        res = engine.generate(prompt, max_new_tokens=30)
        assert res.tokens == base
        assert res.stats.accepted > 0.5 * res.stats.drafted, "the target's own weights must agree with it"


def test_a_self_draft_behind_prompt_lookup_copies_where_the_context_repeats(target):
    from specdec_lab.drafters import LookupThenModelDrafter
    engine = sl.SpeculativeEngine(target, SelfDraft(target, lookup=True), k=4)
    drafter = engine.drafter
    assert isinstance(drafter, LookupThenModelDrafter) and isinstance(drafter.model, SelfDrafter)
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


@pytest.mark.parametrize("k,temperature", [(2, 1.0), (4, 0.7)])
def test_sampling_with_a_self_draft_is_distributed_as_the_target(k, temperature):
    from test_engine import _tiny_pair, chi_square_pvalue, exact_distribution
    target, _ = _tiny_pair()
    engine = sl.SpeculativeEngine(target, SelfDraft(target), k=k)
    pvalue = chi_square_pvalue(engine, exact_distribution(target, temperature, 1.0), 2500, temperature, 1.0, k)
    assert pvalue > 0.001, f"samples with a self-draft are not distributed as the target (p = {pvalue:.2e})"


def test_what_a_self_draft_refuses(target):
    with pytest.raises(ValueError, match="weights"):
        SelfDraft(target, "int4")
    with pytest.raises(ValueError, match="target"):
        SelfDraft("SmolLM2")
    with pytest.raises(ValueError, match="float32 CPU target"):
        SelfDraft(sl.tiny_model(0).to(torch.bfloat16))
    with pytest.raises(ValueError, match="contiguous"):
        sl.SpeculativeEngine(target, SelfDraft(target), cache="paged")
    with pytest.raises(ValueError, match="this engine's target"):
        sl.SpeculativeEngine(sl.tiny_model(1), SelfDraft(target))
    with pytest.raises(ValueError, match="weights must be one of"):
        OneTokenDecoder.supports(target, KVCache.for_model(target.cfg, 4), by_token=False, weights="int4")


@pytest.mark.slow
def test_the_default_target_drafts_for_itself_in_int8(default_target):
    """On the real model: the output stays the target's own, and the int8 copy agrees with it on
    most drafted tokens (a distilled draft: 55-61%)."""
    from test_engine import greedy_acceptance
    engine = sl.SpeculativeEngine(default_target, SelfDraft(default_target), k=6)
    assert greedy_acceptance(engine, ("Why is the sky blue?", "Write a Python function that reverses a string.")) > 0.8
