"""Continuous batching: requests come and go at step boundaries, and speculation runs over the batch.

    server = Server(target, draft, max_batch=8)
    a = server.submit("Why is the sky blue?", max_new_tokens=64, temperature=0.7, seed=1)
    b = server.submit([1, 2, 3], max_new_tokens=16, on_step=lambda handle, new: print(new))
    for new in a.stream(): ...        # the new tokens of each step, stepping the server as needed
    b.result()                        # steps until b is done: a Completion (tokens, text, reason)
    server.run_until_idle()

The shape of nano-vllm's scheduler: two queues, `waiting` and `running`. Each `step()`:
  1. retire cancelled requests (their blocks go back to the pool at once);
  2. admit waiting requests, first come first served, while the batch has room (max_batch)
     and the pools have the blocks for their context and their first step, and prefill them;
  3. choose each row's K (the policy, capped by the request's own k), and make sure the pools
     can hold this step's new positions: if not, preempt the last admitted running request
     (vLLM's recompute: its blocks are freed, it goes back to the front of `waiting` keeping its
     tokens and its generator, and on readmission it reads its prompt and output again);
  4. one batched speculative step (engine.BatchEngine.step);
  5. stream each row's new tokens to its callback; a callback that raises fails its own
     request only; retire rows at EOS or their budget and free their blocks at once.
Bad input to `submit` raises ValueError there and leaves the server unchanged. Every admitted
request ends finished, cancelled or failed with its error, and then holds no block.

Faults (docs/design.md has the table). A batched step is a transaction (engine.py): when it
raises, nothing changed, and `step()` raises StepError with the cause; the next step() works.
After `fault_limit` failed steps in a row the server steps each row alone, and a row that still
fails fails its own request. A prefill that fails is retried row by row, so only the request
that cannot be prefilled fails. A callback that steps the server (waits on another request)
gets a RuntimeError, which fails its own request. A stream closed or dropped before its end
cancels its request. Finished requests leave the server: it keeps only what runs and waits, and
the handles the callers hold; `retired` lists the requests that ended since the last step.
"""
import time
from collections import deque
from dataclasses import dataclass

from ..core.config import MAX_K, SamplingConfig
from ..core.engine import check_generate_args, check_seed, check_token_ids
from ..core.sampling import make_generator
from ..core.text import encode_prompt
from ..options import Logprobs, request_processor
from ..paged import blocks_for
from .engine import BatchEngine, BatchRecord, Sequence, model_positions


class RequestFailed(RuntimeError):
    """A request ended with an error (its callback, its prefill or its own step raised); the others ran on."""


class StepError(RuntimeError):
    """A batched step raised (the cause is chained). Nothing changed: caches, blocks, outputs and
    generators are as before the step, and the next step() runs it again."""


@dataclass
class Completion:
    tokens: list  # generated ids
    text: str | None  # decoded, when the server has a tokenizer
    finish_reason: str  # "eos", "length" or "cancelled"
    steps: list  # StepRecord per step this request took part in
    preemptions: int  # times it was preempted and recomputed


REQUEST_OPTIONS = {"grammar", "presence_penalty", "frequency_penalty", "repetition_penalty", "logprobs", "top_logprobs"}


class Handle:
    """A submitted request: its state, its tokens so far, and ways to wait for it."""

    def __init__(self, server, request_id, seq, on_step, k_cap):
        self.server, self.id, self.seq, self.on_step = server, request_id, seq, on_step
        self.k_cap = k_cap  # the request's own largest K (the server's policy chooses below it)
        self.status = "waiting"  # waiting | running | finished | cancelled | failed
        self.error = None
        self.preemptions = 0
        self.first_token_time = None  # perf_counter seconds of the first generated token
        self.submit_time = None
        self.finish_time = None

    @property
    def logprobs(self):
        """Per generated token {"token", "logprob", "top"} (options.Logprobs), where the request asked."""
        proc = self.seq.processor
        found = proc.find(Logprobs) if proc is not None else None
        return None if found is None else found.entries[:len(self.seq.output)]

    @property
    def tokens(self) -> list:
        return list(self.seq.output)

    @property
    def done(self) -> bool:
        return self.status in ("finished", "cancelled", "failed")

    def cancel(self):
        """Stop this request; its blocks are freed at once (or at the end of the step in progress)."""
        if not self.done:
            self.server._cancel(self)

    def stream(self):
        """Yield the new tokens of each step (lists), stepping the server until this request is done.
        Closing the generator before the end (close(), or dropping it) cancels the request."""
        seen = 0
        try:
            while True:
                out = self.seq.output
                if len(out) > seen:
                    yield list(out[seen:])
                    seen = len(out)
                if self.done:
                    break
                self.server.step()
        except GeneratorExit:  # the reader went away: its blocks go back to the pool
            self.cancel()
            raise
        if self.status == "failed":
            raise RequestFailed(f"request {self.id} failed: {self.error!r}") from self.error

    def result(self) -> Completion:
        """Step the server until this request is done; its Completion, or RequestFailed. A StepError
        (a failed batched step, which changed nothing) reaches the caller; calling again resumes."""
        while not self.done:
            self.server.step()
        if self.status == "failed":
            raise RequestFailed(f"request {self.id} failed: {self.error!r}") from self.error
        out = self.seq.output
        text = self.server.tokenizer.decode(out, skip_special_tokens=True) if self.server.tokenizer else None
        return Completion(list(out), text, self.finish_reason, list(self.seq.steps), self.preemptions)

    @property
    def finish_reason(self) -> str | None:
        """"eos", "length", "cancelled" or "failed"; None while it waits or runs."""
        if not self.done:
            return None
        if self.status != "finished":
            return self.status
        out = self.seq.output
        return "eos" if out and out[-1] in self.seq.eos_ids else "length"


class Server:
    """Continuous batching over a BatchEngine (paged memory). `k`: the draft length, an int for
    every step, or a policy (policy.py) with k_for(batch_size) and observe(record); 0 or no draft
    is plain batched decoding. `num_blocks` per model's pool; `on_batch(server, record)` hears
    every step (the metrics exporter's hook). `max_seq_len` above the target's or the draft's
    positions is sized down to them, with a warning. `keep_steps=False`: requests keep no StepRecords
    (their counts only). `fault_limit`: failed steps in a row before rows are stepped alone.
    `history`: steps `k_history` remembers. `verifier` ("token", "block", "match" or a function) and
    `propose` ("sample" or "argmax") go to the BatchEngine."""

    def __init__(self, target, draft=None, max_batch=8, num_blocks=None, block_size=16, max_seq_len=2048, k=4,
                 tokenizer=None, on_batch=None, verifier="token", keep_steps=True, fault_limit=2,
                 history=4096, propose="sample"):
        for name, v, lo in (("max_batch", max_batch, 1), ("block_size", block_size, 1), ("max_seq_len", max_seq_len, 2),
                            ("fault_limit", fault_limit, 1), ("history", history, 1)):
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ValueError(f"{name} must be an int >= {lo}, got {v!r}")
        if num_blocks is None:
            num_blocks = max_batch * blocks_for(min([max_seq_len, *model_positions(target, draft).values()]),
                                                block_size)
        if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 1:
            raise ValueError(f"num_blocks must be an int >= 1, got {num_blocks!r}")
        if isinstance(k, bool) or not (isinstance(k, int) and 0 <= k <= MAX_K or hasattr(k, "k_for")):
            raise ValueError(f"k must be an int in [0, {MAX_K}] or a policy with k_for(batch_size), got {k!r}")
        self.engine = BatchEngine(target, draft, "paged", num_blocks, block_size, max_seq_len=max_seq_len,
                                  verifier=verifier, propose=propose)
        self.max_batch, self.block_size, self.k = max_batch, block_size, k
        self.tokenizer = tokenizer or getattr(target, "tokenizer", None)
        self.on_batch, self.keep_steps, self.fault_limit = on_batch, keep_steps, fault_limit
        self.waiting: deque[Handle] = deque()
        self.running: list[Handle] = []
        self.retired: list[Handle] = []  # requests that ended since the last step's on_batch
        self.steps = 0
        self.preemptions = 0
        self.faults = 0  # failed steps in a row
        self._k_history: deque[tuple[int, int]] = deque(maxlen=history)  # (batch size, the policy's K) per step
        self.k_now = 0
        self._next_id = 0

    @property
    def k_history(self) -> list:
        """(batch size, the policy's K) of the last `history` steps."""
        return list(self._k_history)

    # -- requests ------------------------------------------------------------------

    def submit(self, prompt, max_new_tokens=64, temperature=0.0, top_p=1.0, top_k=0, seed=None, k=None,
               on_step=None, ignore_eos=False, **options) -> Handle:
        """Queue a request; bad input raises ValueError here and queues nothing. ignore_eos decodes
        through the model's end-of-sequence tokens to max_new_tokens (a load test's fixed lengths).
        `options`: grammar, presence_penalty, frequency_penalty, repetition_penalty, logprobs and
        top_logprobs, as api.SpeculativeEngine.generate takes them, each exact under speculation
        (options/); the handle's `logprobs` then holds what was asked for."""
        target = self.engine.target
        ids = encode_prompt(self.tokenizer, prompt)
        check_token_ids(ids, target.cfg.vocab_size)
        check_generate_args(max_new_tokens, temperature, top_p, top_k)
        check_seed(seed)
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= MAX_K):
            raise ValueError(f"k must be None (the server's) or an int in [0, {MAX_K}], got {k!r}")
        if on_step is not None and not callable(on_step):
            raise ValueError(f"on_step must be None or a function (handle, new_tokens), got {on_step!r}")
        if not isinstance(ignore_eos, bool):
            raise ValueError(f"ignore_eos must be True or False, got {ignore_eos!r}")
        need = len(ids) + max_new_tokens + MAX_K + 1
        if need > self.engine.max_seq_len:
            raise ValueError(f"prompt ({len(ids)} tokens) + max_new_tokens ({max_new_tokens}) + lookahead "
                             f"({MAX_K + 1}) = {need} exceeds the server's max_seq_len, {self.engine.max_seq_len} "
                             f"positions ({', '.join(f'{w}: {n}' for w, n in self.engine.limits.items())})")
        pool = self.engine.target_kv.num_blocks
        if blocks_for(need, self.block_size) > pool:
            raise ValueError(f"max_new_tokens ({max_new_tokens}): the request needs up to "
                             f"{blocks_for(need, self.block_size)} blocks alone, the pool has {pool}")
        eos = () if ignore_eos else tuple(target.cfg.eos_token_ids)
        unknown = set(options) - REQUEST_OPTIONS
        if unknown:
            raise ValueError(f"unknown request options {sorted(unknown)}; known: {sorted(REQUEST_OPTIONS)}")
        processor = request_processor(self.tokenizer, target.cfg.vocab_size, eos_ids=target.cfg.eos_token_ids,
                                      **options)
        if processor is not None:
            processor.reset(ids)
        seq = Sequence(ids, SamplingConfig(temperature, top_k, top_p), make_generator(seed, target.device),
                       max_new_tokens, eos, keep_steps=self.keep_steps, processor=processor)
        handle = Handle(self, self._next_id, seq, on_step, MAX_K if k is None else k)
        self._next_id += 1
        handle.submit_time = _now()
        self.waiting.append(handle)
        return handle

    def _cancel(self, handle):
        handle.status = "cancelled"
        if handle in self.waiting:
            self.waiting.remove(handle)
            self._retire(handle, release=False)
        elif not self._in_step:
            self._retire(handle)

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running

    def run_until_idle(self, max_steps=None):
        """Step until no request waits or runs; returns the number of steps taken."""
        n = 0
        while not self.idle and (max_steps is None or n < max_steps):
            self.step()
            n += 1
        return n

    # -- the loop ------------------------------------------------------------------

    _in_step = False

    def step(self):
        """One scheduling step (module docstring). Returns the BatchRecord, or None when idle.
        Raises StepError when the batched step raised; then nothing changed."""
        if self._in_step:
            raise RuntimeError("Server.step() was called inside a step: an on_step callback may not wait on a "
                               "request (result(), stream()) or step the server; it runs between steps' work")
        for h in [h for h in self.running if h.status == "cancelled"]:
            self._retire(h)
        self._admit()
        if not self.running:
            return None
        self._fit_memory()
        self._in_step = True
        try:
            pairs, record = self._batched_step(list(self.running))
            self.steps += 1
            self._k_history.append((record.batch_size, self.k_now))
            if not isinstance(self.k, int):
                self.k.observe(record)
            self._deliver(pairs)
        finally:
            self._in_step = False
        for h in list(self.running):
            if h.status in ("cancelled", "failed") or h.seq.finished:
                if h.status == "running":
                    h.status = "finished"
                self._retire(h)
        if self.on_batch is not None:
            self.on_batch(self, record)
        self.retired = []
        return record

    def _batched_step(self, rows):
        """The engine's step over `rows`: ([(handle, StepRecord)], BatchRecord). A failed step changed
        nothing and raises StepError, until `fault_limit` in a row: then each row steps alone."""
        try:
            record = self.engine.step([h.seq for h in rows])
        except Exception as err:
            self.faults += 1
            if self.faults < self.fault_limit:
                raise StepError(f"the batched step over {len(rows)} rows raised {err!r}; nothing changed, "
                                f"the next step() runs it again") from err
            return self._isolate(rows)
        self.faults = 0
        return list(zip(rows, record.rows)), record

    def _isolate(self, rows):
        """Step each row alone; a row whose own step raises fails its request (its state is unchanged)."""
        pairs, records = [], []
        for h in rows:
            try:
                rec = self.engine.step([h.seq])
            except Exception as err:
                h.status, h.error = "failed", err
                continue
            pairs.append((h, rec.rows[0]))
            records.append(rec)
        self.faults = 0
        merged = BatchRecord([r for _, r in pairs], sum(r.draft_seconds for r in records),
                             sum(r.target_seconds for r in records), sum(r.syncs for r in records),
                             sum(r.draft_forwards for r in records))
        return pairs, merged

    def _k_for(self, batch_size) -> int:
        return self.k if isinstance(self.k, int) else self.k.k_for(max(batch_size, 1))

    def _set_k(self) -> int:
        """Each running row's K this step: the policy's for this batch size, capped by the request."""
        k = self._k_for(len(self.running))
        for h in self.running:
            h.seq.k = min(k, h.k_cap)
        return k

    def _step_blocks(self, h, k):
        """Blocks (target, draft) running request h needs for one step at draft length k."""
        eng, s = self.engine, h.seq
        k = eng.step_k(s, min(k, h.k_cap))
        target = eng.target_kv.blocks_to_grow(s.seq_id, k + 1)
        draft = eng.draft_kv.blocks_to_grow(s.seq_id, len(s.pending) + k - 1) if k and eng.draft_kv else 0
        return target, draft

    def _admission_blocks(self, h, k):
        """Blocks a waiting request needs to be prefilled and take its first step at draft length k."""
        k = self.engine.step_k(h.seq, min(k, h.k_cap))
        n = blocks_for(len(h.seq.context) + k + 1, self.block_size)
        return n, (n if self.engine.draft_kv is not None else 0)

    def _free(self):
        eng = self.engine
        return eng.target_kv.free_blocks, (eng.draft_kv.free_blocks if eng.draft_kv is not None else 0)

    def _admit(self):
        """Admit from the front of `waiting` while the batch has room and the pools hold every row's
        next step at the K the policy gives the batch with the newcomer in it."""
        admitted = []
        while self.waiting and len(self.running) + len(admitted) < self.max_batch:
            batch = self.running + admitted
            k = self._k_for(len(batch) + 1)
            need_t, need_d = self._admission_blocks(self.waiting[0], k)
            free_t, free_d = self._free()
            for h in self.running:
                grow_t, grow_d = self._step_blocks(h, k)
                free_t, free_d = free_t - grow_t, free_d - grow_d
            for h in admitted:
                held_t, held_d = self._admission_blocks(h, k)
                free_t, free_d = free_t - held_t, free_d - held_d
            if need_t > free_t or need_d > free_d:
                break
            admitted.append(self.waiting.popleft())
        if not admitted:
            return
        try:
            self.engine.prefill([h.seq for h in admitted])  # releases what it took if it fails
            ok = admitted
        except Exception:  # one request's failure is its own: prefill them one by one
            ok = []
            for h in admitted:
                try:
                    self.engine.prefill([h.seq])
                    ok.append(h)
                except Exception as err:
                    h.status, h.error = "failed", err
                    self._retire(h, release=False)
        for h in ok:
            h.status = "running"
        self.running += ok

    def _fit_memory(self):
        """Preempt from the back (the last admitted) until this step's new positions fit."""
        while True:
            self.k_now = self._set_k()
            needs = [self._step_blocks(h, h.seq.k) for h in self.running]
            free_t, free_d = self._free()
            if sum(n[0] for n in needs) <= free_t and sum(n[1] for n in needs) <= free_d:
                return
            if len(self.running) == 1:
                raise RuntimeError("the pool cannot hold one request's step; submit checks prevent this")
            victim = self.running.pop()
            self.engine.release([victim.seq])
            victim.status, victim.preemptions = "waiting", victim.preemptions + 1
            self.preemptions += 1
            self.waiting.appendleft(victim)

    def _deliver(self, pairs):
        """Each row's new tokens to its callback. `pairs` is fixed before any callback runs, and a
        callback that steps the server gets the RuntimeError of step(): nothing is skipped."""
        now = _now()
        for h, row in pairs:
            if row.committed and h.first_token_time is None:
                h.first_token_time = now
            if h.on_step is None or not row.committed or h.status != "running":
                continue
            try:
                h.on_step(h, list(row.committed))
            except Exception as err:  # the callback's failure is its request's, not the server's
                h.status, h.error = "failed", err

    def _retire(self, h, release=True):
        if release:
            self.engine.release([h.seq])
            if h in self.running:
                self.running.remove(h)
        h.finish_time = _now()
        self.retired.append(h)


def _now() -> float:
    return time.perf_counter()
