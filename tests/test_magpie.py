"""Prompt synthesis (train/magpie.py) on a tiny target: filters, both deduplications, the
statistics, and a run that stops and resumes to the same file as one that never stopped."""
import json

import pytest
import torch

import specdec_lab as sl
from specdec_lab.train.handwritten import HANDWRITTEN_PROMPTS, ngram_overlap, normalize, word_ngrams
from specdec_lab.train.magpie import (PromptFilter, SynthesisConfig, load_prompt_file, looks_like_request,
                                      prompt_statistics, reject_reason, sample_turns,
                                      synthesize_prompts)

# A word per token id of the tiny target (vocabulary 8, end of turn = 7): sampled turns read as
# short word strings, many of them repeats, a few of them requests.
WORDS = ["what", "how", "is", "the", "cat", "why", "river?"]
PREFIX = [1, 2, 3]


def decode(ids):
    return " ".join(WORDS[i] for i in ids)


def _target():
    """The end of turn gets the head row of 'what', so that turns end about as often as they run away."""
    model = sl.tiny_model(0, vocab_size=8, dim=32, n_heads=4, n_kv_heads=2, eos_token_ids=(7,), std=0.3)
    with torch.no_grad():
        model.head.weight[7] = model.head.weight[0]
    return model


def _cfg(**kw):
    return SynthesisConfig(**{"n": 12, "seed": 1, "max_new_tokens": 10, "max_attempts": 120, **kw})


def test_filters_name_each_reason():
    assert reject_reason("   ", hit_cap=False) == "empty"
    assert reject_reason("Write a poem about the sea and the sky", hit_cap=True) == "runaway"
    assert reject_reason("Hi<|im_end|> there, can you help?", hit_cap=False) == "template"
    assert reject_reason("Sure! Here is a recipe for pancakes.", hit_cap=False) == "not_request"
    assert reject_reason("The cat sat on the mat all day.", hit_cap=False) == "not_request"
    assert reject_reason("lemmum lemmum lemmum, can you help?", hit_cap=False) == "not_request"
    assert reject_reason(HANDWRITTEN_PROMPTS[3], hit_cap=False) == "held_out"
    assert reject_reason("How do I keep basil alive on a windowsill?", hit_cap=False) is None
    assert looks_like_request("Write a limerick about a slow snail.")
    assert not looks_like_request("Why?"), "one word is not a request"


def test_the_filter_drops_exact_and_near_duplicates_and_counts_them():
    f = PromptFilter(_cfg())
    assert f.add("How do I bake bread at home with little time?", 12, False) is None
    assert f.add("how do I bake bread at home, with little time", 11, False) == "duplicate"
    assert f.add("How do I bake bread at home with little time and no oven?", 15, False) == "near_duplicate"
    assert f.add("What is the best way to learn chess openings?", 10, False) is None
    assert f.kept_tokens == [12, 10] and f.rejected["duplicate"] == f.rejected["near_duplicate"] == 1


def test_prompts_of_an_earlier_file_count_as_duplicates_and_are_not_kept_again():
    f = PromptFilter(_cfg(), avoid=["How do I bake bread at home with little time?"])
    assert f.kept == []
    assert f.add("how do I bake bread at home, with little time", 11, False) == "duplicate"
    assert f.add("How do I bake bread at home with little time and no oven?", 15, False) == "near_duplicate"
    assert f.add("What is the best way to learn chess openings?", 10, False) is None
    assert f.kept == ["What is the best way to learn chess openings?"]


def test_statistics_count_distinct_trigrams_and_length_quantiles():
    prompts = ["a b c d", "a b c e", "x y z"]  # trigrams: abc, bcd, abc, bce, xyz -> 4 distinct of 5
    st = prompt_statistics(prompts, [4, 5, 3])
    assert st["count"] == 3 and st["distinct_3grams"] == 4 and st["distinct_3gram_share"] == 0.8
    assert (st["words"]["p0"], st["words"]["p50"], st["words"]["p100"]) == (3, 4, 4)
    assert (st["tokens"]["p0"], st["tokens"]["p50"], st["tokens"]["p100"]) == (3, 4, 5)
    assert st["tokens"]["mean"] == 4


def test_synthesis_keeps_distinct_requests_and_accounts_for_every_attempt(tmp_path):
    out = tmp_path / "p.json"
    doc = synthesize_prompts(_target(), PREFIX, decode, _cfg(), out, progress=False)
    saved = json.loads(out.read_text())
    assert saved == doc and load_prompt_file(out) == doc["prompts"]
    assert not (tmp_path / "p.json.partial").exists(), "a complete run leaves no partial file"
    kept = doc["prompts"]
    assert 1 <= len(kept) <= 12
    assert doc["attempts"] == len(kept) + sum(doc["rejected"].values()), "every attempt is kept or has a reason"
    rejected = doc["rejected"]
    assert rejected["duplicate"] + rejected["near_duplicate"] > 0, "the tiny target repeats itself"
    assert min(rejected["empty"], rejected["runaway"], rejected["not_request"]) > 0, rejected
    assert len({normalize(p) for p in kept}) == len(kept)
    for i, a in enumerate(kept):
        assert looks_like_request(a)
        for b in kept[:i]:
            assert ngram_overlap(word_ngrams(a), word_ngrams(b)) < 0.5, f"near-duplicates kept: {a!r} {b!r}"
    grams = {tuple(normalize(p).split()[i:i + 3]) for p in kept for i in range(len(normalize(p).split()) - 2)}
    assert doc["stats"]["distinct_3grams"] == len(grams) and doc["stats"]["count"] == len(kept)


@pytest.mark.parametrize("batch_size", [1, 4])
def test_a_stopped_run_resumes_to_the_same_file_as_an_unbroken_one(tmp_path, batch_size):
    target, cfg = _target(), _cfg(batch_size=batch_size)
    whole = synthesize_prompts(target, PREFIX, decode, cfg, tmp_path / "whole.json", progress=False)
    out = tmp_path / "broken.json"
    first = synthesize_prompts(target, PREFIX, decode, cfg, out, stop_after=7, progress=False)
    assert not first["complete"] and not out.exists()
    partial = tmp_path / "broken.json.partial"
    lines = partial.read_text().splitlines()
    assert len(lines) == 1 + 8 if batch_size == 4 else 1 + 7, "the settings, then one line per attempt"
    partial.write_text("\n".join(lines[:-1]) + "\n")  # a kill in the middle of writing a batch
    with pytest.raises(ValueError, match="settings"):
        synthesize_prompts(target, PREFIX, decode, _cfg(batch_size=batch_size, top_p=0.5), out, progress=False)
    resumed = synthesize_prompts(target, PREFIX, decode, cfg, out, progress=False)
    assert resumed == whole, "resuming changed the prompts: attempt seeds must not depend on where a run stopped"
    assert json.loads(out.read_text()) == whole


def test_batched_turns_follow_the_prefix_as_single_ones_do_when_greedy():
    target = _target()
    cfg = _cfg(batch_size=3, temperature=0.0)
    single = sl.autoregressive_generate(target, PREFIX, max_new_tokens=cfg.max_new_tokens).tokens
    ended = single[-1] == 7
    for ids, row_ended in sample_turns(target, PREFIX, cfg, 0):
        assert (ids, row_ended) == ((single[:-1] if ended else single), ended)


def test_bad_settings_name_the_parameter():
    with pytest.raises(ValueError, match="synthesize"):
        SynthesisConfig(n=0).check()
    with pytest.raises(ValueError, match="top_p"):
        SynthesisConfig(n=3, top_p=0).check()
    with pytest.raises(ValueError, match="near_duplicate"):
        SynthesisConfig(n=3, near_duplicate=1.5).check()
    with pytest.raises(ValueError, match="batch_size"):
        SynthesisConfig(n=3, batch_size=0).check()
