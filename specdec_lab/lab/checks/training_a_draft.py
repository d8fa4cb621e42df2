"""Chapter 09's checks: what a shared vocabulary buys, the objective's identity and bound, the toy training
run and its account of the gap to the formula, and the shipped draft's figures as the chapter quotes them.

`learns_the_bigram` is a claim about a training recipe's examples, so the chapter runs it on the toy's
training answers and, through `must_fail`, on `pitfalls.targets_one_position_late` of them, where it has to
fail. The other functions check the chapter's own results, passed in by name.
"""
import copy
import re

from ...drafters import VocabSubsetHead
from ...train.distill import held_out_agreement, train_draft


def vocabulary(mismatch_error, res_self, res_shuffled, greedy_tokens):
    """The engine refuses another vocabulary size, naming both; a model drafting for itself has every draft
    accepted, one with a shuffled vocabulary loses most; and both outputs equal the target's greedy tokens."""
    assert mismatch_error is not None and "vocabulary" in mismatch_error and "49152" in mismatch_error, \
        "a draft with another vocabulary size must be refused with a message naming both sizes"
    assert res_self.stats.accepted_share == 1.0, "a model drafting for itself must have every draft accepted"
    assert res_shuffled.stats.accepted_share < 0.5, "a draft with a shuffled vocabulary should lose most acceptance"
    assert res_self.tokens == greedy_tokens and res_shuffled.tokens == greedy_tokens, \
        "verification must keep the output correct whatever the draft's ids mean"


def objective(identity_gap, pinsker_ok):
    """On the random pairs: sum_x min(p, q) equals 1 - TV(p, q), and beta stays above Pinsker's floor."""
    assert identity_gap < 1e-9, "sum_x min(p, q) must equal 1 - TV(p, q)"
    assert pinsker_ok, "acceptance must stay above Pinsker's floor 1 - sqrt(KL / 2), in either direction"


def toy_runs(runs, curve, before, after, bigram):
    """The toy run (`runs`: "untrained" and "trained" -> the chapter's figures): the training curve ends at the
    final agreement, the trained draft makes no fewer tokens per step, every output is the target's greedy
    one, and acceptance by position gives exactly what the full steps made. For the bigram toy (`bigram`,
    the chapter's TARGET_ATTENTION == 0), the prose's account of the gap to the formula: the draft learned,
    every answer ends in a short loop, a step's first draft is accepted far less often than alpha (less still
    after a bonus), and acceptance by position makes most of the gap, the budget's short steps the rest."""
    assert curve and curve[-1][1] == after, "train_draft's curve must end at the final held-out agreement"
    assert runs["trained"]["tokens_per_step"] >= runs["untrained"]["tokens_per_step"], \
        "a better draft must not make fewer tokens per step"
    assert all(r["same_as_greedy"] for r in runs.values()), "greedy speculative output must equal greedy decoding"
    x = runs["trained"]
    assert abs(x["from_positions"] - x["full_steps"]) < 1e-9, "1 + a1 + a1 a2 + ... is what the full steps made"
    assert x["tokens_per_step"] <= x["full_steps"] and x["short_steps"] > 0, "the budget's short steps make fewer"
    if not bigram:
        return
    assert after > before + 0.3, f"the toy draft should learn the bigram target: {before:.3f} -> {after:.3f}"
    assert all(n is not None and n < 12 for n in x["periods"]), "every greedy answer ends in a short loop"
    assert x["formula"] - x["tokens_per_step"] > 0.2, "the formula expects more than the engine made"
    assert x["by_position"][0] < x["alpha"] - 0.1 and min(x["by_position"][1:]) > x["by_position"][0], \
        "a step's first draft is accepted far less often than alpha"
    assert x["after_bonus"] < x["by_position"][0], "less still right after a step that accepted all four"
    assert x["formula"] - x["from_positions"] > x["full_steps"] - x["tokens_per_step"] > 0, \
        "acceptance by position makes most of the gap, the budget the rest"


def learns_the_bigram(examples, untrained, held_greedy, epochs, lr):
    """The learning claim: a copy of the `untrained` draft, trained on `examples` as the chapter trains it,
    raises its held-out greedy agreement by more than 0.3. Training answers whose stored targets sit one
    position late teach the draft nothing of the bigram, and must fail it."""
    before = held_out_agreement(untrained, held_greedy)
    draft, _ = train_draft(copy.deepcopy(untrained), examples, held_greedy, epochs=epochs, lr=lr, max_tokens=1024,
                           eval_every=10**9, progress=False)
    assert held_out_agreement(draft, held_greedy) > before + 0.3, "the toy draft should learn the bigram target"


def shipped_card(card, classic, agreement, curve_card):
    """The shipped draft's model card as the chapter reads it: a card at all; its alpha above the agreement on
    the benchmark prompts, itself above the hand-written ones; the aim (alpha 0.75, 3 tokens per step at
    K = 4) not reached, 2.25 at K = 4; and a training curve that rises."""
    assert card.strip(), "the shipped draft must carry a model card"
    card_alpha = float(re.match(r"alpha = ([\d.]+)", classic).group(1))
    assert card_alpha > agreement["benchmark"] > agreement["hand-written held-out"], \
        "agreement falls away from the training set"
    assert card_alpha < 0.75 and "2.25" in classic.splitlines()[5], \
        "the aim (alpha 0.75, 3 tokens per step at K = 4) is not reached"
    assert curve_card[-1][0] > curve_card[0][0] and curve_card[-1][1] > curve_card[0][1], "the card's curve rises"


def shipped_draft(pair, weights, subset, profile):
    """The shipped pair: the draft shares the target's vocabulary, its weights file stays under 30 MB, it has
    the prose's 4 layers of width 128 and a head over the 8192 tokens of `subset` only; its c is the machine
    profile's 0.026, at K = 2 and one thread."""
    d = pair.draft.cfg
    assert d.vocab_size == pair.target.cfg.vocab_size, "the shipped draft must share the target's vocabulary"
    assert weights.stat().st_size <= 30e6, "the shipped draft must stay under 30 MB"
    assert d.n_layers == 4 and d.dim == 128 and len(subset["ids"]) == 8192, \
        "the prose's 4 layers, width 128, 8192-token head"
    assert f"{profile['c']['token']:.3f}" == "0.026" and profile["c"]["k"] == 2 and profile["threads"] == 1, \
        "the prose's c is the machine profile's, at K = 2 and one thread"
    assert isinstance(pair.draft.head, VocabSubsetHead) and pair.draft.head.weight.shape[1] == len(subset["ids"]), \
        "the shipped pair's draft must read only its subset's head columns"


def shipped_live(alpha, tokens_per_step, same_as_greedy, subset_runs):
    """The live check of the shipped draft: alpha is a probability, tokens per step at K = 4 lie in [1, 5], the
    output is the target's greedy one; and either head gives the same alpha and outputs, the subset head
    costing less than the whole one, both less than the target."""
    assert 0.0 <= alpha <= 1.0, "alpha is a probability"
    assert 1.0 <= tokens_per_step <= 5.0, "tokens per step at K = 4 lie in [1, K+1]"
    assert same_as_greedy, "greedy speculative output with the shipped draft must equal the target's greedy output"
    whole, narrow = subset_runs["whole head"], subset_runs["subset head"]
    assert whole["outputs"] == narrow["outputs"] and whole["alpha"] == narrow["alpha"], \
        "the draft's head must not change greedy agreement or greedy speculative output on these prompts"
    assert 0.0 < narrow["c"] < whole["c"] < 1.0, \
        "a narrower head must make the draft cheaper, and the draft cheaper than the target"
