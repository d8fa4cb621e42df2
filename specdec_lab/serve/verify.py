"""Verification of a whole batch on the device, with one padded verdict (vLLM's layout).

Inputs for B rows, row b having drafted k_b <= K tokens (K = the batch's largest k_b):
  draft  (B, K) int64     d_1..d_{k_b}, then -1 in the unused slots
  p      (B, K+1, V)      the target's processed distributions p_1..p_{k_b+1} (rows past k_b+1: any)
  q      (B, K, V)        the draft's q_1..q_{k_b} that d_i was drawn from (rows past k_b: any)
  u      (B, K)           uniforms for the acceptance tests
  e      (B, V)           Exponential(1) noise for each row's one final draw

Output: (B, K+1) int64 tokens. Row b holds d_1..d_{n_b}, then the correction or bonus token,
then -1: the shape of vLLM V1's rejection sampler output (vllm/v1/sample/rejection_sampler.py),
so n_b = (row != -1).sum() - 1.

Three rules, each the single engine's (core/verify.py, verification/) applied row by row with the
row's own k_b, so a row's verdict equals its twin's on that row cut to k_b, given the same u and e:
  "token"  verify_batch        accept d_i while u_i < min(1, p_i(d_i) / q_i(d_i))  (arXiv 2211.17192)
  "block"  verify_block_batch  the block judged as a whole, last test h_{k_b} = P_{k_b} (arXiv 2403.10444)
  "match"  verify_match_batch  keep d_i while it equals the target's own draw t_i; q is not read
A greedy row is each rule on one-hot distributions: p one-hot at the target's argmax and q one-hot
at the drafted token, u = 0 and e = 1. Every rule then accepts d_i exactly while it is the argmax
and takes argmax p_{n+1} next (the block rule's P_i is 1 while the drafts match and 0 after, and
its thresholds h_i are 1 and 0 with it; the target's inverse-CDF draw at u = 0 is the argmax), so
mixed rows need no branch. A row with k_b = 0 draws from p_1: plain decoding inside the batch.

The batched rules are vectorised and read nothing to the host; `verify_rows` runs any single-row
rule row by row (reads to the host), and the tests hold each batched rule equal to its twins.
"""
import torch

from ..core.verify import draw, verify_reference
from ..verification import block_weights, target_tokens


def _at(x, idx):
    """Row idx_b of x_b for every b: x (B, N, V), idx (B,) -> (B, V)."""
    B, _, V = x.shape
    return x.gather(1, idx.view(B, 1, 1).expand(B, 1, V)).squeeze(1)  # (B, V)


def _padded(d, n, nxt):
    """The verdict (B, K+1): d_1..d_{n_b}, then the next token, then -1."""
    B, K = d.shape
    j = torch.arange(K + 1, device=d.device)  # (K+1,)
    padded = torch.cat([d, d.new_zeros(B, 1)], 1)  # (B, K+1)
    n_col = n.unsqueeze(1)  # (B, 1)
    return torch.where(j < n_col, padded, torch.where(j == n_col, nxt.unsqueeze(1), -1))  # (B, K+1)


def _rows(draft):
    """(valid (B, K), the ids with padding read as token 0 (B, K), each row's k_b (B,))."""
    valid = draft >= 0
    return valid, draft.clamp(min=0), valid.long().sum(-1)


def verify_batch(draft, p, q, u, e) -> torch.Tensor:
    """Token by token (arXiv 2211.17192, Algorithm 1) for every row: (B, K+1) int64."""
    B, K = draft.shape
    valid, d, k = _rows(draft)
    p_d = p[:, :K].gather(-1, d.unsqueeze(-1)).squeeze(-1)  # (B, K) p_i(d_i)
    q_d = q.gather(-1, d.unsqueeze(-1)).squeeze(-1)  # (B, K) q_i(d_i)
    accept = valid & (q_d > 0) & (u * q_d < torch.minimum(p_d, q_d))  # u < min(1, p/q), no division
    n = accept.long().cumprod(-1).sum(-1)  # (B,) accepted before the first rejection
    p_row = _at(p, n)  # (B, V) p_{n+1}
    if K == 0:
        q_row = torch.zeros_like(p_row)
    else:  # q_{n+1}, or zeros when all k_b passed: the residual against nothing is the bonus p itself
        q_row = _at(q, n.clamp(max=K - 1)) * (n < k).unsqueeze(1)  # (B, V)
    residual = torch.clamp(p_row - q_row, min=0.0)  # (B, V)
    total = residual.sum(-1, keepdim=True)  # (B, 1)
    dist = torch.where(total > 0, residual / total.clamp_min(1e-30), p_row)  # (B, V)
    return _padded(d, n, draw(dist, e))


def verify_block_batch(draft, p, q, u, e) -> torch.Tensor:
    """Block verification (verification/block.py, arXiv 2403.10444, Algorithm 2) for every row:
    (B, K+1) int64. block_weights runs over the padded K; a row's own last test is h_{k_b} = P_{k_b}
    (the residual-mass thresholds past it read padding), and no test past k_b counts."""
    B, K = draft.shape
    valid, d, k = _rows(draft)
    P, h = block_weights(d, p, q)  # (B, K+1), (B, K)
    i = torch.arange(1, K + 1, device=p.device)  # (K,)
    h = torch.where(i == k.unsqueeze(1), P[:, 1:], h)  # (B, K)
    passed = ((u < h) & valid).long() * i  # (B, K): i where test i passes, else 0
    tau = torch.cat([passed, passed.new_zeros(B, 1)], 1).max(-1).values  # (B,) the largest i that passed
    p_row = _at(p, tau)  # (B, V) p_{tau+1}
    q_row = _at(q, tau.clamp(max=K - 1)) if K else torch.zeros_like(p_row)  # (B, V) q_{tau+1}
    residual = torch.clamp(P.gather(1, tau.unsqueeze(1)) * p_row - q_row, min=0.0)  # (B, V): P_tau p - q
    use_p = (tau == k) | (residual.sum(-1) <= 0)  # (B,): the bonus, or a residual of all zeros
    return _padded(d, tau, draw(torch.where(use_p.unsqueeze(1), p_row, residual), e))


def verify_match_batch(draft, p, q, u, e) -> torch.Tensor:
    """Exact match (verification/match.py) for every row: (B, K+1) int64. q is not read."""
    valid, d, k = _rows(draft)
    bonus = draw(_at(p, k), e)  # (B,) from p_{k_b+1}
    t = torch.cat([target_tokens(p, u), bonus.unsqueeze(1)], 1)  # (B, K+1): the target's draws t_1..t_K
    n = ((t[:, :-1] == d) & valid).long().cumprod(-1).sum(-1)  # (B,) matches before the first mismatch
    nxt = torch.where(n == k, bonus, t.gather(1, n.unsqueeze(1)).squeeze(1))  # (B,) t_{n+1}, or the bonus
    return _padded(d, n, nxt)


BATCH_RULES = {"token": verify_batch, "block": verify_block_batch, "match": verify_match_batch}


def batch_rule(verifier):
    """A verifier= value as BatchEngine and Server take it: a name in BATCH_RULES, or a function with
    verify_batch's signature (the tests pass broken ones)."""
    if callable(verifier):
        return verifier
    if not isinstance(verifier, str) or verifier not in BATCH_RULES:
        raise ValueError(f"verifier must be one of {', '.join(map(repr, BATCH_RULES))} or a function like "
                         f"serve.verify.verify_batch, got {verifier!r}")
    return BATCH_RULES[verifier]


def verify_rows(rule, draft, p, q, u, e) -> torch.Tensor:
    """The padded verdict from a single-row rule with core.verify.verify's signature, one row at a
    time on the row cut to its own k_b (reads to the host): the batched rules' twin."""
    B, K = draft.shape
    out = torch.full((B, K + 1), -1, dtype=torch.long, device=p.device)
    for b in range(B):
        k = int((draft[b] >= 0).sum())  # sync: the reference reads each row's length
        verdict = rule(draft[b, :k], p[b, :k + 1], q[b, :k], u[b, :k], e[b])
        n = int(verdict[0])  # sync: and its verdict
        out[b, :n] = draft[b, :n]
        out[b, n] = verdict[1]
    return out


def verify_batch_reference(draft, p, q, u, e) -> torch.Tensor:
    """verify_batch's verdict from core.verify.verify_reference, the readable loop, row by row."""
    return verify_rows(verify_reference, draft, p, q, u, e)


def num_accepted(verdict: torch.Tensor) -> torch.Tensor:
    """(B,) n_b from a padded verdict (B, K+1)."""
    return (verdict >= 0).long().sum(-1) - 1
