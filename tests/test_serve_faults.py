"""Faults in serving: a step that raises changes nothing, one request's failure is its own, every
limit is checked where it is set, and nothing grows without bound. Tiny random models; faults are
injected through the model's runner seam (core/model.py: a runner may answer a forward or raise)
and through the server's verifier argument."""
import gc
import warnings
import weakref

import pytest
import torch

import specdec_lab as sl
from specdec_lab.serve import BatchEngine, GoodputPolicy, KSchedule, RequestFailed, Server, StepError, make_sequence
from specdec_lab.serve.verify import verify_batch
from specdec_lab.tree import DynamicTree, TreeEngine

POISON = 61  # a token id the faulty runner refuses to read


class FaultRunner:
    """A runner that declines every forward (so the eager code runs, unchanged) and raises where
    `fail(tokens, input_pos)` says so: an out-of-memory in the middle of a step, as far as the engine can tell."""
    name = "faulty"

    def __init__(self, fail):
        self.fail = fail

    def _check(self, tokens, input_pos):
        if self.fail(tokens, input_pos):
            raise torch.OutOfMemoryError("injected: out of memory")

    def logits(self, tokens, input_pos=None, *args):
        self._check(tokens, input_pos)

    def hidden(self, tokens, input_pos=None, *args):
        self._check(tokens, input_pos)


class Countdown:
    """fail() is True on the n-th call from now and never again (n=None: never)."""

    def __init__(self):
        self.n = None

    def arm(self, n=1):
        self.n = n

    def __call__(self, *args):
        if self.n is None:
            return False
        self.n -= 1
        if self.n == 0:
            self.n = None
            return True
        return False


def _pair(target_fail=None, draft_fail=None):
    target, draft = sl.tiny_model(0), sl.tiny_model(1, n_layers=1)
    if target_fail is not None:
        target.runner = FaultRunner(target_fail)
    if draft_fail is not None:
        draft.runner = FaultRunner(draft_fail)
    return target, draft


REF_TARGET = sl.tiny_model(0)  # the same weights as _pair's target, never faulty
PROMPTS = [[1, 2, 3], [7, 8], [9, 10, 11, 12, 13, 14], [3]]  # none says POISON or EOS within its budget
BUDGETS = [18, 9, 14, 21]


def _greedy(prompt, n):
    return sl.autoregressive_generate(REF_TARGET, prompt, max_new_tokens=n).tokens


def _blocks(server):
    return server.engine.target_kv.used_blocks, server.engine.draft_kv.used_blocks


# -- 1. a step that raises is a transaction ----------------------------------------------------------

@pytest.mark.parametrize("where", ["verifier", "target forward", "draft forward"])
def test_a_step_that_raises_changes_nothing_and_every_answer_equals_its_fault_free_one(where):
    """Before: the caches kept the failed step's k+1 positions; all four outputs differed from batch-1."""
    countdown, raising = Countdown(), {"armed": False}

    def verifier(*args):
        if raising["armed"]:
            raising["armed"] = False
            raise torch.OutOfMemoryError("injected: out of memory in verification")
        return verify_batch(*args)

    target, draft = _pair(countdown if where == "target forward" else None,
                          countdown if where == "draft forward" else None)
    server = Server(target, draft, max_batch=4, block_size=4, max_seq_len=128, k=3, verifier=verifier)
    hs = [server.submit(p, max_new_tokens=n) for p, n in zip(PROMPTS, BUDGETS)]
    sampled = server.submit([4, 4, 2], max_new_tokens=12, temperature=0.9, seed=5)
    server.step()
    server.step()
    before = ([h.tokens for h in hs], _blocks(server), server.steps)
    if where == "verifier":
        raising["armed"] = True
    else:
        countdown.arm(2 if where == "draft forward" else 1)  # the draft's second forward: midway through drafting
    with pytest.raises(StepError, match="out of memory") as info:
        server.step()
    assert isinstance(info.value.__cause__, torch.OutOfMemoryError), "the cause reaches the caller"
    assert ([h.tokens for h in hs], _blocks(server), server.steps) == before, "nothing changed"
    server.run_until_idle()
    for p, n, h in zip(PROMPTS, BUDGETS, hs):
        assert h.result().tokens == _greedy(p, n), p
    alone = Server(sl.tiny_model(0), sl.tiny_model(1, n_layers=1), block_size=4, max_seq_len=128, k=3)
    assert sampled.result().tokens == alone.submit([4, 4, 2], max_new_tokens=12, temperature=0.9,
                                                   seed=5).result().tokens, "the generator was put back"
    assert _blocks(server) == (0, 0)


def test_the_batch_engine_restores_lengths_blocks_and_generators_when_a_step_raises():
    target, draft = _pair()
    calls = {"n": 0}

    def verifier(*args):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("injected")
        return verify_batch(*args)

    engine = BatchEngine(target, draft, num_blocks=64, block_size=4, max_seq_len=128, verifier=verifier)
    seqs = [make_sequence(p, 12, temperature=0.8, seed=i, k=3) for i, p in enumerate(PROMPTS[:3])]
    engine.prefill(seqs)
    engine.step(seqs)
    state = lambda: ([(engine.target_kv.lengths[s.seq_id], engine.draft_kv.lengths[s.seq_id], len(s.output),  # noqa: E731
                       s.generator.get_state().sum().item(), s.pending.tolist()) for s in seqs],
                     engine.target_kv.used_blocks, engine.draft_kv.used_blocks)
    before = state()
    with pytest.raises(RuntimeError, match="injected"):
        engine.step(seqs)
    assert state() == before


# -- 2. a draft shorter than the target --------------------------------------------------------------

def test_a_draft_shorter_than_the_server_sizes_it_down_says_so_and_refuses_what_cannot_fit():
    """Before: a request that grew past the draft's 32 positions made every later step raise IndexError."""
    target, draft = sl.tiny_model(0), sl.tiny_model(1, n_layers=1, max_seq_len=32)
    with pytest.warns(UserWarning, match="the draft's positions"):
        server = Server(target, draft, max_batch=2, block_size=4, max_seq_len=128, k=2)
    assert server.engine.max_seq_len == 32
    with pytest.raises(ValueError, match=r"max_seq_len, 32 positions .*the draft's positions: 32"):
        server.submit([1, 2, 3], max_new_tokens=20)
    h = server.submit([1, 2, 3], max_new_tokens=10)
    assert h.result().tokens == _greedy([1, 2, 3], 10)


def test_the_engines_refuse_a_request_past_the_drafts_positions_before_any_work():
    target, short = sl.tiny_model(0), sl.tiny_model(1, n_layers=1, max_seq_len=32)
    engine = sl.SpeculativeEngine(target, short, k=3, max_seq_len=256)
    with pytest.raises(ValueError, match="the draft's positions: 32"):
        engine.generate([1, 2, 3], max_new_tokens=20)
    tree = TreeEngine(target, short, tree=(2, 2), max_seq_len=256)
    with pytest.raises(ValueError, match="the draft's positions: 32"):
        tree.generate([1, 2, 3], max_new_tokens=25)
    assert engine.generate([1, 2, 3], max_new_tokens=8).tokens == _greedy([1, 2, 3], 8), "what fits still runs"


def test_a_lookup_drafter_built_before_its_engine_takes_the_engines_size():
    """Before: LookupThenModelDrafter's cache kept its own default of 2048 and overflowed after a long run."""
    target, draft = sl.tiny_model(0, max_seq_len=512), sl.tiny_model(1, n_layers=1, max_seq_len=512)
    drafter = sl.LookupThenModelDrafter(draft, 48)
    engine = sl.SpeculativeEngine(target, drafter, k=3, max_seq_len=256)
    prompt = list(range(1, 60))
    assert engine.generate(prompt, max_new_tokens=100).tokens == sl.autoregressive_generate(
        target, prompt, max_new_tokens=100).tokens
    assert engine.max_seq_len == 256 and drafter.max_seq_len == 256


def test_a_tree_whose_draft_feeds_more_than_its_budget_is_checked_by_what_it_feeds():
    """Before: DynamicTree(4, 4, 4) passed a check of budget + 1 nodes, then the draft fed 12 frontier
    nodes and raised CacheOverflowError midway."""
    target, draft = sl.tiny_model(0), sl.tiny_model(1, n_layers=1)
    engine = TreeEngine(target, draft, tree=DynamicTree(4, 4, 4), max_seq_len=40)
    for n in range(1, 30):
        steps = []
        try:
            engine.generate([1, 2, 3], max_new_tokens=n, on_step=lambda rec, out: steps.append(rec))
        except ValueError as err:
            assert "exceeds" in str(err) and not steps, "refused before any step"


# -- 3. one prefill failure is its own ---------------------------------------------------------------

def test_a_request_whose_prefill_fails_fails_alone():
    """Before: the short request admitted beside it failed with its error."""
    target, draft = _pair(target_fail=lambda t, pos: bool((t == POISON).any()))
    server = Server(target, draft, max_batch=4, block_size=4, max_seq_len=128, k=2)
    bad = server.submit([5, POISON, 6, 7], max_new_tokens=6)
    good = server.submit(PROMPTS[0], max_new_tokens=8)
    server.run_until_idle()
    with pytest.raises(RequestFailed, match="out of memory"):
        bad.result()
    assert good.result().tokens == _greedy(PROMPTS[0], 8)
    assert _blocks(server) == (0, 0)


def test_a_row_that_fails_every_step_fails_alone_after_the_fault_limit():
    target, draft = _pair(target_fail=lambda t, pos: bool((t == POISON).any()))
    server = Server(target, draft, max_batch=4, block_size=4, max_seq_len=128, k=2, fault_limit=2)
    good = [server.submit(p, max_new_tokens=n) for p, n in zip(PROMPTS[:2], BUDGETS[:2])]
    bad = server.submit([5, 6, POISON], max_new_tokens=6)  # prefilled fine; its first step reads POISON
    with pytest.raises(StepError):
        server.step()
    server.run_until_idle()  # the second failure in a row steps each row alone
    assert bad.status == "failed" and isinstance(bad.error, torch.OutOfMemoryError)
    for p, n, h in zip(PROMPTS, BUDGETS, good):
        assert h.result().tokens == _greedy(p, n)
    assert _blocks(server) == (0, 0)


# -- 4. an abandoned stream --------------------------------------------------------------------------

@pytest.mark.parametrize("how", ["close", "garbage collection"])
def test_a_stream_its_reader_abandons_cancels_its_request_and_frees_its_blocks(how):
    """Before: the request ran on to its budget with its blocks held."""
    target, draft = _pair()
    server = Server(target, draft, max_batch=2, block_size=4, max_seq_len=128, k=2)
    other = server.submit(PROMPTS[2], max_new_tokens=14)
    h = server.submit(PROMPTS[0], max_new_tokens=30)
    stream = h.stream()
    next(stream)
    if how == "close":
        stream.close()
    else:
        del stream
        gc.collect()
    assert h.status == "cancelled" and len(h.tokens) < 30
    assert h.seq.seq_id == -1, "its blocks went back at once"
    assert other.result().tokens == _greedy(PROMPTS[2], 14)
    assert _blocks(server) == (0, 0)


# -- 5. a callback that re-enters the server ---------------------------------------------------------

def test_a_callback_that_waits_on_another_request_fails_its_own_and_no_token_is_lost():
    """Before: the inner step changed `running` while the outer delivered, and two callbacks missed tokens."""
    target, draft = _pair()
    server = Server(target, draft, max_batch=4, block_size=4, max_seq_len=128, k=2)
    seen = {i: [] for i in range(3)}
    hs = [server.submit(p, max_new_tokens=n, on_step=lambda h, new, i=i: seen[i].extend(new))
          for i, (p, n) in enumerate(zip(PROMPTS[:3], BUDGETS[:3]))]

    def waits(handle, new):
        hs[0].result()

    waiter = server.submit(PROMPTS[3], max_new_tokens=10, on_step=waits)
    server.run_until_idle()
    with pytest.raises(RequestFailed, match="inside a step"):
        waiter.result()
    for i, (p, n, h) in enumerate(zip(PROMPTS, BUDGETS, hs)):
        assert seen[i] == h.result().tokens == _greedy(p, n), f"request {i}'s callback heard every token"


# -- 6. sampling arguments that give no distribution ------------------------------------------------

def test_a_temperature_that_overflows_the_logits_is_refused_by_every_engine():
    """Before: temperature=1e-45 was accepted and yielded token 0 forever (inf logits, NaN softmax)."""
    target, draft = _pair()
    server = Server(target, draft, block_size=4, max_seq_len=128)
    calls = [lambda: server.submit([1, 2], max_new_tokens=4, temperature=1e-45),
             lambda: sl.SpeculativeEngine(target, draft, k=2).generate([1, 2], 4, temperature=1e-45),
             lambda: TreeEngine(target, draft).generate([1, 2], 4, temperature=1e-45),
             lambda: sl.autoregressive_generate(target, [1, 2], max_new_tokens=4, temperature=1e-45)]
    for call in calls:
        with pytest.raises(ValueError, match=r"temperature must be 0 \(greedy\) or a finite number >= 1e-05"):
            call()
    assert not server.waiting
    out = sl.SpeculativeEngine(target, draft, k=2).generate([1, 2], 16, temperature=1e-5, seed=0).tokens
    assert out == _greedy([1, 2], 16), "the smallest temperature allowed samples like greedy, without NaN"


# -- 7. bounded state --------------------------------------------------------------------------------

def test_finished_requests_leave_the_server_and_its_history_is_bounded():
    """Before: Server.finished held every handle with its step records; k_history grew per step."""
    target, draft = _pair()
    server = Server(target, draft, max_batch=8, block_size=4, max_seq_len=128, k=2, history=50, keep_steps=False)
    refs = []
    for i in range(400):
        refs.append(weakref.ref(server.submit([1 + i % 50, 2], max_new_tokens=3)))
        if i % 8 == 7:
            server.run_until_idle()
    server.run_until_idle()
    gc.collect()
    assert not hasattr(server, "finished") and server.retired == [] and server.idle
    assert sum(r() is not None for r in refs) == 0, "no finished request is kept by the server"
    assert len(server.k_history) == 50 < server.steps
    kept = server.submit([1, 2], max_new_tokens=6)
    server.run_until_idle()
    assert kept.result().tokens == _greedy([1, 2], 6) and kept.seq.steps == [] and kept.seq.num_steps > 0


# -- 8. one meaning per field, and the smaller defects -----------------------------------------------

def test_step_records_hold_the_drafted_ids_with_the_accepted_ones_first_in_every_engine():
    """Before: the server's `drafted` held the verdict ([9, -1, -1, -1]) and the tree's the accepted path."""
    target, draft = _pair()
    server = Server(target, draft, max_batch=2, block_size=4, max_seq_len=128, k=4)
    h = server.submit(PROMPTS[2], max_new_tokens=20)
    engine = sl.SpeculativeEngine(target, draft, k=4)
    tree = TreeEngine(target, draft, tree=(2, 2))
    runs = [h.result().steps, engine.generate(PROMPTS[2], 20).steps, tree.generate(PROMPTS[2], 20).steps]
    for steps in runs:
        assert any(r.num_accepted < r.k for r in steps), "some drafts rejected"
        for r in steps:
            assert len(r.drafted) == r.k and all(0 <= t < 64 for t in r.drafted)
            assert r.committed == (r.drafted[:r.num_accepted] + [r.next_token])[:len(r.committed)]


def test_no_request_is_prefilled_and_preempted_in_the_same_step():
    """Before: every admission was sized at the K of the batch with one newcomer; a schedule whose K
    grows with the batch admitted requests that the step's own memory check then preempted."""
    target, draft = _pair()
    schedule = KSchedule([(1, 2, 0), (3, 8, 8)])
    server = Server(target, draft, max_batch=4, block_size=4, max_seq_len=128, k=schedule, num_blocks=12)
    prefilled = []
    prefill = server.engine.prefill
    server.engine.prefill = lambda seqs: (prefilled.extend(seqs), prefill(seqs))[1]
    hs = [server.submit([1, 2, 3, 4, 5, 6, 7], max_new_tokens=8) for _ in range(4)]
    while not server.idle:
        prefilled.clear()
        server.step()
        assert all(s in [h.seq for h in server.running] or s.finished for s in prefilled), \
            "a request prefilled this step was preempted in it"
    for h in hs:
        assert h.result().tokens == _greedy([1, 2, 3, 4, 5, 6, 7], 8)


def test_the_goodput_policy_refuses_a_zero_prior_weight():
    with pytest.raises(ValueError, match="prior_weight"):
        GoodputPolicy({(1, k): 1.0 + k for k in range(5)}, prior_weight=0)


def test_a_server_construction_warning_names_nothing_when_the_pair_is_long_enough():
    target, draft = _pair()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Server(target, draft, block_size=4, max_seq_len=128)
