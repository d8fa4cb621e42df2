"""Cost arithmetic as pure functions: bytes per token, ceilings, intensity, and the speedup formula.

Shared by the benchmarks, the acceptance report and the notebooks. Units are SI
throughout: bytes, bytes/s, FLOP, FLOP/s, seconds. A "model" argument is either
a ModelConfig (then the KV cache and the untied input embedding are counted
exactly) or a plain parameter count (weights only).

Batch-1 decode reads every weight once per generated token and does about two
FLOPs per weight (one multiply, one add), so its arithmetic intensity is
2 / bytes_per_param FLOP/byte: 1 in FP16. A GPU needs hundreds of FLOPs per byte
to keep its tensor cores busy, so decode waits on memory: tokens/s is capped at
bandwidth / bytes_per_token. A forward over T tokens reads the same weights and
does T times the work, so it costs about as much as one token until T reaches
the critical batch size. That is the slack speculative decoding spends on
verifying K drafted tokens in one target pass (arXiv 2211.17192, section 3.4).

Everything here is arithmetic; timing.py measures this machine.
"""
import math
from dataclasses import dataclass

from ..core.config import ModelConfig

# --------------------------------------------------------------------------- the speedup formula


def _check_int(name, value, lo, hi=None):
    if isinstance(value, bool) or not isinstance(value, int) or value < lo or (hi is not None and value > hi):
        allowed = f"[{lo}, {hi}]" if hi is not None else f">= {lo}"
        raise ValueError(f"{name} must be an int {allowed}, got {value!r}")


def _check_alpha(alpha):
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be a number in [0, 1], got {alpha!r}")


def expected_tokens_per_step(alpha: float, k: int) -> float:
    """E[tokens per step] with K drafts and i.i.d. acceptance alpha (arXiv 2211.17192, eq. 1).

    (1 - alpha^(K+1)) / (1 - alpha) = 1 + alpha + ... + alpha^K: the accepted prefix
    plus the one correction or bonus token. Summed as a series, so alpha = 1 gives
    K + 1 and alpha = 0 gives 1 without dividing by zero.
    """
    _check_alpha(alpha)
    _check_int("k", k, 0)
    return math.fsum(alpha ** i for i in range(k + 1))


def expected_speedup(alpha: float, k: int, c: float, verify_cost: float = 1.0) -> float:
    """Expected walltime improvement over autoregressive decoding (arXiv 2211.17192, Theorem 3.8).

    One step costs K draft forwards (c each, relative to a one-token target forward)
    plus one target forward over K+1 tokens, and yields expected_tokens_per_step(alpha, K)
    tokens; the baseline yields 1 token per target forward. The theorem takes the
    (K+1)-token forward to cost as much as a one-token one (verify_cost = 1), true where
    decode is purely memory-bound; pass a measured verify_cost where it is not.
    """
    if isinstance(c, bool) or not isinstance(c, (int, float)) or not c >= 0 or math.isinf(c):
        raise ValueError(f"c must be a finite number >= 0, got {c!r}")
    if not verify_cost > 0:
        raise ValueError(f"verify_cost must be > 0, got {verify_cost!r}")
    return expected_tokens_per_step(alpha, k) / (k * c + verify_cost)


def optimal_k(alpha: float, c: float, k_min: int = 1, k_max: int = 16, verify_cost: dict | None = None) -> int:
    """argmax over K in [k_min, k_max] of expected_speedup; ties go to the smaller K.
    verify_cost maps K to the measured cost of verifying K drafts (1 where missing)."""
    _check_int("k_min", k_min, 0)
    _check_int("k_max", k_max, k_min)
    v = verify_cost or {}
    speed = {k: expected_speedup(alpha, k, c, v.get(k, 1.0)) for k in range(k_min, k_max + 1)}
    return max(speed, key=lambda k: (speed[k], -k))


def best_k(alpha: float, c: float, k_max: int = 16) -> int:
    """The K in [1, k_max] with the highest expected speedup."""
    return optimal_k(alpha, c, 1, k_max)


# --------------------------------------------------------------------------- hardware


@dataclass(frozen=True)
class Hardware:
    name: str
    memory_bytes: float  # device memory (HBM)
    bandwidth: float  # bytes/s, the datasheet's peak memory bandwidth
    peak_flops: float  # FLOP/s, dense FP16/BF16 tensor-core peak; datasheets also quote 2x "with sparsity"
    source: str  # the vendor document the figures come from

    @property
    def ridge_intensity(self) -> float:
        """FLOP/byte at which the roofline bends: below it a kernel waits on memory."""
        return self.peak_flops / self.bandwidth


_A100_DATASHEET = ("NVIDIA A100 Tensor Core GPU datasheet, https://www.nvidia.com/content/dam/en-zz/Solutions/"
                   "Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf")

# SXM form factors. FP16 tensor-core figures are the datasheets' dense ones (half the starred sparse ones).
HARDWARE = {h.name: h for h in (
    Hardware("A100 40GB", 40e9, 1555e9, 312e12, _A100_DATASHEET),
    Hardware("A100 80GB", 80e9, 2039e9, 312e12, _A100_DATASHEET),
    Hardware("H100 SXM", 80e9, 3.35e12, 989.5e12,
             "NVIDIA H100 Tensor Core GPU datasheet, https://www.nvidia.com/en-us/data-center/h100/"),
    Hardware("H200", 141e9, 4.8e12, 989.5e12,
             "NVIDIA H200 Tensor Core GPU datasheet, https://www.nvidia.com/en-us/data-center/h200/"),
)}

# Published shapes (the models' config.json on the Hugging Face hub), for worked examples.
LLAMA_3_70B = ModelConfig(vocab_size=128256, dim=8192, n_layers=80, n_heads=64, n_kv_heads=8, head_dim=128,
                          intermediate_size=28672, rope_theta=500000.0, tie_embeddings=False)
LLAMA_3_8B = ModelConfig(vocab_size=128256, dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, head_dim=128,
                         intermediate_size=14336, rope_theta=500000.0, tie_embeddings=False)
LLAMA_3_2_1B = ModelConfig(vocab_size=128256, dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, head_dim=64,
                           intermediate_size=8192, rope_theta=500000.0, tie_embeddings=True)
SMOLLM2_135M = ModelConfig()  # the defaults are SmolLM2-135M's shape
# Llama-3.1-8B has LLAMA_3_8B's shape (only its rope scaling differs), so the same config serves both.


# --------------------------------------------------------------------------- bytes and FLOPs per token


def _check_model(model):
    if isinstance(model, ModelConfig):
        return
    if isinstance(model, bool) or not isinstance(model, (int, float)) or not model > 0:
        raise ValueError(f"model must be a ModelConfig or a parameter count > 0, got {model!r}")


def _check_positive(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name} must be a number > 0, got {value!r}")


def streamed_params(model) -> float:
    """Parameters a decode step reads. An untied input embedding is only indexed (one row per
    token), so it is not streamed; a tied one is, since it is also the output head."""
    _check_model(model)
    if not isinstance(model, ModelConfig):
        return float(model)
    untied_embedding = 0 if model.tie_embeddings else model.vocab_size * model.dim
    return float(model.num_params - untied_embedding)


def kv_bytes_per_position(cfg: ModelConfig, bytes_per_elem: float = 2.0) -> float:
    """Cache bytes one position holds, and one decode step reads per position of context:
    keys and values (2) for every layer and key/value head: 2 L Hkv D bytes_per_elem."""
    if not isinstance(cfg, ModelConfig):
        raise ValueError(f"cfg must be a ModelConfig (the cache size needs layers and heads), got {cfg!r}")
    return 2.0 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * bytes_per_elem


def bytes_per_token(model, context: int = 0, bytes_per_param: float = 2.0) -> float:
    """Bytes a batch-1 decode step moves from memory: the streamed weights plus the KV cache
    of `context` earlier positions (stored in the same dtype as the weights)."""
    _check_positive("bytes_per_param", bytes_per_param)
    if isinstance(context, bool) or not isinstance(context, (int, float)) or not context >= 0:
        raise ValueError(f"context must be a number >= 0 (a mean over a decode may be fractional), got {context!r}")
    weights = streamed_params(model) * bytes_per_param
    if context == 0:
        return weights
    if not isinstance(model, ModelConfig):
        raise ValueError("context > 0 needs a ModelConfig: a parameter count does not say how big the KV cache is")
    return weights + context * kv_bytes_per_position(model, bytes_per_param)


def flops_per_token(model, context: int = 0) -> float:
    """FLOPs of one token's forward: 2 per streamed weight (multiply and add), plus attention's
    two (T, D) x (D, context) products per query head: 4 H D context."""
    flops = 2.0 * streamed_params(model)
    if context and isinstance(model, ModelConfig):
        flops += 4.0 * model.n_layers * model.n_heads * model.head_dim * context
    return flops


def tokens_per_second_ceiling(bytes_per_token: float, bandwidth: float) -> float:
    """The batch-1 decode ceiling: a token cannot come faster than its bytes can be read."""
    _check_positive("bytes_per_token", bytes_per_token)
    _check_positive("bandwidth", bandwidth)
    return bandwidth / bytes_per_token


def devices_needed(model, memory_bytes: float, bytes_per_param: float = 2.0) -> int:
    """How many devices of `memory_bytes` the weights alone need (no KV cache, no activations)."""
    _check_positive("memory_bytes", memory_bytes)
    return math.ceil(bytes_per_token(model, 0, bytes_per_param) / memory_bytes)


# --------------------------------------------------------------------------- intensity and the roofline


def arithmetic_intensity(tokens: int, bytes_per_param: float = 2.0) -> float:
    """FLOP/byte of a forward over `tokens` tokens when the weights dominate the bytes:
    2 T N FLOPs over N bytes_per_param bytes = 2 T / bytes_per_param. Decode is T = 1."""
    _check_positive("tokens", tokens)
    _check_positive("bytes_per_param", bytes_per_param)
    return 2.0 * tokens / bytes_per_param


def matmul_intensity(m: int, k: int, n: int, bytes_per_elem: float = 2.0) -> float:
    """FLOP/byte of (m, k) @ (k, n), counting both inputs and the output once:
    2 m k n / (bytes (m k + k n + m n)). With m = T tokens and a (k, n) weight it tends
    to 2 T / bytes while T is much smaller than k and n."""
    return 2.0 * m * k * n / (bytes_per_elem * (m * k + k * n + m * n))


def critical_batch_size(peak_flops: float, bandwidth: float, bytes_per_param: float = 2.0) -> float:
    """Tokens per weight read at which a forward stops being memory-bound: the T where
    arithmetic_intensity(T) reaches the ridge peak_flops / bandwidth. Below it, a forward
    over T tokens costs about the same as over one."""
    _check_positive("peak_flops", peak_flops)
    _check_positive("bandwidth", bandwidth)
    return peak_flops / bandwidth * bytes_per_param / 2.0


def attainable_flops(intensity: float, peak_flops: float, bandwidth: float) -> float:
    """The roofline (Williams, Waterman, Patterson 2009): min(peak, intensity x bandwidth)."""
    return min(peak_flops, intensity * bandwidth)


def forward_seconds(model, tokens: int, peak_flops: float, bandwidth: float, context: int = 0,
                    bytes_per_param: float = 2.0) -> float:
    """Roofline time of one forward over `tokens` new tokens after `context` cached ones:
    the slower of reading the bytes (weights + cache, once) and doing the FLOPs."""
    _check_positive("tokens", tokens)
    moved = bytes_per_token(model, context, bytes_per_param)
    work = tokens * flops_per_token(model, context)
    return max(moved / bandwidth, work / peak_flops)


def hardware_rows(model, context: int = 0, bytes_per_param: float = 2.0, hardware=None) -> list[dict]:
    """One row per device of the table: its figures, and this model's ceiling on it."""
    per_token = bytes_per_token(model, context, bytes_per_param)
    rows = []
    for hw in (hardware or HARDWARE).values():
        rows.append({
            "device": hw.name,
            "memory_GB": hw.memory_bytes / 1e9,
            "bandwidth_TBps": hw.bandwidth / 1e12,
            "fp16_TFLOPs": hw.peak_flops / 1e12,
            "ridge_FLOP_per_byte": hw.ridge_intensity,
            "critical_batch": critical_batch_size(hw.peak_flops, hw.bandwidth, bytes_per_param),
            "tokens_per_s_ceiling": tokens_per_second_ceiling(per_token, hw.bandwidth),
            "devices_needed": devices_needed(model, hw.memory_bytes, bytes_per_param),
        })
    return rows


# --------------------------------------------------------------------------- batches and launches


def batch_forward_seconds(model, batch: int, tokens: int, peak_flops: float, bandwidth: float, context: int = 0,
                          bytes_per_param: float = 2.0) -> float:
    """Roofline time of one forward over `tokens` new tokens for each of `batch` sequences, each
    after `context` cached positions: the weights are read once for the whole batch, each
    sequence's cache once, and the work is batch x tokens tokens' FLOPs. Verifying K drafts for
    B requests is batch=B, tokens=K+1: B(K+1) tokens share one read of the weights, which is
    nearly free until B(K+1) nears the critical batch."""
    _check_int("batch", batch, 1)
    _check_int("tokens", tokens, 1)
    moved = bytes_per_token(model, 0, bytes_per_param)
    if context:
        moved += batch * (bytes_per_token(model, context, bytes_per_param) - moved)
    work = batch * tokens * flops_per_token(model, context)
    return max(moved / bandwidth, work / peak_flops)


def batch_speedup(alpha: float, k: int, batch: int, target, draft, peak_flops: float, bandwidth: float,
                  context: int = 0, bytes_per_param: float = 2.0) -> float:
    """Theorem 3.8 (arXiv 2211.17192) at batch B with the roofline's costs: every request drafts
    K tokens (K draft forwards at batch B), the target verifies B(K+1) tokens in one forward,
    and the baseline decodes B tokens per target forward. Returns the expected tokens/s of
    speculative decoding over autoregressive decoding at the same batch; it falls below 1
    once verification, no longer free, costs more than the accepted drafts save."""
    def t(model, tokens):
        return batch_forward_seconds(model, batch, tokens, peak_flops, bandwidth, context, bytes_per_param)

    base = t(target, 1)
    c, verify_cost = t(draft, 1) / base, t(target, k + 1) / base
    return expected_speedup(alpha, k, c, verify_cost)


def launch_bound_seconds(device_seconds: float, launches: int, host_per_launch: float,
                         gap_per_kernel: float = 0.0) -> float:
    """A forward's time when each of its `launches` kernels costs the host `host_per_launch`
    seconds to issue (eager PyTorch: Python, the dispatcher, the driver) and the device
    `gap_per_kernel` between kernels. The host queues kernels while the device works, so the
    slower of the two sets the pace: max(device + launches x gap, launches x host). A CUDA
    graph issues the whole forward in one launch: host_per_launch ~ 0, the gaps remain."""
    if not device_seconds >= 0:
        raise ValueError(f"device_seconds must be >= 0, got {device_seconds!r}")
    _check_int("launches", launches, 0)
    for name, v in (("host_per_launch", host_per_launch), ("gap_per_kernel", gap_per_kernel)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0:
            raise ValueError(f"{name} must be a number of seconds >= 0, got {v!r}")
    return max(device_seconds + launches * gap_per_kernel, launches * host_per_launch)
