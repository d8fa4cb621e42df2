"""The one clock of the project, and what it measures on this machine.

`Clock` reads time after synchronising CUDA; `best_seconds` takes the fastest of a few
timed calls with it; the rest measure memory bandwidth, matmul FLOP/s and forward
times, for the roofline (roofline.py) and the benchmark.
"""
import time

import torch

from ..core.kv_cache import KVCache


class Clock:
    """perf_counter, with the device synchronised first on CUDA: a host clock read
    while kernels are still queued would time the queueing, not the work."""

    def __init__(self, device="cpu"):
        self.cuda = torch.device(device).type == "cuda"

    def __call__(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()  # sync: every clock read on CUDA
        return time.perf_counter()


def best_seconds(fn, reps: int = 5, device="cpu") -> float:
    """The fastest of `reps` timed calls of fn(), after one warm-up call, read with Clock.
    The minimum, not the mean: noise on a shared machine only adds time."""
    if isinstance(reps, bool) or not isinstance(reps, int) or reps < 1:
        raise ValueError(f"reps must be an int >= 1, got {reps!r}")
    clock = Clock(device)
    fn()  # warm up: first-touch page faults, allocator, kernel selection
    best = float("inf")
    for _ in range(reps):
        t0 = clock()
        fn()
        best = min(best, clock() - t0)
    return best


def measure_memory_bandwidth(nbytes: int = 1 << 28, reps: int = 5, device="cpu", mode: str = "read") -> float:
    """Best-of-reps memory bandwidth in bytes/s over a float32 buffer of `nbytes` (far larger
    than any cache). mode "read" sums the buffer (nbytes read); "copy" copies it into a
    second one (nbytes read + nbytes written)."""
    if mode not in ("read", "copy"):
        raise ValueError(f"mode must be 'read' or 'copy', got {mode!r}")
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 4:
        raise ValueError(f"nbytes must be an int >= 4, got {nbytes!r}")
    x = torch.ones(int(nbytes) // 4, dtype=torch.float32, device=device)
    if mode == "read":
        seconds = best_seconds(lambda: x.sum(), reps, device)
        return x.numel() * 4 / seconds
    y = torch.empty_like(x)
    seconds = best_seconds(lambda: y.copy_(x), reps, device)
    return 2 * x.numel() * 4 / seconds


def measure_matmul_flops(n: int = 1024, reps: int = 5, device="cpu", dtype=None) -> float:
    """Best-of-reps FLOP/s of an (n, n) @ (n, n) matmul: 2 n^3 FLOPs."""
    dtype = dtype or torch.float32
    g = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, generator=g, device=device).to(dtype)
    b = torch.randn(n, n, generator=g, device=device).to(dtype)
    seconds = best_seconds(lambda: a @ b, reps, device)
    return 2.0 * n ** 3 / seconds


def measure_forward_seconds(model, tokens, context: int = 64, reps: int = 3, seed: int = 0) -> list[float]:
    """Best-of-reps seconds of one forward over T new tokens after `context` cached ones, for
    each T in `tokens`. Random token ids; the cache is rolled back between calls."""
    tokens = list(tokens)
    if not tokens or any(isinstance(t, bool) or not isinstance(t, int) or t < 1 for t in tokens):
        raise ValueError(f"tokens must be a non-empty list of ints >= 1, got {tokens!r}")
    g = torch.Generator().manual_seed(seed)
    V, device = model.cfg.vocab_size, model.device
    cache = KVCache.for_model(model.cfg, context + max(tokens) + 1, dtype=model.dtype, device=device)
    out = []
    with torch.no_grad():
        if context:
            model(torch.randint(0, V, (1, context), generator=g).to(device), cache=cache, last_only=True)
        for T in tokens:
            x = torch.randint(0, V, (1, T), generator=g).to(device)  # (1, T)

            def step():
                model(x, cache=cache)
                cache.rollback(context)
            out.append(best_seconds(step, reps, device))
    return out


def forward_rows_rounds(model, rows, context: int = 64, rounds: int = 9, seed: int = 0) -> list[list[float]]:
    """Seconds of one forward over T new rows after `context` cached positions, for each T in
    `rows`, in `rounds` rounds: each round times every T once, in a shuffled order, so that a
    burst of noise on a shared machine falls on all row counts alike rather than on the few that
    happened to run during it. Returns one list per round, in the order of `rows` (take the
    median over rounds per T). Random token ids; the cache is rolled back after every forward,
    and every T is run once untimed first (warm-up)."""
    rows = list(rows)
    if not rows or any(isinstance(t, bool) or not isinstance(t, int) or t < 1 for t in rows):
        raise ValueError(f"rows must be a non-empty list of ints >= 1, got {rows!r}")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be an int >= 1, got {rounds!r}")
    g = torch.Generator().manual_seed(seed)
    V, device, clock = model.cfg.vocab_size, model.device, Clock(model.device)
    cache = KVCache.for_model(model.cfg, context + max(rows) + 1, dtype=model.dtype, device=device)
    inputs = {T: torch.randint(0, V, (1, T), generator=g).to(device) for T in set(rows)}  # (1, T) each
    out = []
    with torch.no_grad():
        if context:
            model(torch.randint(0, V, (1, context), generator=g).to(device), cache=cache, last_only=True)

        def forward(T):
            t0 = clock()
            model(inputs[T], cache=cache)
            seconds = clock() - t0
            cache.rollback(context)
            return seconds
        for T in rows:
            forward(T)
        for _ in range(rounds):
            order = torch.randperm(len(rows), generator=g).tolist()
            seconds = {i: forward(rows[i]) for i in order}
            out.append([seconds[i] for i in range(len(rows))])
    return out


class BandwidthProbe:
    """Memory read bandwidth (bytes/s), measured again at each call: the best of `reps` sums over
    one float32 buffer much larger than the caches (256 MiB on CPU, 2 GiB on CUDA), allocated
    once. The bench calls it between prompts, so the roofline's denominator sees the machine as
    the decode saw it; `samples` keeps every reading."""

    def __init__(self, device="cpu", nbytes=None, reps=3):
        device = torch.device(device)
        nbytes = nbytes or (2 << 30 if device.type == "cuda" else 256 << 20)
        self.x = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
        self.device, self.reps, self.samples = device, reps, []

    @torch.no_grad()
    def __call__(self) -> float:
        self.samples.append(self.x.numel() * 4 / best_seconds(self.x.sum, self.reps, self.device))
        return self.samples[-1]
