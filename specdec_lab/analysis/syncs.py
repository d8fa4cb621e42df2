"""Counting host synchronisations from the outside.

A host synchronisation is any point where the host waits for the device: Python needs a
tensor's value (`.item()`, `.tolist()`, `int(t)`, `float(t)`, `if t:`, `.nonzero()`,
`.cpu()`, `torch.equal`, boolean-mask indexing, whose result's size is data), or a tensor is
made from Python data or copied between devices (on CUDA a blocking copy, which waits for
everything queued before it). A loop that makes one per draft token pays K round trips per
step. On a CPU the same calls are cheap, but they are the same calls: counting them here
predicts the stalls on a GPU.

`count_host_syncs()` counts them with a TorchFunctionMode, which sees every torch function,
factory and Tensor method called inside its `with` block, so the count does not rely on the
code under test reporting itself honestly (compare the `syncs=` argument of
`verify_reference`, which does report itself). `count_cuda_syncs` asks CUDA itself.

    with count_host_syncs() as syncs:
        verdict = verify(draft_ids, p, q, u, e)
    syncs.count   # 0: nothing left the device
    syncs.calls   # the names, in call order
"""
import warnings

import torch
from torch.overrides import TorchFunctionMode

# Tensor methods and torch functions whose result is a Python value read from the tensor's memory,
# or whose result's size depends on the data.
SYNC_NAMES = frozenset({
    "item", "tolist", "__int__", "__float__", "__bool__", "__index__", "__complex__",
    "nonzero", "cpu", "numpy", "equal", "allclose", "is_nonzero", "masked_select", "unique",
})
# Factories that copy Python data (a list, a number) from the host into a new tensor.
FROM_HOST = frozenset({"tensor", "as_tensor", "asarray"})


def _device_of(args, kwargs):
    for a in list(args[1:]) + [kwargs.get("device")]:
        if isinstance(a, (str, torch.device)):
            return torch.device(a)
    return None


def _sync_name(func, args, kwargs):
    """The name under which a call is a host sync, or None."""
    name = getattr(func, "__name__", "")
    if name in SYNC_NAMES:
        return name
    if name in FROM_HOST and args and not isinstance(args[0], torch.Tensor):
        return f"{name}(host data)"
    if name in ("to", "cuda") and args and isinstance(args[0], torch.Tensor):
        device = torch.device("cuda") if name == "cuda" else _device_of(args, kwargs)
        if device is not None and device.type != args[0].device.type:
            return f"{name}({device.type})"
    if name == "__getitem__" and len(args) > 1:
        index = args[1] if isinstance(args[1], tuple) else (args[1],)
        if any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in index):
            return "__getitem__(bool mask)"
    return None


class count_host_syncs(TorchFunctionMode):
    """Context manager: counts host reads of tensor values inside its block (see module docstring)."""

    def __init__(self):
        super().__init__()
        self.calls = []  # names of the syncing calls, in order

    @property
    def count(self) -> int:
        return len(self.calls)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = _sync_name(func, args, kwargs)
        if name is not None:
            self.calls.append(name)
        return func(*args, **kwargs)


def is_sync_free(fn, *args, **kwargs) -> bool:
    """True when calling fn(*args, **kwargs) reads no tensor value on the host."""
    with count_host_syncs() as syncs:
        fn(*args, **kwargs)
    return syncs.count == 0


def count_cuda_syncs(fn):
    """(fn(), n): the host synchronisations CUDA itself reports while fn runs (torch's sync debug
    mode warns at each one: .item(), .tolist(), a blocking copy). n is None without CUDA."""
    if not torch.cuda.is_available():
        return fn(), None
    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            out = fn()
        finally:
            torch.cuda.set_sync_debug_mode(previous)
    return out, sum("synchroniz" in str(w.message) for w in caught)
