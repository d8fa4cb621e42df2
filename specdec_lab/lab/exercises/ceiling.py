"""Exercise "decode_ceiling" (chapter 01): the batch-1 decode ceiling, memory bandwidth over bytes per token.

A batch-1 decode step streams every weight once (n_params * bytes_per_param bytes) and reads the keys
and values of every earlier position (context * kv_bytes_per_position bytes), so no token can come faster
than bandwidth / (those bytes). The reference is analysis/roofline.py's arithmetic: bytes_per_token, then
tokens_per_second_ceiling. The cases are the chapter's own: the 70B example on A100s and an H200, and
the default target, SmolLM2-135M in float32, on this machine.
"""
import math

from ...analysis.roofline import HARDWARE, LLAMA_3_70B, SMOLLM2_135M, kv_bytes_per_position, streamed_params
from .report import Exercise, Failure, grade_cases


def decode_ceiling(n_params, bytes_per_param, context, kv_bytes_per_position, bandwidth):
    """The most tokens per second batch-1 decoding can reach: bandwidth (bytes/s) over the bytes one
    token reads, the weights plus the KV cache of `context` earlier positions."""
    per_token = n_params * bytes_per_param + context * kv_bytes_per_position  # bytes
    return bandwidth / per_token


MISTAKES = [
    ("no_kv_cache", lambda n, b, ctx, kv, bw: bw / (n * b)),
    ("bits_for_bytes", lambda n, b, ctx, kv, bw: bw / (8 * (n * b + ctx * kv))),
    ("bits_for_bytes", lambda n, b, ctx, kv, bw: bw / (8 * n * b + ctx * kv)),  # a weight's bits as its bytes
    ("bits_for_bytes", lambda n, b, ctx, kv, bw: 8 * bw / (n * b + ctx * kv)),  # the bandwidth in bits per second
    ("params_as_bytes", lambda n, b, ctx, kv, bw: bw / (n + ctx * kv)),
    ("two_bytes_assumed", lambda n, b, ctx, kv, bw: bw / (2 * n + ctx * kv)),
    ("cache_bytes_times_b", lambda n, b, ctx, kv, bw: bw / (n * b + ctx * kv * b)),
    ("seconds_per_token", lambda n, b, ctx, kv, bw: (n * b + ctx * kv) / bw),
]

HINTS = {
    "no_kv_cache": "You left out the KV cache. Each token also reads the keys and values of every earlier "
                   "position, context * kv_bytes_per_position bytes: your ceiling is right at context 0 and too "
                   "high at long contexts, where the cache can rival the weights.",
    "bits_for_bytes": "Your ceiling is off by a factor of 8: bits were counted where bytes belong (a float32 "
                      "weight as 32 bytes, or the bandwidth in bits per second). Every argument is already in "
                      "bytes: bytes_per_param, kv_bytes_per_position, and the bandwidth in bytes per second.",
    "params_as_bytes": "You counted each parameter as one byte. The weights take n_params * bytes_per_param "
                       "bytes: 2 per parameter in FP16, 4 in float32, 1 in FP8.",
    "two_bytes_assumed": "You counted 2 bytes per parameter whatever bytes_per_param says. That is right for "
                         "FP16 only: a float32 weight takes 4 bytes and an FP8 one 1.",
    "cache_bytes_times_b": "You multiplied the cache by bytes_per_param a second time. kv_bytes_per_position is "
                           "already in bytes (2 L H_kv D b: keys and values for every layer, in the cache's "
                           "dtype), so the cache reads context * kv_bytes_per_position bytes.",
    "seconds_per_token": "You returned bytes per token over bandwidth: the least time one token takes, in "
                         "seconds. The ceiling is its inverse, bandwidth / bytes per token, in tokens per second.",
}

PROFILE_READ = 32.6e9  # bytes/s: docs/machine_profile.json's one-thread read bandwidth, as chapter 01 quotes it


def _cases():
    """(what the case is, its arguments): the chapter's figures, from analysis/roofline.py."""
    a100, h200 = HARDWARE["A100 80GB"].bandwidth, HARDWARE["H200"].bandwidth
    big, small = streamed_params(LLAMA_3_70B), streamed_params(SMOLLM2_135M)
    kv_fp16, kv_fp8 = kv_bytes_per_position(LLAMA_3_70B, 2), kv_bytes_per_position(LLAMA_3_70B, 1)
    kv_f32 = kv_bytes_per_position(SMOLLM2_135M, 4)
    two = f"two A100 80GB cards, each reading half ({2 * a100 / 1e12:.3f} TB/s together)"
    return [
        (f"70B parameters in FP16 at context 0 on one A100 80GB ({a100 / 1e12:.3f} TB/s)",
         (70e9, 2, 0, kv_fp16, a100)),
        (f"Llama-3-70B in FP8 at context 0 on one H200 ({h200 / 1e12:.1f} TB/s)", (big, 1, 0, kv_fp8, h200)),
        (f"Llama-3-70B in FP16 at context 4,096 on {two}", (big, 2, 4096, kv_fp16, 2 * a100)),
        (f"Llama-3-70B in FP16 at context 32,768 on {two}", (big, 2, 32768, kv_fp16, 2 * a100)),
        (f"SmolLM2-135M in float32 at context 64 on this machine ({PROFILE_READ / 1e9:.1f} GB/s)",
         (small, 4, 64, kv_f32, PROFILE_READ)),
        (f"SmolLM2-135M in float32 at context 8,192 on this machine ({PROFILE_READ / 1e9:.1f} GB/s)",
         (small, 4, 8192, kv_f32, PROFILE_READ)),
    ]


CASES = _cases()


def _read_number(out, case):
    try:
        return float(out)
    except (TypeError, ValueError):
        raise Failure(f"Your function returned {out!r} for {_describe(case)}: it should return a number, "
                      f"the ceiling in tokens per second.") from None


def _same(a, b):
    # 1e-4: a ceiling is quoted to three or four figures, and counting the new token's own position in the
    # cache (context + 1) moves these cases by under 1e-4
    return math.isclose(a, b, rel_tol=1e-4)


def _describe(case):
    return next(label for label, args in CASES if args == case)


def _figure(x, digits):
    """x to `digits` significant figures, in plain notation: 1,120 rather than 1.12e+03."""
    if abs(x) < 1:
        return f"{x:.{digits}g}"
    return f"{x:,.{max(digits - len(str(int(abs(x)))), 0)}f}"


def _pair(a, b, scale=1.0):
    """a and b over scale, with the fewest significant figures (at least 4) that tell them apart."""
    for digits in range(4, 12):
        x, y = _figure(a / scale, digits), _figure(b / scale, digits)
        if x != y:
            break
    return x, y


def _explain(case, got, want):
    n, b, ctx, kv, bw = case
    if not (math.isfinite(got) and got > 0):
        return (f"For {_describe(case)}, the ceiling is {_figure(want, 4)} tokens/s, but your function returned "
                f"{got}: a ceiling is a positive number of tokens per second.")
    rate, your_rate = _pair(want, got)
    scale, unit = (1e9, "GB") if n * b >= 1e10 else (1e6, "MB")
    right, yours = _pair(n * b + ctx * kv, bw / got, scale)  # bytes per token, and what yours implies
    parts = (f"{_figure(n * b / scale, 4)} {unit} of weights and {_figure(ctx * kv / scale, 4)} {unit} of KV cache"
             if ctx else "the weights alone at context 0")
    return (f"For {_describe(case)}, the ceiling is {rate} tokens/s, but your function returned {your_rate}. "
            f"Yours implies {yours} {unit} read per token, where a token reads {right} {unit}: {parts}.")


def grade_decode_ceiling(fn):
    grade_cases(fn, [args for _, args in CASES], decode_ceiling, MISTAKES, describe=_describe, read=_read_number,
                explain=_explain, same=_same)
    return (f"Your ceilings equal analysis.roofline's (bandwidth over bytes_per_token) on {len(CASES)} cases "
            f"from the chapter: 70B in FP16 on one A100 80GB and on two, at contexts 0 to 32,768; Llama-3-70B in "
            f"FP8 on an H200; the default target in float32 on this machine at contexts 64 and 8,192.")


DECODE_CEILING = Exercise("decode_ceiling", decode_ceiling, grade_decode_ceiling, HINTS)
