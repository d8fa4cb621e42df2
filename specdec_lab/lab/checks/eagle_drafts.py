"""Chapter 10's checks: the EAGLE drafts' shapes and layers, training-time test, confidence as a forecast
of acceptance, the stored figures the chapter quotes, and the claim on an EAGLE-3 draft that a broken
draft must fail.

`eagle3_claims` is the engine claim: the chapter runs it on the shipped EAGLE-3 draft and, through
`must_fail`, on four broken drafts (the weights fed the top three layers, or the layers one above
their own; a port that feeds back norm(h); the drafter that feeds back the last true state). The other
functions hold the figures the prose quotes, each section's in one.
"""
import torch

from ...drafters.eagle3 import default_hidden_layers
from ...train.eagle3 import unroll_mask


def rms(t):
    """The root mean square of `t` over its last axis, averaged over the rest."""
    return t.float().pow(2).mean(-1).sqrt().mean().item()


def eagle3_claims(agree, outputs, reference, stored):
    """What this chapter claims of an EAGLE-3 draft: its greedy outputs `outputs` are the target's
    `reference`, and its teacher-forced agreement `agree` at depths 1, 2, 3 stays near the `stored`
    depth-1 agreement and keeps most of it at depths 2 and 3."""
    assert outputs == reference, "greedy speculative output must be the target's own greedy decode"
    # The prompts are fixed and the agreement greedy, so the shipped draft's figure repeats from run to run
    # (0.445 on the chapter's 8 prompts); 0.05 is a margin chosen on these prompts, about two standard errors
    # had their 384 tokens been independent (they are not: resampling the prompts gives larger errors).
    assert agree[0] > stored - 0.05, \
        f"depth 1 agreed {agree[0]:.3f}, more than 0.05 below the stored {stored:.3f} (the margin)"
    kept = [a / agree[0] for a in agree[1:]]
    assert min(kept) > 0.65, (f"depths 2 and 3 kept {kept[0]:.2f} and {kept[1]:.2f} of depth 1's agreement; "
                              "the claim is more than 0.65 each (the shipped draft keeps about 0.8)")


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


def stored_figures(profile, acc, speed, measured, ratios, feature_run):
    """Section 5's figures: the engines' tau (docs/engine_acceptance.json, `acc`), the formula's speedups
    (`speed`, per draft: k, tau, c, v, speedup, free), the measured run (docs/lab_drafts.json, `measured`)
    and the step prices they imply, under the profile's forward ratios (`ratios`: rows -> one-row forwards),
    and each EAGLE draft over the token draft of its own run (`feature_run`: the greedy systems of
    docs/bench_feature_draft.json)."""
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
    assert [f"{speed[n]['speedup']:.2f}" for n in ("token", "eagle3")] == ["1.30", "0.95"], \
        "more per step, and slower by the formula"
    assert [measured[n]["over_autoregressive"] for n in ("token", "eagle3")] == [1.43, 1.131], \
        "the stored run: both pay"
    assert 1 < measured["eagle3"]["over_autoregressive"] < measured["token"]["over_autoregressive"], \
        "EAGLE-3 pays, less than the token draft"
    assert all(m["same_as_autoregressive"] == 24 for m in measured.values()), "every answer the plain decode's"
    assert [measured[n]["tokens_per_step"] for n in ("eagle3", "token")] == [1.56, 1.62], \
        "on those prompts EAGLE-3 commits less"
    price = {n: measured[n]["tokens_per_step"] / measured[n]["over_autoregressive"] for n in measured}
    assert [f"{price[n]:.2f}" for n in ("eagle3", "token")] == ["1.38", "1.13"] \
        and profile["cpu"] == "AMD EPYC (AVX2)", "a measured step cost 1.38 and 1.13 one-row forwards (AVX2 profile)"
    assert [f"{speed[n]['k'] * speed[n]['c'] + speed[n]['v']:.2f}" for n in ("eagle3", "token")] == ["1.71", "1.18"], \
        "the formula prices the steps at 1.71 and 1.18"
    assert speed["eagle3"]["tau"] > speed["token"]["tau"] and speed["eagle3"]["free"] < speed["token"]["speedup"], \
        "EAGLE-3 commits more and, even free, loses by the formula"
    assert f"{speed['eagle3']['free']:.2f}" == "1.17" and f"{ratios[4]:.3f}" == "1.383" \
        and profile["forward"]["ridge_rows"] == 3, "a free EAGLE-3 draft 1.17x; 4 rows at 1.383; the ridge at 3 rows"
    token = feature_run["spec_k2"]
    within = {"feature": feature_run["spec_feat_k3"]["vs_ar"] / token["vs_ar"],
              "eagle3": measured["eagle3"]["over_autoregressive"] / measured["token"]["over_autoregressive"]}
    assert [f"{within[n]:.2f}" for n in ("feature", "eagle3")] == ["1.06", "0.79"], \
        "over the token draft of its own run: the feature draft 1.06 at K = 3, EAGLE-3 0.79"
    assert f"{token['mean_tokens_per_step']:.2f}" == f"{measured['token']['tokens_per_step']:.2f}" == "1.62", \
        "the token draft committed 1.62 tokens per step in both runs"
    assert feature_run["spec_feat_k3"]["mean_tokens_per_step"] > measured["token"]["tokens_per_step"] \
        > measured["eagle3"]["tokens_per_step"], "on the benchmark prompts: the feature draft, token draft, EAGLE-3"


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


def run_prices(run_row):
    """Section 5's within-run table (`run_row`: (file, draft) -> k, tps, c, v, loop, rel): c and v (the target's
    seconds a step) in the run's plain-decode tokens, loop = tokens per step over S_loop, rel = S over the token
    draft's S in the same run."""
    for key, r in run_row.items():
        assert abs(r["k"] * r["c"] + r["v"] - r["loop"]) < 0.01, f"{key}: K c + v must be the loop's price per step"
    feature, old, token = (run_row[k] for k in (("bench_feature_draft", "feature"), ("bench_eagle3", "eagle3*"),
                                                  ("bench_eagle3", "token")))
    assert [f"{feature['rel']:.2f}", f"{old['rel']:.2f}"] == ["1.06", "0.77"], \
        "over the token draft of its own run: the feature draft 1.06, the older EAGLE-3 0.77"
    assert 2.5 < old["c"] / token["c"] < 3.5, "the older EAGLE-3's drafted token cost about three token-draft tokens"
    assert old["v"] - token["v"] > old["k"] * old["c"] - token["k"] * token["c"], \
        "the older EAGLE-3's eager target step cost more, over the token draft's, than its drafting"
