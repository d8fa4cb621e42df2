"""The speculative decoding loop, and the autoregressive baseline it is measured against.

The engine knows token ids only (a target's `tokenizer`, where it has one, turns text into ids
and back) and its draft only through the drafter protocol (drafter.py).

One step (docs/design.md), with c the last committed token the target has not yet seen:
  1. the drafter proposes d_1..d_k with their q;
  2. the target runs ONE forward over [c, d_1..d_k] with the K+1 mask -> p_1..p_{k+1};
  3. `verify` decides on the device; the host reads [n, next, d, p(d), q(d), u]
     in one synchronisation;
  4. commit d_1..d_n and next; roll the target cache back to keep [c, d_1..d_n];
     next becomes the new c, so it costs no extra target forward.
"""
import numbers
import time
from dataclasses import dataclass, field

import torch

from .config import MAX_K, SamplingConfig
from .drafter import Verdict
from .kv_cache import drop_rejected
from .records import RunStats, StepRecord
from .sampling import check_sampling_args, logits_to_probs, make_generator, sample
from .text import encode_prompt
from .verify import pack_step, read_step, target_draws, verify, verify_reference


@dataclass
class GenerationResult:
    tokens: list  # new token ids, prompt excluded
    text: str | None  # decoded new text, when a tokenizer is known
    steps: list = field(default_factory=list)  # StepRecord per step
    stats: RunStats = field(default_factory=RunStats)
    prompt_ids: list = field(default_factory=list)
    logprobs: list | None = None  # per token, where the request asked for them (options.Logprobs)


def check_seed(seed):
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, numbers.Integral)):
        raise ValueError(f"seed must be an int or None, got {seed!r}")


def check_generate_args(max_new_tokens, temperature, top_p, top_k=0):
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
    check_sampling_args(temperature, top_p, top_k)


def check_capacity(prompt_len, max_new_tokens, lookahead, limits: dict):
    """limits: {what: positions}, each a bound on prompt + new tokens + the step's lookahead."""
    need, (what, n) = prompt_len + max_new_tokens + lookahead, min(limits.items(), key=lambda kv: kv[1])
    if need > n:
        raise ValueError(f"prompt ({prompt_len} tokens) + max_new_tokens ({max_new_tokens}) + lookahead ({lookahead}: "
                         f"what one step may write past the text) = {need} exceeds {what}: {n} positions")


def check_k(k):
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K:
        raise ValueError(f"k must be an int in [1, {MAX_K}], got {k!r}")


def check_token_ids(ids, vocab_size):
    if max(ids) >= vocab_size or min(ids) < 0:
        raise ValueError(f"prompt token ids must be in [0, {vocab_size}), got min {min(ids)}, max {max(ids)}")


def _decode(tokenizer, tokens):
    return tokenizer.decode(tokens, skip_special_tokens=True) if tokenizer is not None else None


def cut_at_eos(tokens, budget, eos_ids):
    """The prefix of `tokens` that fits in `budget` and ends at the first EOS."""
    out = []
    for t in tokens[:budget]:
        out.append(t)
        if t in eos_ids:
            break
    return out


# Both loops run under inference_mode rather than no_grad: it also skips autograd's version
# counting and view tracking, and a one-token forward of the default target took 3% less time.
@torch.inference_mode()
def autoregressive_generate(model, prompt, max_new_tokens=128, temperature=0.0, top_p=1.0, seed=None,
                            top_k=0, tokenizer=None, max_seq_len=None, cache=None, processor=None):
    """The baseline: prefill, then one target forward and one sync per token. `cache`, when given,
    is reset and reused; else the model makes one for this call (new_cache: a runner with fixed
    shapes rounds it up to its one capacity). `processor`: as Engine.generate's."""
    tokenizer = tokenizer or getattr(model, "tokenizer", None)
    check_generate_args(max_new_tokens, temperature, top_p, top_k)
    check_seed(seed)
    ids = encode_prompt(tokenizer, prompt)
    check_token_ids(ids, model.cfg.vocab_size)
    capacity = cache.capacity if cache is not None else len(ids) + max_new_tokens
    check_capacity(len(ids), max_new_tokens, 0, {"the cache capacity": capacity, "max_seq_len": max_seq_len
                                                 or capacity, "the model's positions": model.cfg.max_seq_len})
    device, eos = model.device, model.cfg.eos_token_ids
    g = make_generator(seed, device)
    cache = cache if cache is not None else model.new_cache(capacity)
    cache.reset()
    stats, steps, out = RunStats(), [], []
    if processor is not None:
        processor.reset(ids)
    t0 = time.perf_counter()
    logits = model(torch.tensor([ids], device=device), cache=cache, last_only=True)[0, -1]  # the prompt's one copy
    stats.prefill_seconds = time.perf_counter() - t0
    t_start = time.perf_counter()
    while True:
        t1 = time.perf_counter()
        raw, logits = logits, logits if processor is None else processor.target(logits[None], [])[0]
        probs = logits if temperature == 0 else logits_to_probs(logits, temperature, top_k, top_p)
        tok_t = (probs.argmax() if temperature == 0 else sample(probs, g)).view(1, 1)  # (1, 1) on the device
        tok = int(tok_t)  # sync: one per token
        out.append(tok)
        if processor is not None:
            processor.commit([tok], raw[None])
        done = len(out) == max_new_tokens or tok in eos
        if not done:
            logits = model(tok_t, cache=cache)[0, -1]
        rec = StepRecord(step=len(steps), k=0, drafted=[], num_accepted=0, next_token=tok, p_draft=[], q_draft=[],
                         uniforms=[], draft_seconds=0.0, target_seconds=time.perf_counter() - t1, syncs=1,
                         committed=[tok])
        steps.append(rec)
        stats.add_step(rec, 1)
        if done:
            break
    stats.seconds = time.perf_counter() - t_start
    return GenerationResult(out, _decode(tokenizer, out), steps, stats, ids)


class Engine:
    """Speculative decoding (arXiv 2211.17192, 2302.01318) with any drafter of the protocol.

    engine = Engine(target, drafter, k=4, cache=KVCache.for_model(target.cfg, 2048))
    `verifier="reference"` runs the readable loop (one sync per draft token) instead of the
    vectorised one, to compare; a function with verify's signature can be passed too (the
    chapters pass broken ones). `propose="argmax"`: the drafter drafts greedily (its top token,
    q one-hot) at any temperature. An adaptive-K controller (policies/) may be set as `controller`.
    """

    def __init__(self, target, drafter, k=4, cache=None, verifier="device", tokenizer=None, propose="sample"):
        check_k(k)
        if verifier not in ("device", "reference") and not callable(verifier):
            raise ValueError(f"verifier must be 'device', 'reference' or a function like verify, got {verifier!r}")
        self.target, self.drafter, self.k, self.verifier, self.propose = target, drafter, k, verifier, propose
        self.cache = cache if cache is not None else target.new_cache(min(2048, target.cfg.max_seq_len))
        self.limits = {"the cache capacity (max_seq_len)": self.cache.capacity,  # what refuses a request
                       "the target's positions": target.cfg.max_seq_len}
        if getattr(drafter, "max_seq_len", None) is not None:  # a draft model's rotary table, or its cache
            self.limits["the draft's positions"] = drafter.max_seq_len
        self.max_seq_len = min(self.limits.values())
        self.tokenizer = tokenizer or getattr(target, "tokenizer", None)
        self.controller = None

    @torch.inference_mode()
    def generate(self, prompt, max_new_tokens=128, temperature=0.0, top_p=1.0, seed=None, top_k=0,
                 k=None, on_step=None, processor=None) -> GenerationResult:
        """Generate up to max_new_tokens; stops early at EOS. `on_step(record, tokens_so_far)` streams.
        `processor` (options/: a grammar, penalties, logprobs) sees and changes every scored position."""
        ids = encode_prompt(self.tokenizer, prompt)
        if k is not None:
            check_k(k)
        check_generate_args(max_new_tokens, temperature, top_p, top_k)
        check_seed(seed)
        check_capacity(len(ids), max_new_tokens, MAX_K + 1, self.limits)
        check_token_ids(ids, self.target.cfg.vocab_size)
        sampling = SamplingConfig(temperature, top_k, top_p)
        controller, k = (self.controller, self.k) if k is None else (None, k)  # a K given here is kept
        device, eos = self.target.device, self.target.cfg.eos_token_ids
        g = make_generator(seed, device)
        stats, steps, out = RunStats(), [], []

        t0 = time.perf_counter()
        self.cache.reset()
        hidden, prompt = None, torch.tensor(ids, device=device)  # the prompt's one copy to the device
        if len(ids) > 1:  # the prompt but its last token, which the first step feeds as c
            x = prompt[:-1].view(1, -1)  # (1, len - 1)
            if self.drafter.needs_hidden:
                hidden = self._target_states(x)[1][0]  # (len - 1, dim), or (len - 1, layers * dim)
            else:
                self.target(x, cache=self.cache, last_only=True)
        self.drafter.prefill(ids, hidden)
        stats.prefill_seconds = time.perf_counter() - t0
        self.drafter.processor = processor  # a drafter with logits of its own applies it to them
        if processor is not None:
            processor.reset(ids)

        if controller is not None:
            controller.reset()  # estimates describe one generation, not the engine's lifetime
        c = prompt[-1:]  # (1,) on the device: each step's c is the last one's next token, never copied back
        t_start = time.perf_counter()
        while len(out) < max_new_tokens:
            k_step = controller.next_k() if controller is not None else k
            if not getattr(self.target, "fixed_shapes", False):  # never draft past the budget ...
                k_step = min(k_step, max_new_tokens - len(out) - 1)
            # ... except where every forward keeps one shape: a smaller K would be one more graph to
            # compile (for a few extra draft tokens at the very end, which cut_at_eos drops).
            rec, c = self._step(c, k_step, sampling, g, len(steps), processor)
            rec.committed = cut_at_eos(rec.drafted[:rec.num_accepted] + [rec.next_token], max_new_tokens - len(out), eos)
            out += rec.committed
            steps.append(rec)
            stats.add_step(rec, len(rec.committed))
            if controller is not None:
                controller.update(rec)
            if on_step is not None:
                on_step(rec, out)
            if rec.committed[-1] in eos:
                break
        stats.seconds = time.perf_counter() - t_start
        return GenerationResult(out, _decode(self.tokenizer, out), steps, stats, ids)

    def _target_states(self, x):
        """The target's forward over x (1, T) into the cache, for a drafter that reads its states:
        (final states (1, T, dim), what the drafter reads: those, or the residual stream of the
        layers it declares in `hidden_layers`, concatenated (1, T, layers * dim))."""
        layers = getattr(self.drafter, "hidden_layers", None)
        if layers is None:
            final = self.target.hidden(x, cache=self.cache)
            return final, final
        return self.target.hidden(x, cache=self.cache, layers=layers)

    def _step(self, c, k, sampling, g, step_index, processor=None) -> tuple[StepRecord, torch.Tensor]:
        """One step from c, (1,) on the device: its record, and the next step's c, (1,) on the device."""
        device, drafter_syncs = self.target.device, self.drafter.host_syncs
        # 1. The drafter proposes d_1..d_k (perhaps fewer) with the q each was drawn from.
        t0 = time.perf_counter()
        if k > 0:
            draft_ids, q = self.drafter.propose(k, sampling if self.propose == "sample" else SamplingConfig(), g)
        else:
            draft_ids, q = torch.empty(0, dtype=torch.long, device=device), None
        draft_ids = draft_ids.to(device)
        k = draft_ids.shape[0]
        t1 = time.perf_counter()

        # 2. One target forward over [c, d_1..d_k]: p_1..p_{k+1} (the K+1 mask is the model's default).
        x = torch.cat([c, draft_ids]).view(1, k + 1)  # (1, K+1)
        hidden = None
        if self.drafter.needs_hidden:
            final, hidden = self._target_states(x)
            hidden = hidden[0]  # (K+1, dim), or (K+1, layers * dim)
            logits = self.target.head(final[0]).float()  # (K+1, V)
        else:
            logits = self.target(x, cache=self.cache)[0]  # (K+1, V)
        raw, logits = logits, logits if processor is None else processor.target(logits, draft_ids.tolist())

        # 3. Verify on the device; the host reads the packed verdict in one sync.
        p, u, e = target_draws(logits, sampling, k, g)
        loop_syncs = {"count": 0}  # the reference loop's own host reads
        if self.verifier == "reference":
            decision = verify_reference(draft_ids, p, q, u, e, greedy=sampling.greedy, syncs=loop_syncs)
        else:
            decision = (verify if self.verifier == "device" else self.verifier)(draft_ids, p, q, u, e,
                                                                                greedy=sampling.greedy)
        # decision: the device tensor [n, next]; r: the host's reading of it, in the one sync
        packed = pack_step(decision, draft_ids, p, q, u, sampling.greedy)
        r = read_step(packed.tolist(), k, sampling.greedy)  # sync: the one per step
        if processor is not None:
            processor.commit(r.drafted[:r.num_accepted] + [r.next_token], raw)

        # 4. Commit: the target keeps c, d_1..d_n; the drafter hears the verdict; next becomes c.
        drop_rejected(self.cache, fed=k + 1, kept=r.num_accepted + 1)
        nxt = decision[1:2]  # (1,), still on the device
        self.drafter.commit(Verdict(r.drafted, r.num_accepted, r.next_token, draft_ids, nxt), hidden)
        syncs = 1 + loop_syncs["count"] + self.drafter.host_syncs - drafter_syncs  # counted where they happen
        return StepRecord(step=step_index, k=k, drafted=r.drafted, num_accepted=r.num_accepted,
                          next_token=r.next_token, p_draft=r.p_draft, q_draft=r.q_draft, uniforms=r.uniforms,
                          draft_seconds=t1 - t0, target_seconds=time.perf_counter() - t1, syncs=syncs), nxt
