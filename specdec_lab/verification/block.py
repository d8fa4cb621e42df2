"""Block verification: the drafted block judged as a whole (Sun, Mendlovic, Leviathan, Aharoni,
Beirami, Ro, Suresh, "Block Verification Accelerates Speculative Decoding", ICLR 2025, arXiv
2403.10444, Algorithm 2), written from its math for core/verify.py's inputs and verdict.

With d_1..d_K drafted from q_1..q_K and the target's p_1..p_{K+1} (p_i conditioned on d_<i):

  P_0 = 1,  P_i = min(P_{i-1} p_i(d_i) / q_i(d_i), 1)             the block's running weight
  r_i = sum_x max(P_i p_{i+1}(x) - q_{i+1}(x), 0)   (i < K)      the residual mass after i tokens
  h_i = r_i / (r_i + 1 - P_i)   (i < K; 1 where r_i + 1 - P_i = 0),   h_K = P_K
  tau = the largest i whose test u_i < h_i passes (0 if none)

so d_i can be kept after an earlier test failed. The next token is drawn from the residual
max(P_tau p_{tau+1} - q_{tau+1}, 0) (p_{tau+1} where it is all zeros), or is the bonus from
p_{K+1} when tau = K. At K = 1 this is the token rule (h_1 = P_1 = min(1, p/q)), and with q = p
every token is kept. The rule is lossless and, among single-draft rules, optimal in expected
accepted tokens (the paper's Theorems 1 and 2); it needs the draft's real q. q(d) = 0 counts as
p/q = 0, as the token rule rejects it.

The randomness is the token rule's: u (K,) for the K tests, e (V,) for the one final draw
(draw(dist, e) = argmax(dist / e), the exponential race, which needs no normalising). Greedy is
the usual greedy rule (one-hot p and q give P_i = 1 while argmax p_i = d_i, and h = 1 at the
first mismatch), so it is handed to core/verify.py's twins.
"""
import torch

from ..core.verify import draw, one_hot, verify, verify_reference
from .host import host_reader


def _ratios(draft_ids, p, q):
    """p_i(d_i) / q_i(d_i), (..., K), with 0 where q_i(d_i) = 0."""
    d = draft_ids.unsqueeze(-1)  # (..., K, 1)
    p_d = p[..., :d.shape[-2], :].gather(-1, d).squeeze(-1)  # (..., K)
    q_d = q.gather(-1, d).squeeze(-1)  # (..., K)
    return torch.where(q_d > 0, p_d / q_d.clamp_min(1e-30), torch.zeros_like(p_d))


def block_weights(draft_ids, p, q):
    """P_0..P_K, (K+1,), and the thresholds h_1..h_K, (K,), on the device with no host read; with
    leading batch dimensions, (..., K) ids give (..., K+1) and (..., K) (serve/verify.py's rows).
    P_i = min(P_{i-1} a_i, 1) is a clamped running product: with S_i = sum_{j<=i} log a_j and
    S_0 = 0, log P_i = S_i - max_{j<=i} S_j (by induction), a cumsum and a cummax."""
    K = draft_ids.shape[-1]
    log_a = _ratios(draft_ids, p, q).log()  # (..., K), -inf where a ratio is 0
    S = torch.cat([log_a.new_zeros(log_a.shape[:-1] + (1,)), log_a.cumsum(-1)], -1)  # (..., K+1)
    P = (S - S.cummax(-1).values).exp()  # (..., K+1)
    r = torch.clamp(P[..., 1:K, None] * p[..., 1:K, :] - q[..., 1:K, :], min=0.0).sum(-1)  # (..., K-1): r_1..r_{K-1}
    denom = r + 1.0 - P[..., 1:K]
    h = torch.where(denom > 0, r / denom.clamp_min(1e-30), torch.ones_like(r))  # (..., K-1)
    return P, torch.cat([h, P[..., K:]], -1)  # h_K = P_K


def _next_dist(tau, P, p, q, K):
    """The (unnormalised) distribution the next token is drawn from, (V,): the residual at tau+1,
    or p_{K+1} itself when tau = K (or when the residual is all zeros)."""
    p_row = p.index_select(0, tau)[0]  # (V,)
    if K == 0:
        return p_row
    q_row = q.index_select(0, tau.clamp(max=K - 1))[0]  # (V,)
    residual = torch.clamp(P.index_select(0, tau)[0] * p_row - q_row, min=0.0)
    use_p = (tau == K) | (residual.sum() <= 0)
    return torch.where(use_p, p_row, residual)


def verify_block(draft_ids, p, q, u, e, greedy=False) -> torch.Tensor:
    """Block verification on the device, no host read: (2,) int64 [num_accepted, next_token]."""
    if greedy:
        return verify(draft_ids, p, q, u, e, greedy=True)
    K = draft_ids.shape[0]
    if q is None:
        q = one_hot(draft_ids, p.shape[-1])
    P, h = block_weights(draft_ids, p, q)  # (K+1,), (K,)
    passed = (u < h).long() * torch.arange(1, K + 1, device=p.device)  # (K,): i where test i passes, else 0
    tau = torch.cat([passed, passed.new_zeros(1)]).max().view(1)  # (1,): the largest i that passed
    return torch.cat([tau, draw(_next_dist(tau, P, p, q, K), e).view(1)])


def verify_block_reference(draft_ids, p, q, u, e, greedy=False, syncs=None) -> torch.Tensor:
    """The readable loop: the weights P_i, the residual masses and the tests one position at a time."""
    if greedy:
        return verify_reference(draft_ids, p, q, u, e, greedy=True, syncs=syncs)

    host = host_reader(syncs)

    K = draft_ids.shape[0]
    if q is None:
        q = one_hot(draft_ids, p.shape[-1])
    P, tau, weights = 1.0, 0, [1.0]
    for i in range(1, K + 1):  # position i reads p_i = p[i-1], q_i = q[i-1]
        d = host(draft_ids[i - 1], int)
        p_d, q_d = host(p[i - 1, d]), host(q[i - 1, d])
        P = min(P * (p_d / q_d if q_d > 0 else 0.0), 1.0)
        weights.append(P)
        if i < K:
            r = host(torch.clamp(P * p[i] - q[i], min=0.0).sum())  # residual mass r_i
            h = r / (r + 1.0 - P) if r + 1.0 - P > 0 else 1.0
        else:
            h = P
        if host(u[i - 1]) < h:
            tau = i  # a later pass overrides an earlier failure
    if tau == K:
        dist = p[K]  # the bonus
    else:
        residual = torch.clamp(weights[tau] * p[tau] - q[tau], min=0.0)
        dist = residual if host(residual.sum()) > 0 else p[tau]
    token = host(draw(dist, e), int)
    host(0, int)  # counted: the verdict is copied from the host back to the device
    return torch.tensor([tau, token], device=p.device)
