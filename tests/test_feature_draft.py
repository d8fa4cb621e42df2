"""The feature draft (EAGLE): lossless decoding, the drafter's cache, its data, training, saving."""
import copy
import pytest
import torch

import specdec_lab as sl
from specdec_lab.cpu import accelerate
from specdec_lab.cpu import build as kernels
from specdec_lab.train.data import generate_data, sample_batch
from specdec_lab.drafters.feature import FeatureDraft, FeatureDrafter, save_feature_draft
from specdec_lab import load_feature_draft
from specdec_lab.train.feature import load_feature_shards, train_feature_draft
from specdec_lab.core.config import SamplingConfig

PROMPTS = [[1, 2, 3], [5], [7, 7, 7, 7, 2, 9], [3, 4]]


@pytest.fixture(scope="module")
def target():
    return sl.tiny_model(0)


@pytest.fixture(scope="module")
def fdraft(target):
    return FeatureDraft(target, vocab_ids=list(range(0, 64, 2)) + [63], seed=1).eval().requires_grad_(False)


@pytest.mark.parametrize("k", [1, 2, 3, 5, 8])
def test_greedy_with_a_feature_draft_equals_autoregressive(target, fdraft, k):
    engine = sl.SpeculativeEngine(target, fdraft, k=k)
    assert isinstance(engine.drafter, FeatureDrafter)
    for prompt in PROMPTS:
        base = sl.autoregressive_generate(target, prompt, max_new_tokens=30).tokens
        assert engine.generate(prompt, max_new_tokens=30).tokens == base


def test_sampled_decoding_with_a_feature_draft_is_seeded(target, fdraft):
    engine = sl.SpeculativeEngine(target, fdraft, k=3)
    a = engine.generate([1, 2, 3], max_new_tokens=40, temperature=0.8, seed=5).tokens
    b = engine.generate([1, 2, 3], max_new_tokens=40, temperature=0.8, seed=5).tokens
    assert a == b and len(a) >= 1


def _fresh_proposal(target, fdraft, seq, k):
    """What a drafter prefilled from scratch over `seq`, with the target's states, proposes."""
    fresh = FeatureDrafter(fdraft, 512)
    fresh.prefill(seq, target.hidden(torch.tensor([seq[:-1]]))[0])
    return fresh.propose(k, SamplingConfig(), None)[0].tolist(), fresh


@pytest.mark.parametrize("k", [1, 3, 4])
def test_the_drafter_cache_matches_a_fresh_prefill_after_every_step(target, k, monkeypatch):
    # After a step the cache must hold true states for every committed token but the pending
    # ones; estimated states left behind would make proposals differ from a fresh drafter's.
    # Self-distilled on nothing, a random draft accepts little; drafting the target's own greedy
    # path (a draft whose head is the target's and whose layer passes states through) accepts all.
    # The plain forward on both sides: an accelerated draft's half-precision entries would differ from
    # a fresh prefill's float32 ones by rounding (test_an_accelerated_draft_matches_the_plain_forward).
    fd = FeatureDraft(target, seed=2).eval().requires_grad_(False)
    engine = sl.SpeculativeEngine(target, fd, k=k)
    seen = []
    prompt = [4, 5, 6, 9]

    def check(rec, out):
        seq = prompt + out
        drafter = engine.drafter
        assert drafter.cache.length + len(drafter.pending_tokens) == len(seq) - 1  # entries 1 .. len - 1
        want, _ = _fresh_proposal(target, fd, seq, k)
        cache_len, pend = drafter.cache.length, (drafter.pending_tokens.clone(), list(drafter.pending_feats))
        got = drafter.propose(k, SamplingConfig(), None)[0].tolist()
        drafter.cache.rollback(cache_len)  # undo the look-ahead: the engine continues from here
        drafter.pending_tokens, drafter.pending_feats = pend
        seen.append(got == want)

    engine.generate(prompt, max_new_tokens=25, on_step=check)
    assert len(seen) >= 5 and all(seen)


def test_an_accelerated_draft_matches_the_plain_forward(target):
    # An accelerated feature draft reads its layer's weights in float16 in one call: the states,
    # logits and cache entries it writes must match the plain float32 forward's to half-precision
    # rounding, pending rows, drafted rows (reading the draft's own estimate) and the drafted tokens alike.
    if not kernels.has_half():
        pytest.skip("the kernel library was built without F16C (kernels.has_half() is False)")
    fd = FeatureDraft(target, vocab_ids=list(range(0, 64, 2)) + [63], seed=3).eval().requires_grad_(False)
    fd_fast = copy.deepcopy(fd)
    accelerate(fd_fast.body, weights="float16")
    seq = [4, 5, 6, 9, 2, 7, 1]
    feats = target.hidden(torch.tensor([seq[:-1]]))[0]
    fast, slow = FeatureDrafter(fd_fast, 64), FeatureDrafter(fd, 64)
    for d in (fast, slow):
        d.prefill(seq[:4], feats[:3])
        d.queue(torch.tensor(seq[4:6]), feats[3:5])  # three pending rows: the head runs on the last one only
    (h1, l1), (h0, l0) = fast._feed(fast.pending_tokens, fast.pending_feats), \
        slow._feed(slow.pending_tokens, slow.pending_feats)
    for _ in range(3):
        finite = l0.isfinite()
        assert torch.equal(finite, l1.isfinite()) and int(finite.sum()) == 33
        assert torch.allclose(h1, h0, atol=2e-2) and torch.allclose(l1[finite], l0[finite], atol=2e-2)
        assert int(l1.argmax()) == int(l0.argmax()) or float(l0.max() - l0[l1.argmax()]) < 2e-2
        d = l0.argmax().view(1)
        (h1, l1), (h0, l0) = fast._feed(d, [h1.clone()]), slow._feed(d, [h0])
    assert fast.cache.length == slow.cache.length == 2 + 3 + 3
    assert torch.allclose(fast.cache.k[..., :8, :], slow.cache.k[..., :8, :], atol=2e-2)
    assert torch.allclose(fast.cache.v[..., :8, :], slow.cache.v[..., :8, :], atol=2e-2)
    assert not torch.equal(fast.cache.k[..., :8, :], slow.cache.k[..., :8, :])  # it did read half precision


def test_a_feature_draft_for_another_width_is_refused(target):
    other = sl.tiny_model(3, dim=32, n_heads=2, n_kv_heads=1)
    with pytest.raises(ValueError, match="draft"):
        sl.SpeculativeEngine(target, FeatureDraft(other), k=2)


def test_sample_batch_keeps_the_states_a_teacher_forced_pass_computes(target):
    res = sample_batch(target, [[1, 2, 3, 4], [9, 8]], 6, 0.0, torch.Generator().manual_seed(0), keep_hidden=True)
    for prompt, (answer, _, _, states) in zip([[1, 2, 3, 4], [9, 8]], res):
        seq = torch.tensor(prompt + answer.tolist())
        want = target.hidden(seq[None, :-1])[0]
        assert states.shape == want.shape
        assert (states.float() - want).abs().max() < 2e-2 * want.abs().max()  # stored in float16


def test_training_raises_agreement_and_acceptance(tmp_path):
    from test_distill import _bigram_target  # next token from the current one: learnable in a few hundred steps
    target = _bigram_target()
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 40, (int(n),), generator=g).tolist() for n in torch.randint(2, 8, (80,), generator=g)]
    generate_data(target, None, tmp_path, rounds=(1.0, 0.0), batch_size=20, max_new_tokens=24, prompts=prompts,
                  progress=False, keep_hidden=True, top_k_store=16)
    train, held = load_feature_shards([tmp_path], lambda i: i % 10 == 0)
    assert len(held) == 16 and len(train) == 144
    fd = FeatureDraft(target, seed=0)
    before = sl.SpeculativeEngine(target, fd.eval(), k=3).generate([1, 7, 2], max_new_tokens=40).stats
    fd, curve = train_feature_draft(fd.train().requires_grad_(True), train, held, steps=150, lr=1e-2,
                                    max_tokens=512, eval_every=30, progress=False)
    assert curve[-1][1] > curve[0][1] + 0.1, curve  # depth-1 agreement on held-out prompts rose
    assert curve[-1][1] > 0.5 and curve[-1][2] > 0.4, curve
    after = sl.SpeculativeEngine(target, fd, k=3).generate([1, 7, 2], max_new_tokens=40).stats
    assert after.accepted_share > before.accepted_share + 0.1

    out = save_feature_draft(fd, tmp_path / "fd")
    assert not any("head" in k for k in fd.own_state_dict())  # the target's head is not stored
    loaded = load_feature_draft(target, out)
    again = sl.SpeculativeEngine(target, loaded, k=3).generate([1, 7, 2], max_new_tokens=40).stats
    assert again.accepted_share == pytest.approx(after.accepted_share, abs=0.05)  # float16 round trip

    # a second phase (distill-features --init) trains what load_feature_draft returns frozen
    start = {k: v.clone() for k, v in loaded.own_state_dict().items()}
    loaded, more = train_feature_draft(loaded, train, held, steps=20, lr=1e-3, max_tokens=512, eval_every=10,
                                       progress=False)
    assert any(not torch.equal(v, start[k]) for k, v in loaded.own_state_dict().items())
    assert torch.equal(loaded.body.head.proj.weight, fd.body.head.proj.weight)  # the target's head: untouched
    assert more[-1][1] > curve[-1][1] - 0.05, (more, curve)  # it kept what the first phase learnt


def test_loading_for_a_target_of_another_width_is_refused(tmp_path, target, fdraft):
    out = save_feature_draft(fdraft, tmp_path / "fd")
    with pytest.raises(ValueError, match="width"):
        load_feature_draft(sl.tiny_model(3, dim=32, n_heads=2, n_kv_heads=1), out)


@pytest.mark.parametrize("stop_below", [0.3, 0.9])
def test_early_stopping_stays_lossless_and_drafts_fewer(target, fdraft, stop_below):
    drafter = FeatureDrafter(fdraft, 512, stop_below=stop_below)
    engine = sl.SpeculativeEngine(target, drafter, k=6)
    for prompt in PROMPTS:
        base = sl.autoregressive_generate(target, prompt, max_new_tokens=30).tokens
        res = engine.generate(prompt, max_new_tokens=30)
        assert res.tokens == base
    assert any(s.k < 6 for s in res.steps[:-1])  # the budget's last step aside, some stopped early


def test_stop_below_is_checked(fdraft):
    with pytest.raises(ValueError, match="stop_below"):
        FeatureDrafter(fdraft, 64, stop_below=1.5)


def test_distill_features_tiny_budget_runs_end_to_end(tmp_path, default_target):
    """`python -m specdec_lab distill-features --budget tiny`: the real target's answers and states,
    training, and a folder that loads for the target and decodes losslessly."""
    import json
    import os
    import subprocess
    import sys
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = tmp_path / "fd"
    proc = subprocess.run([sys.executable, "-m", "specdec_lab", "distill-features", "--budget", "tiny", "--out",
                           str(out), "--work-dir", str(tmp_path / "work")], env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "feature draft saved to" in proc.stdout
    shard = torch.load(next((tmp_path / "work" / "tasks_t0").glob("round*.pt")))
    assert len(shard["hidden"][0]) == len(shard["prompt_ids"][0]) + len(shard["answer_ids"][0]) - 1
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["dim"] == 576 and cfg["n_layers"] == 1 and 2 in cfg["vocab_ids"]
    assert (out / "model.safetensors").stat().st_size < 12e6  # the layer only: the head is the target's
    fd = load_feature_draft(default_target, out)
    prompt = "Name three primary colours."
    base = sl.autoregressive_generate(default_target, prompt, max_new_tokens=12).tokens
    assert sl.SpeculativeEngine(default_target, fd, k=3).generate(prompt, max_new_tokens=12).tokens == base


def test_lookup_then_feature_draft_is_lossless_and_keeps_the_cache_whole(target, fdraft):
    drafter = sl.LookupThenModelDrafter(fdraft, 512, stop_below=0.2)
    assert isinstance(drafter.model, FeatureDrafter) and drafter.needs_hidden
    engine = sl.SpeculativeEngine(target, drafter, k=4)
    prompt = [3, 4, 5, 6, 3, 4, 5, 6, 3, 4]  # repeats itself: lookup proposes

    def check(rec, out):
        m = drafter.model
        assert m.cache.length + len(m.pending_tokens) == len(prompt) + len(out) - 1
        assert len(m.pending_tokens) == len(m.pending_feats)

    res = engine.generate(prompt, max_new_tokens=30, on_step=check)
    assert res.tokens == sl.autoregressive_generate(target, prompt, max_new_tokens=30).tokens
    assert drafter.lookup_steps > 0 and drafter.model_steps > 0


@pytest.mark.parametrize("k,temperature", [(2, 1.0), (3, 0.7)])
def test_sampling_with_a_feature_draft_is_distributed_as_the_target(k, temperature):
    # The draft's q is a softmax over a head restricted to 4 of the 6 tokens: the other two are
    # reached only through the residual max(p - q, 0), and the states it reads are the target's.
    from test_engine import _tiny_pair, chi_square_pvalue, exact_distribution
    target, _ = _tiny_pair()
    fd = FeatureDraft(target, vocab_ids=[0, 2, 3, 5], seed=4).eval().requires_grad_(False)
    engine = sl.SpeculativeEngine(target, fd, k=k)
    pvalue = chi_square_pvalue(engine, exact_distribution(target, temperature, 1.0), 2500, temperature, 1.0, k)
    assert pvalue > 0.001, f"samples with a feature draft are not distributed as the target (p = {pvalue:.2e})"


@pytest.mark.slow
def test_the_shipped_feature_draft_drafts_for_the_default_target(default_target):
    """The folder that ships (its model card: feature_draft_smollm2/README.md) loads for the real
    target, keeps greedy output the target's own behind prompt lookup, and agrees with it far more
    often than chance: a random feature draft of the same shape accepts next to nothing."""
    fd = load_feature_draft(default_target, sl.shipped_feature_draft_dir())
    assert fd.cfg.n_layers == 1 and fd.state_width == 576 and len(fd.body.head.ids) == 8192
    drafter = sl.LookupThenModelDrafter(fd, 512)
    assert (fd.body.runner is not None) == kernels.available(), "load_feature_draft accelerates on the CPU"
    from test_engine import greedy_acceptance
    engine = sl.SpeculativeEngine(default_target, drafter, k=4)
    assert greedy_acceptance(engine, ("Why is the sky blue?", "Write a Python function that reverses a string.")) > 0.3
    random_fd = FeatureDraft(default_target, vocab_ids=fd.body.head.ids, seed=0).eval().requires_grad_(False)
    res = sl.SpeculativeEngine(default_target, random_fd, k=4).generate("Why is the sky blue?", max_new_tokens=16)
    assert res.stats.accepted / res.stats.drafted < 0.1
