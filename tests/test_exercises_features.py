"""The eagle_pairs exercise: its reference is the pairing train/feature.py trains the feature draft on,
each classic mistake fails with its own diagnosis, and a correct answer written another way passes.
The mistakes are written here as a learner would write them."""
import time
from types import SimpleNamespace

import pytest
import torch

from specdec_lab.lab import exercises
from specdec_lab.train.feature import collate_entries, feature_draft_loss


def not_shifted(tokens, states):
    return tokens[:-1], states[:-1], states[1:]


def reads_its_target(tokens, states):
    return tokens[1:], states[1:], states[1:]


def regresses_to_its_input(tokens, states):
    return tokens[1:], states[:-1], states[:-1]


def states_swapped(tokens, states):
    return tokens[1:], states[1:], states[:-1]


MISTAKES = [(not_shifted, "token_not_shifted"), (reads_its_target, "reads_its_target"),
            (regresses_to_its_input, "regresses_to_its_input"), (states_swapped, "states_swapped")]


def by_index_select(tokens, states):
    """Correct, written another way: the positions each piece comes from, gathered."""
    L = tokens.shape[0]
    before, after = torch.arange(L - 1), torch.arange(1, L)
    return tokens.index_select(0, after), states.index_select(0, before), states.index_select(0, after)


def by_loop(tokens, states):
    """Correct, written another way: one entry at a time, as a list of rows stacked at the end."""
    entries = [(tokens[j + 1], states[j], states[j + 1]) for j in range(len(tokens) - 1)]
    return tuple(torch.stack(column) for column in zip(*entries))


def by_roll(tokens, states):
    """Correct, written another way: the next position rolled into place, the wrapped row dropped."""
    return tokens.roll(-1)[:-1], states[:-1].clone(), states.roll(-1, dims=0)[:-1]


def test_the_reference_passes():
    report = exercises.check("eagle_pairs", exercises.solution("eagle_pairs"))
    assert report.passed, repr(report)
    assert "position j + 1" in report.message and "train/feature.py" in report.message


@pytest.mark.parametrize("fn, diagnosis", MISTAKES, ids=[d for _, d in MISTAKES])
def test_each_mistake_fails_with_its_own_diagnosis(fn, diagnosis):
    report = exercises.check("eagle_pairs", fn)
    assert not report.passed, f"the {diagnosis} variant passed: {report!r}"
    assert report.diagnosis == diagnosis, f"expected {diagnosis}, got {report!r}"
    assert report.hint and report.hint in repr(report)
    assert diagnosis in report._repr_html_()


@pytest.mark.parametrize("fn", [by_index_select, by_loop, by_roll], ids=lambda f: f.__name__)
def test_a_correct_answer_written_another_way_passes(fn):
    report = exercises.check("eagle_pairs", fn)
    assert report.passed, repr(report)


def test_the_message_names_the_positions_paired_and_the_right_ones():
    message = exercises.check("eagle_pairs", not_shifted).message
    assert ("entry 0 reads the token at position 0 with the state at position 0; it should read the token at "
            "position 1 with the state at position 0") in message, message
    message = exercises.check("eagle_pairs", regresses_to_its_input).message
    assert "regresses to the state at position 0; it should regress to the state at position 1" in message, message
    message = exercises.check("eagle_pairs", states_swapped).message
    assert ("reads the token at position 1 with the state at position 1 and regresses to the state at position 0"
            in message), message


def test_a_wrong_shape_or_a_wrong_type_gets_a_clear_message():
    def too_short(tokens, states):
        return tokens[1:-1], states[:-2], states[1:-1]

    def one_tensor(tokens, states):
        return tokens[1:]

    def a_list(tokens, states):
        return tokens[1:].tolist(), states[:-1], states[1:]

    def all_positions(tokens, states):
        return tokens, states, states.roll(-1, dims=0)

    cases = [(too_short, "your entry_tokens has shape (0,); it should have shape (1,)"),
             (one_tensor, "returned a value of type Tensor: it should return three tensors"),
             (a_list, "your entry_tokens has type list; it should be a tensor of shape (1,)"),
             (all_positions, "your entry_tokens has shape (2,); it should have shape (1,)")]
    for fn, words in cases:
        report = exercises.check("eagle_pairs", fn)
        assert not report.passed and report.diagnosis is None and words in report.message, repr(report)


def test_the_reference_is_what_train_feature_builds():
    """collate_entries (train/feature.py) builds the entries of one example; feature_draft_loss's
    regression, `h[:, :-1]` against `feat[:, 1:]`, is zero where the draft's estimates equal the
    reference's regress_to, and not where they equal its input. The library stores a state for
    every token but the last, so its last entry has no state to regress to: the test holds the
    reference to the library's entries, and to the regression on all the entries but that one."""
    g = torch.Generator().manual_seed(0)
    L, P, dim, V, k = 7, 3, 4, 50, 2
    tokens = torch.randperm(V, generator=g)[:L]
    states = (8 * torch.randn(L, dim, generator=g)).round() / 8  # exact in float16, as the shards store them
    example = (tokens, states[:-1].half(), P, torch.randint(V, (L - P, k), generator=g), torch.randn(L - P, k))
    tok, feat, tgt_pos, tgt_lp, weight = collate_entries([example], [0], torch.arange(V))

    entry_tokens, entry_states, regress_to = exercises.solution("eagle_pairs")(tokens, states)
    assert torch.equal(tok[0], entry_tokens)
    assert torch.equal(feat[0].float(), entry_states)

    def regression(estimates):  # feature_draft_loss with a stand-in draft whose estimates are given
        body = SimpleNamespace(head=SimpleNamespace(proj=SimpleNamespace(weight=torch.randn(dim, V, generator=g))),
                               hidden=lambda tok, embeds: estimates[None])
        model = SimpleNamespace(body=body, inputs=lambda tok, states: None)
        loss, _ = feature_draft_loss(model, tok, feat, tgt_pos, tgt_lp, weight, unroll=1, cls_weight=0.0)
        return float(loss)
    assert regression(regress_to) == 0.0
    assert regression(entry_states) > 0.1


def test_the_check_is_quick():
    solution = exercises.solution("eagle_pairs")
    exercises.check("eagle_pairs", solution)  # the first call pays for imports
    start = time.perf_counter()
    exercises.check("eagle_pairs", solution)
    exercises.check("eagle_pairs", not_shifted)
    assert time.perf_counter() - start < 1.0
