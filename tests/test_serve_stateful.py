"""A server driven through random programs (hypothesis's stateful testing): submits (the same
prompt several times too, whose sequences share its blocks), cancels, steps, one-shot faults in the
verifier, the target's and the draft's forwards, requests that fail every step, callbacks that raise
or re-enter the server, and streams abandoned midway. After every action: each request that
completed equals its fault-free reference, and each that ended early holds a prefix of it; only the
requests that were meant to fail fail; every block has as many holders as block tables that list
it, and the pool is empty when the server is idle. At the end, nothing waits or runs: no request is
lost or hangs. Seeded (derandomize), so a failure reproduces."""
from collections import Counter

import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

import specdec_lab as sl
from specdec_lab.serve import RequestFailed, Server, StepError
from specdec_lab.serve.verify import verify_batch
from test_serve_faults import Countdown, FaultRunner

SETTINGS = dict(max_batch=3, block_size=4, max_seq_len=96, k=2)
REF = Server(sl.tiny_model(0), sl.tiny_model(1, n_layers=1), **SETTINGS)  # fault-free, one request at a time
_references = {}
SEEN = {"a block shared": 0, "step errors": 0, "failed alone": 0, "cancelled by a closed stream": 0,
        "failed by a callback": 0, "finished": 0}  # what the programs exercised, over all of them
FAR = 59  # a position only the requests meant to fail reach: the target's runner fails any forward there


def reference(prompt, n, temperature, seed, k):
    """The request's tokens alone on a fault-free server (greedy: its batch-1 decode; sampled: the
    same seed gives the same tokens alone and in any batch)."""
    key = (tuple(prompt), n, temperature, seed, k)
    if key not in _references:
        _references[key] = REF.submit(prompt, max_new_tokens=n, temperature=temperature, seed=seed,
                                      k=k).result().tokens
    return _references[key]


prompts = st.lists(st.integers(1, 60), min_size=1, max_size=6)


class ServerPrograms(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.target_fault, self.draft_fault, self.verify_fault = Countdown(), Countdown(), Countdown()
        far_or = lambda countdown: lambda t, pos: bool((pos >= FAR).any()) or countdown()  # noqa: E731
        target, draft = sl.tiny_model(0), sl.tiny_model(1, n_layers=1)
        target.runner = FaultRunner(far_or(self.target_fault))
        draft.runner = FaultRunner(self.draft_fault)

        def verifier(*args):
            if self.verify_fault():
                raise torch.OutOfMemoryError("injected: out of memory in verification")
            return verify_batch(*args)

        self.server = Server(target, draft, verifier=verifier, **SETTINGS)
        self.requests = []  # (handle, reference tokens, what it is: "plain", "collect", "raise", "reenter", "poison")
        self.heard = {}  # handle id -> tokens its collecting callback heard

    def _callback(self, kind):
        if kind == "collect":
            return lambda h, new: self.heard.setdefault(h.id, []).extend(new)
        if kind == "raise":
            def fails(h, new):
                raise KeyError("the callback's own failure")
            return fails
        if kind == "reenter":
            def waits(h, new):
                others = [o for o, _, _ in self.requests if o is not h and not o.done]
                (others[0] if others else h).result()  # steps the server from inside its step
            return waits
        return None

    @rule(prompt=prompts, n=st.integers(1, 12), sampled=st.booleans(), seed=st.integers(0, 3),
          k=st.sampled_from([None, 0, 1, 3]), kind=st.sampled_from(["plain", "collect", "raise", "reenter"]))
    def submit(self, prompt, n, sampled, seed, k, kind):
        temperature = 0.8 if sampled else 0.0
        h = self.server.submit(prompt, max_new_tokens=n, temperature=temperature, seed=seed, k=k,
                               on_step=self._callback(kind))
        self.requests.append((h, reference(prompt, n, temperature, seed, k), kind))

    @rule(prompt=st.lists(st.integers(1, 60), min_size=2, max_size=14), copies=st.integers(2, 3),
          n=st.integers(1, 8), seed=st.integers(0, 3))
    def submit_the_same_prompt_several_times(self, prompt, copies, n, seed):
        """The n answers to one request: admitted together, they share their prompt's blocks."""
        for i in range(copies):
            h = self.server.submit(prompt, max_new_tokens=n, temperature=0.8, seed=seed + i)
            self.requests.append((h, reference(prompt, n, 0.8, seed + i, None), "plain"))

    @rule(prompt=prompts)
    def submit_a_request_that_fails_every_step(self, prompt):
        h = self.server.submit((prompt * FAR)[:FAR] + [1], max_new_tokens=6)  # prefilled to FAR - 1; its steps fail
        self.requests.append((h, None, "poison"))

    @rule(i=st.integers(0, 40))
    def cancel(self, i):
        if self.requests:
            self.requests[i % len(self.requests)][0].cancel()

    @rule(fault=st.sampled_from([None, "verifier", "target", "draft"]), after=st.integers(1, 3))
    def step(self, fault, after):
        countdown = {"verifier": self.verify_fault, "target": self.target_fault, "draft": self.draft_fault}.get(fault)
        if countdown is not None and self.server.faults == 0:  # one-shot faults only outside isolation
            countdown.arm(after)
        try:
            self.server.step()
        except StepError:
            SEEN["step errors"] += 1
        finally:
            for c in (self.verify_fault, self.target_fault, self.draft_fault):
                c.n = None

    @rule(i=st.integers(0, 40))
    def abandon_a_stream(self, i):
        live = [h for h, _, _ in self.requests if not h.done]
        if not live:
            return
        h = live[i % len(live)]
        stream = h.stream()
        try:
            next(stream)
        except (StepError, RequestFailed, StopIteration):
            return
        done = h.done
        stream.close()
        assert h.done, "a closed stream cancels its request (or it had ended)"
        SEEN["cancelled by a closed stream"] += not done

    def _check(self, h, ref, kind):
        if kind == "poison":
            assert h.status in ("waiting", "running", "failed", "cancelled")
            return
        if kind in ("raise", "reenter"):
            assert h.status != "finished", "its callback fails it at its first tokens"
        else:
            assert h.status != "failed", f"request {h.id} ({kind}) failed: {h.error!r}"
        assert h.tokens == ref[:len(h.tokens)], f"request {h.id}: its tokens part from its reference"
        if h.status == "finished":
            assert h.tokens == ref
        if kind == "collect" and h.status == "finished":
            assert self.heard.get(h.id, []) == h.tokens, "its callback heard every token"

    @invariant()
    def every_request_is_its_reference_or_a_prefix_of_it(self):
        for h, ref, kind in self.requests:
            self._check(h, ref, kind)

    @invariant()
    def the_pool_is_empty_when_idle(self):
        eng = self.server.engine
        if self.server.idle:
            assert (eng.target_kv.used_blocks, eng.draft_kv.used_blocks) == (0, 0)

    @invariant()
    def every_block_has_as_many_holders_as_tables_that_list_it(self):
        for kv in (self.server.engine.target_kv, self.server.engine.draft_kv):
            held = Counter(b for table in kv.tables.values() for b in table)
            assert kv.used_blocks == len(held) and all(kv.allocator.refs(b) == n for b, n in held.items())
            SEEN["a block shared"] += any(n > 1 for n in held.values())

    def teardown(self):
        for _ in range(400):
            if self.server.idle:
                break
            try:
                self.server.step()
            except StepError:
                pass
        assert self.server.idle, "a request hangs"
        for h, ref, kind in self.requests:
            assert h.done
            self._check(h, ref, kind)
            if kind == "poison":
                assert h.status in ("failed", "cancelled")
                SEEN["failed alone"] += h.status == "failed"
            SEEN["failed by a callback"] += kind in ("raise", "reenter") and h.status == "failed"
            SEEN["finished"] += h.status == "finished"
        eng = self.server.engine
        assert (eng.target_kv.used_blocks, eng.draft_kv.used_blocks) == (0, 0)


def test_random_programs_of_submits_cancels_faults_and_streams():
    run_state_machine_as_test(ServerPrograms, settings=settings(
        max_examples=200, stateful_step_count=12, derandomize=True, deadline=None,
        suppress_health_check=list(HealthCheck)))
    assert all(n > 5 for n in SEEN.values()), f"the programs exercise every kind of fault: {SEEN}"
