"""The CPU seam (specdec_lab/cpu/): the panel kernel (csrc/panel_matmul.cpp) against PyTorch's product,
the fast modules accelerate() swaps in, and the C++ decoder (the fused forward) against the eager model."""
import os
import subprocess
import sys

import pytest
import torch

from specdec_lab.core.model import Linear, RMSNorm
from specdec_lab.cpu import FusedForward, accelerate, accelerated
from specdec_lab.cpu import build as kernels
from specdec_lab.cpu.fused import FusedRows
from specdec_lab.cpu.linear import _PANELS, FastLinear, FastRMSNorm

pytestmark = pytest.mark.skipif(not kernels.available(), reason="the kernel did not build here (no working C++ compiler)")


@pytest.mark.parametrize("K,N", [(64, 96), (576, 960), (37, 50), (1, 1), (200, 33)])
@pytest.mark.parametrize("rows", [1, 2, 5, 8, 9, 17])
def test_panel_product_equals_torch(K, N, rows):
    torch.manual_seed(K * 1000 + N + rows)
    w, x = torch.randn(K, N), torch.randn(rows, K)
    y = kernels.matmul(x, kernels.pack(w), N)
    assert y.shape == (rows, N)
    assert torch.allclose(y, x @ w, rtol=1e-4, atol=1e-4 * K ** 0.5)


def test_leading_dimensions_are_rows_and_layouts_do_not_matter():
    w, x = torch.randn(48, 70), torch.randn(2, 3, 48)
    assert torch.allclose(kernels.matmul(x, kernels.pack(w), 70), x @ w, atol=1e-4)
    wt, xt = torch.randn(64, 48).t(), torch.randn(48, 3).t()  # transposed views: not contiguous
    assert torch.allclose(kernels.matmul(xt, kernels.pack(wt), 64), xt @ wt, atol=1e-4)


def test_a_row_is_bit_for_bit_the_same_whatever_the_row_count():
    """Verification feeds K+1 rows through the product that decode feeds one: each output
    element is one multiply-add chain in k order either way, so nothing depends on R."""
    torch.manual_seed(1)
    w = torch.randn(576, 960)
    panels = kernels.pack(w)
    x = torch.randn(12, 576)
    alone = torch.cat([kernels.matmul(x[i:i + 1], panels, 960) for i in range(12)])
    for rows in (2, 5, 8, 9, 12):
        assert torch.equal(kernels.matmul(x[:rows], panels, 960), alone[:rows]), rows


def test_threads_split_the_panels_and_change_no_bit():
    """With torch's threads the panels are shared out; each output is still computed by one thread
    in the same order, so the product does not depend on the thread count."""
    if not kernels.threaded():
        pytest.skip("a serial build of the kernel (it could not link against torch here)")
    torch.manual_seed(2)
    w, x = torch.randn(576, 3072), torch.randn(5, 576)
    panels = kernels.pack(w)
    one = kernels.matmul(x, panels, 3072)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        two = kernels.matmul(x, panels, 3072)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two)
    assert torch.allclose(two, x @ w, rtol=1e-4, atol=1e-3)


def test_pack_rejects_what_it_cannot_pack():
    with pytest.raises(ValueError, match="w must be"):
        kernels.pack(torch.randn(4, 4, dtype=torch.float64))
    with pytest.raises(ValueError, match="w must be"):
        kernels.pack(torch.randn(4))
    with pytest.raises(ValueError, match="features"):
        kernels.matmul(torch.randn(1, 5), kernels.pack(torch.randn(4, 8)), 8)


def test_fast_linear_takes_the_panel_kernel_for_any_rows_and_follows_weight_changes():
    assert torch.get_num_threads() == 1  # conftest
    torch.manual_seed(0)
    plain = Linear(64, 100, bias=True)
    torch.nn.init.normal_(plain.weight)
    torch.nn.init.normal_(plain.bias)
    lin = FastLinear(plain)
    x = torch.randn(1, 3, 64)
    with torch.no_grad():
        assert torch.allclose(lin(x), x @ lin.weight + lin.bias, atol=1e-4)
        first = _PANELS.get(lin.weight, {}).get(torch.float32)
        assert first is not None, "a few-row float32 product must go through the panel copy"
        lin.weight.mul_(-1)
        assert torch.allclose(lin(x), x @ lin.weight + lin.bias, atol=1e-4), "a stale panel copy was used"
        assert _PANELS[lin.weight][torch.float32] is not first
        many = torch.randn(1, kernels.MAX_ROWS + 1, 64)  # prefill: the same panels, no other copy
        assert torch.allclose(lin(many), many @ lin.weight + lin.bias, atol=1e-4)
        assert set(_PANELS[lin.weight]) == {torch.float32} and lin._packed is None
    y = lin(x).sum()  # training: the plain product, which has a backward
    y.backward()
    assert lin.weight.grad is not None


def test_the_default_target_decodes_the_same_tokens_plain_and_accelerated(default_target):
    """Greedy tokens through the CPU seam (the kernels, the one-call forward) against PyTorch's, on the real model."""
    from specdec_lab import autoregressive_generate
    fast = accelerated(default_target)
    assert default_target.runner is None and fast.runner is not None, "accelerated() must leave the model plain"
    assert fast.head.weight is default_target.head.weight, "the fast twin must share the weights"
    outs = [autoregressive_generate(m, "List three primary colours.", max_new_tokens=24, temperature=0.0).tokens
            for m in (default_target, fast)]
    assert outs[0] == outs[1]


def _run(code, **env):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=300)


def test_switched_off_or_without_a_compiler_the_model_still_runs(tmp_path):
    code = ("import warnings, torch; torch.set_num_threads(1)\n"
            "from specdec_lab.cpu import build as kernels\n"
            "from specdec_lab.core.model import Linear\n"
            "from specdec_lab.cpu.linear import _PANELS, FastLinear\n"
            "with warnings.catch_warnings(record=True) as w:\n"
            "    warnings.simplefilter('always')\n"
            "    lin = Linear(8, 8); torch.nn.init.normal_(lin.weight); x = torch.randn(1, 8)\n"
            "    fast = FastLinear(lin)\n"
            "    with torch.no_grad(): y = fast(x)\n"
            "print(kernels.available(), torch.allclose(y, x @ lin.weight), lin.weight not in _PANELS,"
            " any('panel kernel is unavailable' in str(m.message) for m in w))\n")
    off = _run(code, SPECDEC_LAB_KERNELS="0")
    assert off.returncode == 0, off.stderr
    assert off.stdout.split() == ["False", "True", "True", "False"]
    broken = _run(code, CXX="/bin/false", SPECDEC_LAB_CACHE=str(tmp_path))
    assert broken.returncode == 0, broken.stderr
    assert broken.stdout.split() == ["False", "True", "True", "True"], "a failed build must warn and fall back"


def test_rms_norm_equals_the_formula_and_the_module_uses_it_for_few_rows():
    torch.manual_seed(3)
    x, w = torch.randn(2, 3, 576) * 3, torch.randn(576)
    ref = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w
    assert torch.allclose(kernels.rms_norm(x, w, 1e-5), ref, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="weight must have shape"):
        kernels.rms_norm(x, torch.randn(5), 1e-5)
    norm = FastRMSNorm(RMSNorm(576, 1e-5))
    with torch.no_grad():
        norm.weight.copy_(w)
        assert torch.allclose(norm(x), ref, rtol=1e-5, atol=1e-5)
        one = norm(x[:1, :1])
        assert torch.equal(norm(x)[:1, :1], one), "a row's norm must not depend on the other rows"
    y = norm(x).sum()  # training: PyTorch's rms_norm, which has a backward
    y.backward()
    assert norm.weight.grad is not None


# ----------------------------------------------------------------------------- a forward in one call

def _untied(seed=0, **kw):
    from specdec_lab.io.pair import tiny_model
    return tiny_model(seed, tie_embeddings=False, **kw)


@pytest.mark.parametrize("shape", [
    dict(),  # 64 wide, 4 query heads over 2 key/value heads
    dict(vocab_size=100, dim=48, n_heads=6, n_kv_heads=1, n_layers=3),  # widths that are no multiple of PW
    dict(vocab_size=70, dim=32, n_heads=2, n_kv_heads=2, n_layers=1, rope_theta=10000.0),
])
@pytest.mark.parametrize("subset", [False, True])
def test_one_token_decoder_matches_the_eager_forward_and_writes_the_same_cache(shape, subset):
    from specdec_lab.core.kv_cache import KVCache
    from specdec_lab.cpu import OneTokenDecoder
    from specdec_lab.drafters.vocab_subset import restrict_vocab
    m = _untied(3, **shape)
    if subset:
        restrict_vocab(m, torch.arange(1, m.cfg.vocab_size, 3))
    eager, fused = KVCache.for_model(m.cfg, 40), KVCache.for_model(m.cfg, 40)
    prompt = torch.randint(0, m.cfg.vocab_size, (1, 9), generator=torch.Generator().manual_seed(0))
    m(prompt, cache=eager)
    m(prompt, cache=fused)
    decoder = OneTokenDecoder(m, fused)
    for token in [4, 0, m.cfg.vocab_size - 1, 17, 17]:
        a = m(torch.tensor([[token]]), cache=eager, last_only=True)[0, -1]
        b = decoder(token)
        assert b.shape == a.shape == (m.cfg.vocab_size,)
        assert torch.equal(torch.isfinite(a), torch.isfinite(b)), "the subset's -inf columns must match"
        finite = torch.isfinite(a)
        assert torch.allclose(a[finite], b[finite], rtol=1e-4, atol=1e-4)
        assert fused.length == eager.length
    n = eager.length
    assert torch.allclose(eager.k[:, :, :, :n], fused.k[:, :, :, :n], atol=1e-5)
    assert torch.allclose(eager.v[:, :, :, :n], fused.v[:, :, :, :n], atol=1e-5)


def test_one_token_decoder_follows_weight_changes_and_a_full_cache_changes_nothing(monkeypatch):
    from specdec_lab.core.kv_cache import CacheOverflowError, KVCache
    from specdec_lab.cpu import OneTokenDecoder
    m = _untied(1)
    cache = KVCache.for_model(m.cfg, 3)
    decoder = OneTokenDecoder(m, cache)
    before = decoder(5)
    cache.rollback(0)
    with torch.no_grad():
        m.layers[0].mlp.w2.weight.mul_(-2.0)  # in place: the same storage, a new version
    after = decoder(5)
    cache.rollback(0)
    expected = m(torch.tensor([[5]]), cache=cache, last_only=True)[0, -1]
    assert not torch.allclose(before, after)
    assert torch.allclose(after, expected, rtol=1e-4, atol=1e-4)
    decoder(6), decoder(7)
    k, v = cache.k.clone(), cache.v.clone()
    with pytest.raises(CacheOverflowError):
        decoder(8)
    assert cache.length == 3 and torch.equal(cache.k, k) and torch.equal(cache.v, v)
    with pytest.raises(ValueError, match="token"):
        decoder(m.cfg.vocab_size)


def test_one_token_decoder_from_rows_and_in_half_precision(monkeypatch):
    # embedded(row) is __call__(token) with the row given: bit for bit the same logits and state.
    # weights="float16" reads float16 panels: close to the float32 path, not equal to it. head=False
    # writes the cache and the state, and computes no logits.
    from specdec_lab.cpu import build as kernels
    from specdec_lab.core.kv_cache import KVCache
    from specdec_lab.cpu import OneTokenDecoder
    from specdec_lab.io.pair import tiny_model
    m = _untied(2)
    a, b = KVCache.for_model(m.cfg, 8), KVCache.for_model(m.cfg, 8)
    by_token, by_row = OneTokenDecoder(m, a), OneTokenDecoder(m, b, by_token=False)
    for t in (3, 9, 4):
        assert torch.equal(by_token(t), by_row.embedded(m.embed.weight[t].contiguous()))
        assert torch.equal(by_token.state, by_row.state)
    want = m.hidden(torch.tensor([[3, 9, 4]]))[0, -1]
    assert torch.allclose(by_row.state, want, atol=1e-5)
    assert by_row.embedded(m.embed.weight[1].contiguous(), head=False) is None and b.length == 4
    with pytest.raises(ValueError, match="by_token=False"):
        by_row(1)
    with pytest.raises(ValueError, match="row must be"):
        by_row.embedded(torch.zeros(m.cfg.dim + 1))
    assert b.length == 4
    if not kernels.has_half():
        pytest.skip("the kernel library was built without F16C (kernels.has_half() is False)")
    w = torch.randn(40, 70)
    p16 = kernels.pack(w, torch.float16)
    assert p16.dtype == torch.float16 and p16.data_ptr() % 64 == 0
    assert torch.equal(p16.float(), kernels.pack(w.half().float()))  # the same panels, rounded
    tied = tiny_model(0)  # no embedding table of its own: rows only
    assert OneTokenDecoder.supports(tied, KVCache.for_model(tied.cfg, 8), by_token=False, weights="float16")
    c = KVCache.for_model(m.cfg, 8)
    half = OneTokenDecoder(m, c, weights="float16")
    for t in (3, 9, 4):
        y = half(t)
    ref = m(torch.tensor([[3, 9, 4]]))[0, -1]
    assert torch.allclose(y, ref, rtol=1e-2, atol=1e-2) and not torch.equal(y, ref)
    ka, kc = a.k[..., :3, :], c.k[..., :3, :]
    assert (kc - ka).abs().max() < 5e-3 * ka.abs().max()  # float16 rounding, relative to the keys' scale


def test_one_token_decoder_refuses_what_it_does_not_cover():
    from specdec_lab.core.kv_cache import KVCache
    from specdec_lab.cpu import OneTokenDecoder
    from specdec_lab.paged import PagedSequenceCache
    from specdec_lab.io.pair import tiny_model
    tied, untied = tiny_model(0), _untied(0)
    half = _untied(0).to(torch.bfloat16)
    cases = [(tied, KVCache.for_model(tied.cfg, 8)),  # tied: the embedding is the head
             (untied, PagedSequenceCache.for_model(untied.cfg, 32, block_size=8)),  # paged
             (untied, KVCache.for_model(untied.cfg, 8, batch_size=2)),
             (half, KVCache.for_model(half.cfg, 8, dtype=torch.bfloat16))]
    for m, cache in cases:
        assert not OneTokenDecoder.supports(m, cache)
        with pytest.raises(ValueError, match="OneTokenDecoder needs"):
            OneTokenDecoder(m, cache)
    assert OneTokenDecoder.supports(untied, KVCache.for_model(untied.cfg, 8))


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_drafters_propose_the_same_with_a_plain_and_an_accelerated_draft(temperature):
    from specdec_lab import LookupThenModelDrafter, ModelDrafter, SpeculativeEngine
    from specdec_lab.io.pair import tiny_model
    target, draft = tiny_model(0, eos_token_ids=()), _untied(1, n_layers=1, eos_token_ids=())
    prompt = [3, 1, 4, 1, 5, 9, 2, 6, 3, 1, 4]
    runs = {}
    for name, d in (("plain", draft), ("accelerated", accelerated(draft))):  # float32: the same weights
        plain = ModelDrafter(d, 128, stop_below=0.3)
        mixed = LookupThenModelDrafter(d, 128, stop_below=0.3)  # long pending runs: several rows at once
        runs[name] = [SpeculativeEngine(target, dr, k=4, max_seq_len=128).generate(
            prompt, max_new_tokens=40, temperature=temperature, seed=7) for dr in (plain, mixed)]
    for a, b in zip(runs["plain"], runs["accelerated"]):
        assert a.tokens == b.tokens
        assert [(r.k, r.num_accepted) for r in a.steps] == [(r.k, r.num_accepted) for r in b.steps]


def test_a_draft_read_in_half_precision_rounds_its_logits_and_stays_lossless():
    from specdec_lab import ModelDrafter, SpeculativeEngine, autoregressive_generate
    from specdec_lab.io.pair import tiny_model
    target, draft = tiny_model(0, eos_token_ids=()), _untied(1, n_layers=2, eos_token_ids=())
    half = accelerated(draft, weights="float16")
    assert half.runner.weights == ("float16" if kernels.has_half() else "float32")
    assert accelerated(target).runner.weights == "float32"
    if not kernels.has_half():
        return
    logits = {}
    for name, m in (("float32", accelerated(draft)), ("float16", half)):
        d = ModelDrafter(m, 64)
        d.prefill([3, 1, 4, 1, 5])
        logits[name] = d._feed(torch.tensor([[5]]))
    a, b = logits["float32"], logits["float16"]
    assert not torch.equal(a, b), "half-precision weights must round something"
    assert torch.allclose(a, b, rtol=1e-2, atol=1e-2)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    expected = autoregressive_generate(target, prompt, max_new_tokens=30).tokens
    assert SpeculativeEngine(target, half, k=4, max_seq_len=128).generate(prompt, max_new_tokens=30).tokens == expected


# The target's own forward over a few rows (decode and verification) goes through FusedForward.

SHAPES = [dict(), dict(vocab_size=100, dim=48, n_heads=6, n_kv_heads=1, n_layers=3)]


def _forward(m, x, cache, fused):
    """An accelerated m's forward through its runner seam (fused), or around it (the eager code,
    over the fast modules), without rebuilding anything."""
    rows = m.runner
    assert rows is not None, "accelerate the model first"
    assert rows.applies(x, None, cache, None, None) or not fused, "the fused forward does not apply here"
    m.runner = rows if fused else None
    try:
        return m(x, cache=cache)
    finally:
        m.runner = rows


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("tied", [True, False])
def test_fused_forward_matches_the_eager_forward_over_a_few_rows(shape, tied):
    from specdec_lab.core.kv_cache import KVCache
    from specdec_lab.io.pair import tiny_model
    m = accelerate(tiny_model(4, tie_embeddings=tied, **shape))
    g = torch.Generator().manual_seed(1)
    eager, fused = KVCache.for_model(m.cfg, 80), KVCache.for_model(m.cfg, 80)
    prompt = torch.randint(0, m.cfg.vocab_size, (1, 20), generator=g)
    _forward(m, prompt, eager, False)  # 20 rows: the eager forward either way
    _forward(m, prompt, fused, False)
    for T in (1, 2, 5, 9, 16):
        x = torch.randint(0, m.cfg.vocab_size, (1, T), generator=g)
        a = _forward(m, x, eager, False)
        b = _forward(m, x, fused, True)
        assert b.shape == a.shape == (1, T, m.cfg.vocab_size)
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-4), f"T={T}: {(a - b).abs().max()}"
        assert fused.length == eager.length
    n = eager.length
    assert torch.allclose(eager.k[..., :n, :], fused.k[..., :n, :], rtol=1e-4, atol=1e-4)
    assert torch.allclose(eager.v[..., :n, :], fused.v[..., :n, :], rtol=1e-4, atol=1e-4)
    h = m.hidden(torch.tensor([[1, 2]]), cache=fused)
    h_copy = h.clone()
    m.hidden(torch.tensor([[3]]), cache=fused)
    assert torch.equal(h, h_copy), "hidden() must not hand out the fused forward's work buffer"


def test_the_fused_forward_sees_replaced_weights_and_modules(monkeypatch):
    """FusedForward keeps its pointers while the weights stay put; a weight written in place, a
    Parameter replaced, a module replaced and a restricted head must each be seen."""
    from torch import nn
    from specdec_lab.core.kv_cache import KVCache
    from specdec_lab.core.model import Linear
    from specdec_lab.drafters.vocab_subset import restrict_vocab
    m = accelerate(_untied(6, n_layers=2))
    x = torch.tensor([[3, 1, 4]])

    def both():
        out = []
        for fused in (False, True):
            cache = KVCache.for_model(m.cfg, 8)
            with torch.no_grad():
                out.append(_forward(m, x, cache, fused))
        assert torch.allclose(out[0], out[1], rtol=1e-4, atol=1e-4), (out[0] - out[1]).abs().max()
        return out[1]

    first = both()
    with torch.no_grad():
        m.layers[1].attn.wo.weight.mul_(0.5)  # in place
    second = both()
    m.layers[0].mlp.w13.weight = nn.Parameter(torch.randn_like(m.layers[0].mlp.w13.weight) * 0.05)
    third = both()
    wqkv = m.layers[1].attn.wqkv
    fresh = Linear(*wqkv.weight.shape)
    with torch.no_grad():
        fresh.weight.copy_(wqkv.weight.flip(0))
    m.layers[1].attn.wqkv = fresh  # a new module
    fourth = both()
    m.norm.weight.data = m.norm.weight.data * 2.0  # another tensor under the same Parameter
    fifth = both()
    restrict_vocab(m, torch.arange(0, m.cfg.vocab_size, 2))
    sixth = both()
    for a, b in [(first, second), (second, third), (third, fourth), (fourth, fifth)]:
        assert not torch.allclose(a, b)
    assert torch.isinf(sixth[..., 1::2]).all() and torch.isfinite(sixth[..., ::2]).all()


def test_a_fused_row_is_bit_for_bit_the_same_whatever_the_row_count(monkeypatch):
    """Greedy speculative decoding equals autoregressive decoding only if a token's logits do not
    depend on how many tokens the forward held: decode holds one, verification K+1."""
    from specdec_lab.core.kv_cache import KVCache
    from specdec_lab.io.pair import tiny_model
    m = accelerate(tiny_model(5, **SHAPES[1]))
    cache = KVCache.for_model(m.cfg, 64)
    m(torch.randint(0, 100, (1, 30), generator=torch.Generator().manual_seed(2)), cache=cache)
    x = torch.randint(0, 100, (1, 9), generator=torch.Generator().manual_seed(3))
    together = _forward(m, x, cache, True)[0]
    k_together = cache.k[..., 30:39, :].clone()
    cache.rollback(30)
    alone = torch.cat([_forward(m, x[:, i:i + 1], cache, True)[0] for i in range(9)])
    assert torch.equal(together, alone)
    assert torch.equal(k_together, cache.k[..., 30:39, :])


def test_the_fused_forward_is_used_only_where_it_applies():
    from specdec_lab.core.kv_cache import KVCache
    from specdec_lab.core.masks import verification_mask
    from specdec_lab.paged import PagedSequenceCache
    from specdec_lab.io.pair import tiny_model
    m = tiny_model(0)
    rows = FusedRows(m)
    cache = KVCache.for_model(m.cfg, 40)
    cache.length = 5
    x = torch.zeros(1, 3, dtype=torch.long)
    with torch.no_grad():
        assert rows.applies(x, None, cache, None, None) == "chain"
        assert rows.applies(x, torch.arange(5, 8), cache, None, None) == "chain"  # the default positions
        assert rows.applies(x, None, cache, verification_mask(5, 3), None) == "mask"  # a tree's, say
        assert rows.applies(x, torch.tensor([5, 6, 6]), cache, verification_mask(5, 3), None) == "mask"
        refused = {
            "a mask of another shape": (x, None, cache, verification_mask(4, 3)),
            "other positions": (x, torch.arange(6, 9), cache, None),
            "no cache": (x, None, None, None),
            "a paged cache": (x, None, PagedSequenceCache.for_model(m.cfg, 32, block_size=8), None),
            "batch 2": (torch.zeros(2, 3, dtype=torch.long), None, KVCache.for_model(m.cfg, 40, batch_size=2), None),
            "more rows than the kernel takes": (torch.zeros(1, kernels.MAX_ROWS + 1, dtype=torch.long), None, cache,
                                                None),
        }
        for why, args in refused.items():
            assert not rows.applies(*args, None), why
            assert rows.logits(*args, False) is None, why
        assert not FusedForward.supports(tiny_model(0).to(torch.bfloat16))
        assert not FusedForward.supports(tiny_model(0, qkv_bias=True))  # biases: eager
        assert accelerate(tiny_model(0, qkv_bias=True)).runner is None, "accelerate must skip what it cannot run"
    trainable = tiny_model(0).requires_grad_(True)
    trainable_rows = FusedRows(trainable)
    assert not trainable_rows.applies(x, None, cache, None, None)  # a backward needs the eager graph
    with torch.no_grad():
        assert trainable_rows.applies(x, None, cache, None, None)


def test_a_failed_fused_forward_changes_nothing():
    from specdec_lab.core.kv_cache import CacheOverflowError, KVCache
    from specdec_lab.io.pair import tiny_model
    m = tiny_model(0)
    cache = KVCache.for_model(m.cfg, 6)
    with torch.no_grad():
        m(torch.tensor([[1, 2, 3, 4]]), cache=cache)
        k, v = cache.k.clone(), cache.v.clone()
        with pytest.raises(CacheOverflowError):
            m(torch.tensor([[5, 6, 7]]), cache=cache)
        assert cache.length == 4 and torch.equal(cache.k, k) and torch.equal(cache.v, v)
        fused = FusedForward(m)
        for bad in (torch.zeros(2, m.cfg.dim + 1), torch.zeros(kernels.MAX_ROWS + 1, m.cfg.dim),
                    torch.zeros(2, m.cfg.dim, dtype=torch.float64)):
            with pytest.raises(ValueError, match="rows must"):
                fused(bad, cache)
        assert cache.length == 4 and torch.equal(cache.k, k)


def test_two_threads_can_decode_with_one_model_at_once():
    """Two engines may share a target, each thread with its own cache. The kernel runs without the
    GIL, so the fused forward's scratch memory must be each thread's own: shared, one thread's
    hidden states and attention scores are written over by the other's mid-call."""
    import threading
    from specdec_lab.core.kv_cache import KVCache
    m = accelerate(_untied(7, dim=128, n_layers=4, vocab_size=512))
    prompts = [torch.randint(0, 512, (1, 40), generator=torch.Generator().manual_seed(s)) for s in (1, 2)]
    steps = 60

    @torch.inference_mode()
    def decode(prompt, out):  # greedy, one token a step, every step's logits and hidden state kept
        cache = KVCache.for_model(m.cfg, 40 + steps)
        x = prompt
        for _ in range(steps):
            h = m.hidden(x, cache=cache)[0, -1:]
            logits = m.head(h)[0]
            out.append((logits, h[0].clone()))
            x = logits.argmax().view(1, 1)

    alone = [[], []]
    for prompt, out in zip(prompts, alone):
        decode(prompt, out)
    assert m.runner is not None, "the fused forward must be the one under test"
    for _ in range(3):
        together = [[], []]
        threads = [threading.Thread(target=decode, args=(p, o)) for p, o in zip(prompts, together)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for a, b in zip(alone, together):
            assert len(a) == len(b) == steps
            for i, ((la, ha), (lb, hb)) in enumerate(zip(a, b)):
                assert torch.equal(ha, hb) and torch.equal(la, lb), f"step {i} differs when two threads decode"


def test_accelerate_swaps_the_modules_once_and_eager_undoes_it_for_a_block():
    from specdec_lab.cpu import eager, is_accelerated
    from specdec_lab.io.pair import tiny_model
    m = tiny_model(0)
    x = torch.tensor([[5, 3, 2]])
    with torch.no_grad():
        want = m(x)
        accelerate(m)
        kinds = [type(mod) for mod in m.modules()]
        accelerate(m)  # a second call finds nothing left to swap
        assert [type(mod) for mod in m.modules()] == kinds and FastLinear in kinds and FastRMSNorm in kinds
        assert is_accelerated(m) and torch.allclose(m(x), want, atol=1e-4)
        panels = {id(w): dict(_PANELS.get(w, {})) for w in (mod.weight for mod in m.modules()
                                                                 if isinstance(mod, Linear))}
        with eager(m):
            assert not is_accelerated(m) and m.runner is None
            assert torch.equal(m(x), want), "inside eager() the model must be the plain one"
        assert is_accelerated(m) and m.runner is not None
        assert torch.allclose(m(x), want, atol=1e-4)
        for w in (mod.weight for mod in m.modules() if isinstance(mod, Linear)):
            for dtype, copy in panels[id(w)].items():
                assert _PANELS[w][dtype] is copy, "eager() must not make the weights be packed again"
    with pytest.raises(ValueError, match="weights must be one of"):
        accelerate(m, weights="int3")
    with pytest.raises(TypeError, match="model must be a specdec_lab Transformer"):
        accelerate(torch.nn.Linear(2, 2))
