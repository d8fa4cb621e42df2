"""Verification: which drafted tokens the target accepts, and the token that follows.

Inputs for one step with K drafted tokens (step 3 of the algorithm, docs/design.md):
  draft_ids (K,) int64   the drafted tokens d_1..d_K
  p         (K+1, V)     the target's distributions p_1..p_{K+1} (after temperature/top-k/top-p)
  q         (K, V)       the draft's distributions q_1..q_K that d_i was sampled from, or None
                         for a drafter whose q is one-hot at its tokens (lookup, a greedy draft)
  u         (K,)         uniforms for the acceptance tests
  e         (V,)         Exponential(1) noise for the one final draw (argmax(dist / e))

Rule (arXiv 2211.17192, Algorithm 1): accept d_i while u_i < min(1, p_i(d_i) / q_i(d_i)).
At the first rejection j, draw from the residual norm(max(0, p_j - q_j)) (p_j where it is all
zeros); if all K pass, a bonus token from p_{K+1}. q(d) = 0 is rejected. Greedy: accept while
argmax p_i == d_i, then take argmax p_n.

Both return a (2,) int64 tensor [num_accepted, next_token]: `verify_reference` as a loop a
learner can read (a sync per draft token), `verify` on the device with none. `pack_step` puts it
and what the step record wants into one tensor; `read_step` is the engine's one sync per step.
"""
from dataclasses import dataclass

import torch

from .sampling import exponential_noise, logits_to_probs


def draw(dist: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """A token drawn from `dist` (unnormalised, (..., V)) with the step's Exponential(1) noise e:
    argmax(dist / e) is distributed as dist / sum(dist) (the exponential race), with no host read."""
    return (dist / e).argmax(-1)


def one_hot(draft_ids, V):
    """(K, V) q of a drafter that proposes its tokens with certainty."""
    return torch.zeros(draft_ids.shape[0], V, device=draft_ids.device).scatter_(1, draft_ids.view(-1, 1), 1.0)


def verify_reference(draft_ids, p, q, u, e, greedy=False, syncs=None) -> torch.Tensor:
    """The loop. Pass a dict as `syncs` to have syncs["count"] count its host syncs: each read,
    and the copy of its verdict back to the device."""
    if q is None and not greedy:
        q = one_hot(draft_ids, p.shape[-1])

    def host(x, kind=float):
        if syncs is not None:
            syncs["count"] = syncs.get("count", 0) + 1
        return kind(x)  # sync: one host read

    def verdict(n, token):
        host(0, int)  # counted: the verdict is copied from the host back to the device
        return torch.tensor([n, token], device=p.device)

    K = draft_ids.shape[0]
    for i in range(K):
        d = host(draft_ids[i], int)
        if greedy:
            best = host(p[i].argmax(), int)
            if best != d:
                return verdict(i, best)
            continue
        p_d, q_d, u_i = host(p[i, d]), host(q[i, d]), host(u[i])
        if q_d > 0 and u_i < min(1.0, p_d / q_d):
            continue
        residual = torch.clamp(p[i] - q[i], min=0.0)
        total = host(residual.sum())
        dist = residual / total if total > 0 else p[i]
        return verdict(i, host(draw(dist, e), int))
    bonus = p[K].argmax() if greedy else draw(p[K], e)
    return verdict(K, host(bonus, int))


def verify(draft_ids, p, q, u, e, greedy=False) -> torch.Tensor:
    K = draft_ids.shape[0]
    if q is None and not greedy:
        q = one_hot(draft_ids, p.shape[-1])
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
    return torch.cat([n, draw(dist, e).view(1)])


def target_draws(logits, sampling, k, generator):
    """From the verification forward's logits (K+1, V): p, and the randomness verification
    uses, u (K,) and e (V,). Greedy needs neither: p is the logits, whose argmax is all it reads."""
    if sampling.greedy:
        return logits, torch.zeros(k, device=logits.device), None
    p = logits_to_probs(logits, sampling.temperature, sampling.top_k, sampling.top_p)  # (K+1, V)
    u = torch.rand(k, generator=generator, device=logits.device)
    return p, u, exponential_noise(logits.shape[-1], generator, logits.device)


@dataclass
class StepReadout:
    """One step's verdict and the figures its StepRecord keeps, on the host."""
    num_accepted: int
    next_token: int
    drafted: list  # d_1..d_K
    p_draft: list  # p_i(d_i)
    q_draft: list  # q_i(d_i)
    uniforms: list  # u_i; empty when greedy


def pack_step(verdict, draft_ids, p, q, u, greedy) -> torch.Tensor:
    """[n, next, d_1..d_K, p(d), q(d), u] as one float tensor on the device (ids < 2^24 are exact).
    Rows may be batched, (B, 2) verdicts with (B, K) ids padded by -1 (serve/): then (B, 2 + 4K)."""
    d, K = draft_ids.clamp(min=0).unsqueeze(-1), draft_ids.shape[-1]  # (..., K, 1): padding reads token 0
    p_d = ((p[..., :K, :].argmax(-1) == draft_ids).float() if greedy  # one-hot p: 1 where the argmaxes agree
           else p[..., :K, :].gather(-1, d).squeeze(-1))  # (..., K)
    q_d = torch.ones_like(p_d) if greedy or q is None else q.gather(-1, d).squeeze(-1)  # (..., K)
    return torch.cat([verdict.float(), draft_ids.float(), p_d, q_d, u], -1)


def read_step(host, k, greedy, K=None) -> StepReadout:
    """One row of pack_step's output, already read to the host (a list): its first k drafts of K."""
    K = k if K is None else K
    return StepReadout(int(host[0]), int(host[1]), [int(t) for t in host[2:2 + k]], host[2 + K:2 + K + k],
                       host[2 + 2 * K:2 + 2 * K + k], [] if greedy else host[2 + 3 * K:2 + 3 * K + k])
