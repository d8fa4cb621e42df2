"""A hand-written CPU kernel for the few-row float32 products of decode and verification.

`csrc/panel_matmul.cpp` computes y = x @ W for x of 1..RB rows (more in further passes)
with W repacked once into contiguous column panels, so that the product reads the
weight in address order. On this project's 2-core machine, one thread, one run of
`python -m specdec_lab bench --kernels` measured the narrow products of the default
target (576 x 576, 1536 x 576) at 19.0 and 24.5 GB/s for one row, where PyTorch's kernel
reached 12.1 and 12.4 and oneDNN's packed one 11.5 and 14.3; for the 5 rows of a K = 4
verification, 16.4 and 21.7 against oneDNN's 13.0 and 18.2. (Runs differ by up to a
third on this shared machine; the order of the kernels has not.) The file says how it works.
RMSNorm over the same few rows is in the library too: one call instead of several operators.
So is `forward_rows`, a whole decoder's forward over a few rows in one call (fused.FusedForward):
a small draft's eager forward is the cost of launching some 200 operator calls, and even the
default target spent about a quarter of an eager one-token forward on its 450 operator calls. Its
weights can also be read rounded to float16 (`forward_rows_half`, F16C), to int8 with a scale
per output column (`forward_rows_int8`, AVX2), or to 4 bits with a scale and offset per column and
group of 32 inputs (`forward_rows_int4`, AVX2 and F16C; the head in int8 with a scale per group): the
target itself, read that way, is its own draft in self_draft.py.

It is compiled on first use with the C++ compiler at hand ($CXX, c++, g++ or clang++)
into $SPECDEC_LAB_CACHE/kernels/, keyed by a hash of the source, the compiler, the flags,
the torch version and the processor, and loaded with ctypes: no build step at install time, nothing
to do for a user. The first build links against torch's ATen and OpenMP runtime, so
products split over torch's own threads; where that fails a serial build runs on the
calling thread, and where no build works, or SPECDEC_LAB_KERNELS=0, `available()` is
False and `accelerate` leaves the model's products to PyTorch.
"""
import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path

import torch

from ..core.config import cache_dir

SOURCE = Path(__file__).parent / "csrc" / "panel_matmul.cpp"
# The rows one call of the one-call forward (fused.FusedForward.__call__) and FastRMSNorm take. The
# panel product takes any number: over 16 to 256 rows of the default target's products, one thread,
# it kept pace with oneDNN's prepacked GEMM (docs/benchmarks.md, section 39), so a prefill's products
# go through it too, and no second copy of W is packed for them.
MAX_ROWS = 16


def _flag_sets():
    """Compiler flags to try in turn: threaded through torch's ATen, then serial, native then generic."""
    torch_dir = Path(torch.__file__).parent
    common = ["-O3", "-ffp-contract=fast", "-std=c++17", "-shared", "-fPIC"]
    threaded = ["-march=native", "-fopenmp", f"-I{torch_dir / 'include'}",
                f"-D_GLIBCXX_USE_CXX11_ABI={int(torch.compiled_with_cxx11_abi())}",
                f"-L{torch_dir / 'lib'}", "-ltorch_cpu", "-lc10", f"-Wl,-rpath,{torch_dir / 'lib'}"]
    return [common + threaded, common + ["-march=native", "-DSPECDEC_LAB_SERIAL"], common + ["-DSPECDEC_LAB_SERIAL"]]


_lib = None
_tried = False
_threaded = False



def _compiler():
    cxx = (os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or shutil.which("clang++"))
    if cxx is None:
        raise RuntimeError("no C++ compiler found (set CXX)")
    return cxx


def _cpu_id() -> str:
    """What -march=native compiles for: a library built on one processor may not run on another."""
    try:
        info = Path("/proc/cpuinfo").read_text()
        return "|".join(sorted({line for line in info.splitlines() if line.startswith(("model name", "flags"))}))
    except OSError:
        return f"{platform.machine()}|{platform.processor()}"


def build(cache=None) -> Path:
    """Compile the kernel (once per source, compiler, flags, torch and processor) and return the library's path."""
    cxx, src = _compiler(), SOURCE.read_bytes()
    errors = []
    for flags in _flag_sets():
        key = hashlib.sha256(src + "|".join([cxx, torch.__version__, _cpu_id(), *flags]).encode()).hexdigest()[:16]
        out = Path(cache or cache_dir() / "kernels") / f"panel_matmul-{key}.so"
        if out.exists():
            return out
        out.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
            tmp_out = Path(tmp) / out.name
            r = subprocess.run([cxx, str(SOURCE), "-o", str(tmp_out), *flags], capture_output=True, text=True)
            if r.returncode == 0:
                os.replace(tmp_out, out)  # atomic: a concurrent build loses nothing
                return out
            errors.append(f"{cxx} {' '.join(flags)}: {r.stderr.strip()[:400]}")
    raise RuntimeError("could not compile " + SOURCE.name + ":\n" + "\n".join(errors))


def _load():
    global _lib, _tried
    if _tried:
        return _lib
    _tried = True
    if os.environ.get("SPECDEC_LAB_KERNELS", "1") == "0":
        return None
    try:
        lib = ctypes.CDLL(str(build()))
    except (OSError, RuntimeError) as e:  # OSError: built, but the loader refused it
        warnings.warn(f"specdec_lab: the panel kernel is unavailable, PyTorch's kernels are used ({e})")
        return None
    lib.panel_matmul.restype = None
    lib.panel_matmul.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p,
                                 ctypes.c_long, ctypes.c_long]
    lib.panel_width.restype = ctypes.c_long
    lib.panel_threaded.restype = ctypes.c_long
    lib.rms_norm.restype = None
    lib.rms_norm.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_float,
                             ctypes.c_void_p]
    decode_args = ([ctypes.c_void_p, ctypes.c_long, ctypes.c_long] + [ctypes.c_void_p] * 6  # rows, R, layers
                   + [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long]  # final norm, head, n_out
                   + [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long, ctypes.c_long]  # caches, their strides
                   + [ctypes.c_void_p] * 5 + [ctypes.c_long]  # pos, write, start, count, keys; max_keys
                   + [ctypes.c_void_p, ctypes.c_long]  # mask, its columns
                   + [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long]  # cos, sin, their rows
                   + [ctypes.c_long] * 5 + [ctypes.c_float]  # dim, H, Hkv, D, I, eps
                   + [ctypes.c_void_p, ctypes.c_long, ctypes.c_void_p]  # taps, n_taps, tap_out
                   + [ctypes.c_void_p, ctypes.c_void_p])  # work, logits
    lib.forward_work.restype = ctypes.c_long
    lib.forward_work.argtypes = [ctypes.c_long] * 8
    for name in ("forward_rows", "forward_rows_half", "forward_rows_int8", "forward_rows_int4"):
        if hasattr(lib, name):  # half where the compiler targets F16C, int8 AVX2, int4 both
            getattr(lib, name).restype = ctypes.c_long  # 0, or 1 + the first row whose position is off the tables
            getattr(lib, name).argtypes = decode_args
    if hasattr(lib, "feature_input_half"):
        lib.feature_input_half.restype = None
        lib.feature_input_half.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_float, ctypes.c_void_p, ctypes.c_long,
                                                                    ctypes.c_void_p, ctypes.c_void_p]
    global _threaded
    _threaded = bool(lib.panel_threaded())
    _lib = lib
    return lib


def available() -> bool:
    return _load() is not None


def threaded() -> bool:
    """True when products split over torch's threads (torch.set_num_threads), False when serial."""
    return available() and _threaded


def panel_width() -> int:
    return _load().panel_width()


def _aligned(numel: int, dtype) -> torch.Tensor:
    """An empty 1-D tensor whose first element starts a 64-byte cache line."""
    size = torch.tensor([], dtype=dtype).element_size()
    buf = torch.empty(numel + 64 // size, dtype=dtype)
    off = (-buf.data_ptr() // size) % (64 // size)
    return buf[off:off + numel]


def pack(w: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """W (K, N) float32 -> panels (ceil(N / PW), K, PW), zero-padded on the right, 64-byte aligned.
    dtype=torch.float16 rounds the panels to half precision (forward_rows_half reads them).
    dtype=torch.int8 returns (ceil(N / PW), K * PW + 4 * PW) bytes: each panel's weights rounded to
    int8 against a scale per column (the column's largest magnitude / 127), then the PW float32
    scales (forward_rows_int8 reads them); `unpack_int8` gives back the weights they stand for.
    dtype=torch.uint4 returns (ceil(N / PW), K / 32 * 640) bytes: 4-bit weights with a half-precision
    scale and offset per column and group of INT4_GROUP inputs (the layout is in csrc/panel_matmul.cpp;
    forward_rows_int4 reads it, `unpack_int4` gives back the weights); K must be a multiple of 32.
    dtype=torch.qint8 returns (ceil(N / PW), K / 32 * 1088) bytes: int8 weights with a half-precision
    scale per column and group of 32 inputs (forward_rows_int4's head; `unpack_q8`)."""
    if w.dtype != torch.float32 or w.dim() != 2 or w.device.type != "cpu":
        raise ValueError(f"w must be a 2-D float32 CPU tensor, got {tuple(w.shape)} {w.dtype} on {w.device}")
    if dtype not in (torch.float32, torch.float16, torch.int8, torch.uint4, torch.qint8):
        raise ValueError(f"dtype must be torch.float32, torch.float16, torch.int8, torch.uint4 or torch.qint8, "
                         f"got {dtype}")
    if dtype in (torch.uint4, torch.qint8) and (w.shape[0] % INT4_GROUP or w.shape[0] > INT4_MAX_K):
        raise ValueError(f"a weight packed in groups ({dtype}) needs a multiple of {INT4_GROUP} inputs, "
                         f"at most {INT4_MAX_K}, got {w.shape[0]}")
    pw = panel_width()
    K, N = w.shape
    n_pad = -N % pw
    w = torch.nn.functional.pad(w.detach(), (0, n_pad)) if n_pad else w.detach().contiguous()
    n_panels = (N + n_pad) // pw
    by_panel = w.view(K, n_panels, pw).transpose(0, 1)  # (panels, K, PW)
    if dtype == torch.uint4:
        return _pack_int4(by_panel)
    if dtype == torch.qint8:
        return _pack_q8(by_panel)
    if dtype == torch.int8:
        scale = by_panel.abs().amax(1) / 127.0  # (panels, PW)
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # an all-zero column stays zero
        q = torch.round(by_panel / scale[:, None]).clamp_(-127, 127).to(torch.int8)  # (panels, K, PW)
        out = _aligned(n_panels * (K * pw + 4 * pw), torch.int8).view(n_panels, K * pw + 4 * pw)
        out[:, :K * pw] = q.reshape(n_panels, K * pw)
        out[:, K * pw:] = scale.contiguous().view(torch.int8)  # the scales' bytes
        return out
    panels = _aligned(K * n_pad + K * N, dtype).view(n_panels, K, pw)
    panels.copy_(by_panel)
    return panels


def unpack_int8(packed: torch.Tensor, K: int, N: int) -> torch.Tensor:
    """The float32 W (K, N) that pack(w, torch.int8)'s bytes stand for: scale times the int8 weight."""
    pw = panel_width()
    q = packed[:, :K * pw].reshape(-1, K, pw).float()
    scale = packed[:, K * pw:].contiguous().view(torch.float32)  # (panels, PW)
    return (q * scale[:, None]).transpose(0, 1).reshape(K, -1)[:, :N]


INT4_GROUP = 32  # inputs per scale and offset in a 4-bit panel
INT4_MAX_K = 16384  # inputs the 4-bit product takes (it rounds x into a buffer on the stack)
_INT4_BYTES = INT4_GROUP * INT4_GROUP // 2 + 4 * INT4_GROUP  # a group: the 4-bit weights, then d and m


def _pack_int4(by_panel: torch.Tensor) -> torch.Tensor:
    """(panels, K, PW) float32 -> the 4-bit panels: per column and group of 32 inputs, the offset m is
    the group's smallest weight and the scale d spreads the range over 0..15 (both rounded to half
    precision first, so that Q is fitted to the d and m the kernel reads). A weight matrix that was
    stored that way (Q4_1) comes back exactly wherever a group holds both its 0 and its 15."""
    n_panels, K, pw = by_panel.shape
    G = K // INT4_GROUP
    blocks = by_panel.reshape(n_panels, G, INT4_GROUP, pw)
    lo, hi = blocks.amin(2), blocks.amax(2)  # (panels, G, PW)
    m = lo.half()
    d = ((hi - m.float()) / 15).half()
    d = torch.where(d > 0, d, torch.ones_like(d))  # a constant group: every Q is 0
    q = torch.round((blocks - m.float()[:, :, None]) / d.float()[:, :, None]).clamp_(0, 15).to(torch.uint8)
    # a pair of inputs (k, k + 1) is 8 32-bit lanes; lane i holds columns i, 8 + i, 16 + i, 24 + i in
    # 4-bit steps, k in its low 16 bits and k + 1 in its high 16 bits (csrc/panel_matmul.cpp)
    pairs = q.view(n_panels, G, INT4_GROUP // 2, 2, 4, pw // 4)  # (.., pair, k or k + 1, 8-column block j, i)
    lo, hi = pairs[:, :, :, :, 0] | (pairs[:, :, :, :, 1] << 4), pairs[:, :, :, :, 2] | (pairs[:, :, :, :, 3] << 4)
    nibbles = torch.stack([lo, hi], -1).transpose(3, 4)  # (.., pair, i, k or k + 1, low or high byte)
    out = _aligned(n_panels * G * _INT4_BYTES, torch.uint8).view(n_panels, G, _INT4_BYTES)
    half = INT4_GROUP * INT4_GROUP // 2
    out[:, :, :half] = nibbles.reshape(n_panels, G, half)
    out[:, :, half:half + 2 * pw] = d.contiguous().view(torch.uint8)
    out[:, :, half + 2 * pw:] = m.contiguous().view(torch.uint8)
    return out.view(n_panels, G * _INT4_BYTES)


def unpack_int4(packed: torch.Tensor, K: int, N: int) -> torch.Tensor:
    """The float32 W (K, N) that pack(w, torch.uint4)'s bytes stand for: d * Q + m."""
    pw, G = panel_width(), K // INT4_GROUP
    g = packed.view(-1, G, _INT4_BYTES)
    half = INT4_GROUP * INT4_GROUP // 2
    b = g[:, :, :half].reshape(-1, G, INT4_GROUP // 2, pw // 4, 2, 2)  # (.., pair, i, k or k + 1, byte)
    q = torch.stack([b[..., 0] & 15, b[..., 0] >> 4, b[..., 1] & 15, b[..., 1] >> 4], -1)  # (.., i, k, j)
    q = q.permute(0, 1, 2, 4, 5, 3).reshape(-1, G, INT4_GROUP, pw).float()  # (.., pair, k, j, i) -> columns 8 j + i
    d = g[:, :, half:half + 2 * pw].contiguous().view(torch.float16).float()
    m = g[:, :, half + 2 * pw:].contiguous().view(torch.float16).float()
    w = q * d[:, :, None] + m[:, :, None]  # (panels, G, 32, PW)
    return w.reshape(-1, K, pw).transpose(0, 1).reshape(K, -1)[:, :N]


_Q8_BYTES = INT4_GROUP * INT4_GROUP + 2 * INT4_GROUP  # a group: the int8 weights in pairs of inputs, then d


def _pack_q8(by_panel: torch.Tensor) -> torch.Tensor:
    """(panels, K, PW) float32 -> int8 panels with a scale per column and group of 32 inputs: d is the
    group's largest magnitude / 127, rounded to half precision first. Weights stored that way (Q8_0)
    come back exactly."""
    n_panels, K, pw = by_panel.shape
    G = K // INT4_GROUP
    blocks = by_panel.reshape(n_panels, G, INT4_GROUP, pw)
    d = (blocks.abs().amax(2) / 127).half()
    d = torch.where(d > 0, d, torch.ones_like(d))  # an all-zero group stays zero
    q = torch.round(blocks / d.float()[:, :, None]).clamp_(-127, 127).to(torch.int8)
    pairs = q.view(n_panels, G, INT4_GROUP // 2, 2, pw).transpose(3, 4)  # (.., pair, column, k or k + 1)
    out = _aligned(n_panels * G * _Q8_BYTES, torch.int8).view(n_panels, G, _Q8_BYTES)
    body = INT4_GROUP * INT4_GROUP
    out[:, :, :body] = pairs.reshape(n_panels, G, body)
    out[:, :, body:] = d.contiguous().view(torch.int8)
    return out.view(n_panels, G * _Q8_BYTES)


def unpack_q8(packed: torch.Tensor, K: int, N: int) -> torch.Tensor:
    """The float32 W (K, N) that pack(w, torch.qint8)'s bytes stand for: d * Q."""
    pw, G = panel_width(), K // INT4_GROUP
    g = packed.view(-1, G, _Q8_BYTES)
    body = INT4_GROUP * INT4_GROUP
    q = g[:, :, :body].reshape(-1, G, INT4_GROUP // 2, pw, 2).transpose(3, 4).reshape(-1, G, INT4_GROUP, pw)
    d = g[:, :, body:].contiguous().view(torch.float16).float()
    w = q.float() * d[:, :, None]
    return w.reshape(-1, K, pw).transpose(0, 1).reshape(K, -1)[:, :N]


def matmul(x: torch.Tensor, panels: torch.Tensor, n: int) -> torch.Tensor:
    """x (..., K) float32 @ the packed W -> (..., n). x's leading dimensions are the rows."""
    n_panels, K, pw = panels.shape
    if x.shape[-1] != K:
        raise ValueError(f"x has {x.shape[-1]} features; the packed weight expects {K}")
    rows = x.numel() // K
    x2 = x.reshape(rows, K).contiguous()
    y = torch.empty(rows, n_panels * pw, dtype=torch.float32)
    _lib.panel_matmul(x2.data_ptr(), rows, panels.data_ptr(), y.data_ptr(), K, n_panels * pw)
    if n != n_panels * pw:
        y = y[:, :n]
    return y.view(*x.shape[:-1], n)


def forward_rows(*args):
    """A few rows through a whole decoder (csrc/panel_matmul.cpp, `forward_rows`);
    fused.FusedForward gathers the arguments."""
    return _load().forward_rows(*args)


def forward_work(rows: int, dim: int, n_heads: int, n_kv_heads: int, head_dim: int, intermediate: int,
                 max_keys: int, threads: int) -> int:
    """Floats of work buffer that forward_rows needs for `rows` rows attending over at most `max_keys`
    keys each, on `threads` threads."""
    return _load().forward_work(rows, dim, n_heads, n_kv_heads, head_dim, intermediate, max_keys, threads)


def has_half() -> bool:
    """Whether the library was built with forward_rows_half (a compiler targeting F16C)."""
    return available() and hasattr(_lib, "forward_rows_half")


def forward_rows_half(*args):
    """forward_rows over half-precision panels (kernels.pack(w, torch.float16))."""
    return _load().forward_rows_half(*args)


def has_int8() -> bool:
    """Whether the library was built with forward_rows_int8 (a compiler targeting AVX2)."""
    return available() and hasattr(_lib, "forward_rows_int8")


def forward_rows_int8(*args):
    """forward_rows over int8 panels with a scale per column (kernels.pack(w, torch.int8))."""
    return _load().forward_rows_int8(*args)


def has_int4() -> bool:
    """Whether the library was built with forward_rows_int4 (a compiler targeting AVX2 and F16C)."""
    return available() and hasattr(_lib, "forward_rows_int4")


def forward_rows_int4(*args):
    """forward_rows with the layers' products over 4-bit panels (kernels.pack(w, torch.uint4)) and the
    head over int8 ones with a scale per group of 32 inputs (kernels.pack(w, torch.qint8))."""
    return _load().forward_rows_int4(*args)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dimension of a float32 CPU x, one call for all its rows."""
    D = x.shape[-1]
    if weight.shape != (D,):
        raise ValueError(f"weight must have shape ({D},), got {tuple(weight.shape)}")
    x2 = x.contiguous()
    y = torch.empty_like(x2)
    _lib.rms_norm(x2.data_ptr(), x2.numel() // D, D, weight.contiguous().data_ptr(), eps, y.data_ptr())
    return y
