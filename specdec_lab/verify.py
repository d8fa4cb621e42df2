"""Verification: which drafted tokens the target accepts, and the token that follows.

Inputs for one step with K drafted tokens (DESIGN.md section 5, step 3):
  draft_ids (K,) int64   the drafted tokens d_1..d_K
  p         (K+1, V)     the target's distributions p_1..p_{K+1} (after temperature/top-k/top-p)
  q         (K, V)       the draft's distributions q_1..q_K that d_i was sampled from
  u         (K,)         uniforms for the acceptance tests
  e         (V,)         Exponential(1) noise for the one final draw (argmax(dist / e))

Rule (arXiv 2211.17192, Algorithm 1): accept d_i while u_i < min(1, p_i(d_i) / q_i(d_i)).
At the first rejection j, draw from the residual norm(max(0, p_j - q_j)); if all K
pass, draw a bonus token from p_{K+1}. A draft token with q(d) = 0 is rejected; a
residual that is numerically all zeros falls back to p_j. In greedy mode p and q
only matter through argmax: accept while argmax p_i == d_i, then take argmax p_n.

Both versions return a (2,) int64 tensor [num_accepted, next_token].
`verify_reference` is a loop a learner can read; it syncs once per draft token.
`verify` does the same on the device with no sync at all; the caller reads
its result with one sync per step.
"""
import torch


def _draw(dist: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    return (dist / e).argmax(-1)


def verify_reference(draft_ids, p, q, u, e, greedy=False, syncs=None) -> torch.Tensor:
    """The loop. Pass a dict as `syncs` to have syncs["count"] count its host reads."""
    def host(x, kind=float):
        if syncs is not None:
            syncs["count"] = syncs.get("count", 0) + 1
        return kind(x)  # sync: one host read

    K = draft_ids.shape[0]
    for i in range(K):
        d = host(draft_ids[i], int)
        if greedy:
            best = host(p[i].argmax(), int)
            if best != d:
                return torch.tensor([i, best])
            continue
        p_d, q_d, u_i = host(p[i, d]), host(q[i, d]), host(u[i])
        if q_d > 0 and u_i < min(1.0, p_d / q_d):
            continue
        residual = torch.clamp(p[i] - q[i], min=0.0)
        total = host(residual.sum())
        dist = residual / total if total > 0 else p[i]
        return torch.tensor([i, host(_draw(dist, e), int)])
    bonus = p[K].argmax() if greedy else _draw(p[K], e)
    return torch.tensor([K, host(bonus, int)])


def verify(draft_ids, p, q, u, e, greedy=False) -> torch.Tensor:
    K = draft_ids.shape[0]
    idx = torch.arange(K, device=p.device)
    if greedy:
        best = p.argmax(-1)  # (K+1,)
        accept = best[:K] == draft_ids
    else:
        p_d, q_d = p[idx, draft_ids], q[idx, draft_ids]  # (K,)
        accept = (q_d > 0) & (u * q_d < torch.minimum(p_d, q_d))  # u < min(1, p/q), no division
    n = accept.long().cumprod(0).sum().view(1)  # number accepted before the first rejection, (1,)
    if greedy:
        return torch.cat([n, best.index_select(0, n)])
    # Row n of q, or zeros when n = K: the residual against a zero draft is p_{K+1} itself, the bonus.
    if K == 0:
        q_row = q.new_zeros(q.shape[-1])
    else:
        q_row = q.index_select(0, n.clamp(max=K - 1))[0] * (n < K)  # (V,), no copy of q
    p_row = p.index_select(0, n)[0]  # (V,)
    residual = torch.clamp(p_row - q_row, min=0.0)
    total = residual.sum()
    dist = torch.where(total > 0, residual / total.clamp_min(1e-30), p_row)
    return torch.cat([n, _draw(dist, e).view(1)])
