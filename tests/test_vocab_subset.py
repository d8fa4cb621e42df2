"""A draft whose head covers only its most frequent tokens (drafters.VocabSubsetHead)."""
import json

import pytest
import torch

import specdec_lab as sl
from specdec_lab.train.distill import frequent_tokens, save_draft, save_vocab_subset
from specdec_lab.drafters.vocab_subset import VocabSubsetHead, restrict_vocab
from test_engine import V, chi_square_pvalue, exact_distribution

SUBSET = [0, 2, 3, 5, 8, 13, 21, 34, 55]


def _untied(seed, **kw):
    return sl.tiny_model(seed, tie_embeddings=False, **kw)


def test_restricted_head_keeps_the_subset_logits_and_masks_the_rest():
    full = _untied(1)
    sub = restrict_vocab(_untied(1), SUBSET)
    x = torch.tensor([[1, 4, 9, 16]])
    with torch.no_grad():
        a, b = full(x), sub(x)
    keep = torch.zeros(full.cfg.vocab_size, dtype=torch.bool)
    keep[SUBSET] = True
    assert torch.allclose(a[..., keep], b[..., keep], atol=1e-6)
    assert torch.isneginf(b[..., ~keep]).all(), "tokens outside the subset must get -inf"
    assert sub.head.proj.weight.shape == (full.cfg.dim, len(SUBSET)), "the product must read the subset's columns only"
    assert b.argmax(-1).unique().tolist() and set(b.argmax(-1).flatten().tolist()) <= set(SUBSET)


def test_greedy_decoding_with_a_restricted_draft_is_still_the_targets():
    target = _untied(0)
    draft = restrict_vocab(_untied(1), list(range(0, 64, 3)))
    for k in (1, 4):
        engine = sl.SpeculativeEngine(target, draft, k=k)
        for prompt in ([1, 2, 3], [7, 7, 7, 2, 9]):
            want = sl.autoregressive_generate(target, prompt, max_new_tokens=20).tokens
            assert engine.generate(prompt, max_new_tokens=20).tokens == want


def test_sampling_with_a_restricted_draft_is_distributed_as_the_target():
    kw = dict(vocab_size=V, dim=16, n_heads=2, n_kv_heads=1, eos_token_ids=(10 ** 6,))
    target, draft = sl.tiny_model(3, **kw), _untied(4, **kw)
    restrict_vocab(draft, list(range(0, V, 2)))  # half the tokens can only come from the residual
    engine = sl.SpeculativeEngine(target, draft, k=2)
    pvalue = chi_square_pvalue(engine, exact_distribution(target, 1.0, 1.0), 2500, 1.0, 1.0, 2)
    assert pvalue > 0.001, f"a restricted draft changed what the engine samples (p = {pvalue:.2e})"


@pytest.mark.parametrize("ids,match", [([3, 3, 4], "distinct"), ([-1, 2], "distinct"), ([64], "distinct"),
                                       ([], "distinct")])
def test_bad_subsets_raise_value_error(ids, match):
    with pytest.raises(ValueError, match=match):
        VocabSubsetHead(_untied(1).head, ids)


def test_a_tied_head_cannot_be_restricted_and_a_head_is_restricted_once():
    with pytest.raises(ValueError, match="untied"):
        restrict_vocab(sl.tiny_model(1), SUBSET)
    sub = restrict_vocab(_untied(1), SUBSET)
    with pytest.raises(ValueError, match="already"):
        restrict_vocab(sub, SUBSET)


def test_frequent_tokens_counts_answers_and_reports_coverage():
    ex = lambda answer: (torch.tensor([1]), torch.tensor(answer), None, None, 0.0)  # noqa: E731
    ids, coverage = frequent_tokens([ex([5, 5, 5, 7, 7, 9]), ex([5, 7, 11])], n=2, vocab_size=16, always=(15,))
    assert ids == [5, 7, 15]
    assert coverage == pytest.approx(7 / 9)
    with pytest.raises(ValueError, match="empty"):
        frequent_tokens([], 2, 16)


def test_load_pair_restricts_a_draft_folder_with_a_subset_file_and_can_be_switched_off(tmp_path):
    save_draft(_untied(0), tmp_path / "target", dtype=torch.float32)
    save_draft(_untied(1), tmp_path / "draft", dtype=torch.float32)
    save_vocab_subset(tmp_path / "draft", SUBSET, 0.9, source="test")
    assert json.loads((tmp_path / "draft" / "vocab_subset.json").read_text())["ids"] == SUBSET
    pair = sl.load_pair(tmp_path / "target", tmp_path / "draft")
    assert isinstance(pair.draft.head, VocabSubsetHead) and pair.draft.head.ids.tolist() == SUBSET
    assert sl.load_pair(tmp_path / "target", tmp_path / "draft").draft is pair.draft, "loaded once per process"
    full = sl.load_pair(tmp_path / "target", tmp_path / "draft", vocab_subset_head=False).draft
    assert not isinstance(full.head, VocabSubsetHead), "the cached full draft must stay whole"
    assert full.head.weight.shape[1] == 64
