"""lab/eagle.py: the confidence log changes nothing the drafter does, each broken variant is the bug
it names and only that, and the teacher-forced agreement by depth is the drafting it describes."""
import pytest
import torch

import specdec_lab as sl
from specdec_lab.core.kv_cache import KVCache
from specdec_lab.drafters import Eagle3Draft, Eagle3Drafter
from specdec_lab.lab import eagle
from specdec_lab.train.eagle3 import eagle3_loss, subset_positions
from specdec_lab.train.feature import collate_entries

PROMPTS = [[1, 2, 3], [7, 7, 7, 7, 2, 9], [3, 4], [5, 8, 11, 4, 6]]
SUBSET = list(range(0, 64, 2)) + [63]
ANSWER = 12


@pytest.fixture(scope="module")
def target():
    return sl.tiny_model(0, n_layers=4, eos_token_ids=())


@pytest.fixture(scope="module")
def draft(target):
    return Eagle3Draft(target, (0, 1, 3), vocab_ids=SUBSET, seed=1).eval().requires_grad_(False)


@pytest.fixture(scope="module")
def answers(target):
    return [sl.autoregressive_generate(target, p, max_new_tokens=ANSWER).tokens for p in PROMPTS]


def run(target, drafter, temperature=0.0, k=3):
    engine = sl.SpeculativeEngine(target, drafter, k=k)
    return [engine.generate(p, max_new_tokens=ANSWER, temperature=temperature, seed=3) for p in PROMPTS]


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_the_log_changes_nothing_the_drafter_does(target, draft, temperature):
    plain = run(target, Eagle3Drafter(draft, 256), temperature)
    drafter = eagle.ConfidenceDrafter(draft, 256)
    logged = run(target, drafter, temperature)
    for a, b in zip(plain, logged):
        assert a.tokens == b.tokens
        assert [(s.drafted, s.num_accepted, s.next_token) for s in a.steps] == \
               [(s.drafted, s.num_accepted, s.next_token) for s in b.steps]
    assert len(drafter.answers) == len(PROMPTS)
    for res, log in zip(logged, drafter.answers):
        steps = [s for s in res.steps if s.k > 0]
        assert [len(q) for q in log] == [s.k for s in steps]
        assert all(0.0 < q <= 1.0 for step in log for q in step)


def test_greedy_confidence_is_the_drafts_top_probability(target, draft):
    """At temperature 0 the drafted token is the argmax, so its q is the largest probability, and
    the first drafted token's q is the draft's softmax at the base entry."""
    drafter = eagle.ConfidenceDrafter(draft, 256)
    res = run(target, drafter)[0]
    p = PROMPTS[0]
    final, states = target.hidden(torch.tensor([p]), layers=draft.hidden_layers)
    g = draft.fuse_states(states)
    _, logits = draft(torch.tensor([p[1:]]), g[:, :-1])
    q = torch.softmax(logits[0, -1], -1)
    assert res.steps[0].drafted[0] == int(q.argmax())
    assert drafter.answers[0][0][0] == pytest.approx(float(q.max()), rel=1e-5)


def test_the_stale_state_drafter_changes_only_the_later_drafts(target, draft, answers):
    good, stale = eagle.ConfidenceDrafter(draft, 256), eagle.ConfidenceDrafter(draft, 256, feed_back="last_true")
    a, b = run(target, good), run(target, stale)
    assert [r.tokens for r in a] == [r.tokens for r in b] == answers, "greedy output is the target's either way"
    assert all(x.steps[0].drafted[0] == y.steps[0].drafted[0] for x, y in zip(a, b)), "the first draft reads a true state"
    first_steps = [(x[0], y[0]) for x, y in zip(good.answers, stale.answers)]  # q of each answer's first step
    assert all(x[0] == y[0] for x, y in first_steps), "the first drafted token is the correct drafter's"
    assert all(x[1:] != y[1:] for x, y in first_steps), "the later ones read a stale state"
    with pytest.raises(ValueError, match="feed_back"):
        eagle.ConfidenceDrafter(draft, 256, feed_back="final")


def test_reading_layers_keeps_the_weights_and_reads_other_layers(target, draft):
    twin = eagle.reading_layers(draft, target, (1, 2, 3))
    assert twin.hidden_layers == (1, 2, 3) and draft.hidden_layers == (0, 1, 3)
    ours, theirs = draft.own_state_dict(), twin.own_state_dict()
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    with pytest.raises(ValueError, match="reads 3 layers"):
        eagle.reading_layers(draft, target, (1, 2))


def test_confidence_table_counts_every_tested_token(target, draft):
    drafter = eagle.ConfidenceDrafter(draft, 256)
    results = run(target, drafter)
    table = eagle.confidence_table(results, drafter, edges=(0.0, 0.5, 1.0))
    steps = [s for r in results for s in r.steps if s.k > 0]
    assert sum(row[2] for row in table) == sum(min(s.num_accepted + 1, s.k) for s in steps)
    assert sum(row[3] for row in table) == sum(s.num_accepted for s in steps)
    for low, high, tested, accepted, mean_q in table:
        assert 0 <= accepted <= tested and (mean_q is None or low <= mean_q <= high)
    with pytest.raises(ValueError, match="results"):
        eagle.confidence_table(results[:2], drafter)


def test_examples_are_the_targets_answers_and_states(target, draft, answers):
    ex = eagle.answer_examples(target, draft.hidden_layers, PROMPTS, answers)
    for (tok, states, P, ids, lp), p, a in zip(ex, PROMPTS, answers):
        assert tok.tolist() == p + a and P == len(p)
        _, want = target.hidden(torch.tensor([p + a]), layers=draft.hidden_layers)
        torch.testing.assert_close(states, want[0, :-1].half(), rtol=1e-3, atol=1e-3)
        assert ids[:, 0].tolist() == a, "greedy answers: the target's top token is the answer's"
        assert ids.shape == lp.shape == (len(a), 64)
    picked = eagle.pick_layers(eagle.answer_examples(target, (0, 1, 2, 3), PROMPTS, answers), (0, 1, 2, 3),
                               draft.hidden_layers)
    for x, y in zip(picked, ex):
        torch.testing.assert_close(x[1], y[1], rtol=1e-3, atol=1e-3)
    with pytest.raises(ValueError, match="not among"):
        eagle.pick_layers(ex, draft.hidden_layers, (2,))


def test_own_feed_back_is_eagle3_loss_s_passes(target, draft, answers):
    ex = eagle.answer_examples(target, draft.hidden_layers, PROMPTS, answers)
    _, _, want = eagle3_loss(draft, *collate_entries(ex, list(range(len(ex))), subset_positions(draft)), unroll=3)
    assert eagle.agreement_by_depth(draft, ex, depth=3) == pytest.approx(want, abs=1e-6)


def reference_by_depth(draft, ex, depth, feed_back):
    """Entry by entry through a KVCache: from every base whose drafted chain stays in the answer,
    the true next tokens fed, the draft's own h (or the base's true state) read after each."""
    hits, counts = [0] * depth, [0] * depth
    for tok, states, P, ids, _ in ex:
        g = draft.fuse_states(states.float())  # (L - 1, dim): entry e reads (t_(e+1), g_e)
        L = len(tok)
        for base in range(P - 2, L - 1):
            cache = KVCache.for_model(draft.cfg, L)
            h, logits = draft(tok[None, 1:base + 2], g[None, :base + 1], cache=cache, last_only=True)
            h = h[0, -1]
            for s in range(depth):
                e = base + s  # the entry that predicts t_(e+2), answer token e + 2 - P
                if e + 2 >= L:
                    break
                top = ids[e + 2 - P, 0]
                hits[s] += int(int(logits[0, -1].argmax()) == int(top))
                counts[s] += 1
                if s + 1 < depth and e + 3 < L:
                    fed = h if feed_back == "own" else g[base]
                    h, logits = draft(tok[None, e + 2:e + 3], fed.view(1, 1, -1), cache=cache, last_only=True)
                    h = h[0, -1]
    return [a / n for a, n in zip(hits, counts)]


@pytest.mark.parametrize("feed_back", eagle.FEED_BACK)
def test_agreement_by_depth_is_drafting_entry_by_entry(target, draft, answers, feed_back):
    ex = eagle.answer_examples(target, draft.hidden_layers, PROMPTS, answers)
    got = eagle.agreement_by_depth(draft, ex, depth=3, feed_back=feed_back)
    assert got == pytest.approx(reference_by_depth(draft, ex, 3, feed_back), abs=1e-6)


def test_the_stale_feed_back_differs_only_past_depth_one(target, draft, answers):
    ex = eagle.answer_examples(target, draft.hidden_layers, PROMPTS, answers)
    own, stale = (eagle.agreement_by_depth(draft, ex, depth=3, feed_back=f) for f in eagle.FEED_BACK)
    assert own[0] == stale[0]
    with pytest.raises(ValueError, match="feed_back"):
        eagle.agreement_by_depth(draft, ex, feed_back="final")
