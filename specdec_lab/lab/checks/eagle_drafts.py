"""Chapter 10's checks: the EAGLE drafts' shapes and layers, training-time test, confidence as a forecast
of acceptance, the stored figures the chapter quotes, and the claim on an EAGLE-3 draft that a broken
draft must fail.

`eagle3_claims` is the claim on a port of the EAGLE-3 draft: the chapter runs it on the shipped draft
and, through `must_fail`, on four broken drafts (the weights fed the top three layers, or the layers one above
their own; a port that feeds back norm(h); the drafter that feeds back the last true state). The other
functions hold the figures the prose quotes, each section's in one.
"""
import torch

from ...drafters.eagle3 import default_hidden_layers
from ...train.eagle3 import unroll_mask

# docs/three_drafts.json's speedups, which section 5 quotes (a stored run)
QUOTED_S = {"token": 1.35, "feature": 1.26, "eagle3 K=2": 1.124, "eagle3": 1.074}


def rms(t):
    """The root mean square of `t` over its last axis, averaged over the rest."""
    return t.float().pow(2).mean(-1).sqrt().mean().item()


def eagle3_claims(agree, match, outputs, reference, stored, se):
    """What this chapter claims of an EAGLE-3 draft: its greedy outputs `outputs` are the target's
    `reference`; its teacher-forced agreement at depth 1 (`agree[0]`) reaches the `stored` depth-1
    agreement less three of today's bootstrap standard errors `se`; and at each depth its guesses are
    the shipped draft's (`match`: the share of positions where they pick the same token) at 0.98 of
    positions or more, which float rounding in another engine leaves (it flips only near-ties)."""
    assert outputs == reference, "greedy speculative output must be the target's own greedy decode"
    assert agree[0] > stored - 3 * se, \
        f"depth 1 agreed {agree[0]:.3f}, more than three standard errors ({se:.3f}) below the stored {stored:.3f}"
    assert min(match) >= 0.98, ("at depths 1, 2, 3 it guessed the shipped draft's token at "
                                + ", ".join(f"{m:.3f}" for m in match) + " of positions; the claim is 0.98 or more")


def draft_shapes(target, token_draft, feature, eagle3, h, f, h3, config):
    """Sections 1 and 2: the feature draft's one layer of the target's width over the head's 8,192
    tokens, the 128-wide token draft, and the EAGLE-3 draft's three layers fused by `fc`; `h` and `f` are
    section 1's estimates and target states, `h3` the EAGLE-3 draft's fed-back states, `config` its
    config.json."""
    dim = target.cfg.dim
    head = feature.body.head.proj.weight
    assert target.cfg.n_layers == 30 and len(feature.body.layers) == 1 and head.shape[1] == 8192, \
        "the target has 30 layers, the feature draft one, over the head's 8,192 tokens"
    assert tuple(feature.fc.weight.shape) == (2 * dim, dim) and h.shape == f[:, 1:].shape, \
        "fc brings [token, state] to the width, and h estimates the states after the first"
    assert token_draft.cfg.dim == 128, "the token draft is 128 wide"
    assert config["hidden_layers"] == list(default_hidden_layers(30)) == [1, 14, 26], \
        "the EAGLE-3 draft reads layers 1, 14 and 26"
    wqkv = eagle3.layer.attn.wqkv.weight
    assert tuple(eagle3.fc.weight.shape) == (3 * dim, dim) and tuple(wqkv.shape)[0] == 2 * dim, \
        "fc over 3 layers, qkv over 2 halves"
    assert rms(h3) > 5 * rms(eagle3.norm(h3)), \
        "what is fed back (h) is on the residual stream's scale, not the head's input's"


def stored_agreement(profile, stored):
    """Section 1's quoted figures: the profile's c of each draft and the depth-1 agreement stored over
    the 72 hand-written held-out prompts (`stored`: each draft's held-out set)."""
    assert [f"{profile['c'][d]:.3f}" for d in ("token", "feature", "eagle3")] == ["0.026", "0.099", "0.108"], \
        "the profile prices the drafts at c = 0.026, 0.099 and 0.108"
    assert [f"{stored[n]['agreement']:.3f}" for n in ("token draft", "feature draft", "EAGLE-3 draft")] \
        == ["0.336", "0.372", "0.435"], "the stored depth-1 agreement the prose quotes"
    assert all(s["num_prompts"] == 72 for s in stored.values()), "the 72 hand-written held-out prompts"


def layer_readings(lens, by_reading, hidden_layers, off_by_one, top_three):
    """Section 2: the logit lens (`lens`, the share of answer tokens the head picks from each state) and
    the agreement by depth when the same weights read other layers (`by_reading`, keyed by layers)."""
    assert lens["final state"] >= 0.99, "the final state's top token is the target's next token"
    assert lens["after layer 1"] < lens["after layer 14"] < lens["final state"], \
        "the low and middle layers hold something else"
    assert off_by_one == (2, 15, 27), "the off-by-one reads vLLM's numbering as the lab's"
    good, off, top = (by_reading[layers][0] for layers in (hidden_layers, off_by_one, top_three))
    assert off > 2 / 3 * good and top < good / 3, "an off-by-one costs little, the top three layers nearly everything"


def training_time_test(by_depth, loss_agree, card_rows, card, feature_card):
    """Section 3: the unroll's masks, `eagle3_loss`'s passes equal to the drafting measured, only the
    fed-back state changing depths 2 and 3, and the model cards' figures (`card_rows`: step -> the
    agreement at depths 1 to 3 in the EAGLE-3 card `card`; `feature_card`: the feature draft's card)."""
    assert all(((unroll_mask(6, s)[0, 0] == 0).sum(-1)[s:] == torch.arange(s + 1, 7)).all() for s in range(3)), \
        "entry e of pass s sees the true entries 0..e-s and its s drafted entries"
    assert max(abs(a - b) for a, b in zip(loss_agree, by_depth["own h (EAGLE-3)"])) < 1e-6, \
        "eagle3_loss's passes are the drafting measured"
    own, stale = by_depth["own h (EAGLE-3)"], by_depth["last true state"]
    assert own[0] == stale[0] and stale[1] < own[1] and stale[2] < own[2], "only depths 2 and 3 read the fed-back state"
    assert card_rows[600] == [0.502, 0.454, 0.424] and max(card_rows) == 600 and "67 held-out answers" in card, \
        "the EAGLE-3 card: 0.502, 0.454 and 0.424 at step 600, on 67 held-out answers"
    assert "smooth L1" in feature_card and "0.1 x cross-entropy" in feature_card \
        and "two unrolled passes" in feature_card, "the feature draft's card: its loss and its two unrolled passes"


def confidence(table, mean_q):
    """Section 4: the live run's drafted tokens binned by the draft's probability q (`table`: rows of
    low, high, tested, accepted, mean q), and the mean q of accepted and rejected tokens (`mean_q`)."""
    rates = [a / n for _, _, n, a, _ in table]
    assert rates[0] < 0.3 and rates[-1] > 0.8, "low-confidence drafts rarely pass, the most confident almost always"
    assert mean_q[True] > mean_q[False], "accepted drafts were drafted with more confidence"


def stored_figures(profile, acc, speed, ratios):
    """Section 5's figures from the engines' run (docs/engine_acceptance.json, `acc`) and the formula
    (`speed`, per draft: k, tau, c, v, speedup, free, second) under the AVX2 profile's forward ratios
    (`ratios`: rows -> one-row forwards)."""
    assert acc["config"]["num_prompts"] == 12 and acc["config"]["max_new_tokens"] == 64, "12 prompts, 64 tokens"
    taus = {name: {eng: r["tau"] for eng, r in d["engines"].items()} for name, d in acc["drafts"].items()}
    assert [f"{taus[n]['lab']:.2f}" for n in ("token", "eagle3")] == ["1.54", "1.62"], "the lab's tau: 1.54 and 1.62"
    assert all(abs(t / taus[n]["lab"] - 1) < 0.02 for n in taus for t in taus[n].values()), \
        "the engines agree with the lab"
    assert all(d["engines"][e]["same_as_lab_autoregressive"] == 12 for d in acc["drafts"].values()
               for e in ("lab", "vllm")), "the lab and vLLM give the lab's greedy answer to all 12 prompts"
    for s in speed.values():
        assert abs(s["speedup"] - s["tau"] / (s["k"] * s["c"] + s["v"])) < 1e-6, \
            "the formula is tau over the step's price"
    assert [f"{speed[n]['speedup']:.2f}" for n in ("token", "eagle3")] == ["1.30", "0.95"] \
        and profile["cpu"] == "AMD EPYC (AVX2)", "more per step, and slower by the formula (AVX2 profile)"
    assert [f"{speed[n]['second']:.2f}" for n in ("token", "eagle3")] == ["1.42", "1.19"], \
        "the AVX-512 profile: both pay, EAGLE-3 less"
    assert speed["eagle3"]["tau"] > speed["token"]["tau"] and speed["eagle3"]["free"] < speed["token"]["speedup"], \
        "EAGLE-3 commits more and, even free, loses by the formula"
    assert f"{speed['eagle3']['free']:.2f}" == "1.17" and f"{ratios[4]:.3f}" == "1.383" \
        and profile["forward"]["ridge_rows"] == 3, "a free EAGLE-3 draft 1.17x; 4 rows at 1.383; the ridge at 3 rows"


def speed_run(run, second):
    """Section 5's run (docs/three_drafts.json, `run`): every answer the plain decode's, each step's price
    (drafted per step x c + target/step, in plain-decode tokens) equal to tokens per step over S_loop, the
    figures the prose quotes, and where EAGLE-3's dearer step went; `second` is the AVX-512 profile."""
    s = {n: m for n, m in run["systems"].items() if n != "autoregressive"}
    assert "AVX-512" in run["cpu"] and run["cpu"] == second["cpu"] and "+changes" not in run["commit"], \
        "the run records its CPU, the AVX-512 profile's kind, and a clean commit"
    assert all(m["same_as_autoregressive"] == run["prompts"] == 24 for m in s.values()), \
        "every answer the plain decode's"
    price = {n: m["drafted_per_step"] * m["c"] + m["target_per_step"] for n, m in s.items()}
    for n, m in s.items():
        assert abs(price[n] - m["tokens_per_step"] / m["loop_over_autoregressive"]) < 0.01, \
            f"{n}: drafting plus the target's phase must be the loop's price per step"
        assert max(m["by_pass"]) - min(m["by_pass"]) < 0.05, f"{n}: the passes agree within 0.05"
    assert {n: m["over_autoregressive"] for n, m in s.items()} == QUOTED_S, "the speedups the prose quotes"
    assert s["eagle3"]["interval"][1] < s["token"]["interval"][0], \
        "EAGLE-3 slower than the token draft, intervals apart"
    assert s["feature"]["interval"][0] < s["token"]["over_autoregressive"] < s["feature"]["interval"][1], \
        "the feature draft level with the token draft"
    first = {n: m["accepted_by_position"][0] for n, m in s.items()}
    assert first["feature"] > first["token"] > first["eagle3"], \
        "on these prompts the feature draft's first token passes most often, EAGLE-3's least"
    extra = s["eagle3"]["drafted_per_step"] * s["eagle3"]["c"] - s["token"]["drafted_per_step"] * s["token"]["c"]
    assert extra > 3 * (s["eagle3"]["target_per_step"] - s["token"]["target_per_step"]), \
        "EAGLE-3's dearer step is mostly drafting, not verification"
    free = s["eagle3"]["tokens_per_step"] / s["eagle3"]["target_per_step"]  # exercise 3: a free EAGLE-3 draft
    assert f"{free:.2f}" == "1.38" and free < s["token"]["loop_over_autoregressive"], \
        "even free, EAGLE-3's loop stays under the token draft's on these prompts"


def exercise_answers(acc, speed, ratios, card_alpha, by_card, near_ties):
    """The answers' figures: the tie cost c at K = 2 (answer 2), the feature card's agreement and the
    formula's ranking, and llama.cpp's one near-tie (`near_ties`: draft and logit gap)."""
    tau2 = 1 + sum(acc["drafts"]["eagle3"]["engines"]["lab"]["per_position"][:2])  # answer 2
    c_tie = (tau2 / speed["token"]["speedup"] - ratios[3]) / 2
    assert f"{tau2:.3f}" == "1.561" and f"{c_tie:.3f}" == "0.035", "answer 2: tau 1.561 at K = 2, a tie at c = 0.035"
    assert card_alpha == {"token": 0.535, "feature": 0.608} and by_card["feature"] < by_card["token"], \
        "the feature draft agrees more often and the formula ranks it below the token draft"
    assert len(near_ties) == 2 and all(f"{t['gap']:.3f}" == "0.004" for t in near_ties), "llama.cpp's one near-tie"


def live_run(live_same, broken_runs, tau_ok):
    """The live runs: the EAGLE-3 draft's greedy output the target's (`live_same`), each broken draft's
    too (`broken_runs`: name -> same, tau, caught), caught by `eagle3_claims`, and over three prompts the
    engine's tau barely telling the stale drafter from the correct one (`tau_ok`)."""
    assert live_same, "greedy speculative output with the EAGLE-3 draft must equal the target's greedy decode"
    for name, b in broken_runs.items():
        assert b["same"], f"{name}: verification keeps even a broken draft's output the target's"
        assert b["caught"] is not None, f"the claims must fail on {name}"
    stale = next(b for name, b in broken_runs.items() if "last true state" in name)
    assert abs(stale["tau"] - tau_ok) < 0.15, \
        "over three prompts the engine's tau barely tells the stale drafter from the correct one"
