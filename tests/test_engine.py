"""The speculative engine: lossless greedy and sampled decoding, seeds, syncs, bad input."""

import pytest
import torch
from scipy.stats import chisquare

import specdec_lab as sl
from specdec_lab.core.sampling import logits_to_probs
from specdec_lab.core.verify import verify

PROMPTS = [[1, 2, 3], [5], [7, 7, 7, 7, 2, 9]]


@pytest.fixture(scope="module")
def target():
    return sl.tiny_model(0)


@pytest.fixture(scope="module")
def draft():
    return sl.tiny_model(1)


@pytest.mark.parametrize("k", range(1, 9))
def test_greedy_speculative_equals_autoregressive_for_every_k(target, draft, k):
    for engine in (sl.SpeculativeEngine(target, draft, k=k), sl.SpeculativeEngine(target, target, k=k)):
        for prompt in PROMPTS:
            base = sl.autoregressive_generate(target, prompt, max_new_tokens=30).tokens
            got = engine.generate(prompt, max_new_tokens=30).tokens
            assert got == base, f"k={k}: speculative greedy output diverged from the target's own"


def test_target_as_its_own_draft_accepts_everything(target):
    res = sl.SpeculativeEngine(target, target, k=4).generate([1, 2, 3], max_new_tokens=41)
    assert res.stats.accepted_share == 1.0
    assert all(s.num_accepted == s.k for s in res.steps), "the all-accepted (bonus) path rejected a token"
    assert res.stats.mean_tokens_per_step > 4.0


def test_draft_cache_stays_consistent_after_all_accepted_steps(target):
    # With the target as draft, every step is all-accepted: d_K must be fed to the draft with the
    # next token. If it is not, the draft's cache drifts and its proposals stop matching.
    engine = sl.SpeculativeEngine(target, target, k=3)
    engine.generate([4, 5, 6], max_new_tokens=60)
    drafter = engine.drafter
    assert drafter.cache.length + len(drafter.pending) == engine.cache.length + 1


def test_stops_exactly_at_max_new_tokens(draft):
    target = sl.tiny_model(0, eos_token_ids=(10 ** 6,))  # no EOS: only the budget stops it
    for n in (1, 2, 5, 17):
        res = sl.SpeculativeEngine(target, target, k=8).generate([1, 2], max_new_tokens=n)
        assert len(res.tokens) == n, "overshot or undershot max_new_tokens"
        res = sl.SpeculativeEngine(target, draft, k=3).generate([1, 2], max_new_tokens=n, temperature=1.0, seed=0)
        assert len(res.tokens) <= n


def test_stops_at_eos_even_inside_accepted_draft_tokens():
    t = sl.tiny_model(0)
    base = sl.autoregressive_generate(t, [1, 2, 3], max_new_tokens=30).tokens
    eos = base[5]  # make the 6th greedy token the end-of-sequence token
    t.cfg.eos_token_ids = (eos,)
    try:
        expected = base[:base.index(eos) + 1]
        res = sl.SpeculativeEngine(t, t, k=8).generate([1, 2, 3], max_new_tokens=30)
        assert res.tokens == expected, "tokens after an accepted EOS were emitted"
    finally:
        t.cfg.eos_token_ids = (t.cfg.vocab_size - 1,)


def test_default_path_has_one_host_sync_per_step(target, draft):
    res = sl.SpeculativeEngine(target, draft, k=4).generate([1, 2, 3], max_new_tokens=40, temperature=1.0, seed=1)
    assert all(s.syncs == 1 for s in res.steps)
    assert res.stats.syncs == res.stats.steps


def test_seeded_runs_repeat_and_different_seeds_differ(target, draft):
    engine = sl.SpeculativeEngine(target, draft, k=3)
    a = engine.generate([1, 2, 3], max_new_tokens=40, temperature=1.0, seed=11).tokens
    b = engine.generate([1, 2, 3], max_new_tokens=40, temperature=1.0, seed=11).tokens
    c = engine.generate([1, 2, 3], max_new_tokens=40, temperature=1.0, seed=12).tokens
    assert a == b, "the same seed gave different outputs"
    assert a != c, "different seeds gave the same output"


def test_step_records_hold_what_the_demo_draws(target, draft):
    res = sl.SpeculativeEngine(target, draft, k=4).generate([1, 2, 3], max_new_tokens=20, temperature=1.0, seed=3)
    for s in res.steps:
        assert len(s.drafted) == s.k == len(s.p_draft) == len(s.q_draft) == len(s.uniforms)
        assert 0 <= s.num_accepted <= s.k
        assert all(q > 0 for q in s.q_draft), "a drafted token must have q(d) > 0"
        assert s.draft_seconds >= 0 and s.target_seconds > 0
    assert sum(len(s.committed) for s in res.steps) == len(res.tokens)


# --------------------------------------------------------------------------- lossless sampling

V, N_TOKENS = 6, 2
PROMPT = [1, 2]


def _tiny_pair():
    kw = dict(vocab_size=V, dim=16, n_heads=2, n_kv_heads=1, eos_token_ids=(10 ** 6,))  # never stops
    t, d = sl.tiny_model(3, **kw), sl.tiny_model(4, **kw)
    with torch.no_grad():  # a weak draft, so that rejections and residual draws are common
        d.head.weight.mul_(0.3)
    return t, d


def exact_distribution(target, temperature, top_p):
    """P(x1, x2) of the target's own sampling, enumerated."""
    probs = {}
    with torch.no_grad():
        p1 = logits_to_probs(target(torch.tensor([PROMPT]))[0, -1], temperature, 0, top_p)
        for x1 in range(V):
            p2 = logits_to_probs(target(torch.tensor([PROMPT + [x1]]))[0, -1], temperature, 0, top_p)
            for x2 in range(V):
                probs[(x1, x2)] = float(p1[x1] * p2[x2])
    return probs


def greedy_acceptance(engine, prompts, max_new_tokens=32):
    """Checks every greedy answer against the target's own decoding; returns the fraction of
    drafted tokens the target accepted over the prompts."""
    drafted = accepted = 0
    for prompt in prompts:
        base = sl.autoregressive_generate(engine.target, prompt, max_new_tokens=max_new_tokens).tokens
        res = engine.generate(prompt, max_new_tokens=max_new_tokens)
        assert res.tokens == base, f"greedy output differs from the target's own on {prompt!r}"
        drafted, accepted = drafted + res.stats.drafted, accepted + res.stats.accepted
    return accepted / drafted


def chi_square_pvalue(engine, probs, n, temperature, top_p, k):
    counts = dict.fromkeys(probs, 0)
    for seed in range(n):
        toks = engine.generate(PROMPT, max_new_tokens=N_TOKENS, temperature=temperature, top_p=top_p,
                               seed=seed, k=k).tokens
        counts[tuple(toks)] += 1
    support = [key for key in probs if probs[key] > 0]
    assert sum(counts[key] for key in probs if probs[key] == 0) == 0, "sampled an impossible sequence"
    big = [key for key in support if probs[key] * n >= 5]
    small = [key for key in support if probs[key] * n < 5]
    obs = [counts[key] for key in big] + ([sum(counts[key] for key in small)] if small else [])
    exp = [probs[key] * n for key in big] + ([sum(probs[key] for key in small) * n] if small else [])
    total = sum(exp)
    exp = [e * n / total for e in exp]
    return chisquare(obs, exp).pvalue


@pytest.mark.parametrize("k,temperature,top_p", [(1, 1.0, 1.0), (3, 0.7, 1.0), (2, 1.3, 0.8)])
def test_speculative_sampling_is_distributed_as_the_target(k, temperature, top_p):
    target, draft = _tiny_pair()
    engine = sl.SpeculativeEngine(target, draft, k=k)
    pvalue = chi_square_pvalue(engine, exact_distribution(target, temperature, top_p), 2500,
                               temperature, top_p, k)
    assert pvalue > 0.001, f"speculative samples are not distributed as the target (p = {pvalue:.2e})"


def broken_verify_resamples_from_p(draft_ids, p, q, u, e, greedy=False):
    """The classic bug: at a rejection, draw from p instead of the residual max(0, p - q)."""
    n = verify(draft_ids, p, q, u, e)[:1]
    return torch.cat([n, (p.index_select(0, n)[0] / e).argmax().view(1)])


def test_chi_square_check_rejects_a_verifier_that_resamples_from_p():
    target, draft = _tiny_pair()
    engine = sl.SpeculativeEngine(target, draft, k=2, verifier=broken_verify_resamples_from_p)
    pvalue = chi_square_pvalue(engine, exact_distribution(target, 1.0, 1.0), 2500, 1.0, 1.0, 2)
    assert pvalue < 1e-4, f"the test has no power: a broken verifier passed (p = {pvalue:.2e})"


# --------------------------------------------------------------------------- bad input

BAD_CALLS = [
    (dict(prompt=""), "prompt"),
    (dict(prompt=[]), "prompt"),
    (dict(max_new_tokens=0), "max_new_tokens"),
    (dict(max_new_tokens=10 ** 6), "max_new_tokens"),
    (dict(temperature=-0.5), "temperature"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"),
    (dict(k=0), "k"),
    (dict(k=99), "k"),
]


@pytest.mark.parametrize("bad,name", BAD_CALLS)
def test_bad_input_raises_value_error_naming_the_parameter_and_leaves_the_engine_working(target, draft, bad, name):
    engine = sl.SpeculativeEngine(target, draft, k=3)
    before = engine.generate([1, 2, 3], max_new_tokens=12).tokens
    args = dict(prompt=[1, 2, 3], max_new_tokens=12) | bad
    with pytest.raises(ValueError, match=name):
        engine.generate(args.pop("prompt"), **args)
    assert engine.generate([1, 2, 3], max_new_tokens=12).tokens == before, "a failed call changed the engine"


@pytest.mark.parametrize("kwargs,name", [(dict(k=0), "k"), (dict(k=17), "k"), (dict(cache="ring"), "cache"),
                                         (dict(verifier="gpu"), "verifier"), (dict(block_size=0), "block_size")])
def test_bad_engine_settings_raise_value_error(target, draft, kwargs, name):
    with pytest.raises(ValueError, match=name):
        sl.SpeculativeEngine(target, draft, **kwargs)


def test_draft_with_a_different_vocabulary_is_refused(target):
    with pytest.raises(ValueError, match="vocabulary"):
        sl.SpeculativeEngine(target, sl.tiny_model(2, vocab_size=32), k=2)
