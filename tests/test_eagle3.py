"""The EAGLE-3-style draft: the target's layer states on every path, lossless decoding, the
drafter's syncs, the unrolled training passes against drafting itself, training, saving."""
import copy
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import specdec_lab as sl
from specdec_lab.analysis.syncs import count_host_syncs
from specdec_lab.core.model import check_layers
from specdec_lab.cpu import accelerate
from specdec_lab.cpu import build as kernels
from specdec_lab.cpu.linear import FastLinear, FastRMSNorm
from specdec_lab.drafters import Eagle3Draft, Eagle3Drafter, FeatureDrafter, load_eagle3_draft, save_eagle3_draft
from specdec_lab.drafters.eagle3 import default_hidden_layers
from specdec_lab.drafters.feature import FeatureDraft, save_feature_draft
from specdec_lab.train.data import generate_data
from specdec_lab.train.eagle3 import (UnrollKeys, eagle3_loss, init_by_folding, subset_positions,
                                      target_view, train_eagle3_draft, unroll_mask, unroll_reference)
from specdec_lab.train.feature import collate_entries, load_feature_shards

PROMPTS = [[1, 2, 3], [5], [7, 7, 7, 7, 2, 9], [3, 4]]
SUBSET = list(range(0, 64, 2)) + [63]


@pytest.fixture(scope="module")
def target():
    return sl.tiny_model(0, n_layers=3)


@pytest.fixture(scope="module")
def draft(target):
    return Eagle3Draft(target, (0, 1, 2), vocab_ids=SUBSET, seed=1).eval().requires_grad_(False)


def _layer_states(model, x):
    """The reference: the blocks run one by one, the residual stream kept after each."""
    T = x.shape[1]
    cos, sin = model.rope_cos[:T][:, None], model.rope_sin[:T][:, None]
    h, out = model.embed_tokens(x), []
    for i, block in enumerate(model.layers):
        h = block(h, cos, sin, i, None, None)
        out.append(h)
    return out


def test_the_chosen_layers_states_are_the_residual_stream_on_every_path(target):
    x = torch.tensor([[4, 5, 6, 9, 2, 7, 1, 3]])
    ref = _layer_states(target, x)
    final, states = target.hidden(x, layers=(0, 2))
    assert states.shape == (1, 8, 2 * 64)
    torch.testing.assert_close(states, torch.cat([ref[0], ref[2]], -1))
    assert torch.equal(final, target.hidden(x)), "asking for layers must not change the final states"
    # through a cache, a prompt then verification rows: eager, static, and the CPU fast path
    static = sl.use_static_shapes(copy.copy(target))
    fast = copy.deepcopy(target)
    accelerate(fast)
    assert (fast.runner is not None) == kernels.available()
    got = []
    for model in (target, static, fast):
        cache = model.new_cache(32)
        with torch.inference_mode():
            a = model.hidden(x[:, :5], cache=cache, layers=(0, 2))
            b = model.hidden(x[:, 5:], cache=cache, layers=(0, 2))
        assert cache.length == 8
        got.append((torch.cat([a[0], b[0]], 1), torch.cat([a[1], b[1]], 1)))
    for f, s in got:  # rounding apart: attention over a cache is a different kernel from the causal pass's
        torch.testing.assert_close(s, states, atol=1e-3, rtol=1e-3)
        torch.testing.assert_close(f, final, atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("layers", [(), (1, 0), (0, 0), (0, 3), (-1,), [0, 1], (0, True)])
def test_layers_outside_the_model_or_out_of_order_are_refused(target, layers):
    with pytest.raises(ValueError, match="layers must be"):
        target.hidden(torch.tensor([[1, 2]]), layers=layers)
    with pytest.raises(ValueError, match="layers must be"):
        Eagle3Draft(target, layers if isinstance(layers, tuple) else (5,))


def test_the_default_layers_are_eagle3s_low_middle_and_high():
    assert default_hidden_layers(30) == (1, 14, 26)  # SmolLM2-135M
    assert default_hidden_layers(2) == (0, 1)
    for n in range(1, 40):
        check_layers(default_hidden_layers(n), n)


@pytest.mark.parametrize("k", [1, 3, 5])
def test_greedy_with_an_eagle3_draft_equals_autoregressive(target, draft, k):
    engine = sl.SpeculativeEngine(target, draft, k=k)
    assert isinstance(engine.drafter, Eagle3Drafter) and engine.drafter.hidden_layers == (0, 1, 2)
    for prompt in PROMPTS:
        base = sl.autoregressive_generate(target, prompt, max_new_tokens=30).tokens
        assert engine.generate(prompt, max_new_tokens=30).tokens == base


def test_a_static_target_a_paged_cache_and_lookup_in_front_stay_lossless(target, draft):
    prompt = [3, 4, 5, 6, 3, 4, 5, 6, 3, 4]  # repeats itself: lookup proposes
    base = sl.autoregressive_generate(target, prompt, max_new_tokens=30).tokens
    want = sl.SpeculativeEngine(target, draft, k=3).generate(prompt, max_new_tokens=30)
    got = sl.SpeculativeEngine(sl.use_static_shapes(copy.copy(target)), draft, k=3).generate(prompt, max_new_tokens=30)
    assert got.tokens == want.tokens == base
    assert [r.num_accepted for r in got.steps] == [r.num_accepted for r in want.steps]
    paged = sl.SpeculativeEngine(target, draft, k=3, cache="paged", block_size=4).generate(prompt, max_new_tokens=30)
    assert paged.tokens == base
    drafter = sl.LookupThenModelDrafter(draft, 512)
    assert drafter.hidden_layers == (0, 1, 2), "lookup in front must pass the layers on to the engine"
    res = sl.SpeculativeEngine(target, drafter, k=4).generate(prompt, max_new_tokens=30)
    assert res.tokens == base and drafter.lookup_steps > 0 and drafter.model_steps > 0


def test_sampling_with_an_eagle3_draft_is_distributed_as_the_target():
    from test_engine import _tiny_pair, chi_square_pvalue, exact_distribution
    target, _ = _tiny_pair()
    fd = Eagle3Draft(target, vocab_ids=[0, 2, 3, 5], seed=4).eval().requires_grad_(False)
    engine = sl.SpeculativeEngine(target, fd, k=2)
    pvalue = chi_square_pvalue(engine, exact_distribution(target, 1.0, 1.0), 800, 1.0, 1.0, 2)
    assert pvalue > 0.001, f"samples with an EAGLE-3 draft are not distributed as the target (p = {pvalue:.2e})"


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_step_reads_the_device_once_as_with_a_feature_draft(target, draft, temperature):
    """The fusion is device work: a step's only sync is the verdict's, as FeatureDrafter's is."""
    for drafter in (Eagle3Drafter(draft, 256), FeatureDrafter(draft, 256)):
        seen = []
        with count_host_syncs() as syncs:
            res = sl.SpeculativeEngine(target, drafter, k=3).generate(
                [1, 2, 3], max_new_tokens=30, temperature=temperature, seed=0,
                on_step=lambda rec, out: seen.append(syncs.count))
        per_step = [b - a for a, b in zip(seen, seen[1:])]
        assert len(per_step) >= 5 and set(per_step) == {1}, (type(drafter).__name__, per_step)
        assert [r.syncs for r in res.steps[1:]] == per_step


def test_the_unrolled_passes_compute_what_drafting_computes(target, draft):
    """Pass s at entry e must be the chain drafted from base e - s, fed entry by entry through a
    KVCache (unroll_reference): the mask, the positions and the state hand-over all agree."""
    seq = [4, 5, 6, 9, 2, 7, 1, 3, 8, 8, 2]
    x = torch.tensor([seq])
    with torch.no_grad():
        states, _, _ = target_view(target, draft, x)
        g, tok, N = draft.fuse_states(states), x[:, 1:], len(seq) - 1
        keys, passes = UnrollKeys(1), []
        for s in range(3):
            h = draft.states(tok, g, cache=keys, input_pos=torch.arange(N), mask=unroll_mask(N, s))
            passes.append(draft.head.proj(draft.norm(h)).log_softmax(-1)[0])
            g = torch.cat([g[:, :1], h[:, :-1]], 1)
    for base in (0, 3, 7):
        ref = unroll_reference(draft, target, seq, base, 3)
        for s in range(3):
            torch.testing.assert_close(passes[s][base + s], ref[s], atol=1e-4, rtol=1e-4)
    assert not torch.allclose(passes[1][4], passes[0][4]), "pass 1 must read the draft's own state"


def test_unroll_is_checked(target, draft):
    z = torch.zeros(1, 3, dtype=torch.long)
    with pytest.raises(ValueError, match="unroll"):
        eagle3_loss(draft, z, torch.zeros(1, 3, 3 * 64), z[..., None], torch.zeros(1, 3, 1), z.float(), unroll=0)


def test_the_stored_states_and_top_k_are_what_the_target_computes(target, draft, tmp_path):
    """generate_data(keep_layers) stores, per answer, the states a teacher-forced pass gives, and
    the batch collate_entries makes puts the target's top token at the entry that drafts it."""
    prompts = [[1, 2, 3], [5, 9], [7, 7, 7, 7, 2, 9]]
    generate_data(target, None, tmp_path, rounds=(0.0,), batch_size=3, max_new_tokens=12, prompts=prompts,
                  progress=False, keep_layers=draft.hidden_layers)
    train, _ = load_feature_shards([tmp_path], lambda i: False)
    assert len(train) == 3
    for tokens, states, P, top_ids, _ in train:
        want, _, _ = target_view(target, draft, tokens[None])
        assert states.shape == (len(tokens) - 1, 3 * 64)
        torch.testing.assert_close(states.float(), want[0], atol=2e-2, rtol=2e-2)  # stored in float16
        assert torch.equal(top_ids[:, 0], tokens[P:]), "greedy answers: the top token is the answer's"
    tok, feat, tgt_pos, tgt_lp, weight = collate_entries(train, [0, 1, 2], subset_positions(draft))
    pos = subset_positions(draft)
    for b, (tokens, _, P, _, _) in enumerate(train):
        n = len(tokens) - P
        assert weight[b].nonzero().flatten().tolist() == list(range(P - 2, P - 2 + n))
        assert tgt_pos[b, P - 2:P - 2 + n, 0].tolist() == pos[tokens[P:]].tolist()  # entry e drafts t_{e+2}


def _earlier_layout(target, fd, x, fuse):
    """The earlier layout's fusion and attention input for entries (x[1:], states of x[:-1]):
    g = fuse([rms(a), rms(b), rms(c)]), then attn_norm(fc_in([norm(e), norm(g)])) @ Wqkv."""
    import torch.nn.functional as F
    states, _, _ = target_view(target, Eagle3Draft(target, (0, 1, 2), vocab_ids=SUBSET), x)
    n, dim = 3, 64
    g = F.rms_norm(states.unflatten(-1, (n, dim)), (dim,)).flatten(-2) @ fuse
    e = F.embedding(x[:, 1:], fd.embed_weight)
    z = torch.cat([fd.embed_norm(e), fd.feat_norm(g)], -1)
    return states, g, fd.body.layers[0].attn.wqkv(fd.body.layers[0].attn_norm(fd.fc(z)))


def test_a_draft_of_the_earlier_layout_folds_into_this_one(target, tmp_path):
    """init_by_folding: on a sample of one entry, whose RMS is then the typical one, the folded
    fusion gives the earlier g and the folded q, k, v the earlier layer's, exactly; the residual
    is the one thing that differs."""
    fd = FeatureDraft(target, SUBSET, seed=3)
    fuse = torch.randn(3 * 64, 64, generator=torch.Generator().manual_seed(4)) / 14
    folder = save_feature_draft(fd, tmp_path / "fd")
    fd = sl.api.load_feature_draft(target, folder, accelerate=False)  # the stored (float16) weights, as folded
    sd = load_file(str(folder / "model.safetensors"))
    save_file({**sd, "fuse.weight": fuse.half()}, str(folder / "model.safetensors"))  # an EAGLE-3 draft of layout 1
    fuse = fuse.half().float()
    x = torch.tensor([[4, 5, 6, 9, 2, 7]])
    with torch.no_grad():
        states, g, qkv = _earlier_layout(target, fd, x, fuse)
        for j in (0, 3):  # a one-entry sample each time
            e3 = init_by_folding(Eagle3Draft(target, (0, 1, 2), vocab_ids=SUBSET, seed=9), target, folder,
                                 (x[0, 1 + j:2 + j], states[0, j:j + 1]))
            g3 = e3.fuse_states(states[0, j])
            torch.testing.assert_close(g3, g[0, j], atol=1e-4, rtol=1e-4)
            e = torch.nn.functional.embedding(x[0, 1 + j], e3.embed_weight)
            x3 = torch.cat([e3.layer.embed_norm(e), e3.layer.state_norm(g3)], -1)
            torch.testing.assert_close(e3.layer.attn.wqkv(x3), qkv[0, j], atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="subset"):
        init_by_folding(Eagle3Draft(target, (0, 1, 2), vocab_ids=SUBSET[:-1]), target, folder,
                        (x[0, 1:], states[0]))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A one-layer draft trained 80 steps on a tiny target's own greedy answers."""
    from test_distill import _bigram_target  # next token from the current one: learnable in a few dozen steps
    target = _bigram_target()
    folder = tmp_path_factory.mktemp("eagle3")
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 40, (int(n),), generator=g).tolist() for n in torch.randint(2, 8, (60,), generator=g)]
    fd = Eagle3Draft(target, seed=1)
    generate_data(target, None, folder / "data", rounds=(0.0,), batch_size=20, max_new_tokens=24, prompts=prompts,
                  progress=False, keep_layers=fd.hidden_layers)
    train, held = load_feature_shards([folder / "data"], lambda i: i % 10 == 0)
    before = sl.SpeculativeEngine(target, fd.eval(), k=3).generate([1, 7, 2], max_new_tokens=40).stats
    fd, history, curve = train_eagle3_draft(fd, train, held, steps=80, lr=2e-2, max_tokens=256,
                                            eval_every=10, progress=False, work_dir=folder / "work")
    return target, fd, history, curve, before, train, held, folder


def test_training_lowers_every_passs_loss_and_raises_agreement(trained):
    target, fd, history, curve, before, *_ = trained
    first = torch.tensor([h[1] for h in history[:5]]).mean(0)  # (unroll,)
    last = torch.tensor([h[1] for h in history[-5:]]).mean(0)
    assert len(first) == 3 and bool((last < first - 1.0).all()), (first, last)  # the unrolled passes learnt too
    assert all(a > 0.8 for a in curve[-1][1]), curve  # held-out agreement at depths 1, 2, 3
    after = sl.SpeculativeEngine(target, fd, k=3).generate([1, 7, 2], max_new_tokens=40)
    assert after.stats.accepted_share > before.accepted_share + 0.3
    assert after.tokens == sl.autoregressive_generate(target, [1, 7, 2], max_new_tokens=40).tokens


def test_the_target_and_its_head_are_not_trained(trained):
    target, fd, *_ = trained
    assert not any(p.requires_grad for p in target.parameters())
    assert torch.equal(fd.head.proj.weight, target.head.weight[:, fd.head.ids])


def test_a_rerun_resumes_from_the_checkpoint(trained):
    target, fd, history, curve, _, train, held, folder = trained
    fresh = Eagle3Draft(target, seed=7)  # its own weights are replaced by the checkpoint's
    fresh, more, more_curve = train_eagle3_draft(fresh, train, held, steps=82, lr=2e-2, max_tokens=256,
                                                 eval_every=10, progress=False, work_dir=folder / "work")
    assert len(more) == 82 and more[:80] == history and more_curve[:8] == curve
    assert more_curve[-1][1][0] > 0.8, "it went on from the trained weights, not from seed 7's"


def test_saved_and_loaded_it_drafts_the_same(trained, tmp_path):
    target, fd, *_ = trained
    out = save_eagle3_draft(fd, tmp_path / "fd")
    loaded = sl.api.load_eagle3_draft(target, out, accelerate=False)
    assert loaded.hidden_layers == fd.hidden_layers
    for k, v in fd.own_state_dict().items():
        torch.testing.assert_close(loaded.own_state_dict()[k], v, atol=1e-2, rtol=1e-2)  # stored in float16
    a = sl.SpeculativeEngine(target, fd, k=3).generate([1, 7, 2], max_new_tokens=40).stats
    b = sl.SpeculativeEngine(target, loaded, k=3).generate([1, 7, 2], max_new_tokens=40).stats
    assert b.accepted_share == pytest.approx(a.accepted_share, abs=0.05)
    fast = sl.api.load_eagle3_draft(target, out)  # on the CPU: its layer in one call
    assert isinstance(fast.layer.attn.wqkv, FastLinear) and isinstance(fast.norm, FastRMSNorm)
    res = sl.SpeculativeEngine(target, fast, k=3).generate([1, 7, 2], max_new_tokens=40)
    assert res.tokens == sl.autoregressive_generate(target, [1, 7, 2], max_new_tokens=40).tokens
    assert res.stats.accepted_share == pytest.approx(a.accepted_share, abs=0.1)
    with pytest.raises(ValueError, match="EAGLE-3"):
        load_eagle3_draft(target, tmp_path)


def test_a_draft_for_a_deeper_target_is_refused(target):
    deeper = sl.tiny_model(1, n_layers=6)
    with pytest.raises(ValueError, match="layers"):
        sl.SpeculativeEngine(target, Eagle3Draft(deeper, (1, 5)), k=2)


@pytest.mark.slow  # the default target answers ten prompts
def test_the_recipe_answers_a_prompt_file_trains_and_writes_its_card_and_a_rerun_resumes(tmp_path, default_target):
    import json

    from specdec_lab.train.eagle3 import eagle3_main
    prompts = [f"Tell me one thing about the number {i}." for i in range(12)]
    (tmp_path / "mine.json").write_text(json.dumps({"prompts": prompts}))
    kw = dict(budget="tiny", work_dir=tmp_path / "work", prompt_files=[tmp_path / "mine.json"],
              data_dtype=torch.bfloat16, init=Path(sl.__file__).parent / "feature_draft_smollm2", progress=False,
              log=lambda s: None, command="python -m specdec_lab distill-features --recipe eagle3 ...")
    out, curve = eagle3_main(**kw)
    shards = sorted((tmp_path / "work" / "mine_t0").glob("round*.pt"))
    assert len(shards) == 1 and torch.load(shards[0])["layers"] == [1, 14, 26]
    assert len(curve) == 1 and len(curve[0][1]) == 3, "the tenth prompt is held out: one evaluation, three depths"
    card = (out / "README.md").read_text()
    assert "distill-features --recipe eagle3 ..." in card and f"| 5 | {curve[0][1][0]:.3f}" in card
    assert "9 training answers" in card and "1 held-out answers" in card
    model = sl.api.load_eagle3_draft(default_target, out)
    assert model.hidden_layers == (1, 14, 26)
    stamp = shards[0].stat().st_mtime
    _, again = eagle3_main(**kw)  # data and training both done: nothing is made again
    assert again == curve and shards[0].stat().st_mtime == stamp


@pytest.mark.slow
def test_the_shipped_draft_loads_by_default_and_keeps_greedy_decoding_the_targets(default_target):
    draft = sl.load_eagle3_draft(default_target)
    assert draft.hidden_layers == (1, 14, 26) and sl.shipped_eagle3_draft_dir().name == "eagle3_draft_smollm2"
    prompt = "Write a short note to a neighbour about a parcel."
    base = sl.autoregressive_generate(default_target, prompt, max_new_tokens=24)
    res = sl.SpeculativeEngine(default_target, sl.LookupThenModelDrafter(draft, 512), k=4).generate(
        prompt, max_new_tokens=24)
    assert res.tokens == base.tokens and res.stats.mean_tokens_per_step > 1.2, res.stats


# torch.compile on the CPU (inductor, C++): about ten seconds a graph.
@pytest.mark.slow
def test_a_compiled_target_hands_out_the_same_layer_states(target, draft):
    compiled = sl.compiled_twin(target)
    static = sl.use_static_shapes(copy.copy(target))
    x = torch.tensor([[4, 5, 6, 9, 2, 7, 1, 3]])
    out = []
    for model in (static, compiled):
        cache = model.new_cache(32)
        with torch.inference_mode():
            model.hidden(x[:, :5], cache=cache, layers=(0, 1, 2))
            out.append(model.hidden(x[:, 5:], cache=cache, layers=(0, 1, 2)))  # three rows: compiled
    for a, b in zip(*out):
        torch.testing.assert_close(b, a, atol=1e-3, rtol=1e-3)
    prompt = [3, 4, 5, 6, 3, 4]
    want = sl.SpeculativeEngine(static, draft, k=3).generate(prompt, max_new_tokens=20).tokens
    assert sl.SpeculativeEngine(compiled, draft, k=3).generate(prompt, max_new_tokens=20).tokens == want
