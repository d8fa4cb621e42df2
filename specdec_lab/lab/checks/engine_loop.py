"""Chapter 07's checks: what a correct engine loop satisfies, where a step's time goes, the sweep over K, and
the machine profile's figures the chapter quotes.

`engine_claims` is a claim about an engine, so the chapter runs it on its `SpeculativeEngine` and, through
`must_fail`, on `pitfalls.off_by_one_rollback_engine`, whose target cache keeps one position too few after
each step. The other functions check the chapter's own results, or the stored profile, passed in by name.
"""
import numpy as np

from ..trace import check_fed_forward, record_forward_inputs, trace_rows

PROFILE_KS = (1, 2, 3, 4, 6)  # the sweep's K whose verification cost the prose quotes


def engine_claims(engine, prompt, max_new_tokens, baseline_tokens):
    """A correct engine, run greedy on `prompt` with its target's forward calls recorded: it reproduces the
    target's greedy tokens `baseline_tokens`; after one prefill of the prompt without its last token, each
    step makes exactly one target forward over [previous next token] + its drafts; a step commits its n
    accepted drafts and one token, a bonus exactly when all K passed; and it reads the device once per step."""
    with record_forward_inputs(engine.target) as target_calls:
        res = engine.generate(prompt, max_new_tokens=max_new_tokens, temperature=0.0)
    rows = trace_rows(res.steps, None, res.prompt_ids, target_calls)
    assert res.tokens == list(baseline_tokens), "greedy speculative decoding must reproduce the target's greedy output"
    assert check_fed_forward(rows) == [], "each verification pass must be [previous next token] + this step's drafts"
    assert len(target_calls) == 1 + res.stats.steps, \
        "one prefill, then exactly one target forward per step: the next token never gets a forward of its own"
    assert target_calls[0] == res.prompt_ids[:-1], "the prefill must leave the prompt's last token to the first step"
    assert [t for r in rows for t in r["committed"]] == res.tokens, "the rows' committed tokens must spell the output"
    assert all(len(r["committed"]) == r["num_accepted"] + 1 for r in rows[:-1]), "a step commits n accepted + 1"
    assert all((r["kind"] == "bonus") == (r["k"] > 0 and r["num_accepted"] == r["k"]) for r in rows), \
        "a step's next token is a bonus exactly when all its K drafts were accepted"
    assert res.stats.mean_tokens_per_step == res.stats.new_tokens / res.stats.steps, \
        "tokens per step must be the new tokens over the steps"
    assert 1.0 <= res.stats.mean_tokens_per_step <= engine.k + 1, "a step yields between 1 and K+1 tokens"
    assert res.stats.syncs_per_step == 1.0, "the engine reads the device once per step"


def time_split(covered, sweep):
    """Where the time goes: the draft and target phases cover nearly all of the traced decode loop
    (`covered`, a share), and in every row of the sweep over K the output equals autoregressive decoding,
    tokens per step lie in [1, K+1], the interval holds the measured ratio, and the target's verification
    dominates a step's time."""
    assert covered > 0.8, "the draft and target phases should account for nearly all of the decode loop"
    for k, s in sweep.items():
        assert s["same_as_ar"], f"K={k}: greedy speculative output differs from autoregressive"
        assert 1.0 <= s["tokens_per_step"] <= k + 1, f"K={k}: tokens per step outside [1, K+1]"
        assert s["ci"][0] <= s["speedup"] <= s["ci"][1], f"K={k}: the interval must contain the measured ratio"
        assert s["target_ms"] > 5 * s["draft_ms"], f"K={k}: the target's verification must dominate a step's time"


def profile_figures(profile):
    """The machine profile's figures as the prose quotes them: at most 1.25 one-row forwards up to the ridge
    of 3 rows, more past it, 8.72 at 33 rows, a quarter of a forward or more per row past 3; verification
    of K = 1, 2, 3, 4, 6 at 1.07, 1.13, 1.38, 1.67 and 2.29 one-row forwards (7 rows interpolated); and
    the shipped draft's c = 0.026 at K = 2."""
    fwd = profile["forward"]
    row_cost = dict(zip(fwd["rows"], fwd["ratio_to_one_row"]))
    verify_cost = {k: float(np.interp(k + 1, fwd["rows"], fwd["ratio_to_one_row"])) for k in PROFILE_KS}
    assert fwd["ridge_rows"] == 3 and max(r for t, r in row_cost.items() if t <= 3) <= 1.25, row_cost
    assert all(r > 1.25 for t, r in row_cost.items() if t > 3) and round(row_cost[33], 2) == 8.72, row_cost
    assert [round(verify_cost[k], 2) for k in PROFILE_KS] == [1.07, 1.13, 1.38, 1.67, 2.29], verify_cost
    assert all(row_cost[t + 1] - row_cost[t] >= 0.25 for t in (3, 4, 5)), "past 3 rows, a quarter of a forward a row"
    assert round(profile["c"]["token"], 3) == 0.026 and profile["c"]["k"] == 2, profile["c"]
