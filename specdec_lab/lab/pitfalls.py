"""Broken on purpose: small variants of correct pieces, each with one classic bug.

The chapters plug these into the engine (which accepts a drafter object, a
`verifier=` function and a target model) to show what each bug does, next to
the correct version. Nothing else in the library imports this module.

Verification (chapter 02), measured with lab/lossless.py's chi-square test:
- `verify_resample_from_p`: at a rejection, draws the next token from p instead
  of the residual norm(max(0, p - q)). Tokens the draft over-proposes come out
  too often: p(x) is paid twice, once through acceptance and once through p.
- `GreedyDraftSampledQ`: the draft proposes its argmax but reports its softmax
  as q. The acceptance rule assumes d ~ q; a greedy draft's real q is one-hot.

The acceptance rule (chapter 03), each twice: in fractions for lossless.exact_step_output,
and with core.verify.verify's signature for the engine and lossless.sample_step_outputs:
- `exact_block_ratio_test` / `verify_block_ratio_test`: block verification with the token
  rule's per-token test u_i < min(1, p_i(d_i) / q_i(d_i)) in place of the block's threshold
  h_i, still keeping the largest i that passes. A later pass then overrides an earlier
  failure without the mass the block's h_i accounts for.
- `exact_block_unscaled_residual` / `verify_block_unscaled_residual`: the block rule's tests,
  with the next token drawn from max(p - q, 0) instead of max(P_tau p - q, 0).
- `exact_match_any_positive` / `verify_match_any_positive`: "exact match" that keeps a
  drafted token whenever the target gives it any probability, instead of comparing it with
  the target's own draw.

The KV cache (chapter 04), the rollback of the Rust article "Speculative Decoding
in Custom LLM Servicing: Implementing Draft Models in Rust" (docs/design.md lists
its pitfalls):
- `OffByOneDraftCache`: after a step it keeps `num_accepted` draft-cache entries
  instead of num_accepted + 1, and never feeds d_K. Every step loses one committed
  token from the draft's view; verification keeps the output right, but the
  draft drafts from a corrupted context and its acceptance falls.
- `OffByOneRollbackCache`: a target cache that keeps l + n positions after a step instead of
  l + 1 + n (x_0 and the n accepted drafts), where nothing checks it: the output itself goes wrong.
  (The article's `current_len - k + accepted` is right on the target, which reads K + 1 positions.)

The verification mask (chapter 05):
- `UnmaskedTarget`: runs the K+1 verification pass with no mask, so position i
  also sees the drafted tokens after it, including the one it is judging.

The batched server (chapter 13):
- `verify_batch_keep_every_draft`: a batch rule that keeps every drafted token of every
  row, as if each test had passed, then appends p's top token after them. Rows commit
  more tokens a step, and their greedy output stops being the target's.

The distillation recipe (chapter 09):
- `targets_one_position_late`: training examples whose stored target distributions sit one
  answer position late, so the draft at each position is taught the distribution of the
  token after the next one: inputs and labels off by one. Training runs without an error;
  the draft learns another function and agrees with the target's next token far less.

The export (chapter 14):
- `export_gguf_draft_hf_rope_order`: the GGUF draft with its Q and K rows left in
  Hugging Face's rotary order (the two halves of a head) where llama.cpp rotates
  adjacent pairs. The file loads and runs; its attention is another function, so
  llama.cpp's draft proposes the target's token far less often.
"""
from unittest import mock

import torch

from ..api import SpeculativeEngine
from ..core.kv_cache import KVCache
from ..core.sampling import logits_to_probs
from ..core.verify import draw, verify
from ..drafters import ModelDrafter
from ..io import export
from ..verification import block_weights
from . import lossless


def verify_resample_from_p(draft_ids, p, q, u, e, greedy=False):
    """Bug: the correction token is drawn from p_j, not from norm(max(0, p_j - q_j))."""
    if greedy:
        return verify(draft_ids, p, q, u, e, greedy=True)
    n = verify(draft_ids, p, q, u, e)[:1]  # (1,) the number accepted is computed correctly
    return torch.cat([n, draw(p.index_select(0, n)[0], e).view(1)])


class GreedyDraftSampledQ(ModelDrafter):
    """Bug: proposes argmax q but returns the soft q, as if the token had been sampled from it.
    The fix is to return q = None (one-hot), which the engine verifies correctly."""

    def propose(self, k, sampling, generator):
        x = self.pending.view(1, -1)  # (1, T)
        ids, qs = [], []
        for _ in range(k):
            logits = self.model(x, cache=self.cache, last_only=True)[0, -1]  # (V,)
            q = logits_to_probs(logits, max(sampling.temperature, 1e-6), sampling.top_k, sampling.top_p)
            d = q.argmax(-1)  # not a draw from q
            ids.append(d)
            qs.append(q)
            x = d.view(1, 1)
        return torch.stack(ids), torch.stack(qs)


def exact_block_ratio_test(p_rows, q_rows, drafts):
    """Bug (fractions): the block rule with h_i = min(1, p_i(d_i) / q_i(d_i)), the token rule's test."""
    P, _ = lossless.block_thresholds(p_rows, q_rows, drafts)
    h = [min(p_rows[i][x] / q_rows[i][x], 1) for i, x in enumerate(drafts)]
    return lossless.block_outcomes(P, h, p_rows, q_rows)


def exact_block_unscaled_residual(p_rows, q_rows, drafts):
    """Bug (fractions): the block rule's tests, the next token from max(p - q, 0) without P_tau."""
    P, h = lossless.block_thresholds(p_rows, q_rows, drafts)
    return lossless.block_outcomes(P, h, p_rows, q_rows, scaled=False)


def exact_match_any_positive(p_rows, q_rows, drafts):
    """Bug (fractions): keeps d_i whenever p_i(d_i) > 0; after a token with p = 0, a draw from p_i."""
    K, out, alive = len(drafts), [], lossless.Fraction(1)
    for i, x in enumerate(drafts):
        keep = 1 if p_rows[i][x] > 0 else 0
        out.append((i, p_rows[i], alive * (1 - keep)))
        alive *= keep
    return out + [(K, p_rows[K], alive)]


def _block_next(tau, P, p, q, K):
    """The token after a block verdict tau (1,): the bonus from p_{K+1} at tau = K, else a draw from
    max(P_tau p_{tau+1} - q_{tau+1}, 0) (p_{tau+1} where that is all zeros); P is (K+1,)."""
    p_row = p.index_select(0, tau)[0]
    q_row = q.index_select(0, tau.clamp(max=K - 1))[0]
    residual = torch.clamp(P.index_select(0, tau)[0] * p_row - q_row, min=0.0)
    return torch.where((tau == K) | (residual.sum() <= 0), p_row, residual)


def _block_verdict(h, P, p, q, u, e):
    K = h.shape[0]
    passed = (u < h).long() * torch.arange(1, K + 1, device=p.device)
    tau = torch.cat([passed, passed.new_zeros(1)]).max().view(1)  # the largest i that passed
    return torch.cat([tau, draw(_block_next(tau, P, p, q, K), e).view(1)])


def verify_block_ratio_test(draft_ids, p, q, u, e, greedy=False):
    """Bug: block verification with the token rule's test u_i < min(1, p_i(d_i) / q_i(d_i)) in place of h_i."""
    if greedy or q is None:
        return verify(draft_ids, p, q, u, e, greedy=greedy)
    P, _ = block_weights(draft_ids, p, q)
    idx = torch.arange(draft_ids.shape[0], device=p.device)
    h = (p[idx, draft_ids] / q[idx, draft_ids].clamp_min(1e-30)).clamp(max=1.0)
    return _block_verdict(h, P, p, q, u, e)


def verify_block_unscaled_residual(draft_ids, p, q, u, e, greedy=False):
    """Bug: block verification's tests, the next token drawn from max(p - q, 0) without the weight P_tau."""
    if greedy or q is None:
        return verify(draft_ids, p, q, u, e, greedy=greedy)
    P, h = block_weights(draft_ids, p, q)
    return _block_verdict(h, torch.ones_like(P), p, q, u, e)


def verify_match_any_positive(draft_ids, p, q, u, e, greedy=False):
    """Bug: keeps a drafted token whenever the target gives it p > 0, not only when it equals the target's draw."""
    if greedy:
        return verify(draft_ids, p, q, u, e, greedy=True)
    K = draft_ids.shape[0]
    n = (p[torch.arange(K, device=p.device), draft_ids] > 0).long().cumprod(0).sum().view(1)
    return torch.cat([n, draw(p.index_select(0, n)[0], e).view(1)])


class OffByOneDraftCache(ModelDrafter):
    """The article's draft-cache rollback: keep `num_accepted` of the k entries this step
    appended, and feed only the next token. `seen` tracks the token ids the draft's cache
    really holds, `committed` the ones it should hold (both without the pending token)."""

    def reset(self):
        super().reset()
        self.seen = []  # token ids whose keys/values are in the draft's cache, in order
        self.committed = []  # what the target committed: prompt[:-1] at first, then each step's tokens

    def prefill(self, prompt_ids, hidden=None):
        super().prefill(prompt_ids)
        self.seen = list(prompt_ids[:-1])
        self.committed = list(prompt_ids[:-1])

    def commit(self, verdict, hidden=None):
        k, drafted, num_accepted = verdict.k, verdict.drafted, verdict.num_accepted
        if k == 0:
            return super().commit(verdict)
        pending = self.pending.tolist()  # host ids for the bookkeeping below (a broken drafter, for teaching)
        fed = pending + list(drafted[:k - 1])  # what propose() wrote: pending, d_1..d_{k-1}
        start = self.cache.length - len(fed)
        self.committed += pending + list(drafted[:num_accepted])
        # The article's: draft_kv.rollback(current_len - k + accepted), and only the next token is fed.
        # With one pending token that keeps [c, d_1..d_{a-1}]: d_a (or c when a = 0) is lost.
        keep = self.cache.length - k + num_accepted
        self.cache.rollback(keep)
        self.seen = self.seen[:start] + fed[:keep - start]
        self.pending = verdict.committed_ids(self.model.device)[-1:]  # only the next token


def draft_lag(engine) -> int:
    """Committed tokens that the engine's model drafter has neither in its cache nor pending.
    The target's cache holds every committed token but the newest, so a correct drafter
    satisfies draft cache length + pending == target cache length + 1, and this is 0."""
    drafter = engine.drafter
    return engine.cache.length + 1 - drafter.cache.length - len(drafter.pending)


class OffByOneRollbackCache(KVCache):
    """A target cache whose rollback keeps one position fewer than asked: l + n positions after a
    step instead of l + 1 + n, so the next step's x_0 attends to a context missing a committed token."""

    def rollback(self, length: int):
        super().rollback(max(0, length - 1))


def off_by_one_rollback_engine(target, draft, k=4, **kwargs) -> SpeculativeEngine:
    """A SpeculativeEngine whose target cache is a OffByOneRollbackCache (same capacity and dtype)."""
    engine = SpeculativeEngine(target, draft, k=k, **kwargs)
    engine.cache = OffByOneRollbackCache.for_model(target.cfg, engine.max_seq_len, dtype=target.dtype,
                                               device=target.device)
    return engine


class UnmaskedTarget(torch.nn.Module):
    """Wraps a Transformer and runs every multi-token pass over a non-empty cache (the K+1
    verification pass) with an all-zero mask: each new position attends to every new
    position, later ones included. The prefill (empty cache) and single-token decode are
    left as they are, so the verification pass is the only thing that changes."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        self.cfg = model.cfg
        self.tokenizer = getattr(model, "tokenizer", None)

    @property
    def device(self):
        return self.model.device

    @property
    def dtype(self):
        return self.model.dtype

    def new_cache(self, capacity, batch_size=1):
        return self.model.new_cache(capacity, batch_size)

    def forward(self, tokens, input_pos=None, cache=None, mask=None, last_only=False):
        if cache is not None and cache.length > 0 and tokens.shape[1] > 1:
            B, T, L = tokens.shape[0], tokens.shape[1], cache.length
            mask = torch.zeros(B, 1, T, L + T, device=tokens.device, dtype=self.dtype)  # sees everything
        return self.model(tokens, input_pos, cache, mask, last_only)


def verify_batch_keep_every_draft(D, P, Q, U, E):
    """verify_batch's signature, (B, K) drafts padded with -1: keeps each row's drafts, then p's top token."""
    k = (D >= 0).sum(1)                                                # each row's own K
    after = P[torch.arange(len(D)), k].argmax(-1)                      # p's top token after the drafts
    return torch.cat([D, torch.full_like(D[:, :1], -1)], 1).scatter(1, k.view(-1, 1), after.view(-1, 1))


def targets_one_position_late(examples):
    """load_shards' examples (prompt, answer, top_ids, top_logprobs, temperature) with each answer
    position's stored target moved to the position before it; the last position keeps its own."""
    return [(prompt, answer, torch.cat([top_ids[1:], top_ids[-1:]]), torch.cat([top_lp[1:], top_lp[-1:]]), temperature)
            for prompt, answer, top_ids, top_lp, temperature in examples]


def export_gguf_draft_hf_rope_order(draft_dir, target_gguf, out_path):
    """io.export.export_gguf_draft without its rope_rows_to_gguf step: Q and K as Hugging Face orders them."""
    with mock.patch.object(export, "rope_rows_to_gguf", lambda w, n_heads: w):
        return export.export_gguf_draft(draft_dir, target_gguf, out_path)
