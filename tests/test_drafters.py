"""ModelDrafter's early stop and LookupThenModelDrafter: lossless, and the draft's cache kept whole."""
import pytest

import specdec_lab as sl
from specdec_lab.lab import lossless
from specdec_lab.core.config import SamplingConfig
from specdec_lab import LookupThenModelDrafter
from specdec_lab.drafters import ModelDrafter
from specdec_lab import SpeculativeEngine
from specdec_lab import autoregressive_generate
from specdec_lab.io.pair import tiny_model

REPEATING = [5, 6, 7, 8, 9, 10, 5, 6, 7, 8, 9, 10, 5, 6]  # prompt lookup finds matches at once


@pytest.fixture
def models():
    return tiny_model(0, eos_token_ids=()), tiny_model(1, n_layers=1, eos_token_ids=())


@pytest.mark.parametrize("value", [0, 1, 1.5, -0.1, True, "0.2"])
def test_stop_below_outside_0_1_is_refused_naming_it(models, value):
    _, draft = models
    with pytest.raises(ValueError, match="stop_below"):
        ModelDrafter(draft, 64, stop_below=value)
    with pytest.raises(ValueError, match="stop_below"):
        LookupThenModelDrafter(draft, 64, stop_below=value)


def test_lookup_then_model_refuses_a_bad_min_match(models):
    with pytest.raises(ValueError, match="min_ngram"):
        LookupThenModelDrafter(models[1], 64, min_match=0)


@pytest.mark.parametrize("stop_below", [None, 0.3])
def test_greedy_output_equals_the_targets_own_with_both_sources_used(models, stop_below):
    target, draft = models
    drafter = LookupThenModelDrafter(draft, 256, stop_below=stop_below)
    res = SpeculativeEngine(target, drafter, k=4, max_seq_len=256).generate(REPEATING, max_new_tokens=48)
    base = autoregressive_generate(target, REPEATING, max_new_tokens=48)
    assert res.tokens == base.tokens, "verification must keep the mixed drafter lossless"
    assert drafter.lookup_steps > 0 and drafter.model_steps > 0, (
        f"both sources should draft here: lookup {drafter.lookup_steps}, model {drafter.model_steps} steps")


def test_the_draft_cache_holds_every_committed_token_after_lookup_steps(models):
    """After a generation that mixed the sources, the model drafts what a fresh drafter
    prefilled with the whole text drafts: tokens queued during lookup steps were fed."""
    target, draft = models
    drafter = LookupThenModelDrafter(draft, 256)
    res = SpeculativeEngine(target, drafter, k=4, max_seq_len=256).generate(REPEATING, max_new_tokens=40)
    assert drafter.lookup_steps > 0
    fresh = ModelDrafter(draft, 256)
    fresh.prefill(REPEATING + res.tokens)
    greedy = SamplingConfig(0.0)
    ours, _ = drafter.model.propose(4, greedy, None)
    theirs, _ = fresh.propose(4, greedy, None)
    assert ours.tolist() == theirs.tolist()
    # Both hold the whole text and d_1..d_3 (d_4 is drafted, never fed).
    assert drafter.model.cache.length == fresh.cache.length == len(REPEATING) + len(res.tokens) + 3


def test_stop_below_shortens_drafts_and_keeps_greedy_output(models):
    target, draft = models
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    base = autoregressive_generate(target, prompt, max_new_tokens=32)
    sure = SpeculativeEngine(target, ModelDrafter(draft, 128, stop_below=1e-6), k=4, max_seq_len=128)
    unsure = SpeculativeEngine(target, ModelDrafter(draft, 128, stop_below=0.999), k=4, max_seq_len=128)
    a, b = sure.generate(prompt, max_new_tokens=32), unsure.generate(prompt, max_new_tokens=32)
    assert a.tokens == b.tokens == base.tokens
    assert max(r.k for r in a.steps) == 4, "a threshold no draft falls below must not shorten drafts"
    assert all(r.k == 1 for r in b.steps[:-1]), "a random draft is never 99.9% sure: every step drafts one token"


def test_sampling_with_lookup_and_stop_is_distributed_as_the_target():
    shape = dict(vocab_size=5, dim=16, n_heads=2, n_kv_heads=1, eos_token_ids=(10 ** 6,))
    target, draft = sl.tiny_model(3, **shape), sl.tiny_model(4, **shape)
    prompt = [1, 2, 1, 2, 1]  # repeats: lookup drafts some steps, the model the others
    probs = lossless.exact_sequence_probs(target, prompt, 3, temperature=1.0)
    drafter = LookupThenModelDrafter(draft, 64, stop_below=0.5)
    engine = SpeculativeEngine(target, drafter, k=3, max_seq_len=64)
    result = lossless.chi_square_test(lossless.sample_sequences(engine, prompt, 3, 1200), probs)
    assert drafter.lookup_steps > 0 and drafter.model_steps > 0
    assert result.pvalue > 1e-3, f"prompt lookup + draft failed the lossless check (p = {result.pvalue:.1e})"


@pytest.mark.slow
def test_default_pair_copies_a_summarised_text_through_lookup(default_target):
    from specdec_lab import load_default_pair
    pair = load_default_pair()
    prompt = ("Summarize this text: The city council voted to build a new park near the river. "
              "The park will have a playground, walking paths and a small lake.")
    drafter = LookupThenModelDrafter(pair.draft, 512, stop_below=0.2)
    res = SpeculativeEngine(pair.target, drafter, k=6, max_seq_len=512).generate(prompt, max_new_tokens=40)
    base = autoregressive_generate(pair.target, prompt, max_new_tokens=40)
    assert res.tokens == base.tokens
    assert drafter.lookup_steps > 0, "a summary repeats words of its text: lookup should draft some steps"
    assert res.stats.mean_tokens_per_step > 1.2
