"""Chapter 05's checks (specdec_lab/lab/checks/verification_mask.py), and `must_fail` that every chapter's
check cell uses: the checks hold on the target and fail on the target without the mask."""
import pytest
import torch

import specdec_lab as sl
from specdec_lab.core.text import encode_prompt
from specdec_lab.lab import pitfalls
from specdec_lab.lab.checks import must_fail, take, verification_mask as checks


def test_must_fail_prints_the_failure_it_caught_and_raises_on_a_check_that_passes(capsys):
    def positive(x):  # raised by hand: pytest rewrites a test module's asserts and adds to their messages
        if x <= 0:
            raise AssertionError("x must be positive")

    assert must_fail(positive, -1, name="minus one") == "x must be positive"
    assert capsys.readouterr().out == "minus one fails the check, as it must: x must be positive\n"
    with pytest.raises(AssertionError, match="the check did not catch one"):
        must_fail(positive, 1, name="one")
    assert take({"a": 1, "b": 2}, "b a") == [2, 1]


@pytest.mark.slow
def test_the_verification_pass_holds_on_the_target_and_fails_without_the_mask(default_target):
    ids = encode_prompt(default_target.tokenizer, "Why is the sky blue?")
    vocab = default_target.cfg.vocab_size
    drafts = torch.randint(0, vocab, (4,), generator=torch.Generator().manual_seed(0)).tolist()
    random_draft = sl.tiny_model(0, vocab_size=vocab, dim=64)
    baseline = sl.autoregressive_generate(default_target, ids, max_new_tokens=16).tokens
    checks.verification_pass(default_target, ids, drafts, random_draft, baseline)
    with pytest.raises(AssertionError, match="single-token passes"):
        checks.verification_pass(pitfalls.UnmaskedTarget(default_target), ids, drafts, random_draft, baseline)


def test_the_figures_hold_for_a_leak_and_fail_where_nothing_leaked():
    same = torch.zeros(5, 8)
    probs = (torch.tensor([1e-4, 2e-3]), torch.tensor([0.3, 1e-3]))
    checks.figures("cpu-fused", same, same, [2.0] * 5, probs, (0.0, 0.4))
    checks.figures("cpu-fused", same, same, [2.0] * 5, None, (0.0, 0.4))  # a greedy draft: no random tokens
    broken = {"an eager forward": ("eager", same, same, [2.0] * 5, probs, (0.0, 0.4)),
              "a pass off by a rounding": ("cpu-fused", same, same + 1e-6, [2.0] * 5, probs, (0.0, 0.4)),
              "a leak under one logit": ("cpu-fused", same, same, [2.0] * 4 + [0.5], probs, (0.0, 0.4)),
              "random tokens made likely": ("cpu-fused", same, same, [2.0] * 5, probs[::-1], (0.0, 0.4)),
              "no more accepted without the mask": ("cpu-fused", same, same, [2.0] * 5, probs, (0.1, 0.1))}
    for name, args in broken.items():
        with pytest.raises(AssertionError):
            checks.figures(*args)
            pytest.fail(name)
