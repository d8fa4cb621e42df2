"""The batched speculative step: B sequences, each with its own length, K, sampling and seed.

One step over the batch (the single engine's four steps, docs/design.md, done for all rows at once):
  1. draft: one draft forward per drafted position, over the rows still drafting (k_b > i);
     the first feeds each row's pending tokens (ragged), the others one token per row;
  2. score: ONE target forward over every row's [c, d_1..d_{k_b}], padded to K+1 tokens;
  3. verify on the device (verify.py: the token, block or exact-match rule, row by row) and read
     the padded verdict, with what the step records keep beside it, in ONE host read for the whole batch;
  4. commit: row b keeps d_1..d_{n_b} and its next token, rolls its target cache back to
     [c, d_1..d_{n_b}], and its draft cache follows (the ModelDrafter invariant: the draft's
     cache holds every committed token except its pending ones).
A step is a transaction: whatever raises inside it (a forward, the verifier, an out-of-memory),
every sequence's cache lengths and blocks, pending tokens, output and generator are put back as
they were before the step, and the error goes on to the caller (docs/design.md, "Faults").
A row with k_b = 0 is plain decoding inside the batch. Randomness is per row: each sequence
draws from its own generator, in an order that depends on its own k_b only, so its tokens do
not depend on its neighbours. Memory is per row: kv.PagedBatchKV gives each sequence its own
block table (kv.PaddedBatchKV, the readable twin, a row of a padded tensor).

The engine knows token ids only; the scheduler (scheduler.py) decides which sequences run
and with which K. The draft is a Transformer (a token draft), or None for plain decoding.
"""
import time
import warnings
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from ..core.config import MAX_K, SamplingConfig
from ..core.engine import cut_at_eos
from ..core.kv_cache import drop_rejected
from ..core.records import StepRecord
from ..core.sampling import draft_token, exponential_noise, logits_to_probs, make_generator
from ..core.verify import pack_step, read_step
from ..drafters.model import commit_draft
from .forward import hidden, logits as batch_logits
from .kv import PagedBatchKV, PaddedBatchKV
from .verify import batch_rule, num_accepted


@dataclass
class Sequence:
    """One request's state. `k` is set before each step (the scheduler's choice); the engine
    clamps it to the budget."""
    prompt: list  # token ids
    sampling: SamplingConfig
    generator: torch.Generator
    max_new_tokens: int
    eos_ids: tuple = ()
    k: int = 0  # draft length for the next step
    output: list = field(default_factory=list)  # generated ids
    steps: list = field(default_factory=list)  # StepRecord per step, when keep_steps
    keep_steps: bool = True  # False: count the steps, keep no records (a long-running server)
    num_steps: int = 0  # steps taken
    drafted: int = 0  # draft tokens verified, over all steps
    accepted: int = 0  # of which accepted
    seq_id: int = -1  # id in the engine's caches while it holds them
    c: torch.Tensor | None = None  # (1,) the target's pending token, on the device
    pending: torch.Tensor | None = None  # (T,) committed tokens the draft has not seen, on the device
    processor: object = None  # the request's options (options/: a grammar, penalties, logprobs), reset to the prompt

    @property
    def finished(self) -> bool:
        return len(self.output) >= self.max_new_tokens or bool(self.output and self.output[-1] in self.eos_ids)

    @property
    def context(self) -> list:
        return self.prompt + self.output


@dataclass
class BatchRecord:
    """What one batched step did: a StepRecord per row, and the step's shared costs."""
    rows: list  # StepRecord per sequence, in batch order
    draft_seconds: float
    target_seconds: float
    syncs: int  # host reads for the whole batch (1)
    draft_forwards: int  # one per drafted position

    @property
    def batch_size(self) -> int:
        return len(self.rows)

    @property
    def k_max(self) -> int:
        return max((r.k for r in self.rows), default=0)


class BatchEngine:
    """The caches of a target and its draft for many sequences, and the batched step.

    kv="paged": blocks of `block_size` from pools of `num_blocks` (per model); kv="padded":
    the contiguous twin with `max_rows` rows. `verifier`: "token", "block" or "match" (verify.py),
    or a function with verify_batch's signature (the tests pass broken ones). `propose`: "sample"
    (each row's draft draws from its q) or "argmax" (its top token at any temperature, q one-hot:
    lossless under every rule, as in the single engine, api.SpeculativeEngine)."""

    def __init__(self, target, draft=None, kv="paged", num_blocks=256, block_size=16, max_rows=16,
                 max_seq_len=None, verifier="token", propose="sample"):
        if kv not in ("paged", "padded"):
            raise ValueError(f"kv must be 'paged' or 'padded', got {kv!r}")
        if draft is not None and draft.cfg.vocab_size != target.cfg.vocab_size:
            raise ValueError(f"draft vocabulary ({draft.cfg.vocab_size}) differs from the target's "
                             f"({target.cfg.vocab_size}); the draft must share the target's tokenizer")
        if propose not in ("sample", "argmax"):
            raise ValueError(f"propose must be one of 'sample', 'argmax', got {propose!r}")
        self.target, self.draft, self.verifier, self.propose = target, draft, batch_rule(verifier), propose
        self.limits = model_positions(target, draft)
        self.max_seq_len = min([max_seq_len or target.cfg.max_seq_len, *self.limits.values()])
        if max_seq_len and max_seq_len > self.max_seq_len:
            what = min(self.limits, key=self.limits.get)
            warnings.warn(f"max_seq_len {max_seq_len} exceeds {what} ({self.max_seq_len}): the engine holds "
                          f"{self.max_seq_len} positions per sequence", stacklevel=3)

        def make(model):
            if kv == "paged":
                return PagedBatchKV(model.cfg, num_blocks, block_size, self.max_seq_len, model.dtype, model.device)
            return PaddedBatchKV(model.cfg, max_rows, self.max_seq_len, model.dtype, model.device)
        self.target_kv = make(target)
        self.draft_kv = make(draft) if draft is not None else None
        self._next_id = 0
        self.positions_read = 0  # context positions prefill ran through the target
        self.positions_shared = 0  # context positions a sequence took from another's blocks instead

    @property
    def device(self):
        return self.target.device

    # -- sequences in and out ------------------------------------------------------

    @torch.inference_mode()
    def prefill(self, seqs):
        """Give each sequence caches and read its context (prompt, and what it generated before a
        preemption) but the last token, which stays pending for the target and the draft. Sequences
        with the same context (the n answers to one request) read it once: the first reads it and the
        others share its blocks (kv.fork; a block is copied when one of them first writes into it)."""
        ctx, lead, first = [], [], {}
        for s in seqs:
            s.seq_id, self._next_id = self._next_id, self._next_id + 1
            ctx.append(torch.tensor(s.context, device=self.device))  # the context's one copy to the device
            s.c, s.pending = ctx[-1][-1:], ctx[-1][-1:]
            lead.append(first.setdefault(tuple(s.context), s))  # who reads this sequence's context
        leads = list(first.values())
        rows = [(s, x[:-1]) for s, x, by in zip(seqs, ctx, lead) if len(x) > 1 and by is s]
        real = [len(x) for _, x in rows]
        try:
            for model, kv in ((self.target, self.target_kv), (self.draft, self.draft_kv)):
                if model is None:
                    continue
                for s in leads:
                    kv.add(s.seq_id)
                if rows:
                    tokens = torch.stack([F.pad(x, (0, max(real) - len(x))) for _, x in rows])  # (B, T)
                    hidden(model, kv.view([s.seq_id for s, _ in rows], real), tokens)  # the states are not needed
                for s, by in zip(seqs, lead):
                    if by is not s:
                        kv.fork(by.seq_id, s.seq_id)
        except Exception:
            self.release(seqs)
            raise
        self.positions_read += sum(real)
        self.positions_shared += sum(len(x) - 1 for s, x, by in zip(seqs, ctx, lead) if by is not s)

    def release(self, seqs):
        """Free every block the sequences hold (they may be prefilled again later)."""
        for s in seqs:
            for kv in (self.target_kv, self.draft_kv):
                if kv is not None and s.seq_id in kv.lengths:
                    kv.free(s.seq_id)
            s.seq_id, s.c, s.pending = -1, None, None

    # -- the step ------------------------------------------------------------------

    def step_k(self, s, k=None) -> int:
        """The K a sequence drafts this step: its k (or `k`), clamped to the budget and to 0 without a draft."""
        if self.draft is None:
            return 0
        return max(0, min(s.k if k is None else k, MAX_K, s.max_new_tokens - len(s.output) - 1))

    @torch.inference_mode()
    def step(self, seqs) -> BatchRecord:
        """One speculative step for every sequence in `seqs` (prefilled, not finished). If anything
        raises, every sequence is as it was before the step (a transaction) and the error propagates."""
        saved = [self._save(s) for s in seqs]
        try:
            return self._step(seqs)
        except BaseException:
            for s, state in zip(seqs, saved):
                self._restore(s, state)
            raise

    def _save(self, s):
        """What a step changes in a sequence: its caches' lengths, pending tokens, output, counts, and
        generator (a greedy row draws nothing from it). Host values only: no sync."""
        lengths = [kv.lengths[s.seq_id] for kv in (self.target_kv, self.draft_kv) if kv is not None]
        rng = None if s.sampling.greedy else s.generator.get_state()
        mark = None if s.processor is None else s.processor.mark()
        return lengths, s.c, s.pending, len(s.output), len(s.steps), (s.num_steps, s.drafted, s.accepted), rng, mark

    def _restore(self, s, state):
        lengths, s.c, s.pending, n_out, n_steps, (s.num_steps, s.drafted, s.accepted), rng, mark = state
        if s.processor is not None:
            s.processor.restore(mark)
        for kv, n in zip([kv for kv in (self.target_kv, self.draft_kv) if kv is not None], lengths):
            kv.rollback(s.seq_id, n)  # frees the blocks the step took (paged)
        del s.output[n_out:], s.steps[n_steps:]
        if rng is not None:
            s.generator.set_state(rng)

    def _step(self, seqs) -> BatchRecord:
        ks = [self.step_k(s) for s in seqs]
        t0 = time.perf_counter()
        drafts, qs, forwards = self._draft(seqs, ks)
        t1 = time.perf_counter()
        K = max(ks)
        logits = self._score(seqs, ks, drafts, K)  # (B, K+1, V)
        D, P, Q, U, E = self._draws(seqs, ks, drafts, qs, logits, K)
        verdict = self.verifier(D, P, Q, U, E)  # (B, K+1), -1 in unused slots
        n = num_accepted(verdict)  # (B,)
        decision = torch.stack([n, verdict.gather(1, n.view(-1, 1)).squeeze(1)], 1)  # (B, 2) [n, next]
        host = pack_step(decision, D, P, Q, U, greedy=False).tolist()  # sync: the one host read per step
        records = self._commit(seqs, ks, verdict, host, K, t1 - t0, time.perf_counter() - t1, logits)
        return BatchRecord(records, t1 - t0, time.perf_counter() - t1, 1, forwards)

    def _draft(self, seqs, ks):
        """Draft forward i runs over the rows with k_b > i. Returns each row's drafted ids and
        the q each was drawn from (one-hot for a greedy row), as lists of device tensors."""
        drafts, qs = [[] for _ in seqs], [[] for _ in seqs]
        V, forwards = self.target.cfg.vocab_size, 0
        for i in range(max(ks, default=0)):
            rows = [b for b, k in enumerate(ks) if k > i]
            if i == 0:  # each row's pending tokens: 1, 2 after a fully accepted step, more after k = 0 steps
                feed = [seqs[b].pending for b in rows]
            else:
                feed = [drafts[b][-1].view(1) for b in rows]
            real = [len(x) for x in feed]
            tokens = torch.stack([F.pad(x, (0, max(real) - r)) for x, r in zip(feed, real)])  # (B', T)
            out = batch_logits(self.draft, self.draft_kv.view([seqs[b].seq_id for b in rows], real), tokens)
            logits = torch.stack([out[j, r - 1] for j, r in enumerate(real)])  # (B', V) each row's last real token
            forwards += 1
            for j, b in enumerate(rows):
                s = seqs[b]
                row = logits[j] if s.processor is None else s.processor.draft(logits[j], [int(d) for d in drafts[b]])
                d, q = draft_token(row, s.sampling if self.propose == "sample" else SamplingConfig(), s.generator)
                drafts[b].append(d)
                qs[b].append(q if q is not None else torch.zeros(V, device=d.device).scatter_(0, d.view(1), 1.0))
        return drafts, qs, forwards

    def _score(self, seqs, ks, drafts, K):
        """One target forward over every row's [c, d_1..d_k], padded to K+1: logits (B, K+1, V)."""
        rows = [torch.cat([s.c] + [d.view(1) for d in drafts[b]]) for b, s in enumerate(seqs)]
        tokens = torch.stack([F.pad(x, (0, K + 1 - len(x))) for x in rows])  # (B, K+1)
        view = self.target_kv.view([s.seq_id for s in seqs], [k + 1 for k in ks])
        return batch_logits(self.target, view, tokens)  # (B, K+1, V)

    def _draws(self, seqs, ks, drafts, qs, logits, K):
        """The padded inputs of the verifier; each row draws u then e from its own generator, as the
        single engine does; a greedy row draws nothing (one-hot p and q, u = 0, e = 1)."""
        V, device = logits.shape[-1], logits.device
        D, P, Q, U, E = [], [], [], [], []
        for b, (s, k) in enumerate(zip(seqs, ks)):
            sp, rows = s.sampling, logits[b, :k + 1]
            if s.processor is not None:  # each row as if the drafts before it had been generated (options/)
                rows = s.processor.target(rows, [int(d) for d in drafts[b]])
            p = logits_to_probs(rows, sp.temperature, sp.top_k, sp.top_p)  # (k+1, V)
            if sp.greedy:
                u, e = torch.zeros(k, device=device), torch.ones(V, device=device)
            else:
                u = torch.rand(k, generator=s.generator, device=device)
                e = exponential_noise(V, s.generator, device)
            d = torch.stack(drafts[b]) if k else torch.empty(0, dtype=torch.long, device=device)
            q = torch.stack(qs[b]) if k else torch.empty(0, V, device=device)
            D.append(F.pad(d, (0, K - k), value=-1))  # (K,)
            P.append(F.pad(p, (0, 0, 0, K - k)))  # (K+1, V)
            Q.append(F.pad(q, (0, 0, 0, K - k)))  # (K, V)
            U.append(F.pad(u, (0, K - k)))  # (K,)
            E.append(e)
        return torch.stack(D), torch.stack(P), torch.stack(Q), torch.stack(U), torch.stack(E)

    def _commit(self, seqs, ks, verdict, host, K, draft_seconds, target_seconds, logits):
        """Row b keeps c, d_1..d_n in the target's cache (the single engine's drop_rejected) and its
        draft cache follows (ModelDrafter's rule, commit_draft); its next token becomes its c; its
        processor hears the committed tokens with the target's raw rows (logits (B, K+1, V))."""
        records = []
        for b, (s, k) in enumerate(zip(seqs, ks)):
            r = read_step(host[b], k, s.sampling.greedy, K)  # one-hot p and q: p(d), q(d) as the engine's
            n = r.num_accepted
            drop_rejected(self.target_kv.row(s.seq_id), fed=k + 1, kept=n + 1)
            committed = verdict[b, :n + 1]  # (n+1,) d_1..d_n, next on the device
            s.c = committed[-1:]
            if self.draft is not None:
                s.pending = commit_draft(self.draft_kv.row(s.seq_id), s.pending, k, n, committed)
            rec = StepRecord(step=s.num_steps, k=k, drafted=r.drafted, num_accepted=n, next_token=r.next_token,
                             p_draft=r.p_draft, q_draft=r.q_draft, uniforms=r.uniforms,
                             draft_seconds=draft_seconds, target_seconds=target_seconds, syncs=1)
            if s.processor is not None:
                s.processor.commit(r.drafted[:n] + [r.next_token], logits[b, :n + 1])
            rec.committed = cut_at_eos(r.drafted[:n] + [r.next_token], s.max_new_tokens - len(s.output), s.eos_ids)
            s.output += rec.committed
            s.num_steps, s.drafted, s.accepted = s.num_steps + 1, s.drafted + k, s.accepted + n
            if s.keep_steps:
                s.steps.append(rec)
            records.append(rec)
        return records


def model_positions(target, draft=None) -> dict:
    """{what: positions} no sequence may outgrow: the target's rotary table, and the draft's."""
    limits = {"the target's positions": target.cfg.max_seq_len}
    if draft is not None:
        limits["the draft's positions"] = draft.cfg.max_seq_len
    return limits


def make_sequence(prompt_ids, max_new_tokens=32, temperature=0.0, top_p=1.0, top_k=0, seed=0, k=4,
                  eos_ids=(), device="cpu", processor=None) -> Sequence:
    """A Sequence with its own generator (seeded: a row's tokens repeat alone or in any batch), and the
    request's options (`processor`, options/), reset to its prompt here."""
    if processor is not None:
        processor.reset(list(prompt_ids))
    return Sequence(list(prompt_ids), SamplingConfig(temperature, top_k, top_p), make_generator(seed, device),
                    max_new_tokens, tuple(eos_ids), k=k, processor=processor)


def run_to_completion(engine, seqs):
    """Prefill every sequence, step the batch until each is finished (rows leave as they finish),
    release their caches. Returns the BatchRecords."""
    engine.prefill(seqs)
    records, live = [], [s for s in seqs if not s.finished]
    while live:
        records.append(engine.step(live))
        done = [s for s in live if s.finished]
        engine.release(done)
        live = [s for s in live if not s.finished]
    engine.release([s for s in seqs if s.seq_id >= 0])
    return records
