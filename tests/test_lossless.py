"""lossless.py: exact enumeration and the chi-square check, on tiny models."""
from collections import Counter

import pytest
import torch

import specdec_lab as sl
from specdec_lab.lab import lossless
from specdec_lab.lab import pitfalls
from specdec_lab.core.sampling import logits_to_probs

V = 5
SHAPE = dict(vocab_size=V, dim=16, n_heads=2, n_kv_heads=1, eos_token_ids=(10 ** 6,))  # never stops early


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: a thread pool costs more than the work
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def pair():
    target, draft = sl.tiny_model(3, **SHAPE), sl.tiny_model(4, **SHAPE)
    with torch.no_grad():
        draft.head.weight.mul_(0.3)  # a weak draft: rejections are common
    return target, draft


def test_exact_probabilities_sum_to_one_and_factor_by_position(pair):
    target, _ = pair
    probs = lossless.exact_sequence_probs(target, [1, 2], 2, temperature=0.8, top_p=0.9)
    assert len(probs) == V ** 2
    assert sum(probs.values()) == pytest.approx(1.0, abs=1e-6)
    with torch.no_grad():
        p1 = logits_to_probs(target(torch.tensor([[1, 2]]))[0, -1], 0.8, 0, 0.9)
    for x1 in range(V):
        assert sum(probs[(x1, x2)] for x2 in range(V)) == pytest.approx(float(p1[x1]), abs=1e-6)


def test_counts_proportional_to_the_exact_distribution_pass():
    probs = {(0,): 0.5, (1,): 0.3, (2,): 0.2, (3,): 0.0}
    result = lossless.chi_square_test(Counter({(0,): 500, (1,): 300, (2,): 200}), probs)
    assert result.pvalue == pytest.approx(1.0) and result.total_variation == pytest.approx(0.0)
    assert result.n == 1000 and result.dof == 2 and result.impossible == 0


def test_a_sample_of_an_impossible_sequence_fails_outright():
    probs = {(0,): 0.5, (1,): 0.5, (2,): 0.0}
    result = lossless.chi_square_test(Counter({(0,): 50, (1,): 49, (2,): 1}), probs)
    assert result.impossible == 1 and result.pvalue == 0.0


def test_rare_cells_are_pooled():
    probs = {(0,): 0.9, (1,): 0.04, (2,): 0.04, (3,): 0.02}
    result = lossless.chi_square_test(Counter({(0,): 90, (1,): 4, (2,): 4, (3,): 2}), probs)
    assert result.dof == 1, "cells expected fewer than 5 times are pooled into one"


def test_the_engine_passes_and_a_verifier_resampling_from_p_fails(pair):
    target, draft = pair
    probs = lossless.exact_sequence_probs(target, [1, 2], 2, temperature=1.0)
    good = sl.SpeculativeEngine(target, draft, k=2)
    bad = sl.SpeculativeEngine(target, draft, k=2, verifier=pitfalls.verify_resample_from_p)
    ok = lossless.chi_square_test(lossless.sample_sequences(good, [1, 2], 2, 1200), probs)
    broken = lossless.chi_square_test(lossless.sample_sequences(bad, [1, 2], 2, 1200), probs)
    assert ok.pvalue > 1e-3, f"the engine failed the lossless check (p = {ok.pvalue:.1e})"
    assert broken.pvalue < 1e-3, f"the check did not catch resampling from p (p = {broken.pvalue:.1e})"


@pytest.mark.parametrize("kwargs,name", [(dict(n_tokens=0), "n_tokens"), (dict(n_tokens=9), "n_tokens"),
                                         (dict(n_tokens=2, temperature=0), "temperature")])
def test_exact_enumeration_rejects_bad_input(pair, kwargs, name):
    with pytest.raises(ValueError, match=name):
        lossless.exact_sequence_probs(pair[0], [1], **kwargs)


def test_empty_counts_are_refused():
    with pytest.raises(ValueError, match="counts"):
        lossless.chi_square_test(Counter(), {(0,): 1.0})
