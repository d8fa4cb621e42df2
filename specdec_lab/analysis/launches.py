"""Kernel launches per forward, counted on the meta device: what a GPU would be asked to run.

On a GPU, eager PyTorch launches at least one kernel per aten operation that computes
something, and each launch costs host time (Python, the dispatcher, the driver) whether
the kernel reads 15 GB or 15 bytes. At batch 1 a decoder's forward is hundreds of small
kernels, so that fixed cost can exceed the time the weights take to stream. Counting the
operations needs no GPU: a model built on the meta device has shapes and no data, and a
dispatch mode sees every aten call its forward makes.

The count is of aten operations that produce new data. Views (a `view`, `transpose`, a
slice) and aliases only change a tensor's metadata and launch nothing. The count is a
floor for the eager path: a cuBLAS product may launch two kernels, and a fused kernel
(torch.compile, FlashAttention) replaces several operations with one.
"""
from collections import Counter
from dataclasses import dataclass

import torch
# TorchDispatchMode is PyTorch's documented hook for seeing aten calls ("Extending PyTorch");
# it lives in a module with a leading underscore and has no public alias.
from torch.utils._python_dispatch import TorchDispatchMode

from ..core.config import ModelConfig
from ..core.kv_cache import KVCache
from ..core.model import Transformer

# aten operations that allocate or relabel memory without running a kernel.
NO_KERNEL = frozenset({"aten.empty", "aten.empty_strided", "aten._unsafe_view", "aten.detach", "aten.alias",
                       "aten.lift_fresh", "aten.view", "aten._reshape_alias"})


class _CountOps(TorchDispatchMode):
    """Records the aten operation behind every dispatched call."""

    def __init__(self):
        super().__init__()
        self.ops = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[func] += 1
        return func(*args, **(kwargs or {}))


def launches_kernel(op) -> bool:
    """Whether an aten overload computes data (a kernel on a GPU) rather than making a view."""
    return not op.is_view and str(op.overloadpacket) not in NO_KERNEL


@dataclass(frozen=True)
class LaunchCount:
    tokens: int  # T: new tokens in the forward
    launches: int  # aten operations that would launch a kernel
    views: int  # operations that only made views or aliases
    by_op: dict  # launches per aten operation, largest first


def _count(model, tokens, context) -> LaunchCount:
    cache = KVCache.for_model(model.cfg, context + tokens, device="meta")
    cache.length = context  # the cache's state is its length; the meta tensors hold no data to fill
    x = torch.zeros(1, tokens, dtype=torch.long, device="meta")  # (B, T)
    with _CountOps() as counter:
        model(x, cache=cache)
    return _tally(counter.ops, tokens)


def _tally(ops, tokens) -> LaunchCount:
    launched, views = Counter(), 0
    for op, n in ops.items():
        if launches_kernel(op):
            launched[str(op.overloadpacket)] += n
        else:
            views += n
    return LaunchCount(tokens, sum(launched.values()), views, dict(launched.most_common()))


def count_call_launches(fn, *args, **kwargs) -> LaunchCount:
    """Kernel launches of one eager call fn(*args, **kwargs), counted as count_launches counts
    a forward's (tokens is 0: the call is not a forward). The arguments may live on any device;
    a host read (`int(t)`, `.item()`) counts as the copy it launches."""
    if not callable(fn):
        raise ValueError(f"fn must be callable, got {fn!r}")
    with torch.no_grad(), _CountOps() as counter:
        fn(*args, **kwargs)
    return _tally(counter.ops, 0)


def count_launches(cfg: ModelConfig, k: int = 4, context: int = 128) -> dict[int, LaunchCount]:
    """Kernel launches of the eager forward of a `cfg`-shaped Transformer, built on the meta
    device (no memory, no weights), after `context` cached positions: one T=1 forward (a
    decode step, or a draft forward) and one T=K+1 forward (a verification pass).
    Returns {1: LaunchCount, K+1: LaunchCount}."""
    if not isinstance(cfg, ModelConfig):
        raise ValueError(f"cfg must be a ModelConfig, got {cfg!r}")
    for name, v, low in (("k", k, 1), ("context", context, 0)):
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise ValueError(f"{name} must be an int >= {low}, got {v!r}")
    with torch.device("meta"):
        model = Transformer(cfg).eval()
    with torch.no_grad():
        return {t: _count(model, t, context) for t in (1, k + 1)}
