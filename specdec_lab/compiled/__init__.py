"""Fixed shapes and torch.compile, applied to a model from outside (as cpu/ applies the CPU's
fast path): `use_static_shapes(model, compile=...)` installs a StaticRows runner in place;
`compiled_twin(model)` gives a twin that shares the weights and leaves the model as it was.

    twin = compiled_twin(model, rows=(1, 5))   # target: decode and K + 1 = 5 rows compiled
    draft = compiled_twin(draft, rows=(1,))    # draft: one row, always
    twin.forward_kind                          # "compiled"
    graph_counts()                             # graphs compiled and CUDA graph skips so far
"""
import copy

from ..core.model import Transformer
from .cache import StaticKVCache
from .runner import COMPILE_MODES, MAX_ROWS, StaticRows, static_forward

__all__ = ["StaticKVCache", "StaticRows", "static_forward", "use_static_shapes", "compiled_twin",
           "graph_counts", "COMPILE_MODES", "MAX_ROWS"]


def use_static_shapes(model, compile=False, mode=None, rows=None, capacity=2048):
    """Install fixed shapes on `model` in place (and torch.compile with compile=True): the engine,
    the drafters and the autoregressive baseline then make static caches for it (model.new_cache).
    mode: None is "reduce-overhead" (CUDA graphs) on CUDA and inductor's default on the CPU.
    rows: the row counts to compile (see runner.py); capacity: the slots every cache has."""
    if not isinstance(model, Transformer):
        raise TypeError(f"model must be a specdec_lab Transformer, got {type(model).__name__}")
    if not isinstance(compile, bool):
        raise TypeError(f"compile must be True or False, got {compile!r}")
    if model.runner is not None:
        raise ValueError(f"use_static_shapes needs a plain model, and this one runs {model.forward_kind!r} "
                         "(load_pair(..., accelerate=False) or cpu.unaccelerate(model) gives one)")
    model.runner = StaticRows(model, compile=compile, mode=mode, rows=rows, capacity=capacity)
    return model


def compiled_twin(model, mode=None, rows=None, capacity=2048):
    """A shallow copy of a plain model (the same modules and weights) with static shapes and
    torch.compile, so the model itself stays as it was."""
    if not isinstance(model, Transformer):
        raise TypeError(f"model must be a specdec_lab Transformer, got {type(model).__name__}")
    return use_static_shapes(copy.copy(model), compile=True, mode=mode, rows=rows, capacity=capacity)


def graph_counts() -> dict:
    """What torch has compiled in this process so far: `graphs` (dynamo's unique graphs) and
    `cudagraph_skips` (graphs that reduce-overhead ran without a CUDA graph). Read before and
    after a window: the difference is what compiled, or fell back, inside it."""
    from torch._dynamo.utils import counters  # no public counter exists; these are what torch logs
    return {"graphs": int(counters["stats"]["unique_graphs"]),
            "cudagraph_skips": int(counters["inductor"]["cudagraph_skips"])}
