"""Cost arithmetic as pure functions: bytes per token, ceilings, and the speedup formula.

Shared by the benchmarks, the acceptance report and the notebooks.
"""


def expected_tokens_per_step(alpha: float, k: int) -> float:
    """E[tokens per step] = (1 - alpha^(K+1)) / (1 - alpha) (arXiv 2211.17192, Eq. 1);
    K + 1 when alpha = 1."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha!r}")
    if alpha == 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def expected_speedup(alpha: float, k: int, c: float) -> float:
    """Walltime improvement (1 - alpha^(K+1)) / ((1 - alpha)(K c + 1)) (arXiv 2211.17192, Theorem 3.8)."""
    if c < 0:
        raise ValueError(f"c must be >= 0, got {c!r}")
    return expected_tokens_per_step(alpha, k) / (k * c + 1.0)


def best_k(alpha: float, c: float, k_max: int = 16) -> int:
    """The K in [1, k_max] with the highest expected speedup."""
    return max(range(1, k_max + 1), key=lambda k: expected_speedup(alpha, k, c))
