"""Expected accepted drafts per step under each rule, computed from p and q, with no sampling.

The model is the one behind Leviathan et al.'s alpha (arXiv 2211.17192, section 3.5): the i-th
drafted position sees the distributions p_i (target) and q_i (draft) of position i along a fixed
sequence, whatever was drafted before it. Along the target's own answer to a prompt (teacher
forcing), each start position gives K such pairs, and averaging over the start positions gives
the expected number of accepted drafts per step for that answer. Under this model:

  token by token   E = sum_{i<=K} prod_{j<=i} beta_j,    beta_j = sum_x min(p_j(x), q_j(x))
  exact match      E = sum_{i<=K} prod_{j<=i} gamma_j,   gamma_j = sum_x q_j(x) p_j(x)
  exact match, argmax proposal: gamma_j = p_j(argmax q_j)  (and every rule agrees on a one-hot q)
  block            E = sum_{i<=K} P(some test j >= i passes)

The block rule (arXiv 2403.10444, Algorithm 2; verification/block.py) has no product form: its
test at position j reads the running weight P_j = min(P_{j-1} p_j(d_j) / q_j(d_j), 1), a Markov
chain in the drafted tokens. `block_expected` walks that chain on a grid of log P: the law of
log(p_j / q_j) under q_j is binned to the grid, the chain's law is carried forward by convolution
(clamped at P = 1; P = 0 absorbs), and the chance that no test at j or later passes is carried
backward from position K. The only approximation is the grid: tests/test_verification_rules.py
holds the walk to exact enumeration in fractions within 3e-3 on small vocabularies, where a ratio
close to 1 next to P = 1 is the worst case (on a random pair of 49,152-token rows, K = 8, halving the
grid moved the result by 2e-6).
"""
import numpy as np
import torch

GRID = 0.001  # the width of a log-P bin
FLOOR = 20.0  # log P below -FLOOR counts as P = 0: a weight of e^-20 passes a test about never


def chain_expected(rates) -> np.ndarray:
    """(..., K) per-position acceptance rates -> (..., K) expected accepted drafts at K' = 1..K:
    sum_{i <= K'} prod_{j <= i} rate_j (the token rule with beta, exact match with gamma)."""
    return np.cumsum(np.cumprod(np.asarray(rates, dtype=np.float64), axis=-1), axis=-1)


def rates(p, q):
    """Per-position rates from (K, V) probability rows: beta (token rule), gamma (exact match with
    q sampled) and gamma_argmax (exact match with the draft's top token proposed), each (K,)."""
    p, q = p.double(), q.double()
    beta = torch.minimum(p, q).sum(-1)
    gamma = (p * q).sum(-1)
    top = p.gather(-1, q.argmax(-1, keepdim=True)).squeeze(-1)
    return beta.numpy(), gamma.numpy(), top.numpy()


def _residual_mass(p_next, q_next, P):
    """r(P) = sum_x max(P p(x) - q(x), 0) for every P of the grid, by sorting the tokens by q/p."""
    p_next, q_next = p_next.numpy(), q_next.numpy()
    keep = p_next > 0
    t = q_next[keep] / p_next[keep]  # P p(x) > q(x) exactly when P > q(x) / p(x)
    order = np.argsort(t)
    t, cp, cq = t[order], np.cumsum(p_next[keep][order]), np.cumsum(q_next[keep][order])
    n = np.searchsorted(t, P, side="left")  # tokens with q/p < P
    has = n > 0
    r = np.zeros_like(P)
    r[has] = P[has] * cp[n[has] - 1] - cq[n[has] - 1]
    return np.clip(r, 0.0, None)


def _log_ratio_law(p, q, grid, n_bins):
    """The law of log(p(x) / q(x)) for x ~ q, binned: (mass by bin index b = -n_bins..n_bins as an
    array of 2 n_bins + 1, mass where p(x) = 0). Bin b holds log ratios nearest to b * grid; log
    ratios beyond the range are clipped to its ends (a ratio above e^FLOOR saturates P anyway)."""
    p, q = p.double().numpy(), q.double().numpy()
    on = q > 0
    p, q = p[on], q[on]
    dead = q[p <= 0].sum()
    p, q = p[p > 0], q[p > 0]
    b = np.clip(np.rint(np.log(p / q) / grid), -n_bins, n_bins).astype(np.int64) + n_bins
    return np.bincount(b, weights=q, minlength=2 * n_bins + 1), float(dead)


def _conv(a, b):
    n = len(a) + len(b) - 1
    size = 1 << (n - 1).bit_length()
    out = np.fft.irfft(np.fft.rfft(a, size) * np.fft.rfft(b, size), size)[:n]
    return np.clip(out, 0.0, None)


def block_expected(p, q, grid=GRID, floor=FLOOR) -> np.ndarray:
    """(K,) expected accepted drafts of the block rule at K' = 1..K, from p (K, V) and q (K, V),
    the target's and the draft's rows at drafted positions 1..K (the bonus row is not needed)."""
    K = p.shape[0]
    G = int(round(floor / grid))  # grid index k holds log P = -k * grid, k = 0..G; P = 0 is apart
    P = np.exp(-np.arange(G + 1) * grid)
    laws = [_log_ratio_law(p[j], q[j], grid, G) for j in range(K)]
    # forward: the law of P_j over the grid (index 0 is P = 1), and the mass at P = 0
    forward, dist, zero = [], np.zeros(G + 1), 0.0
    dist[0] = 1.0
    for j in range(K):
        forward.append((dist, zero))
        law, dead = laws[j]
        # the new index is k - b (b: the log-ratio bin, up to G either way): conv over k and -b
        moved = _conv(dist, law[::-1])  # index m holds k - b + G
        new = np.zeros(G + 1)
        new[0] = moved[:G + 1].sum()  # k - b <= 0: P clamps at 1
        new[1:] = moved[G + 1:2 * G + 1]
        zero = zero + moved[2 * G + 1:].sum() + (1.0 - zero) * dead
        dist = new
    # backward, for each K' <= K: the chance that no test at j..K' passes, given P_{j-1}
    out = np.zeros(K)
    h_grid = [None] * K
    for j in range(K - 1):
        r = _residual_mass(p[j + 1].double(), q[j + 1].double(), P)
        denom = r + 1.0 - P
        h_grid[j] = np.where(denom > 0, r / np.where(denom > 0, denom, 1.0), 1.0)
    for k_max in range(1, K + 1):
        none_after = np.ones(G + 1)  # V_{K'+1} = 1
        total = 0.0
        for j in range(k_max - 1, -1, -1):
            h = P if j == k_max - 1 else h_grid[j]  # h_{K'} = P_{K'}
            f = (1.0 - h) * none_after  # at the new P; P = 0 passes nothing later: f = 1 there
            law, dead = laws[j]
            # V_j[k] = sum_b law[b] f[clamp(k - b)], f = f[0] for k - b < 0 and 1 for k - b > G
            ext = np.concatenate([np.full(G, f[0]), f, np.ones(G)])  # index k - b + G
            moved = _conv(law, ext)  # index k + 2G holds sum_i law[i] ext[k + 2G - i]
            none_after = moved[2 * G:3 * G + 1] + dead  # a dead draft (p = 0) keeps f = 1
            dist_j, zero_j = forward[j]
            total += 1.0 - (dist_j @ none_after + zero_j)  # P(a test at j or later passes)
        out[k_max - 1] = total
    return out


def expected_accepted(p, q, ks) -> dict:
    """{rule: {K: expected accepted drafts}} for one start, from (max K, V) rows p and q (already
    at the temperature of the run). Rules: token, block, match, match_argmax."""
    kmax = max(ks)
    beta, gamma, top = rates(p[:kmax], q[:kmax])
    block = block_expected(p[:kmax], q[:kmax])
    chains = {"token": chain_expected(beta), "block": block, "match": chain_expected(gamma),
              "match_argmax": chain_expected(top)}
    return {rule: {k: float(v[k - 1]) for k in ks} for rule, v in chains.items()}
