"""serve/: the batched speculative step on tiny models (the default pair in one slow test)."""
from collections import Counter

import pytest
import torch

import specdec_lab as sl
from specdec_lab.analysis.syncs import count_host_syncs
from specdec_lab.core.text import encode_prompt
from specdec_lab.core.verify import draw
from specdec_lab.lab import lossless
from specdec_lab.serve.engine import BatchEngine, make_sequence, run_to_completion
from specdec_lab.serve.forward import hidden
from specdec_lab.serve.verify import BATCH_RULES, _at, _padded, num_accepted, verify_rows
from specdec_lab.verification import RULES

V = 5
SHAPE = dict(vocab_size=V, dim=16, n_heads=2, n_kv_heads=1, eos_token_ids=(10 ** 6,))  # never stops early


@pytest.fixture(scope="module")
def small_pair():
    target, draft = sl.tiny_model(3, **SHAPE), sl.tiny_model(4, **SHAPE)
    with torch.no_grad():
        draft.head.weight.mul_(0.3)  # a weak draft: rejections are common
    return target, draft


def _pair():
    return sl.tiny_model(0), sl.tiny_model(1, n_layers=1)


PROMPTS = [[1, 2, 3, 4, 5], [7, 8], [9, 10, 11, 12, 13, 14, 15, 16, 17], [3], [20, 21, 22]]


def test_paged_rows_equal_the_padded_twin_token_for_token_and_key_for_key():
    target, draft = _pair()
    outs = {}
    for kv in ("paged", "padded"):
        engine = BatchEngine(target, draft, kv=kv, num_blocks=64, block_size=4, max_rows=8, max_seq_len=128)
        seqs = [make_sequence(p, 12, temperature=0.9, seed=i, k=k) for i, (p, k) in
                enumerate(zip(PROMPTS, [4, 2, 0, 3, 1]))]
        engine.prefill(seqs)
        for _ in range(3):
            engine.step(seqs)
        keys = [engine.target_kv.row_keys(s.seq_id, 1) for s in seqs]
        outs[kv] = ([s.output for s in seqs], keys)
    assert outs["paged"][0] == outs["padded"][0]
    for a, b in zip(outs["paged"][1], outs["padded"][1]):
        assert torch.equal(a, b), "a paged row's keys differ from the padded twin's"


def test_ragged_forward_matches_each_row_run_alone():
    target, _ = _pair()
    engine = BatchEngine(target, None, num_blocks=32, block_size=4, max_seq_len=64)
    kv = engine.target_kv
    for i in range(3):
        kv.add(i)
    T = max(map(len, PROMPTS[:3]))
    tokens = torch.tensor([p + [0] * (T - len(p)) for p in PROMPTS[:3]])
    with torch.no_grad():
        states = hidden(target, kv.view([0, 1, 2], [len(p) for p in PROMPTS[:3]]), tokens)
        logits = target.head(states)
        for b, p in enumerate(PROMPTS[:3]):
            alone = target(torch.tensor([p]), cache=sl.KVCache.for_model(target.cfg, 32))[0]
            torch.testing.assert_close(logits[b, :len(p)], alone, atol=1e-4, rtol=1e-4)
    assert [kv.length(i) for i in range(3)] == [len(p) for p in PROMPTS[:3]], "padding must not be committed"


def test_greedy_rows_equal_their_batch_1_autoregressive_outputs_and_blocks_return():
    target, draft = _pair()
    engine = BatchEngine(target, draft, num_blocks=64, block_size=4, max_seq_len=128)
    eos = target.cfg.eos_token_ids
    seqs = [make_sequence(p, 20, k=k, eos_ids=eos) for p, k in zip(PROMPTS, [4, 2, 0, 3, 6])]
    run_to_completion(engine, seqs)
    for p, s in zip(PROMPTS, seqs):
        assert s.output == sl.autoregressive_generate(target, p, max_new_tokens=20).tokens, p
    assert engine.target_kv.used_blocks == 0 and engine.draft_kv.used_blocks == 0


def test_a_step_reads_the_host_once_for_the_whole_batch():
    target, draft = _pair()
    engine = BatchEngine(target, draft, num_blocks=64, block_size=4, max_seq_len=128)
    seqs = [make_sequence(p, 20, temperature=t, top_p=0.9, seed=i, k=k)
            for i, (p, t, k) in enumerate(zip(PROMPTS, [0.0, 0.8, 1.2, 0.0, 0.5], [4, 2, 0, 3, 1]))]
    engine.prefill(seqs)
    for _ in range(3):
        with count_host_syncs() as syncs:
            rec = engine.step(seqs)
        assert syncs.count == 1 == rec.syncs, syncs.calls
        assert rec.draft_forwards == max(r.k for r in rec.rows), "one draft forward per drafted position"


def _random_inputs(ks, greedy, g):
    B, K = len(ks), max(ks)
    D = torch.full((B, K), -1, dtype=torch.long)
    P = torch.rand(B, K + 1, V, generator=g) ** 3
    P = P / P.sum(-1, keepdim=True)
    Q = torch.rand(B, K, V, generator=g) ** 3
    Q = Q / Q.sum(-1, keepdim=True)
    U = torch.rand(B, K, generator=g)
    E = sl.core.sampling.exponential_noise(B * V, g).view(B, V)
    for b, k in enumerate(ks):
        D[b, :k] = torch.multinomial(Q[b, :k], 1, generator=g).view(-1) if k else D[b, :0]
        if greedy[b]:  # one-hot p and q, u = 0, e = 1: the greedy rule
            P[b] = torch.zeros(K + 1, V).scatter_(1, P[b].argmax(-1, keepdim=True), 1.0)
            Q[b] = torch.zeros(K, V).scatter_(1, D[b].clamp(min=0).view(-1, 1), 1.0)
            U[b], E[b] = 0.0, 1.0
    return D, P, Q, U, E


@pytest.mark.parametrize("name", ["token", "block", "match"])
def test_each_batched_rule_equals_both_single_row_twins_row_by_row(name):
    """Ragged K (0 included), greedy and sampled rows mixed, the same u and e: row b's verdict is the
    chain engine's rule (vectorised and readable loop) on row b cut to its own k_b."""
    g = torch.Generator().manual_seed(0)
    for trial in range(200):
        ks = [int(x) for x in torch.randint(0, 5, (4,), generator=g)]
        ks[0] = max(ks[0], 1)
        greedy = [bool(x) for x in torch.randint(0, 2, (4,), generator=g)]
        D, P, Q, U, E = _random_inputs(ks, greedy, g)
        out = BATCH_RULES[name](D, P, Q, U, E)
        for twin in RULES[name]:
            ref = verify_rows(twin, D, P, Q, U, E)
            assert torch.equal(out, ref), (trial, twin.__name__, ks, out, ref)
        n = num_accepted(out)
        assert all(0 <= int(n[b]) <= k for b, k in enumerate(ks))
        assert all((out[b, int(n[b]) + 1:] == -1).all() for b in range(4)), "unused slots must be -1"


@pytest.mark.parametrize("name", ["token", "block", "match"])
def test_greedy_rows_take_the_argmax_rule_under_every_batched_rule(name):
    """One-hot p and q, u = 0, e = 1: d_i kept exactly while it is argmax p_i, then argmax p_{n+1}."""
    g = torch.Generator().manual_seed(2)
    for trial in range(100):
        ks = [int(x) for x in torch.randint(0, 5, (3,), generator=g)]
        D, P, Q, U, E = _random_inputs(ks, [True] * 3, g)
        best = P.argmax(-1)  # (B, K+1)
        D[:, :] = torch.where((D >= 0) & (torch.rand(D.shape, generator=g) < 0.6), best[:, :-1], D)  # mostly right
        Q = torch.nn.functional.one_hot(D.clamp(min=0), V).float()  # q one-hot at the (new) drafts
        out = BATCH_RULES[name](D, P, Q, U, E)
        for b, k in enumerate(ks):
            n = next((i for i in range(k) if D[b, i] != best[b, i]), k)
            assert out[b, :n + 1].tolist() == D[b, :n].tolist() + [int(best[b, n])], (trial, b, out[b])


@pytest.mark.parametrize("name", ["token", "block", "match"])
def test_the_batched_rules_read_nothing_to_the_host(name):
    D, P, Q, U, E = _random_inputs([3, 0, 2], [False, True, False], torch.Generator().manual_seed(1))
    with count_host_syncs() as syncs:
        BATCH_RULES[name](D, P, Q, U, E)
    assert syncs.count == 0, syncs.calls


def resample_from_p(name):
    """The classic bug, batched: the token after the kept drafts drawn from p_{n+1} rather than from
    the rule's own correction (the residual; for the block rule, the residual weighted by P_tau)."""
    def broken(D, P, Q, U, E):
        out = BATCH_RULES[name](D, P, Q, U, E)
        n = num_accepted(out)
        return out.scatter(1, n.view(-1, 1), draw(_at(P, n), E).view(-1, 1))
    return broken


def match_keeps_any_possible_token(D, P, Q, U, E):
    """Exact match's slip, batched: d_i kept whenever p_i(d_i) > 0, not only when it is the target's
    own draw. (Resampling from p is nearly invisible for exact match with this weak, flat draft.)"""
    K = D.shape[1]
    possible = P[:, :K].gather(-1, D.clamp(min=0).unsqueeze(-1)).squeeze(-1) > 0  # (B, K)
    n = (possible & (D >= 0)).long().cumprod(-1).sum(-1)  # (B,)
    return _padded(D.clamp(min=0), n, draw(_at(P, n), E))


BROKEN = {"token": resample_from_p("token"), "block": resample_from_p("block"), "match": match_keeps_any_possible_token}


ROWS = [  # prompt, K, temperature, top_p, top_k: one batch, every row different
    ([1, 2], 2, 1.0, 1.0, 0),
    ([3], 1, 0.7, 0.9, 0),
    ([4, 0, 1], 0, 1.3, 1.0, 0),
    ([2, 2], 3, 1.0, 0.8, 0),
    ([0, 3], 2, 0.9, 1.0, 3),
]


def _sample_rows(target, draft, verifier, n_batches, n_tokens=2, propose="sample"):
    engine = BatchEngine(target, draft, num_blocks=64, block_size=4, max_seq_len=32, verifier=verifier,
                         propose=propose)
    counts = [Counter() for _ in ROWS]
    greedy = []
    for i in range(n_batches):
        seqs = [make_sequence(p, n_tokens, temperature=t, top_p=tp, top_k=tk, seed=i * 10 + b, k=k)
                for b, (p, k, t, tp, tk) in enumerate(ROWS)]
        seqs.append(make_sequence([1, 4], n_tokens, k=2))  # a greedy row rides along
        run_to_completion(engine, seqs)
        for b in range(len(ROWS)):
            counts[b][tuple(seqs[b].output)] += 1
        greedy.append(tuple(seqs[-1].output))
    return counts, greedy


@pytest.mark.parametrize("verifier,propose", [("token", "sample"), ("block", "sample"), ("match", "sample"),
                                              ("match", "argmax")])
def test_every_row_of_a_mixed_batch_is_distributed_as_its_target_and_a_broken_verifier_fails(small_pair, verifier,
                                                                                            propose):
    target, draft = small_pair
    good, greedy = _sample_rows(target, draft, verifier, 1000, propose=propose)
    bad, _ = _sample_rows(target, draft, BROKEN[verifier], 1000, propose=propose)
    assert len(set(greedy)) == 1, "a greedy row must give the same tokens in every batch"
    caught = 0
    for b, (prompt, k, t, tp, tk) in enumerate(ROWS):
        probs = lossless.exact_sequence_probs(target, prompt, 2, temperature=t, top_p=tp, top_k=tk)
        ok = lossless.chi_square_test(good[b], probs)
        assert ok.pvalue > 1e-4, f"row {b} (K={k}, T={t}, top_p={tp}) failed the lossless check (p = {ok.pvalue:.1e})"
        broken = lossless.chi_square_test(bad[b], probs)
        caught += broken.pvalue < 1e-4
    assert caught >= 2, f"the check did not catch {BROKEN[verifier].__name__} in the drafting rows"


def test_greedy_rows_give_the_same_tokens_under_every_verifier_and_proposal():
    """Greedy output is unchanged by the rule: in a batch with sampled neighbours, every greedy row is
    the target's own greedy decode under token, block and exact-match verification, drafting either way."""
    target, draft = _pair()
    eos = target.cfg.eos_token_ids
    outputs = {}
    for verifier in ("token", "block", "match"):
        for propose in ("sample", "argmax"):
            engine = BatchEngine(target, draft, num_blocks=128, block_size=4, max_seq_len=128, verifier=verifier,
                                 propose=propose)
            seqs = [make_sequence(p, 16, temperature=0.0 if b % 2 == 0 else 0.9, seed=b, k=k, eos_ids=eos)
                    for b, (p, k) in enumerate(zip(PROMPTS, [4, 2, 3, 1, 5]))]
            run_to_completion(engine, seqs)
            outputs[verifier, propose] = [s.output for s in seqs[::2]]
    base = [sl.autoregressive_generate(target, p, max_new_tokens=16).tokens for p in PROMPTS[::2]]
    assert all(out == base for out in outputs.values()), {key: out == base for key, out in outputs.items()}


def test_a_row_gives_the_same_tokens_alone_and_in_a_batch_with_the_same_seed():
    target, draft = _pair()
    engine = BatchEngine(target, draft, num_blocks=128, block_size=4, max_seq_len=128)
    alone = make_sequence([5, 6, 7], 24, temperature=0.9, top_p=0.95, seed=7, k=3)
    run_to_completion(engine, [alone])
    neighbours = [make_sequence(p, 10 + 3 * i, temperature=1.1, seed=100 + i, k=i % 4)
                  for i, p in enumerate(PROMPTS)]
    crowd = make_sequence([5, 6, 7], 24, temperature=0.9, top_p=0.95, seed=7, k=3)
    run_to_completion(engine, neighbours[:2] + [crowd] + neighbours[2:])
    assert crowd.output == alone.output


def test_bad_engine_arguments_are_refused():
    target, draft = _pair()
    with pytest.raises(ValueError, match="kv"):
        BatchEngine(target, draft, kv="ring")
    with pytest.raises(ValueError, match="vocabulary"):
        BatchEngine(target, sl.tiny_model(1, vocab_size=32))


@pytest.mark.parametrize("make", [BatchEngine, sl.Server], ids=["BatchEngine", "Server"])
def test_bad_verifier_and_propose_names_are_refused_with_the_choices(make):
    target, draft = _pair()
    with pytest.raises(ValueError) as err:
        make(target, draft, verifier="blocks")
    assert all(word in str(err.value) for word in ("verifier", "'blocks'", "'token'", "'block'", "'match'"))
    with pytest.raises(ValueError) as err:
        make(target, draft, propose="top")
    assert all(word in str(err.value) for word in ("propose", "'top'", "'sample'", "'argmax'"))


def test_an_argmax_proposal_drafts_the_drafts_top_token_with_a_one_hot_q():
    """propose="argmax" on a sampled row: the first step drafts the draft's greedy continuation, q(d) = 1."""
    target, draft = _pair()
    engine = BatchEngine(target, draft, num_blocks=64, block_size=4, max_seq_len=128, verifier="match",
                         propose="argmax")
    seq = make_sequence([5, 6, 7], 8, temperature=1.0, seed=3, k=4)
    run_to_completion(engine, [seq])
    assert seq.steps[0].drafted == sl.autoregressive_generate(draft, [5, 6, 7], max_new_tokens=4).tokens
    assert all(q == 1.0 for r in seq.steps for q in r.q_draft)


@pytest.mark.slow
def test_default_pair_greedy_rows_equal_batch_1_decoding():
    pair = sl.load_default_pair()
    prompts = ["Why is the sky blue?", "Write a haiku about autumn.", "List three prime numbers.",
               "What is the capital of France?"]
    ids = [encode_prompt(pair.tokenizer, p) for p in prompts]
    engine = BatchEngine(pair.target, pair.draft, num_blocks=256, block_size=16, max_seq_len=512)
    seqs = [make_sequence(x, 32, k=k, eos_ids=pair.target.cfg.eos_token_ids) for x, k in zip(ids, [4, 3, 0, 5])]
    run_to_completion(engine, seqs)
    same = sum(s.output == sl.autoregressive_generate(pair.target, x, max_new_tokens=32).tokens
               for x, s in zip(ids, seqs))
    assert same == len(prompts)
    assert sum(r.num_accepted for s in seqs for r in s.steps) > 0, "the draft should be accepted sometimes"


def test_a_forward_that_does_not_fit_the_pool_changes_nothing():
    from specdec_lab.paged import PoolExhaustedError
    from specdec_lab.serve.kv import PagedBatchKV
    target, _ = _pair()
    kv = PagedBatchKV(target.cfg, num_blocks=3, block_size=4, max_seq_len=64)
    kv.add(0)
    kv.add(1)
    with torch.no_grad():
        hidden(target, kv.view([0], [5]), torch.tensor([[1, 2, 3, 4, 5]]))
    before = (dict(kv.lengths), {s: list(t) for s, t in kv.tables.items()}, kv.free_blocks)
    with pytest.raises(PoolExhaustedError, match="blocks"):
        with torch.no_grad():
            hidden(target, kv.view([0, 1], [4, 4]), torch.ones(2, 4, dtype=torch.long))
    assert (dict(kv.lengths), {s: list(t) for s, t in kv.tables.items()}, kv.free_blocks) == before
    kv.rollback(0, 0)
    kv.free(0)
    kv.free(1)
    assert kv.used_blocks == 0


@pytest.mark.parametrize("seqs,real,name", [([0, 0], [1, 1], "distinct"), ([0], [0], "real"), ([5], [1], "seq")])
def test_bad_views_are_refused(seqs, real, name):
    from specdec_lab.serve.kv import PagedBatchKV
    kv = PagedBatchKV(sl.tiny_model(0).cfg, num_blocks=4, block_size=4, max_seq_len=64)
    kv.add(0)
    with pytest.raises(ValueError, match=name):
        kv.view(seqs, real)


def _answers(target, draft, prompt, n, together, block_size=4):
    """n answers to one prompt (answer i seeded with i), prefilled in one call (together) or one by one;
    the outputs, the target's blocks in use after the prefill, and the two pools' blocks at the end."""
    engine = BatchEngine(target, draft, kv="paged", num_blocks=64, block_size=block_size, max_seq_len=128)
    seqs = [make_sequence(prompt, 14, temperature=1.0, seed=i, k=3) for i in range(n)]
    if together:
        engine.prefill(seqs)
    else:
        for s in seqs:
            engine.prefill([s])
    after_prefill = engine.target_kv.used_blocks
    while not all(s.finished for s in seqs):
        engine.step([s for s in seqs if not s.finished])
    keys = [engine.target_kv.row_keys(s.seq_id, 1) for s in seqs]
    return [s.output for s in seqs], after_prefill, keys, engine


def test_the_n_answers_to_one_prompt_share_its_blocks_and_answer_as_if_alone(small_pair, monkeypatch):
    """Sequences prefilled together with the same context read it once: the first reads it, the others
    share its blocks (one more holder each), and a block is copied when a sequence first writes into
    one another holds. Each answer and each row's keys are what they are when every answer reads the
    prompt alone; without the copy on write the answers write into each other's blocks and change."""
    target, draft = small_pair
    prompt = [1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1]  # 10 positions read: two full blocks of 4 and a partial one
    alone, blocks_alone, keys_alone, _ = _answers(target, draft, prompt, 3, together=False)
    shared, blocks_shared, keys_shared, engine = _answers(target, draft, prompt, 3, together=True)
    assert (blocks_alone, blocks_shared) == (9, 3), "the prompt's blocks were not shared"
    assert shared == alone, "an answer that shared its prompt's blocks differs from the one that read it alone"
    for a, b in zip(keys_shared, keys_alone):
        assert torch.equal(a, b), "a row's keys differ from those it has when it reads the prompt alone"
    assert len(set(map(tuple, alone))) > 1, "the answers are all the same: the test cannot tell them apart"
    for kv in (engine.target_kv, engine.draft_kv):
        held = [b for s in kv.tables for b in kv.tables[s]]
        assert all(kv.allocator.refs(b) == held.count(b) for b in set(held)), "a count disagrees with the tables"
    from specdec_lab.serve.kv import PagedBatchKV
    monkeypatch.setattr(PagedBatchKV, "_shared_from", lambda self, seq, start: [])  # no copy on write
    broken, _, _, _ = _answers(target, draft, prompt, 3, together=True)
    assert broken != alone, "writing into a shared block went unnoticed"


def test_a_forked_row_equals_the_padded_twins_copy():
    """fork on the paged pool (shared blocks) and on the padded twin (a copied row) give the same keys."""
    target, draft = _pair()
    keys = {}
    for kv in ("paged", "padded"):
        engine = BatchEngine(target, draft, kv=kv, num_blocks=64, block_size=4, max_rows=8, max_seq_len=128)
        seqs = [make_sequence(PROMPTS[2], 10, temperature=0.8, seed=i, k=2) for i in range(3)]
        engine.prefill(seqs)
        for _ in range(3):
            engine.step(seqs)
        keys[kv] = [engine.target_kv.row_keys(s.seq_id, 0) for s in seqs] + [[s.output for s in seqs]]
    assert keys["paged"][-1] == keys["padded"][-1]
    for a, b in zip(keys["paged"][:-1], keys["padded"][:-1]):
        assert torch.equal(a, b)
