"""The engine on the real default target (SmolLM2-135M-Instruct)."""
import pytest

import specdec_lab as sl
from specdec_lab.io.assets import ensure_default_target
from specdec_lab.io.pair import load_model_cached

pytestmark = pytest.mark.slow

PROMPTS = ["Why is the sky blue?", "Write a Python function that adds two numbers."]


@pytest.fixture(scope="module")
def smol():
    return load_model_cached(ensure_default_target())


@pytest.fixture(scope="module")
def baselines(smol):
    return {p: sl.autoregressive_generate(smol, p, max_new_tokens=24).tokens for p in PROMPTS}


@pytest.mark.parametrize("k", range(1, 9))
def test_greedy_with_the_target_as_draft_equals_autoregressive(smol, baselines, k):
    engine = sl.SpeculativeEngine(smol, smol, k=k)
    res = engine.generate(PROMPTS[k % 2], max_new_tokens=24)
    assert res.tokens == baselines[PROMPTS[k % 2]]
    assert res.stats.accepted_share == 1.0


@pytest.mark.parametrize("k", [1, 4, 8])
def test_greedy_with_a_random_draft_equals_autoregressive(smol, baselines, k):
    rand = sl.tiny_model(5, vocab_size=smol.cfg.vocab_size, dim=32, n_heads=2, n_kv_heads=1)
    engine = sl.SpeculativeEngine(smol, rand, k=k)
    for p in PROMPTS:
        assert engine.generate(p, max_new_tokens=24).tokens == baselines[p]


PAGED_PROMPTS = PROMPTS + ["List three colours.", "Summarize: the cat sat on the mat all day.",
                           "Reverse this list: a, b, c, d."]


@pytest.mark.parametrize("block_size", [1, 16, 512])  # 512 is larger than any prompt here
def test_paged_cache_gives_the_same_greedy_output_on_five_prompts(smol, block_size):
    rand = sl.tiny_model(6, vocab_size=smol.cfg.vocab_size, dim=32, n_heads=2, n_kv_heads=1)
    paged = sl.SpeculativeEngine(smol, rand, k=3, cache="paged", block_size=block_size)
    contiguous = sl.SpeculativeEngine(smol, rand, k=3)
    for p in PAGED_PROMPTS:
        want = contiguous.generate(p, max_new_tokens=12).tokens
        assert paged.generate(p, max_new_tokens=12).tokens == want, f"paged (P={block_size}) diverged on {p!r}"


@pytest.mark.parametrize("verifier,propose", [("device", "sample"), ("block", "sample"), ("match", "sample"),
                                              ("match", "argmax"), ("block", "argmax")])
def test_the_default_pairs_greedy_output_is_the_same_under_every_acceptance_rule(smol, baselines, verifier, propose):
    """Greedy, every rule keeps a drafted token exactly when it is the target's argmax: the shipped
    draft under token-by-token, block and exact-match verification gives autoregressive decoding's tokens."""
    draft = sl.load_pair(ensure_default_target(), sl.default_draft_dir()).draft
    engine = sl.SpeculativeEngine(smol, draft, k=4, verifier=verifier, propose=propose)
    for p in PROMPTS:
        res = engine.generate(p, max_new_tokens=24)
        assert res.tokens == baselines[p], (verifier, propose, p)
        assert res.stats.accepted > 0, "the shipped draft is accepted"
