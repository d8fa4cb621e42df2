"""Fast twins of core.model's Linear and RMSNorm for a CPU: the same interface and the same math.

`FastLinear` runs float32 products through the project's panel kernel (build.py,
csrc/panel_matmul.cpp), which reads a copy of W laid out as contiguous column panels: decode's one
row, verification's K+1 and a prefill's chunks alike (over 16 to 256 rows it kept pace with
oneDNN's prepacked product, whose own copy of W it so replaces: docs/benchmarks.md, section 39).
bfloat16 products go through a oneDNN copy of W prepacked once into its blocked layout, where
torch has it. `FastRMSNorm` normalises a few rows in one call. Each copy of W is built on first
use and rebuilt whenever W changes; a float32 weight has one copy, the panels. Neither copy has a
backward, so a weight being trained takes the plain product.

A weight the loader mapped from a file (io/weights.py, the lab's layout of the default target) is
read once, to build its panels, and its pages are then handed back (`release_pages`): the panels are
the only copy that stays in memory, and W stays on disk for whatever reads it later (an export, a
training step, the plain product). A tied model's embeddings are read from the head's panels too.
"""
import ctypes
import mmap

import torch
from torch.utils.weak import WeakIdKeyDictionary

from ..core.model import Linear, RMSNorm
from . import build as kernels

# Private torch APIs, each with a fallback when absent:
# - mkldnn._reorder_linear_weight / _linear_pointwise: oneDNN's prepacked linear (PyTorch's own
#   CPU inference path uses them); without them, products stay `x @ W`.
# - mkldnn._is_mkldnn_bf16_supported: whether oneDNN packs bfloat16 on this processor (AVX-512 BF16
#   or AVX-NE-CONVERT); without it, bfloat16 products stay `x @ W`.
_MKLDNN = getattr(torch.ops, "mkldnn", None)
HAVE_PACKING = torch.backends.mkldnn.is_available() and hasattr(_MKLDNN, "_reorder_linear_weight")
CAN_PACK_BF16 = (HAVE_PACKING and hasattr(_MKLDNN, "_is_mkldnn_bf16_supported")
                 and bool(_MKLDNN._is_mkldnn_bf16_supported()))
PACK_ROWS_HINT = 5  # the row count oneDNN tunes its layout for; it serves any row count

# Each weight's panel copies: {dtype: ((data_ptr, version) of W, panels)}. Kept beside the weight,
# not in a module, so that copying or saving a model copies none of them, and keyed by the weight,
# so that a plain module and its fast twin (which share it), and eager()'s swaps, share them too.
_PANELS = WeakIdKeyDictionary()


def panel_weight(linear: Linear, dtype=torch.float32) -> torch.Tensor:
    """The panel kernel's copy of `linear`'s W (build.pack): float32, or rounded to float16, int8,
    4 bits (torch.uint4) or int8 per group (torch.qint8). Rebuilt when W changes: its storage or
    its version counter (Tensor._version, bumped by every in-place write)."""
    w = linear.weight
    key = (w.data_ptr(), w._version)
    copies = _PANELS.setdefault(w, {})
    cached = copies.get(dtype)
    if cached is None or cached[0] != key:
        cached = copies[dtype] = (key, kernels.pack(w, dtype))
        release_pages(w)
    return cached[1]


MADV_DONTNEED, MADV_PAGEOUT = 4, 21  # Linux's madvise advice values


def _file_mapped(start: int, end: int) -> bool:
    """Whether [start, end) lies inside one mapping of a regular file (/proc/self/maps)."""
    try:
        lines = open("/proc/self/maps").read().splitlines()
    except OSError:
        return False
    for line in lines:
        fields = line.split(maxsplit=5)
        lo, hi = (int(a, 16) for a in fields[0].split("-"))
        if lo <= start and end <= hi:
            return len(fields) == 6 and fields[5].startswith("/") and not fields[5].startswith("/dev/")
    return False


def _all_pages_from_the_file(start: int, end: int) -> bool:
    """Whether no page of [start, end) is the process's own (/proc/self/pagemap): each is either not
    in memory or the file's (bit 61), none swapped out (bit 62). A page written to since the mapping
    was made is a private copy, which dropping would lose."""
    page = mmap.PAGESIZE
    try:
        with open("/proc/self/pagemap", "rb") as f:
            f.seek(start // page * 8)
            entries = torch.frombuffer(bytearray(f.read((end - start) // page * 8)), dtype=torch.int64)
    except OSError:
        return False
    present, swapped = entries < 0, (entries & (1 << 62)) != 0  # bit 63 is the sign bit
    own = present & ((entries & (1 << 61)) == 0)
    return not bool((own | swapped).any())


def release_pages(w: torch.Tensor) -> int:
    """Hand back the resident pages of a CPU tensor that a file mapping backs: the process's memory
    drops by them, and a later read brings them back from the file. Where every page is still the
    file's, madvise(MADV_DONTNEED) drops them from this process even when another process maps the
    same file (two kernels of the lab); a page written to is the process's own, and then the whole
    range only gets MADV_PAGEOUT, which never loses a page (the kernel keeps or swaps it). Memory that
    no file backs is never touched. Returns the bytes advised, 0 where nothing applies (another
    system, a tensor in memory)."""
    if w.device.type != "cpu" or not w.is_contiguous():
        return 0
    page = mmap.PAGESIZE
    start = -(-w.data_ptr() // page) * page
    end = (w.data_ptr() + w.numel() * w.element_size()) // page * page
    if end <= start or not _file_mapped(start, end):
        return 0
    advice = MADV_DONTNEED if _all_pages_from_the_file(start, end) else MADV_PAGEOUT
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return end - start if libc.madvise(start, end - start, advice) == 0 else 0


def uses_kernels(x: torch.Tensor, w: torch.Tensor, max_rows=kernels.MAX_ROWS) -> bool:
    """The kernel library takes this call: float32 on the CPU, at most `max_rows` rows (None: any),
    nothing to differentiate, a library that built, and threads it can use."""
    return (x.dtype == torch.float32 and w.dtype == torch.float32 and w.device.type == "cpu"
            and 0 < x.numel() and (max_rows is None or x.numel() <= max_rows * x.shape[-1])
            and not (w.requires_grad and torch.is_grad_enabled()) and kernels.available()
            and (kernels.threaded() or torch.get_num_threads() == 1))


def can_pack(w: torch.Tensor) -> bool:
    return (HAVE_PACKING and w.device.type == "cpu"
            and (w.dtype == torch.float32 or (w.dtype == torch.bfloat16 and CAN_PACK_BF16)))


class FastLinear(Linear):
    """Linear with the panel kernel for float32 and oneDNN's packed product for bfloat16.
    `packed=False` leaves the bfloat16 products to `x @ W`."""

    def __init__(self, linear: Linear, packed: bool = True):
        torch.nn.Module.__init__(self)  # not Linear's: it would allocate a W to throw away
        self.weight, self.bias = linear.weight, linear.bias  # the same Parameters: nothing is copied
        self.packed = packed
        self._packed, self._packed_key = None, None

    def packed_weight(self):
        w = self.weight
        key = (w.data_ptr(), w._version, w.dtype)
        if self._packed_key != key:
            self._packed = _MKLDNN._reorder_linear_weight(w.detach().t().contiguous(), PACK_ROWS_HINT)
            self._packed_key = key
        return self._packed

    def packed_product(self, x):
        """x @ W through oneDNN's prepacked copy (bias left out), whatever the row count."""
        return _MKLDNN._linear_pointwise(x, self.packed_weight(), None, "none", [None], "")

    def forward(self, x):
        w = self.weight
        if uses_kernels(x, w, max_rows=None):
            y = kernels.matmul(x, panel_weight(self), w.shape[1])
            return y + self.bias if self.bias is not None else y
        if (self.packed and w.dtype == torch.bfloat16 and can_pack(w) and x.dtype == w.dtype
                and not (w.requires_grad and torch.is_grad_enabled())):
            bias = None if self.bias is None else self.bias.detach()
            return _MKLDNN._linear_pointwise(x, self.packed_weight(), bias, "none", [None], "")
        return super().forward(x)

    def columns(self, idx):
        """Linear.columns from the float32 panels, where the product reads them: column n of W is lane
        n % PW of panel n // PW. The same values as W's, without a read of W."""
        w = self.weight
        if not uses_kernels(w[:1], w, max_rows=None):
            return super().columns(idx)
        panels = panel_weight(self)  # (ceil(N / PW), K, PW)
        pw = panels.shape[2]
        return panels[idx // pw, :, idx % pw]  # (*idx.shape, K)


class FastRMSNorm(RMSNorm):
    """RMSNorm over a few float32 rows in one call into the kernel library."""

    def __init__(self, norm: RMSNorm):
        torch.nn.Module.__init__(self)
        self.eps, self.weight = norm.eps, norm.weight

    def forward(self, x):
        if uses_kernels(x, self.weight):
            return kernels.rms_norm(x, self.weight, self.eps)
        return super().forward(x)
