"""The decoder against transformers: same weights, same logits (float32, max abs error <= TOL).

Two kinds of model: the real default target (SmolLM2-135M-Instruct, 30 layers),
and tiny random Llama / Qwen2 configurations built by transformers itself, which
cover what SmolLM2 does not: untied embeddings, Llama-3 rope scaling, q/k/v biases.
Each parity check is run both as one full pass and as a chunked pass through a
KVCache (prefill, a multi-token chunk, then single tokens), because decode and
verification take the chunked path. The parity tests run twice: on the plain model, and on
its fast twin (cpu.accelerated: the CPU kernels, and a few rows through a contiguous cache in one
call), which must compute the same logits.
"""
import dataclasses
import json
import os
import subprocess
import sys

import pytest
import torch
import transformers

from specdec_lab.core.kv_cache import KVCache
from specdec_lab.core.model import Linear, Transformer, apply_rope, init_weights
from specdec_lab.cpu import accelerated
from specdec_lab.cpu.linear import _PANELS, CAN_PACK_BF16, FastLinear
from specdec_lab.core.text import encode_prompt
from specdec_lab.io.weights import LAYOUT, build_model, config_from_hf, from_hf_state_dict

# Logits of the default target reach about 30 in magnitude; two float32 GEMMs that sum in a
# different order (MKL's, oneDNN's packed one, transformers') differ by ~1e-4 there. A
# conversion or layer bug shows up as 1e-2 or more. The order of the sums depends on the
# processor: the largest difference measured was 9.4e-5 (plain) and 1.3e-4 (fast twin) on an
# AVX-512 machine, under 1e-4 on an AVX2 one, so the bound sits at 4.5 times the largest,
# still 17 times under a bug.
TOL = 6e-4
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}


@pytest.fixture(params=["fast", "plain"])
def prepared(request):
    """The model as built (plain), or its fast twin sharing the weights (cpu.accelerated)."""
    return accelerated if request.param == "fast" else (lambda model: model)


TEXT = ("Speculative decoding lets a small draft model propose several tokens, and the large target "
        "model checks all of them in one forward pass. Explain, step by step and with a worked example, "
        "why the output distribution is exactly the target's, and when the method saves time.")


def max_diff(a, b):
    return (a.float() - b.float()).abs().max().item()


def chunked_logits(model, ids, chunks):
    """Logits (1, T, V) from feeding `ids` through a KVCache in pieces of the given sizes."""
    cache = KVCache.for_model(model.cfg, ids.shape[1])
    out, start = [], 0
    for n in chunks:
        out.append(model(ids[:, start:start + n], cache=cache))
        start += n
    assert start == ids.shape[1] and cache.length == start
    return torch.cat(out, dim=1)


def randomize_(hf_model, seed, std=0.1):
    """Weights large enough that a wrong rope, bias or head changes logits by O(1):
    transformers' own init (std 0.02, zero biases, unit norms) hides such bugs."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in hf_model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith("bias"):
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(std * torch.randn(p.shape, generator=g))
    return hf_model


def tiny_hf(kind, seed=0):
    """A random transformers model: GQA with 6 query heads sharing 2 key/value heads."""
    common = dict(vocab_size=97, hidden_size=96, intermediate_size=192, num_hidden_layers=2,
                  num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=256,
                  rms_norm_eps=1e-6, rope_theta=10000.0)
    if kind == "qwen2":
        config = transformers.Qwen2Config(tie_word_embeddings=True, **common)
        model = transformers.Qwen2ForCausalLM(config)
    else:
        extra = {"rope_scaling": dict(LLAMA3_ROPE)} if kind == "llama3-rope" else {}
        if kind == "head-dim-32":  # head_dim set explicitly, H * D != hidden size (as in some Llama variants)
            extra = {"head_dim": 32}
        config = transformers.LlamaConfig(tie_word_embeddings=(kind == "tied"), **common, **extra)
        model = transformers.LlamaForCausalLM(config)
    return randomize_(model.eval(), seed)


def convert(hf_model):
    cfg = config_from_hf(hf_model.config.to_dict())
    return build_model(cfg, from_hf_state_dict(hf_model.state_dict(), cfg))


def token_ids(n, vocab, seed=1):
    return torch.randint(0, vocab, (1, n), generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------- default target (slow)

@pytest.fixture(scope="module")
def prompt64(default_target):
    ids = encode_prompt(default_target.tokenizer, TEXT)  # chat template + text
    assert len(ids) >= 64, "the parity text must be at least 64 tokens long"
    return torch.tensor([ids[:64]])


@pytest.fixture(scope="module")
def hf_logits64(hf_target, prompt64):
    with torch.no_grad():
        return hf_target(prompt64).logits  # (1, 64, V)


@pytest.mark.slow
def test_default_target_has_smollm2_135m_shape(default_target):
    cfg = default_target.cfg
    assert (cfg.n_layers, cfg.dim, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.vocab_size) == \
        (30, 576, 9, 3, 64, 49152), "the converted default target is not SmolLM2-135M's shape"
    assert cfg.tie_embeddings, "SmolLM2 ties its embeddings; an untied head would be a copy out of sync"
    assert default_target.tokenizer.eos_token_id in cfg.eos_token_ids, \
        "generation would not stop at the tokenizer's end-of-turn token"
    assert default_target.dtype == torch.float32


@pytest.mark.slow
def test_default_target_full_pass_logits_equal_transformers(default_target, prepared, prompt64, hf_logits64):
    default_target = prepared(default_target)
    with torch.no_grad():
        ours = default_target(prompt64)
    assert ours.shape == hf_logits64.shape == (1, 64, 49152)
    assert ours.dtype == torch.float32
    d = max_diff(ours, hf_logits64)
    assert d <= TOL, f"decoder logits differ from transformers' by {d:.2e} (a conversion or layer bug)"


@pytest.mark.slow
def test_default_target_chunked_cache_pass_equals_transformers_full_pass(default_target, prepared, prompt64, hf_logits64):
    default_target = prepared(default_target)
    with torch.no_grad():
        ours = chunked_logits(default_target, prompt64, [40, 10] + [1] * 14)
    d = max_diff(ours, hf_logits64)
    assert d <= TOL, (f"prefill 40 + chunk 10 + single tokens through the KV cache differ from transformers "
                      f"by {d:.2e}: cached positions, rope offsets or the chunk mask are wrong")


@pytest.mark.slow
def test_default_target_last_only_is_the_last_row_of_the_full_pass(default_target, prepared, prompt64, hf_logits64):
    default_target = prepared(default_target)
    with torch.no_grad():
        last = default_target(prompt64, last_only=True)
    assert last.shape == (1, 1, 49152)
    assert max_diff(last[0, -1], hf_logits64[0, -1]) <= TOL, "last_only returned another position's logits"


# ---------------------------------------------------------------- tiny transformers-built configs

@pytest.mark.parametrize("kind", ["tied", "untied", "llama3-rope", "head-dim-32", "qwen2"])
def test_tiny_random_model_logits_equal_transformers_full_and_chunked(kind, prepared):
    hf = tiny_hf(kind)
    model = prepared(convert(hf))
    ids = token_ids(200, 97)  # 200 > 64: beyond llama3's original_max_position_embeddings
    with torch.no_grad():
        ref = hf(ids).logits
        full = model(ids)
        chunked = chunked_logits(model, ids, [120, 30, 17] + [1] * 33)
    d_full, d_chunked = max_diff(full, ref), max_diff(chunked, ref)
    assert d_full <= TOL, f"{kind}: full-pass logits differ from transformers' by {d_full:.2e}"
    assert d_chunked <= TOL, f"{kind}: chunked cached logits differ from transformers' by {d_chunked:.2e}"


def test_tiny_configs_convert_to_the_expected_model_config():
    cfgs = {kind: config_from_hf(tiny_hf(kind).config.to_dict()) for kind in
            ["tied", "untied", "llama3-rope", "qwen2"]}
    assert cfgs["tied"].tie_embeddings and not cfgs["untied"].tie_embeddings
    assert cfgs["tied"].rope_scaling is None, "default rope must not be treated as scaled"
    assert cfgs["llama3-rope"].rope_scaling["rope_type"] == "llama3"
    assert cfgs["qwen2"].qkv_bias and not cfgs["tied"].qkv_bias, "only Qwen2 has q/k/v biases"
    for cfg in cfgs.values():
        assert (cfg.n_heads, cfg.n_kv_heads, cfg.head_dim) == (6, 2, 16), "GQA head counts lost in conversion"


def test_llama3_rope_scaling_matters_so_the_parity_check_can_see_it():
    """Guards the test itself: without the scaling the logits beyond position 64 must differ a lot,
    otherwise the parity test above would pass even if the scaling were ignored."""
    hf = tiny_hf("llama3-rope")
    cfg = config_from_hf(hf.config.to_dict())
    plain = build_model(dataclasses.replace(cfg, rope_scaling=None), from_hf_state_dict(hf.state_dict(), cfg))
    ids = token_ids(200, 97)
    with torch.no_grad():
        d = max_diff(plain(ids), hf(ids).logits)
    assert d > 0.1, f"ignoring llama3 rope scaling changed logits by only {d:.2e}; the parity test is blind to it"


def test_qwen2_qkv_bias_matters_so_the_parity_check_can_see_it():
    hf = tiny_hf("qwen2")
    cfg = config_from_hf(hf.config.to_dict())
    sd = {k: v for k, v in from_hf_state_dict(hf.state_dict(), cfg).items() if not k.endswith("wqkv.bias")}
    no_bias = build_model(dataclasses.replace(cfg, qkv_bias=False), sd)
    ids = token_ids(50, 97)
    with torch.no_grad():
        d = max_diff(no_bias(ids), hf(ids).logits)
    assert d > 0.1, f"dropping Qwen2's q/k/v biases changed logits by only {d:.2e}; the parity test is blind to it"


# ---------------------------------------------------------------- the decoder on its own

def test_batched_forward_equals_one_row_at_a_time(tiny_pair, prepared):
    model = prepared(tiny_pair.target)
    ids = token_ids(24, model.cfg.vocab_size).view(2, 12)
    with torch.no_grad():
        both = model(ids)
        rows = torch.cat([model(ids[i:i + 1]) for i in range(2)])
    # 24 rows take PyTorch's kernels, 12 the project's (kernels.MAX_ROWS): their sums round
    # differently, by about 1e-5 here. A row leaking into another would move logits by O(1).
    assert max_diff(both, rows) <= 1e-4, "one batch row leaks into another"


def test_explicit_input_pos_equals_the_cache_default(tiny_pair, prepared):
    model = prepared(tiny_pair.target)
    ids = token_ids(9, model.cfg.vocab_size)
    with torch.no_grad():
        c1, c2 = KVCache.for_model(model.cfg, 16), KVCache.for_model(model.cfg, 16)
        model(ids[:, :6], cache=c1)
        model(ids[:, :6], input_pos=torch.arange(6), cache=c2)
        a = model(ids[:, 6:], cache=c1)
        b = model(ids[:, 6:], input_pos=torch.arange(6, 9), cache=c2)
    assert max_diff(a, b) == 0.0, "input_pos defaults to something other than [cache.length, cache.length + T)"


def test_uncached_causal_pass_equals_cached_masked_pass(tiny_pair, prepared):
    """Training takes the fused causal kernel, decode the explicit-mask path: they must agree."""
    model = prepared(tiny_pair.target)
    ids = token_ids(30, model.cfg.vocab_size)
    with torch.no_grad():
        plain = model(ids)
        cached = model(ids, cache=KVCache.for_model(model.cfg, 30))
    assert max_diff(plain, cached) <= 1e-4, "the training path and the cached path compute different attention"


def test_later_tokens_do_not_change_earlier_logits(tiny_pair, prepared):
    model = prepared(tiny_pair.target)
    ids = token_ids(20, model.cfg.vocab_size)
    other = ids.clone()
    other[0, 10:] = (other[0, 10:] + 1) % model.cfg.vocab_size
    with torch.no_grad():
        a, b = model(ids), model(other)
    assert max_diff(a[:, :10], b[:, :10]) <= 1e-5, "the causal mask lets a position see the future"


@pytest.mark.gpu
def test_decoder_on_cuda_matches_cpu():
    cfg = _tiny_cfg()
    cpu = init_weights(Transformer(cfg), seed=0, std=0.1).eval()
    gpu = init_weights(Transformer(cfg), seed=0, std=0.1).eval().cuda()
    ids = token_ids(40, cfg.vocab_size)
    with torch.no_grad():
        a = cpu(ids)
        b = gpu(ids.cuda(), cache=KVCache.for_model(cfg, 40, device="cuda")).cpu()
    assert max_diff(a, b) <= 1e-3, "the decoder computes something else on CUDA"


def _tiny_cfg():
    from specdec_lab.core.config import ModelConfig
    return ModelConfig(vocab_size=97, dim=96, n_layers=2, n_heads=6, n_kv_heads=2, head_dim=16,
                       intermediate_size=192, max_seq_len=256)


def test_fast_linear_keeps_one_copy_of_a_float32_weight_and_follows_weight_changes():
    """A few rows and many (a prefill) both go through the panel kernel: a float32 weight has one copy,
    its panels, and no oneDNN packed copy beside them. bfloat16 goes through oneDNN's prepacked copy
    where oneDNN packs it. Both follow in-place changes to W."""
    torch.manual_seed(0)
    lin = Linear(64, 96)
    torch.nn.init.normal_(lin.weight)
    fast = FastLinear(lin)
    assert fast.weight is lin.weight, "the fast twin must share the weight, not copy it"
    with torch.no_grad():
        for x in (torch.randn(3, 64), torch.randn(3, 10, 64)):  # 3 rows and 30
            assert torch.allclose(fast(x), x @ lin.weight, atol=1e-4)
            first = _PANELS[lin.weight][torch.float32]
            lin.weight.mul_(-1)  # an in-place change (an optimizer step, load_state_dict) must be seen
            assert torch.allclose(fast(x), x @ lin.weight, atol=1e-4), "a stale panel copy was used"
            assert _PANELS[lin.weight][torch.float32] is not first
        assert fast._packed is None, "a float32 weight got a second (oneDNN) copy"
        idx = torch.tensor([[0, 95, 17], [16, 15, 48]])  # W's columns, read from the panels (a tied embedding)
        assert torch.equal(fast.columns(idx), lin.columns(idx)) and fast.columns(idx).shape == (2, 3, 64)
        if CAN_PACK_BF16:
            half_linear = Linear(64, 96)
            torch.nn.init.normal_(half_linear.weight)  # Linear allocates W uninitialised: NaN would fail the equality
            half = FastLinear(half_linear.to(torch.bfloat16))
            xb = torch.randn(30, 64, dtype=torch.bfloat16)
            first = (half(xb), half._packed)
            assert first[1] is not None, "bfloat16 goes through oneDNN's packed copy"
            half.weight.mul_(-1)
            assert torch.equal(half(xb), -first[0]) and half._packed is not first[1], "a stale packed copy was used"
    x = torch.randn(3, 10, 64)
    y = fast(x).sum()  # grad enabled and W trainable: the plain product, which has a backward
    y.backward()
    assert lin.weight.grad is not None and torch.allclose(lin.weight.grad, x.reshape(-1, 64).sum(0)[:, None].expand(64, 96), atol=1e-4)


def test_rope_is_the_rotate_half_formula():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 5, 8)  # (B, T, heads, D)
    angles = torch.randn(3, 4)
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()  # (T, D)
    got = apply_rope(x, cos[:, None], sin[:, None])
    x1, x2 = x[..., :4], x[..., 4:]
    c, s = angles.cos()[:, None], angles.sin()[:, None]
    assert torch.allclose(got, torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], -1), atol=1e-6)


@pytest.mark.parametrize("rows", [1, 3])
def test_bfloat16_linear_runs_whether_or_not_onednn_packs_bfloat16_here(rows):
    # On a processor without bfloat16 instructions oneDNN's reorder raises; the fast Linear must then
    # fall back to PyTorch's product instead of failing (cpu.linear.CAN_PACK_BF16 says which path this is).
    lin = Linear(64, 96).to(torch.bfloat16)
    torch.nn.init.normal_(lin.weight, std=0.1)
    x = torch.randn(rows, 64, dtype=torch.bfloat16)
    with torch.inference_mode():
        y = FastLinear(lin)(x)
    assert y.dtype == torch.bfloat16 and y.shape == (rows, 96)
    torch.testing.assert_close(y.float(), x.float() @ lin.weight.detach().float(), atol=0.05, rtol=0.02)


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["read", "mapped"])
def test_loading_keeps_no_second_copy_of_any_weight(default_target_dir, tmp_path, layout):
    """The resident memory a load adds, and its peak. Read (a folder of Hugging Face files only): about
    the weights' bytes. Reading the safetensors file through a memory map kept the whole file's pages
    resident while the model was converted beside it: a peak of 1.8 times the weights' bytes (and, while a
    layer norm's weight was still a view of the map, 2.1 times after the load); the reader now reads a
    tensor at a time into memory it owns, and the allocator's freed buffers go back to the system.
    Mapped (the folder holds the project's layout, lab/layout.pt): a tenth of it at most (measured: 5%,
    the rotary table and the modules), as nothing is read until it is used.
    Measured in a fresh process, after the tokenizer (and with it transformers) has loaded, so that only
    the weights are counted."""
    folder = default_target_dir
    if layout == "read":  # the same files without the layout
        folder = tmp_path / "hf"
        folder.mkdir()
        for f in default_target_dir.iterdir():
            if f.is_file():
                (folder / f.name).symlink_to(f)
    code = f"""
import json
from pathlib import Path
from specdec_lab.io.weights import load_model, load_tokenizer
def status(field):
    return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith(field))
load_tokenizer({str(folder)!r})
before = status("VmRSS")
model, _ = load_model({str(folder)!r})
print(json.dumps([status("VmRSS") - before, status("VmHWM") - before,
                  sum(p.numel() * p.element_size() for p in model.parameters())]))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    added, peak, weights = json.loads(out.stdout.strip().splitlines()[-1])
    # The peak moves from load to load: 1.08 to 1.29 times the weights over 8 fresh loads of the read layout
    # on this machine (the allocator's timing). A second copy of the weights, the bug this guards against,
    # peaked at 1.8, so the bound sits between the two.
    most, highest = (1.06, 1.5) if layout == "read" else (0.1, 0.15)
    assert added < most * weights, f"loading added {added / 1e6:.0f} MB resident for {weights / 1e6:.0f} MB of weights"
    assert peak < highest * weights, f"loading peaked {peak / 1e6:.0f} MB above its start for {weights / 1e6:.0f} MB of weights"


@pytest.mark.slow
def test_the_default_pair_and_its_fast_path_hold_one_copy_of_each_weight(default_target_dir):
    """The draft load_default_pair gives (its head restricted to the shipped vocabulary subset) and the
    fast twins share every weight with the models loaded once per process: the twin that restricts the
    head once was a deep copy, a second draft. And after an engine has answered (a prefill of more than
    16 rows and decode), each float32 product of the target has one copy beside its weight, the panels:
    no oneDNN packed copy for the prefill, as there was. The target's weights themselves are mapped from
    its layout file, and once their panels are built their pages go back: the mapping keeps less than
    8 MB resident (its tensors' edges and the norms), also while another process maps the same file
    and reads all of it (as a second kernel of the lab does). Reading a tied embedding from W instead of
    the head's panels brought back tens of MB, and handing the pages back with MADV_PAGEOUT alone kept
    all 538 MB where another process mapped them. In a fresh process, where nothing else (a self-draft's
    rounded panels) has packed the same weights."""
    code = f"""
import json, torch
from specdec_lab import SpeculativeEngine, load_default_pair
from specdec_lab.cpu.linear import _PANELS, FastLinear
from specdec_lab.io.pair import default_draft_dir, load_model_cached
pair = load_default_pair()
own = []
for fast, base in ((pair.target, load_model_cached({str(default_target_dir)!r})),
                   (pair.draft, load_model_cached(default_draft_dir()))):
    shared = {{p.data_ptr() for p in base.parameters()}}
    own += [n for n, p in fast.named_parameters() if p.data_ptr() not in shared and not n.startswith("head.proj")]
SpeculativeEngine(pair.target, pair.draft, k=2).generate("Summarise: " + "the river ran past the mill " * 12,
                                                          max_new_tokens=8)
linears = [m for m in pair.target.modules() if isinstance(m, FastLinear)]
maps = open("/proc/self/smaps").read().split("\\n")
mapped = [int(next(m for m in maps[i:] if m.startswith("Rss:")).split()[1]) * 1024
          for i, l in enumerate(maps) if l.endswith("/lab/layout.pt")]
print(json.dumps([own, len(linears), sum(m._packed is not None for m in linears),
                  sorted({{str(d) for m in linears for d in _PANELS.get(m.weight, {{}})}}), mapped]))
"""
    reader = f"""
import sys, torch
sd = torch.load({str(default_target_dir / LAYOUT)!r}, mmap=True, weights_only=True)
print(sum(float(t.sum()) for t in sd.values()), flush=True)  # every page read, and kept mapped
sys.stdin.read()
"""
    other = subprocess.Popen([sys.executable, "-c", reader], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        other.stdout.readline()
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                             env={**os.environ, "OMP_NUM_THREADS": "1"})
    finally:
        other.communicate("", timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    own, n_linears, onednn, panel_dtypes, mapped = json.loads(out.stdout.strip().splitlines()[-1])
    assert mapped and sum(mapped) < 8e6, f"the target's mapped weights keep {sum(mapped) / 1e6:.1f} MB resident"
    assert not own, f"{own[:3]} are copies of the loaded weights"
    assert n_linears > 0 and onednn == 0, f"{onednn} float32 weights got a oneDNN copy"
    assert panel_dtypes == ["torch.float32"], panel_dtypes
