"""Chapter 04's checks: a rollback that moves one integer and still gives a fresh cache's logits, what a correct
engine does when the target drafts for itself at temperature 0, and what the off-by-one rollbacks cost."""
from ..pitfalls import draft_lag


def hand_step(diff, reference, cache, address, prompt, forward_kind):
    """The step run by hand: the rolled-back cache's next logits within 1e-5 of a fresh cache's (`diff`, the
    largest difference; `reference`, the fresh cache's logits), rounding at logits of about 10 on the tiny
    model's eager forward (`forward_kind`), no reallocation (`cache` still at `address`), and answer 1."""
    assert diff < 1e-5, "a rolled-back cache must give the logits of a cache that never saw the rejected tokens"
    largest = reference.abs().max().item()
    assert diff < 1e-6 * largest and 5 < largest < 20, "rounding, at logits of about 10"
    assert cache.k.data_ptr() == address, "rollback must not reallocate"
    assert len(prompt) + 1 == 5, "answer 1: the prompt and c"
    assert forward_kind == "eager", "the prose: the tiny model runs the eager forward"


def self_draft(engine, prompt, max_new_tokens, baseline_tokens):
    """What any correct engine must do when the target drafts for itself at temperature 0: reproduce the
    target's greedy tokens `baseline_tokens`, accept every draft, and never let the draft fall behind the
    committed text (`pitfalls.draft_lag` after every step). The off-by-one draft cache fails it, though its
    output is correct."""
    lag = []
    res = engine.generate(prompt, max_new_tokens=max_new_tokens,
                          on_step=lambda rec, out: lag.append(draft_lag(engine)))
    assert res.tokens == list(baseline_tokens), "speculative greedy must equal the target's greedy"
    assert max(lag) == 0, "the draft fell behind the committed text"
    assert res.stats.accepted_share == 1.0, \
        f"a self-draft at temperature 0 had {res.stats.accepted_share:.2f} accepted"


def off_by_one(res_correct, res_obo, lag_obo, baseline_tokens, res_broken):
    """The experiment's figures: the off-by-one draft cache (`res_obo`, its lag after every step `lag_obo`)
    costs most of the tokens each step commits against the correct engine (`res_correct`), loses one token per
    drafting step, and leaves the output the target's greedy `baseline_tokens`; the off-by-one in the target's
    own cache (`res_broken`) corrupts the output."""
    drafting_steps = sum(1 for s in res_obo.steps if s.k > 0)
    assert res_obo.stats.mean_tokens_per_step < 0.5 * res_correct.stats.mean_tokens_per_step, \
        "the off-by-one costs most of the tokens each step commits"
    assert lag_obo[-1] == drafting_steps, "the off-by-one rollback loses exactly one token per drafting step"
    assert res_obo.tokens == list(baseline_tokens), "verification must keep the output correct whatever the draft does"
    assert res_broken.tokens != list(baseline_tokens), "an off-by-one in the target's cache must corrupt the output"
