"""NGramDrafter (prompt lookup): its index against a plain scan, and the engine driving it."""
import pytest
import torch
from hypothesis import given, settings, strategies as st

from specdec_lab.core.drafter import Verdict
from specdec_lab.core.config import SamplingConfig
from specdec_lab.drafters import NGramDrafter, ngram_lookup_reference
from specdec_lab import SpeculativeEngine
from specdec_lab import autoregressive_generate
from specdec_lab.io.pair import tiny_model

GREEDY = SamplingConfig(0.0)


def proposal(drafter, k):
    ids, q = drafter.propose(k, GREEDY, None)
    assert q is None, "an n-gram proposal is one-hot: q must be None"
    assert ids.dtype == torch.int64 and ids.dim() == 1
    return ids.tolist()


def copying_target(seed=0):
    """A tiny decoder whose attention output is zeroed: its next token depends only on the current one.

    Its greedy continuation is then a walk of a fixed map on V tokens, so within V
    steps it repeats a cycle: text that copies itself, as code and quoted documents do.
    """
    model = tiny_model(seed=seed, eos_token_ids=())
    for block in model.layers:
        block.attn.wo.weight.zero_()
    return model


def test_no_match_proposes_nothing():
    d = NGramDrafter()
    d.prefill([1, 2, 3, 4])
    assert proposal(d, 4) == []


def test_longest_suffix_wins_over_a_more_recent_shorter_one():
    d = NGramDrafter(max_ngram=3, min_ngram=1)
    d.prefill([1, 2, 9, 5, 2, 7, 1, 2])  # suffix [1, 2] was followed by 9; [2] most recently by 7
    assert proposal(d, 1) == [9]


def test_most_recent_occurrence_of_the_suffix_is_used():
    d = NGramDrafter(max_ngram=2, min_ngram=2)
    d.prefill([4, 5, 6, 4, 5, 8, 4, 5])
    assert proposal(d, 2) == [8, 4]


def test_copy_runs_on_through_its_own_proposal_on_a_periodic_context():
    d = NGramDrafter()
    d.prefill([1, 2, 1, 2])
    assert proposal(d, 5) == [1, 2, 1, 2, 1]


def test_min_ngram_above_one_ignores_single_token_matches():
    d = NGramDrafter(max_ngram=3, min_ngram=2)
    d.prefill([7, 1, 8, 1])
    assert proposal(d, 3) == []


def test_commit_appends_accepted_tokens_and_next_token_only():
    d = NGramDrafter()
    d.prefill([1, 2, 3, 1, 2])
    assert proposal(d, 3) == [3, 1, 2]
    d.commit(Verdict([3, 1, 2], 1, 9))  # the target accepted 3, then chose 9
    assert d.context == [1, 2, 3, 1, 2, 3, 9]
    d.reset()
    assert d.context == [] and proposal(d, 2) == []


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 4), min_size=1, max_size=40), st.integers(1, 6),
       st.integers(1, 4), st.integers(0, 3))
def test_indexed_lookup_equals_the_reference_scan(context, k, max_ngram, extra):
    min_ngram = max(1, max_ngram - extra)
    d = NGramDrafter(max_ngram=max_ngram, min_ngram=min_ngram)
    d.prefill(context[:1])
    for t in context[1:]:  # grow the index the way the engine does, one commit at a time
        d.commit(Verdict([], 0, t))
    assert d.context == context
    assert d.lookup(k) == ngram_lookup_reference(context, k, max_ngram, min_ngram)


@pytest.mark.parametrize("kwargs, name", [(dict(max_ngram=0), "max_ngram"), (dict(min_ngram=0), "min_ngram"),
                                          (dict(max_ngram=2, min_ngram=3), "min_ngram")])
def test_bad_ngram_sizes_raise(kwargs, name):
    with pytest.raises(ValueError, match=name):
        NGramDrafter(**kwargs)


def test_greedy_output_equals_the_targets_own_on_a_random_tiny_target():
    target = tiny_model(seed=0, eos_token_ids=())
    prompt = [1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2]
    res = SpeculativeEngine(target, NGramDrafter(), k=4, max_seq_len=128).generate(prompt, max_new_tokens=40)
    base = autoregressive_generate(target, prompt, max_new_tokens=40)
    assert res.tokens == base.tokens, "verification must make n-gram drafting lossless"
    assert res.steps[0].k == 4, "the prompt repeats: the first step must draft from a match"


def test_repeating_target_commits_more_than_1_5_tokens_per_step_and_matches_greedy():
    target = copying_target()
    # The prompt is the target's own greedy text: once it holds a full cycle, the
    # continuation is already in the context and prompt lookup can find it.
    seed_text = autoregressive_generate(target, [1, 2, 3], max_new_tokens=70).tokens
    prompt = [1, 2, 3] + seed_text
    res = SpeculativeEngine(target, NGramDrafter(), k=4, max_seq_len=256).generate(prompt, max_new_tokens=48)
    base = autoregressive_generate(target, prompt, max_new_tokens=48)
    assert res.tokens == base.tokens
    assert res.stats.mean_tokens_per_step > 1.5, (
        f"mean tokens per step {res.stats.mean_tokens_per_step:.2f} with accepted share {res.stats.accepted_share:.2f}")
    assert res.stats.accepted_share > 0.5


def test_sampling_with_ngram_drafts_runs_and_repeats_under_a_seed():
    target = tiny_model(seed=0, eos_token_ids=())
    prompt = [1, 2, 3, 1, 2, 3, 1, 2]
    engine = SpeculativeEngine(target, NGramDrafter(), k=4, max_seq_len=128)
    a = engine.generate(prompt, max_new_tokens=30, temperature=1.0, seed=0)
    b = engine.generate(prompt, max_new_tokens=30, temperature=1.0, seed=0)
    assert a.tokens == b.tokens and len(a.tokens) == 30
    assert all(0 <= t < target.cfg.vocab_size for t in a.tokens)
    assert a.steps[0].k == 4, "the prompt repeats, so the first step has a match to draft"
    assert all(q == 1.0 for r in a.steps for q in r.q_draft), "n-gram drafts are one-hot: q(d) = 1"


def test_no_match_makes_the_engine_take_a_plain_target_step():
    target = tiny_model(seed=0, eos_token_ids=())
    res = SpeculativeEngine(target, NGramDrafter(), k=4, max_seq_len=128).generate(
        [10, 11, 12, 13], max_new_tokens=5, temperature=1.0, seed=0)
    assert res.steps[0].k == 0 and res.steps[0].drafted == [] and len(res.steps[0].committed) == 1
    assert len(res.tokens) == 5
