"""Exact-match verification: the target draws its own token at each position, and a drafted token
is kept only while it equals that draw (llama.cpp's server; vLLM Model Runner V2's "strict" rule).

  t_i = the target's draw from p_i   (i = 1..K)
  n   = the largest n with d_j = t_j for every j <= n
  next = t_{n+1} if n < K, else the bonus drawn from p_{K+1}

It is lossless whatever q is: every emitted token is the target's own draw from p given the
tokens before it, and q is never read. A token drafted from q is kept with probability
sum_x q(x) p(x), against sum_x min(p(x), q(x)) for the token rule (arXiv 2211.17192); the two
meet only when q is one-hot.

Randomness, the token rule's, so seeded runs repeat: t_i is the inverse-CDF draw from p_i with
the uniform u_i, t_i = min{x : u_i * sum(p_i) < cdf_i(x)} (core/sampling.py's `sample`), and the
bonus is draw(p_{K+1}, e) = argmax(p_{K+1} / e). Each position has its own uniform, so the t_i
are independent draws given the prefix. Greedy is the usual greedy rule (t_i = argmax p_i).
"""
import torch

from ..core.verify import draw, verify, verify_reference
from .host import host_reader


def target_tokens(p, u):
    """The target's own draws t_1..t_K, (K,), from the rows p_1..p_K with the uniforms u (K,); with
    leading batch dimensions, (..., K) uniforms give (..., K) draws (serve/verify.py's rows)."""
    K = u.shape[-1]
    cdf = p[..., :K, :].cumsum(-1)  # (..., K, V)
    t = torch.searchsorted(cdf, (u.to(cdf.dtype) * cdf[..., -1]).unsqueeze(-1), right=True)  # (..., K, 1)
    return t.squeeze(-1).clamp_max(p.shape[-1] - 1)  # (..., K)


def verify_match(draft_ids, p, q, u, e, greedy=False) -> torch.Tensor:
    """Exact match on the device, no host read: (2,) int64 [num_accepted, next_token]. q is not read."""
    if greedy:
        return verify(draft_ids, p, q, u, e, greedy=True)
    K = draft_ids.shape[0]
    t = torch.cat([target_tokens(p, u), draw(p[K], e).view(1)])  # (K+1,): t_1..t_K, then the bonus
    n = (t[:K] == draft_ids).long().cumprod(0).sum().view(1)  # (1,): matches before the first mismatch
    return torch.cat([n, t.index_select(0, n)])


def verify_match_reference(draft_ids, p, q, u, e, greedy=False, syncs=None) -> torch.Tensor:
    """The readable loop: at each position walk p_i's CDF to the target's own token, compare."""
    if greedy:
        return verify_reference(draft_ids, p, q, u, e, greedy=True, syncs=syncs)

    host = host_reader(syncs)

    def verdict(n, token):
        host(0, int)  # counted: the verdict is copied from the host back to the device
        return torch.tensor([n, token], device=p.device)

    K, V = draft_ids.shape[0], p.shape[-1]
    for i in range(K):
        cdf = p[i].cumsum(-1)  # (V,)
        level = host(u[i].to(cdf.dtype) * cdf[-1])  # u_i * sum(p_i)
        cdf = host(cdf, lambda t: t.tolist())  # p_i's CDF on the host
        target = next((x for x in range(V) if level < cdf[x]), V - 1)  # the first x with u_i * sum < cdf(x)
        if target != host(draft_ids[i], int):
            return verdict(i, target)
    return verdict(K, host(draw(p[K], e), int))
