"""lab/exercises: every reference passes, every classic mistake fails with its own diagnosis, and a
correct answer written another way passes too. The broken variants are written as a learner would
write them (or taken from lab/pitfalls.py); nothing is mocked."""
import copy

import pytest
import torch

import specdec_lab as sl
from specdec_lab.core.drafter import Verdict
from specdec_lab.core.kv_cache import drop_rejected
from specdec_lab.core.verify import target_draws, verify, verify_reference
from specdec_lab.lab import exercises, pitfalls
from specdec_lab.lab.exercises.positions import rollback, rollback_cases
from specdec_lab.lab.exercises.sampled import rule_as_exercise
from specdec_lab.tree.structure import ancestors, static_parents
from specdec_lab.verification import verify_block


# ---- verify and block_verify: the sampled rules ----

def token_loop(accept=lambda p_d, q_d: min(1.0, p_d / q_d), residual=lambda p, q: (p - q).clamp(min=0),
               bonus=lambda p, q, K: p[K], late=False, stop_early=False):
    """A learner's loop for the token rule, with the pieces a mistake changes."""
    def fn(p, q, drafted, generator):
        K = drafted.shape[0] - int(stop_early)
        for i in range(K):
            d = int(drafted[i])
            if float(torch.rand(1, generator=generator)) < accept(float(p[i, d]), float(q[i, d])):
                continue
            return i + int(late), int(torch.multinomial(residual(p[i], q[i]), 1, generator=generator))
        return K, int(torch.multinomial(bonus(p, q, K), 1, generator=generator))
    return fn


def inverse_cdf_unnormalised(p, q, drafted, generator):
    """The right test, then inverse-CDF sampling from max(0, p - q) without dividing by its mass."""
    for i in range(drafted.shape[0]):
        d = int(drafted[i])
        if float(torch.rand(1, generator=generator)) < min(1.0, float(p[i, d] / q[i, d])):
            continue
        cdf = (p[i] - q[i]).clamp(min=0).cumsum(0)
        u = torch.rand(1, generator=generator)
        return i, int(torch.searchsorted(cdf, u).clamp(max=p.shape[1] - 1))
    return drafted.shape[0], int(torch.multinomial(p[-1], 1, generator=generator))


def argmax_rule(p, q, drafted, generator):
    best = p.argmax(-1)
    for i in range(drafted.shape[0]):
        if int(drafted[i]) != int(best[i]):
            return i, int(best[i])
    return drafted.shape[0], int(best[-1])


def vectorised_token_rule(p, q, drafted, generator):
    """Correct, written another way: every test at once, the residual by the exponential race."""
    K, V = drafted.shape[0], p.shape[1]
    u = torch.rand(K, generator=generator)
    idx = torch.arange(K)
    keep = u * q[idx, drafted] < p[idx, drafted]  # u < p/q, no division
    n = int(keep.long().cumprod(0).sum())
    dist = p[K] if n == K else (p[n] - q[n]).clamp(min=0)
    e = torch.empty(V).exponential_(generator=generator)
    return n, int((dist / e).argmax())


SAMPLED_MISTAKES = [
    ("verify", rule_as_exercise(pitfalls.verify_resample_from_p), "resample_from_p"),
    ("verify", token_loop(accept=lambda p_d, q_d: min(1.0, q_d / p_d) if p_d else 1.0), "ratio_inverted"),
    ("verify", inverse_cdf_unnormalised, "residual_unnormalised"),
    ("verify", token_loop(bonus=lambda p, q, K: p[K - 1]), "no_bonus"),
    ("verify", token_loop(bonus=lambda p, q, K: q[K - 1]), "bonus_from_q"),
    ("verify", token_loop(late=True), "off_by_one"),
    ("verify", token_loop(stop_early=True), "off_by_one"),
    ("verify", token_loop(accept=lambda p_d, q_d: 1.0), "accept_all"),
    ("verify", argmax_rule, "argmax_not_sample"),
    ("block_verify", rule_as_exercise(pitfalls.verify_block_ratio_test), "block_ratio_test"),
    ("block_verify", rule_as_exercise(pitfalls.verify_block_unscaled_residual), "block_unscaled_residual"),
    ("block_verify", rule_as_exercise(verify), "token_rule"),
]

# ---- verify_greedy and rollback ----


def greedy_no_bonus(target_logits, drafted):
    best = target_logits.argmax(-1)
    for i in range(drafted.shape[0]):
        if drafted[i] != best[i]:
            return i, int(best[i])
    return drafted.shape[0], int(best[drafted.shape[0] - 1])


def greedy_next_row(target_logits, drafted):
    best, n = target_logits.argmax(-1), 0
    while n < drafted.shape[0] and drafted[n] == best[n]:
        n += 1
    return n, int(best[n + 1])  # the row after: out of range when every draft matched


def greedy_counts_all(target_logits, drafted):
    best = target_logits.argmax(-1)
    n = int((drafted == best[:-1]).sum())
    return n, int(best[n])


def greedy_vectorised(target_logits, drafted):
    best = target_logits.argmax(-1)  # (K+1,)
    n = int((drafted == best[:-1]).long().cumprod(0).sum())
    return n, int(best[n])


def rollback_keeps_n(target_len, draft_len, k, n):
    pending = target_len + 1 - draft_len
    return target_len + n, draft_len + pending + min(n, k - 1), 1 if n < k else 2


def rollback_forgets_lag(target_len, draft_len, k, n):
    pending = target_len + 1 - draft_len
    return target_len + n + 1, draft_len + pending + n, 1


def rollback_pending_one(target_len, draft_len, k, n):
    return target_len + n + 1, draft_len + 1 + min(n, k - 1), 1 if n < k else 2


def rollback_by_fed(target_len, draft_len, k, n):
    """Correct, written another way: what each cache was fed, minus what it drops."""
    pending = target_len + 1 - draft_len
    target_fed, draft_fed = target_len + k + 1, draft_len + pending + k - 1
    dropped = k - 1 - n if n < k else 0
    return target_fed - (k - n), draft_fed - dropped, 2 if n == k else 1


# ---- masks ----

def mask_unmasked(prefix_len, k):
    return torch.ones(k + 1, prefix_len + k + 1, dtype=torch.bool)


def mask_no_self(prefix_len, k):
    return torch.ones(k + 1, prefix_len + k + 1).tril(diagonal=prefix_len - 1).bool()


def mask_shifted(prefix_len, k):
    return torch.ones(k + 1, prefix_len + k + 1).tril(diagonal=prefix_len + 1).bool()


def mask_transposed(prefix_len, k):
    return (torch.ones(k + 1, prefix_len + k + 1).tril(diagonal=prefix_len) > 0).T


def mask_not_shifted(prefix_len, k):
    return torch.ones(k + 1, prefix_len + k + 1).tril().bool()


def mask_loop(prefix_len, k):
    """Correct, written another way: the double loop of core/masks.py's reference."""
    mask = torch.zeros(k + 1, prefix_len + k + 1, dtype=torch.bool)
    for i in range(k + 1):
        mask[i, :prefix_len + i + 1] = True
    return mask


def tree_chain(parents):
    return torch.ones(len(parents), len(parents)).tril().bool()


def tree_parent_only(parents):
    mask = torch.eye(len(parents), dtype=torch.bool)
    for i, j in enumerate(parents.tolist()):
        if j >= 0:
            mask[i, j] = True
    return mask


def tree_no_self(parents):
    return exercises.solution("tree_mask")(parents) & ~torch.eye(len(parents), dtype=torch.bool)


def tree_transposed(parents):
    return exercises.solution("tree_mask")(parents).T


def tree_parent_first(parents):
    """Correct, written another way: EAGLE's parent-first build, mask[i] = mask[parent(i)] | {i}."""
    N = len(parents)
    mask = torch.zeros(N, N, dtype=torch.bool)
    for i, j in enumerate(parents.tolist()):
        if j >= 0:
            mask[i] = mask[j]
        mask[i, i] = True
    return mask


# ---- expected_tokens and speedup ----

def tokens_without_bonus(alpha, k):
    return sum(alpha ** i for i in range(1, k + 1))


def tokens_closed_form(alpha, k):
    return (1 - alpha ** (k + 1)) / (1 - alpha)


def tokens_torch_closed_form(alpha, k):
    a = torch.tensor(alpha, dtype=torch.float64)
    return float((1 - a ** (k + 1)) / (1 - a))  # nan at alpha = 1


def tokens_series(alpha, k):
    """Correct, written another way: the series, which needs no special case at alpha = 1."""
    return sum(alpha ** i for i in range(k + 1))


def speedup_c_once(alpha, k, c, v):
    return tokens_series(alpha, k) / (c + v)


def speedup_no_v(alpha, k, c, v):
    return tokens_series(alpha, k) / (k * c + 1)


def speedup_without_bonus(alpha, k, c, v):
    return tokens_without_bonus(alpha, k) / (k * c + v)


def speedup_closed_form(alpha, k, c, v):
    return tokens_closed_form(alpha, k) / (k * c + v)


def speedup_library(alpha, k, c, v):
    """Correct, written another way: the roofline's own function."""
    from specdec_lab.analysis.roofline import expected_speedup
    return expected_speedup(alpha, k, c, verify_cost=v)


# ---- step ----

def step_with(rollback=True, tell=True, keep=1):
    """A learner's step; rollback=False keeps the rejected rows, tell=False never calls drafter.commit,
    keep=0 keeps n positions of the k + 1 fed instead of n + 1."""
    def fn(target, cache, drafter, c, k, sampling, generator):
        ids, q = drafter.propose(k, sampling, generator)
        logits = target(torch.cat([c, ids]).view(1, -1), cache=cache)[0]
        p, u, e = target_draws(logits, sampling, ids.shape[0], generator)
        n, token = verify(ids, p, q, u, e, greedy=sampling.greedy).tolist()
        if rollback:
            cache.rollback(cache.length - (ids.shape[0] + 1) + n + keep)
        if tell:
            drafter.commit(Verdict(ids.tolist(), n, token))
        return ids.tolist()[:n] + [token], torch.tensor([token])
    return fn


def step_by_pieces(target, cache, drafter, c, k, sampling, generator):
    """Correct, written another way: the reference loop verifier, drop_rejected, and device tensors
    in the verdict."""
    ids, q = drafter.propose(k, sampling, generator)
    k = ids.shape[0]
    logits = target(torch.cat([c, ids]).view(1, k + 1), cache=cache)[0]
    p, u, e = target_draws(logits, sampling, k, generator)
    decision = verify_reference(ids, p, q, u, e, greedy=sampling.greedy)
    n, token = decision.tolist()
    drop_rejected(cache, fed=k + 1, kept=n + 1)
    drafter.commit(Verdict(ids.tolist(), n, token, ids, decision[1:2]))
    return ids[:n].tolist() + [token], decision[1:2]


def rows_one_mask(logits, drafted, allowed):
    return torch.stack([row.masked_fill(~allowed([]), float("-inf")) for row in logits])


def rows_shifted(logits, drafted, allowed):
    return torch.stack([row.masked_fill(~allowed(list(drafted[:i + 1])), float("-inf")) for i, row in enumerate(logits)])


def rows_bonus_unmasked(logits, drafted, allowed):
    out = logits.clone()
    for i in range(len(drafted)):  # the K draft rows only
        out[i][~allowed(list(drafted[:i]))] = float("-inf")
    return out


def rows_zero(logits, drafted, allowed):
    return torch.stack([torch.where(allowed(list(drafted[:i])), row, torch.zeros_like(row)) for i, row in enumerate(logits)])


def rows_where(logits, drafted, allowed):
    masks = torch.stack([allowed(list(drafted[:i])) for i in range(len(drafted) + 1)])
    return torch.where(masks, logits, torch.full_like(logits, float("-inf")))


def lookup_first(context, n, k):
    for s in range(len(context) - n):
        if context[s:s + n] == context[-n:]:
            return context[s + n:s + n + k]
    return []


def lookup_self(context, n, k):
    s = len(context) - n
    return context[s + n:s + n + k]  # the tail itself: nothing after it


def lookup_cut_short(context, n, k):
    for s in range(len(context) - n - 1, -1, -1):
        if context[s:s + n] == context[-n:]:
            return context[s + n:s + n + k]
    return []


def lookup_growing(context, n, k):
    seq = list(context)
    for s in range(len(context) - n - 1, -1, -1):
        if seq[s:s + n] == seq[len(context) - n:len(context)]:
            for i in range(k):
                seq.append(seq[s + n + i])
            return seq[len(context):]
    return []


MISTAKES = SAMPLED_MISTAKES + [
    ("grammar_rows", rows_one_mask, "one_mask_for_every_row"),
    ("grammar_rows", rows_shifted, "mask_shifted_by_one"),
    ("grammar_rows", rows_bonus_unmasked, "bonus_row_unmasked"),
    ("grammar_rows", rows_zero, "zero_not_minus_inf"),
    ("lookup", lookup_first, "first_occurrence"),
    ("lookup", lookup_self, "matches_itself"),
    ("lookup", lookup_cut_short, "stops_at_the_end"),
    ("verify_greedy", greedy_no_bonus, "no_bonus"),
    ("verify_greedy", greedy_next_row, "off_by_one"),
    ("verify_greedy", greedy_counts_all, "no_stop_at_mismatch"),
    ("rollback", rollback_keeps_n, "off_by_one_rollback"),
    ("rollback", rollback_forgets_lag, "all_accepted_pending"),
    ("rollback", rollback_pending_one, "pending_ignored"),
    ("verify_mask", mask_unmasked, "unmasked"),
    ("verify_mask", mask_no_self, "no_self"),
    ("verify_mask", mask_shifted, "off_by_one"),
    ("verify_mask", mask_transposed, "transposed"),
    ("verify_mask", mask_not_shifted, "not_shifted"),
    ("tree_mask", tree_chain, "chain_mask"),
    ("tree_mask", tree_parent_only, "parent_only"),
    ("tree_mask", tree_no_self, "no_self"),
    ("tree_mask", tree_transposed, "transposed"),
    ("expected_tokens", tokens_without_bonus, "missing_bonus"),
    ("expected_tokens", tokens_closed_form, "division_by_zero_at_one"),
    ("expected_tokens", tokens_torch_closed_form, "division_by_zero_at_one"),
    ("speedup", speedup_c_once, "c_not_times_k"),
    ("speedup", speedup_no_v, "ignores_v"),
    ("speedup", speedup_without_bonus, "missing_bonus"),
    ("speedup", speedup_closed_form, "division_by_zero_at_one"),
    ("step", step_with(rollback=False), "no_rollback"),
    ("step", step_with(tell=False), "drafter_not_told"),
    ("step", step_with(keep=0), "off_by_one_rollback"),
]

OTHER_WAYS = [
    ("verify", vectorised_token_rule),
    ("verify", rule_as_exercise(verify)),
    ("block_verify", rule_as_exercise(verify_block)),
    ("verify_greedy", greedy_vectorised),
    ("rollback", rollback_by_fed),
    ("verify_mask", mask_loop),
    ("tree_mask", tree_parent_first),
    ("expected_tokens", tokens_series),
    ("speedup", speedup_library),
    ("step", step_by_pieces),
    ("grammar_rows", rows_where),
    ("lookup", lookup_growing),
]


def _id(param):
    return getattr(param, "__name__", None) or str(param)


def test_names_cover_the_chapters_exercises():
    assert {"verify", "verify_greedy", "rollback", "verify_mask", "tree_mask", "expected_tokens", "speedup",
            "block_verify", "step", "lookup", "grammar_rows", "decode_ceiling", "acceptance_rate", "eagle_pairs",
            "best_k", "blocks_to_take", "step_fates"} <= set(exercises.names())


def assert_diagnosed(report, diagnosis):
    """A failed check that names `diagnosis`, its hint shown in the text and the diagnosis in the HTML box."""
    assert not report.passed, f"{report.exercise}: the {diagnosis} variant passed: {report!r}"
    assert report.diagnosis == diagnosis, f"{report.exercise}: expected {diagnosis}, got {report!r}"
    assert report.hint and report.hint in repr(report) and diagnosis in report._repr_html_()


@pytest.mark.parametrize("name", exercises.names())
def test_the_reference_solution_passes(name):
    report = exercises.check(name, exercises.solution(name))
    assert report.passed, repr(report)
    assert report.diagnosis is None and report.message


@pytest.mark.parametrize("name, fn, diagnosis", MISTAKES, ids=[f"{m[0]}-{m[2]}-{i}" for i, m in enumerate(MISTAKES)])
def test_each_mistake_fails_with_its_own_diagnosis(name, fn, diagnosis):
    report = exercises.check(name, fn)
    assert_diagnosed(report, diagnosis)


@pytest.mark.parametrize("name, fn", OTHER_WAYS, ids=[f"{n}-{_id(f)}" for n, f in OTHER_WAYS])
def test_a_correct_answer_written_another_way_passes(name, fn):
    report = exercises.check(name, fn)
    assert report.passed, repr(report)


@pytest.mark.parametrize("name", exercises.names())
def test_a_starter_that_raises_not_implemented_is_not_written_yet(name):
    def starter(*args):
        raise NotImplementedError
    report = exercises.check(name, starter)
    assert not report.passed and report.diagnosis is None
    assert "not written" in report.message


def test_an_exception_is_reported_with_its_case_not_raised():
    def crashes(prefix_len, k):
        raise KeyError("oops")
    report = exercises.check("verify_mask", crashes)
    assert not report.passed and "KeyError" in report.message and "prefix_len = 0, k = 1" in report.message


def test_a_bad_name_is_refused_with_the_allowed_ones():
    with pytest.raises(ValueError, match="'verfy'.*'verify'"):
        exercises.check("verfy", exercises.solution("verify"))
    with pytest.raises(ValueError, match="'step'"):
        exercises.solution("nope")


def test_the_report_reads_as_a_coloured_box():
    good = exercises.check("speedup", lambda *args: exercises.solution("speedup")(*args))   # a learner's, correct
    bad = exercises.check("speedup", speedup_c_once)
    assert "#1a7f37" in good._repr_html_() and "Passed" in good._repr_html_()
    assert repr(good).startswith("speedup: passed. Your speedups")
    assert "#b42318" in bad._repr_html_() and "c_not_times_k" in bad._repr_html_()
    assert repr(bad).startswith("speedup: not yet.") and "k * c" in repr(bad)


def test_a_report_on_the_reference_says_the_reference_passed_not_yours():
    report = exercises.check("speedup", exercises.solution("speedup"))
    assert report.passed and report.reference
    assert repr(report).startswith("speedup: the reference solution passed") and "Its speedups" in repr(report)
    assert "Your" not in repr(report).split(").", 1)[1] and "Passed" not in report._repr_html_()
    assert "NotImplementedError until you write it" in report._repr_html_()


def test_a_sampled_check_is_deterministic_even_with_the_global_generator():
    def global_rng(p, q, drafted, generator):
        return token_loop(late=True)(p, q, drafted, None)  # ignores the generator it was given
    before = torch.get_rng_state()
    first, second = exercises.check("verify", global_rng), exercises.check("verify", global_rng)
    assert first.message == second.message and first.diagnosis == second.diagnosis == "off_by_one"
    assert torch.equal(torch.get_rng_state(), before), "check leaves the caller's global generator alone"


def test_a_lossy_rule_is_told_what_it_does_to_the_output():
    report = exercises.check("verify", rule_as_exercise(pitfalls.verify_resample_from_p))
    assert "no longer the target's distribution" in report.message and "where the target gives it" in report.message


def test_the_library_masks_agree_with_the_solutions():
    for parents in (torch.tensor([-1, 0, 1, 0, 3]), static_parents((4, 2, 1))[0]):
        assert torch.equal(exercises.solution("tree_mask")(parents), ancestors(parents, max_depth=4))


def test_the_rollback_solution_is_the_engines_arithmetic():
    """Run the real engine on tiny models and hold the cache lengths after each step to the solution."""
    target = sl.tiny_model(0)
    draft = copy.deepcopy(target)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for w in draft.parameters():
            w.add_(0.05 * w.std() * torch.randn(w.shape, generator=g))
    engine = sl.SpeculativeEngine(target, draft, k=2)
    lengths = []

    def record(rec, out):
        lengths.append((rec.k, rec.num_accepted, engine.cache.length, engine.drafter.cache.length,
                        len(engine.drafter.pending)))
    engine.generate([1, 2, 3], max_new_tokens=60, on_step=record)
    t, d = 2, 2  # after the prefill: the prompt but its last token, in both caches
    seen = set()
    for k, n, target_len, draft_len, pending in lengths:
        if k == 0:
            break  # the last step may draft nothing: the exercise's steps draft k >= 1
        assert rollback(t, d, k, n) == (target_len, draft_len, pending), (k, n, t, d)
        seen.add((n == k, t + 1 - d))
        t, d = target_len, draft_len
    assert seen == {(True, 1), (True, 2), (False, 1), (False, 2)}, "every kind of step was exercised"
    assert len(rollback_cases()) == 40


def test_a_chapters_exercise_cell_grades_yours_unless_told_to_grade_the_reference(monkeypatch):
    from specdec_lab.lab import exercises

    def mine(alpha, k):
        raise NotImplementedError
    monkeypatch.delenv("SPECDEC_LAB_EXERCISES", raising=False)
    assert exercises.yours("expected_tokens", mine) is mine, "a learner's kernel grades the learner's code"
    assert not exercises.check("expected_tokens", exercises.yours("expected_tokens", mine)).passed
    monkeypatch.setenv("SPECDEC_LAB_EXERCISES", "reference")
    assert exercises.yours("expected_tokens", mine) is exercises.solution("expected_tokens")
    assert exercises.check("expected_tokens", exercises.yours("expected_tokens", mine)).passed
    monkeypatch.setenv("SPECDEC_LAB_EXERCISES", "mine")
    with pytest.raises(ValueError, match="SPECDEC_LAB_EXERCISES must be yours or reference, got 'mine'"):
        exercises.yours("expected_tokens", mine)
