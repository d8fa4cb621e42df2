"""Prefill: the fused attention kernel for long queries and the CPU runner's chunks against the one eager
forward they replace (the cache, the next logits, the states a feature drafter reads, greedy output),
and the prefill benchmark on tiny stand-ins."""
import json
import statistics

import pytest
import torch

import specdec_lab as sl
from specdec_lab.bench import prefill as bench
from specdec_lab.core.attention import LONG_QUERY, grouped_attention, grouped_attention_reference
from specdec_lab.core.kv_cache import CacheOverflowError, KVCache
from specdec_lab.core.masks import verification_mask
from specdec_lab.cpu import accelerated
from specdec_lab.cpu import fused as fused_module
from specdec_lab.cpu.fused import FusedRows
from specdec_lab.cpu.prefill import PREFILL_CHUNK, chunk_applies, chunked_hidden
from specdec_lab.drafters import Eagle3Draft
from specdec_lab.drafters.feature import FeatureDraft

LONG = PREFILL_CHUNK + 150  # crosses one chunk boundary and ends inside the second chunk


def tiny(seed=0, **kw):
    return sl.tiny_model(seed, max_seq_len=1024, **kw)


def ids(n, seed=0, vocab=64):
    return torch.randint(0, vocab, (1, n), generator=torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------------------- attention


@pytest.mark.parametrize("L", [0, 37])
def test_long_query_attention_is_the_two_matmul_form(L):
    g = torch.Generator().manual_seed(L)
    T = LONG_QUERY + 21
    q = torch.randn(1, 6, T, 16, generator=g)  # (B, H, T, D): three query heads per key/value head
    k, v = torch.randn(2, 1, 2, L + T, 16, generator=g)  # (B, Hkv, L+T, D) each
    holes = verification_mask(L, T).clone()
    holes[..., ::3, : L // 2] = float("-inf")  # a tree-like mask: some rows lose part of the cache
    for mask in (verification_mask(L, T), holes, None):
        got, want = grouped_attention(q, k, v, mask), grouped_attention_reference(q, k, v, mask)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(grouped_attention(q, k, v, None), grouped_attention(q, k, v, verification_mask(L, T)),
                              atol=1e-3), "the mask must matter, or the comparison proves nothing"


def test_decode_and_verification_keep_the_two_matmuls_bit_for_bit():
    g = torch.Generator().manual_seed(0)
    for T in (1, 5, LONG_QUERY):
        q, k, v = torch.randn(1, 4, T, 16, generator=g), torch.randn(1, 2, T + 9, 16, generator=g), \
            torch.randn(1, 2, T + 9, 16, generator=g)
        mask = verification_mask(9, T)
        assert torch.equal(grouped_attention(q, k, v, mask), grouped_attention_reference(q, k, v, mask))


# ----------------------------------------------------------------------------- chunks against one forward


@pytest.mark.parametrize("chunk,start", [(7, 0), (100, 0), (PREFILL_CHUNK, 0), (100, 11)])
def test_chunked_prefill_leaves_the_cache_and_next_logits_of_one_forward(chunk, start):
    m = tiny()
    x = ids(LONG)
    one, chunked = KVCache.for_model(m.cfg, 600), KVCache.for_model(m.cfg, 600)
    with torch.inference_mode():
        if start:  # a cache already holding a few tokens
            for cache in (one, chunked):
                m(ids(start, seed=1), cache=cache)
        want = m.eager_hidden(x, cache=one)
        got = chunked_hidden(m, x, chunked, chunk=chunk)
        n = start + LONG
        assert one.length == chunked.length == n
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(chunked.k[..., :n, :], one.k[..., :n, :], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(chunked.v[..., :n, :], one.v[..., :n, :], atol=1e-5, rtol=1e-5)
        nxt = torch.tensor([[5]])
        torch.testing.assert_close(m(nxt, cache=chunked), m(nxt, cache=one), atol=1e-5, rtol=1e-5)


def test_a_chunk_that_forgot_the_earlier_ones_would_be_seen():
    """The comparison above can fail: chunks that each start from an empty cache give other states."""
    m = tiny()
    x = ids(LONG)
    with torch.inference_mode():
        want = m.eager_hidden(x, cache=KVCache.for_model(m.cfg, 600))
        broken = torch.cat([m.eager_hidden(x[:, s:s + 100], cache=KVCache.for_model(m.cfg, 600))
                            for s in range(0, LONG, 100)], dim=1)
    assert not torch.allclose(broken[:, 100:], want[:, 100:], atol=1e-3)


def test_the_cpu_runner_takes_a_long_prompt_in_chunks(monkeypatch):
    plain = tiny()
    fast = accelerated(plain)
    assert isinstance(fast.runner, FusedRows)
    calls = []
    real = type(fast).eager_hidden
    monkeypatch.setattr(type(fast), "eager_hidden", lambda self, t, *a, **kw: (calls.append(t.shape[1]),
                                                                                real(self, t, *a, **kw))[1])
    x = ids(LONG)
    with torch.inference_mode():
        a, b = KVCache.for_model(plain.cfg, 600), KVCache.for_model(plain.cfg, 600)
        want = plain(x, cache=a)
        calls.clear()
        got = fast(x, cache=b)
        assert calls == [PREFILL_CHUNK, LONG - PREFILL_CHUNK], calls
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(b.k[..., :LONG, :], a.k[..., :LONG, :], atol=1e-5, rtol=1e-5)
        last = fast(ids(LONG, seed=3), cache=KVCache.for_model(plain.cfg, 600), last_only=True)
        assert last.shape == (1, 1, plain.cfg.vocab_size)


def test_the_runner_hands_back_every_prompt_position_state_and_layer():
    plain = tiny(n_layers=3)
    fast = accelerated(plain)
    x = ids(LONG)
    embeds = torch.randn(1, LONG, plain.cfg.dim, generator=torch.Generator().manual_seed(4))
    with torch.inference_mode():
        for kw in (dict(), dict(layers=(0, 2)), dict(embeds=embeds)):
            want = plain.hidden(x, cache=KVCache.for_model(plain.cfg, 600), **kw)
            got = fast.hidden(x, cache=KVCache.for_model(plain.cfg, 600), **kw)
            want, got = (want, got) if "layers" in kw else ((want,), (got,))
            for w, g in zip(want, got):  # the residual stream is large: oneDNN's products round it
                assert g.shape[1] == LONG
                torch.testing.assert_close(g, w, atol=1e-3, rtol=1e-3)


def test_chunks_apply_only_to_a_prefill_they_reproduce():
    m = accelerated(tiny())
    cache = KVCache.for_model(m.cfg, 600)
    x = ids(LONG)
    with torch.no_grad():
        assert chunk_applies(m, x, None, cache, None)
        assert chunk_applies(m, x, torch.arange(LONG), cache, None)  # the default positions
        refused = {"a short prompt": (ids(PREFILL_CHUNK), None, cache, None),
                   "an explicit mask": (x, None, cache, verification_mask(0, LONG)),
                   "other positions": (x, torch.arange(1, LONG + 1), cache, None),
                   "no cache": (x, None, None, None),
                   "batch 2": (ids(LONG).expand(2, -1), None, KVCache.for_model(m.cfg, 600, batch_size=2), None),
                   "past the rotary table": (ids(LONG), None, KVCache.for_model(m.cfg, 2048), None)}
        refused["past the rotary table"][2].length = m.cfg.max_seq_len - LONG + 1
        for why, args in refused.items():
            assert not chunk_applies(m, *args), why
    assert not chunk_applies(tiny().requires_grad_(True), x, None, cache, None), "a backward needs one graph"


def test_a_prefill_that_does_not_fit_changes_nothing():
    m = accelerated(tiny())
    cache = KVCache.for_model(m.cfg, LONG - 1)
    with torch.inference_mode(), pytest.raises(CacheOverflowError):
        m(ids(LONG), cache=cache)
    assert cache.length == 0 and not cache.k.any(), "no chunk may write before the whole prompt is known to fit"


# ----------------------------------------------------------------------------- the engine


def test_greedy_generation_after_a_chunked_prefill_is_unchanged():
    target, draft = tiny(), tiny(seed=1, dim=32, n_layers=1, n_heads=2, n_kv_heads=1)
    prompt = ids(LONG, seed=5)[0].tolist()
    want = sl.autoregressive_generate(target, prompt, max_new_tokens=24).tokens  # plain: one forward
    engine = sl.SpeculativeEngine(accelerated(target), accelerated(draft), k=4, max_seq_len=LONG + 64)
    assert engine.generate(prompt, max_new_tokens=24).tokens == want
    assert sl.autoregressive_generate(accelerated(target), prompt, max_new_tokens=24).tokens == want


@pytest.mark.parametrize("kind", ["feature", "eagle3"])
def test_a_feature_drafter_reads_the_same_states_of_every_prompt_position(kind, monkeypatch):
    target = tiny(n_layers=3)
    fd = (FeatureDraft(target, seed=1) if kind == "feature" else Eagle3Draft(target, (0, 1, 2), seed=1))
    fd = fd.eval().requires_grad_(False)
    prompt = ids(LONG, seed=6)[0].tolist()
    seen, runs = [], {}
    for name, t in (("plain", target), ("chunked", accelerated(target))):
        engine = sl.SpeculativeEngine(t, fd, k=3, max_seq_len=LONG + 64)
        real = engine.drafter.prefill
        monkeypatch.setattr(engine.drafter, "prefill", lambda p, hidden=None: (seen.append(hidden), real(p, hidden))[1])
        runs[name] = engine.generate(prompt, max_new_tokens=16).tokens
    plain, chunked = seen
    assert plain.shape[0] == chunked.shape[0] == LONG - 1
    torch.testing.assert_close(chunked, plain, atol=1e-3, rtol=1e-3)
    assert runs["chunked"] == runs["plain"] == sl.autoregressive_generate(target, prompt, max_new_tokens=16).tokens


# ----------------------------------------------------------------------------- the benchmark


def _stand_ins():
    """A tiny pair made fast, and the plain target's uncached causal forward standing in for transformers'."""
    target, draft = tiny(), tiny(seed=1, dim=32, n_layers=1, n_heads=2, n_kv_heads=1)
    return accelerated(target), accelerated(draft), (lambda x: target(x))


def test_the_prefill_benchmark_document_has_its_shape(tmp_path):
    lines = []
    out = tmp_path / "prefill.json"
    doc = bench.main(["--reps", "2", "--lengths", f"40,{LONG}", "--out", str(out)], out=lines.append,
                     load=lambda threads: _stand_ins())
    assert json.loads(lines[-1]) == doc == json.loads(out.read_text()), "the document is the last line and the file"
    assert "prefill tok/s" in lines[0]
    assert doc["bench"] == "prefill" and doc["machine"]["threads"] == torch.get_num_threads()
    assert doc["machine"]["date"] and doc["config"]["lengths"] == [40, LONG] and doc["config"]["reps"] == 2
    for n in ("40", str(LONG)):
        entry = doc["lengths"][n]
        assert set(entry["systems"]) == set(bench.SYSTEMS)
        for s in entry["systems"].values():
            assert len(s["prefill_seconds"]) == len(s["ttft_seconds"]) == len(s["ttft_cpu_seconds"]) == 2
            assert all(0 < p <= t for p, t in zip(s["prefill_seconds"], s["ttft_seconds"]))
            assert all(c > 0 for c in s["ttft_cpu_seconds"])
            assert s["prefill_tokens_per_second"] == int(n) / statistics.median(s["prefill_seconds"])
        for name in bench.RATIO_OF:
            for kind in ("prefill", "ttft", "ttft_cpu"):
                r = entry["vs_transformers"][name][kind]
                assert 0 < r["min"] <= r["median"] <= r["max"]
        assert entry["check"]["max_abs_logit_diff_vs_reference"] < bench.LOGIT_TOLERANCE
        assert len(set(entry["check"]["first_token"].values())) == 1


def test_the_prefill_benchmark_refuses_to_time_a_broken_prefill(monkeypatch):
    target, draft, reference = _stand_ins()

    def forgetful(model, tokens, cache, last_only):  # each chunk attends to itself alone
        for s in range(0, tokens.shape[1], PREFILL_CHUNK):
            part = tokens[:, s:s + PREFILL_CHUNK]
            x = model.eager_hidden(part, cache=model.new_cache(part.shape[1]))
        cache.advance(tokens.shape[1])
        return model.head(x[:, -1:]).float()

    monkeypatch.setattr(fused_module, "chunked_logits", forgetful)
    with pytest.raises(bench.PrefillMismatch):
        bench.measure_prefill(target, draft, reference, lengths=(LONG,), reps=1)
    monkeypatch.undo()
    assert bench.measure_prefill(target, draft, reference, lengths=(LONG,), reps=1)["lengths"][str(LONG)]


def test_the_benchmarks_plain_twin_shares_the_weights_and_has_no_fast_path():
    target, _, _ = _stand_ins()
    with torch.inference_mode():
        target(ids(30), cache=target.new_cache(40))  # the fast modules hold their packed copies now
    twin = bench.plain_twin(target)
    assert twin.forward_kind == "eager" and target.forward_kind == "cpu-fused"
    assert twin.head.weight is target.head.weight, "a twin shares the weights"
    assert type(twin.layers[0].attn.wqkv) is not type(target.layers[0].attn.wqkv), "and has the plain modules"
