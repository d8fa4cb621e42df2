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

The rule is the single engine's (core/verify.py; arXiv 2211.17192, Algorithm 1), row by row:
accept d_i while u_i < min(1, p_i(d_i) / q_i(d_i)); at the first rejection j draw from
norm(max(0, p_j - q_j)), or, when all k_b pass, from p_{k_b+1}. A greedy row is the same rule on
one-hot distributions: p one-hot at the target's argmax and q one-hot at the drafted token,
u = 0 and e = 1, so a token is accepted exactly when it is the argmax and the next token is
argmax p_{n+1}. Mixed rows therefore need no branch. A row with k_b = 0 draws from p_1: plain
decoding inside the batch.

`verify_batch` is vectorised and reads nothing to the host; `verify_batch_reference` calls
the single engine's readable loop row by row, and the tests hold the two equal.
"""
import torch

from ..core.verify import draw, verify_reference


def verify_batch(draft, p, q, u, e) -> torch.Tensor:
    B, K = draft.shape
    V = p.shape[-1]
    valid = draft >= 0  # (B, K)
    d = draft.clamp(min=0)  # (B, K): padding reads token 0, then is ignored
    k = valid.long().sum(-1)  # (B,) each row's k_b
    p_d = p[:, :K].gather(-1, d.unsqueeze(-1)).squeeze(-1)  # (B, K) p_i(d_i)
    q_d = q.gather(-1, d.unsqueeze(-1)).squeeze(-1)  # (B, K) q_i(d_i)
    accept = valid & (q_d > 0) & (u * q_d < torch.minimum(p_d, q_d))  # u < min(1, p/q), no division
    n = accept.long().cumprod(-1).sum(-1)  # (B,) accepted before the first rejection
    p_row = p.gather(1, n.view(B, 1, 1).expand(B, 1, V)).squeeze(1)  # (B, V) p_{n+1}
    if K == 0:
        q_row = torch.zeros_like(p_row)
    else:  # q_{n+1}, or zeros when all k_b passed: the residual against nothing is the bonus p itself
        q_row = q.gather(1, n.clamp(max=K - 1).view(B, 1, 1).expand(B, 1, V)).squeeze(1)  # (B, V)
        q_row = q_row * (n < k).unsqueeze(1)
    residual = torch.clamp(p_row - q_row, min=0.0)  # (B, V)
    total = residual.sum(-1, keepdim=True)  # (B, 1)
    dist = torch.where(total > 0, residual / total.clamp_min(1e-30), p_row)  # (B, V)
    nxt = draw(dist, e)  # (B,)
    j = torch.arange(K + 1, device=p.device)  # (K+1,)
    padded = torch.cat([d, d.new_zeros(B, 1)], 1)  # (B, K+1)
    n_col = n.unsqueeze(1)  # (B, 1)
    return torch.where(j < n_col, padded, torch.where(j == n_col, nxt.unsqueeze(1), -1))  # (B, K+1)


def verify_batch_reference(draft, p, q, u, e) -> torch.Tensor:
    """The same verdict from core.verify.verify_reference, one row at a time (reads to the host)."""
    B, K = draft.shape
    out = torch.full((B, K + 1), -1, dtype=torch.long, device=p.device)
    for b in range(B):
        k = int((draft[b] >= 0).sum())  # sync: the reference reads each row's length
        verdict = verify_reference(draft[b, :k], p[b, :k + 1], q[b, :k], u[b, :k], e[b])
        n = int(verdict[0])  # sync: and its verdict
        out[b, :n] = draft[b, :n]
        out[b, n] = verdict[1]
    return out


def num_accepted(verdict: torch.Tensor) -> torch.Tensor:
    """(B,) n_b from a padded verdict (B, K+1)."""
    return (verdict >= 0).long().sum(-1) - 1
