"""The speculative decoding loop, and the autoregressive baseline it is measured against.

Contract: the engine knows token ids only; a tokenizer, when the target carries
one (`model.tokenizer`), turns text prompts into ids and ids back into text.

One step (DESIGN.md section 5), with c the last committed token the target has
not yet seen:
  1. the drafter proposes d_1..d_k with their q;
  2. the target runs ONE forward over [c, d_1..d_k] with the K+1 mask -> p_1..p_{k+1};
  3. `verify` decides on the device; the host reads [n, next, d, p(d), q(d), u]
     in one synchronisation;
  4. commit d_1..d_n and next; roll the target cache back to keep [c, d_1..d_n];
     next becomes the new c, so it costs no extra target forward.
"""
import time
from dataclasses import dataclass, field

import torch

from .config import MAX_K, SamplingConfig
from .kv_cache import KVCache
from .drafters import LookupThenModelDrafter, ModelDrafter
from .feature_draft import FeatureDraft, FeatureDrafter
from .metrics import RunStats, StepRecord
from .sampling import check_sampling_args, exponential_noise, logits_to_probs, make_generator, sample
from .self_draft import SelfDraft, SelfDrafter
from .text import encode_prompt
from .verify import verify, verify_reference


@dataclass
class GenerationResult:
    tokens: list  # new token ids, prompt excluded
    text: str | None  # decoded new text, when a tokenizer is known
    steps: list = field(default_factory=list)  # StepRecord per step
    stats: RunStats = field(default_factory=RunStats)
    prompt_ids: list = field(default_factory=list)


def check_generate_args(max_new_tokens, temperature, top_p, top_k=0):
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
    check_sampling_args(temperature, top_p, top_k)


def check_capacity(prompt_len, max_new_tokens, lookahead, capacity, max_seq_len):
    need = prompt_len + max_new_tokens + lookahead
    if need > min(capacity, max_seq_len):
        raise ValueError(f"prompt ({prompt_len} tokens) + max_new_tokens ({max_new_tokens}) + lookahead "
                         f"({lookahead}) = {need} exceeds the cache capacity {min(capacity, max_seq_len)}")


def check_token_ids(ids, vocab_size):
    if max(ids) >= vocab_size or min(ids) < 0:
        raise ValueError(f"prompt token ids must be in [0, {vocab_size}), got min {min(ids)}, max {max(ids)}")


def _decode(tokenizer, tokens):
    return tokenizer.decode(tokens, skip_special_tokens=True) if tokenizer is not None else None


def _cut(tokens, budget, eos_ids):
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
                            top_k=0, tokenizer=None, max_seq_len=None):
    """The baseline: prefill, then one target forward and one sync per token."""
    tokenizer = tokenizer or getattr(model, "tokenizer", None)
    check_generate_args(max_new_tokens, temperature, top_p, top_k)
    ids = encode_prompt(tokenizer, prompt)
    check_token_ids(ids, model.cfg.vocab_size)
    capacity = len(ids) + max_new_tokens
    check_capacity(len(ids), max_new_tokens, 0, capacity, max_seq_len or model.cfg.max_seq_len)
    device, eos = model.device, model.cfg.eos_token_ids
    g = make_generator(seed, device)
    cache = KVCache.for_model(model.cfg, capacity, dtype=model.dtype, device=device)
    stats, steps, out = RunStats(), [], []
    t0 = time.perf_counter()
    logits = model(torch.tensor([ids], device=device), cache=cache, last_only=True)[0, -1]
    stats.prefill_seconds = time.perf_counter() - t0
    t_start = time.perf_counter()
    while True:
        t1 = time.perf_counter()
        probs = logits if temperature == 0 else logits_to_probs(logits, temperature, top_k, top_p)
        tok = int(probs.argmax() if temperature == 0 else sample(probs, g))  # sync: one per token
        out.append(tok)
        if len(out) == max_new_tokens or tok in eos:
            rec = StepRecord(len(steps), 0, [], 0, tok, [], [], [], 0.0, time.perf_counter() - t1, 1, [tok])
            steps.append(rec)
            stats.add_step(rec, 1)
            break
        logits = model(torch.tensor([[tok]], device=device), cache=cache)[0, -1]
        rec = StepRecord(len(steps), 0, [], 0, tok, [], [], [], 0.0, time.perf_counter() - t1, 1, [tok])
        steps.append(rec)
        stats.add_step(rec, 1)
    stats.seconds = time.perf_counter() - t_start
    return GenerationResult(out, _decode(tokenizer, out), steps, stats, ids)


class SpeculativeEngine:
    """Speculative decoding with a draft model (arXiv 2211.17192, 2302.01318).

    engine = SpeculativeEngine(target, draft, k=4); engine.generate(prompt, ...)
    `draft` is a Transformer sharing the target's vocabulary, a feature draft (feature_draft.py),
    the target's own weights at lower precision (self_draft.SelfDraft), or any drafter object
    with the interface of drafters.py. `verifier="reference"` runs the readable
    loop (one sync per draft token) instead of the vectorised one, to compare;
    a function with verify's signature can be passed too (the notebooks pass broken ones).
    """

    def __init__(self, target, draft, k=4, max_seq_len=2048, cache="contiguous", block_size=16,
                 verifier="device", tokenizer=None):
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K:
            raise ValueError(f"k must be an int in [1, {MAX_K}], got {k!r}")
        if cache not in ("contiguous", "paged"):
            raise ValueError(f"cache must be 'contiguous' or 'paged', got {cache!r}")
        if verifier not in ("device", "reference") and not callable(verifier):
            raise ValueError(f"verifier must be 'device', 'reference' or a function like verify, got {verifier!r}")
        if isinstance(max_seq_len, bool) or not isinstance(max_seq_len, int) or max_seq_len < 2:
            raise ValueError(f"max_seq_len must be an int >= 2, got {max_seq_len!r}")
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size must be an int >= 1, got {block_size!r}")
        if hasattr(draft, "cfg") and draft.cfg.vocab_size != target.cfg.vocab_size:
            raise ValueError(f"draft vocabulary ({draft.cfg.vocab_size}) differs from the target's "
                             f"({target.cfg.vocab_size}); the draft must share the target's tokenizer")
        self.target, self.k, self.verifier = target, k, verifier
        self.max_seq_len = min(max_seq_len, target.cfg.max_seq_len)
        self.tokenizer = tokenizer or getattr(target, "tokenizer", None)
        factory = self._cache_factory(cache, block_size)
        self.cache_kind, self.block_size = cache, block_size
        self.cache = factory(target.cfg, self.max_seq_len, dtype=target.dtype, device=target.device)
        if isinstance(draft, FeatureDraft) and draft.state_width != target.cfg.dim:
            raise ValueError(f"the feature draft reads states of width {draft.state_width}; the target's are "
                             f"{target.cfg.dim}: build the draft for this target")
        if isinstance(draft, SelfDraft):
            if draft.target is not target:
                raise ValueError("a SelfDraft drafts with the target's own weights and cache: build it from this "
                                 "engine's target")
            self.drafter = SelfDrafter(draft, self.cache)
            if draft.lookup:
                self.drafter = LookupThenModelDrafter(self.drafter)
        elif isinstance(draft, FeatureDraft):
            self.drafter = FeatureDrafter(draft, self.max_seq_len, factory)
        else:
            self.drafter = ModelDrafter(draft, self.max_seq_len, factory) if hasattr(draft, "cfg") else draft
        # A drafter that reads the target's hidden states (feature_draft.py) gets them from every target forward.
        self.hidden_to_drafter = getattr(self.drafter, "reads_target_hidden", False)
        self.controller = None  # an adaptive-K controller (adaptive.py) may be set here

    @staticmethod
    def _cache_factory(kind, block_size):
        if kind == "contiguous":
            return KVCache.for_model
        from .paged import PagedSequenceCache
        return lambda cfg, cap, **kw: PagedSequenceCache.for_model(cfg, cap, block_size=block_size, **kw)

    def _check(self, ids, max_new_tokens, temperature, top_p, top_k):
        check_generate_args(max_new_tokens, temperature, top_p, top_k)
        check_capacity(len(ids), max_new_tokens, MAX_K + 1, self.max_seq_len, self.max_seq_len)
        check_token_ids(ids, self.target.cfg.vocab_size)

    @torch.inference_mode()
    def generate(self, prompt, max_new_tokens=128, temperature=0.0, top_p=1.0, seed=None, top_k=0,
                 k=None, on_step=None) -> GenerationResult:
        """Generate up to max_new_tokens; stops early at EOS. `on_step(record, tokens_so_far)` streams."""
        ids = encode_prompt(self.tokenizer, prompt)
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K):
            raise ValueError(f"k must be an int in [1, {MAX_K}], got {k!r}")
        self._check(ids, max_new_tokens, temperature, top_p, top_k)
        sampling = SamplingConfig(temperature, top_k, top_p)
        k = k or self.k
        device, eos = self.target.device, self.target.cfg.eos_token_ids
        g = make_generator(seed, device)
        stats, steps, out = RunStats(), [], []

        t0 = time.perf_counter()
        self.cache.reset()
        if self.hidden_to_drafter:
            x = torch.tensor([ids[:-1]], device=device)
            self.drafter.prefill(ids, self.target.hidden(x, cache=self.cache)[0] if len(ids) > 1 else None)
        else:
            if len(ids) > 1:
                self.target(torch.tensor([ids[:-1]], device=device), cache=self.cache, last_only=True)
            self.drafter.prefill(ids)
        stats.prefill_seconds = time.perf_counter() - t0

        if self.controller is not None:
            self.controller.reset()  # estimates describe one generation, not the engine's lifetime
        c = ids[-1]
        t_start = time.perf_counter()
        while len(out) < max_new_tokens:
            k_step = self.controller.next_k() if self.controller is not None else k
            k_step = min(k_step, max_new_tokens - len(out) - 1)  # never draft past the budget
            rec = self._step(c, k_step, sampling, g, len(steps))
            new = _cut(rec.drafted[:rec.num_accepted] + [rec.next_token], max_new_tokens - len(out), eos)
            rec.committed = new
            out += new
            steps.append(rec)
            stats.add_step(rec, len(new))
            if self.controller is not None:
                self.controller.update(rec)
            if on_step is not None:
                on_step(rec, out)
            if new[-1] in eos:
                break
            c = rec.next_token
        stats.seconds = time.perf_counter() - t_start
        return GenerationResult(out, _decode(self.tokenizer, out), steps, stats, ids)

    def _step(self, c, k, sampling, g, step_index) -> StepRecord:
        device, V = self.target.device, self.target.cfg.vocab_size
        t0 = time.perf_counter()
        draft_ids, q = self.drafter.propose(k, sampling, g) if k > 0 else \
            (torch.empty(0, dtype=torch.long, device=device), None)
        draft_ids = draft_ids.to(device)
        k = draft_ids.shape[0]  # a drafter may propose fewer than asked
        t1 = time.perf_counter()
        x = torch.cat([torch.tensor([c], device=device), draft_ids]).view(1, k + 1)  # (1, K+1)
        base = self.cache.length
        if self.hidden_to_drafter:
            hidden = self.target.hidden(x, cache=self.cache)[0]  # (K+1, dim)
            logits = self.target.head(hidden).float()  # (K+1, V)
        else:
            logits = self.target(x, cache=self.cache)[0]  # (K+1, V)
        greedy = sampling.greedy
        if greedy:  # only argmaxes matter, and nothing is random
            p, q_full, u, e = logits, None, torch.zeros(k, device=device), None
        else:
            p = logits_to_probs(logits, sampling.temperature, sampling.top_k, sampling.top_p)  # (K+1, V)
            q_full = q if q is not None else torch.zeros(k, V, device=device).scatter_(
                1, draft_ids.view(k, 1), 1.0)  # a one-hot drafter
            u = torch.rand(k, generator=g, device=device)
            e = exponential_noise(V, g, device)
        loop_syncs = {"count": 0}
        if self.verifier == "reference":
            verdict = verify_reference(draft_ids, p, q_full, u, e, greedy=greedy, syncs=loop_syncs)
        else:
            fn = verify if self.verifier == "device" else self.verifier
            verdict = fn(draft_ids, p, q_full, u, e, greedy=greedy)  # (2,) [n, next], still on the device
        if greedy:  # the processed distributions are one-hot: p(d) is 1 where the argmaxes agree
            p_d, q_d = (p[:k].argmax(-1) == draft_ids).float(), torch.ones(k, device=device)
        else:
            idx = torch.arange(k, device=device)
            p_d, q_d = p[idx, draft_ids], q_full[idx, draft_ids]
        packed = torch.cat([verdict.float(), draft_ids.float(), p_d, q_d, u])  # ids < 2^24 are exact
        host = packed.tolist()  # sync: the one per step
        n, nxt = int(host[0]), int(host[1])
        drafted = [int(t) for t in host[2:2 + k]]
        self.cache.rollback(base + 1 + n)  # keep c, d_1..d_n
        if self.hidden_to_drafter:
            self.drafter.commit(k, drafted, n, nxt, hidden)
        else:
            self.drafter.commit(k, drafted, n, nxt)
        t2 = time.perf_counter()
        syncs = 1 + loop_syncs["count"]
        return StepRecord(step_index, k, drafted, n, nxt, host[2 + k:2 + 2 * k], host[2 + 2 * k:2 + 3 * k],
                          [] if greedy else host[2 + 3 * k:], t1 - t0, t2 - t1, syncs)
