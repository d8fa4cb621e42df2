"""The one seam for CPU speed: `accelerate(model)` makes a decoder fast on a CPU, from outside.

As gpt-fast quantises by swapping modules and compiles at its entry point, nothing in
core/model.py knows about any of this. `accelerate` swaps every `Linear` and `RMSNorm` for
its fast twin (linear.py: the same Parameters, no copy) and installs, as the model's `runner`,
a forward over a few rows in one call (fused.FusedRows). Where the kernel library
did not build, or the model is not float32 on the CPU, only what applies is done; the
outputs are the eager model's to rounding either way. `eager(model)` undoes it for the
length of a `with` block, to compare the two side by side.

    model = accelerate(model)                      # in place
    draft = accelerate(draft, weights="float16")   # a draft's one-call forward reads half precision
    fast = accelerated(model)                      # a fast twin sharing the weights; model stays plain
    with eager(model):
        ...                                        # the plain PyTorch forward
"""
import copy
import itertools
from contextlib import contextmanager

import torch

from ..core.model import Linear, RMSNorm
from .fused import FusedForward, FusedRows
from .linear import FastLinear, FastRMSNorm

WEIGHTS = ("float32", "float16")


def _check(model, weights, fused, packed):
    if not (hasattr(model, "layers") and hasattr(model, "runner")):
        raise TypeError(f"model must be a specdec_lab Transformer, got {type(model).__name__}")
    if weights not in WEIGHTS:
        raise ValueError(f"weights must be one of {WEIGHTS}, got {weights!r}")
    for name, value in (("fused", fused), ("packed", packed)):
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be True or False, got {value!r}")


def accelerate(model, weights="float32", fused=True, packed=True):
    """Swap in the CPU's fast modules, once; returns the model. `weights="float16"`: the one-call
    forward reads the products' weights rounded to half precision (for a draft, whose weights
    stream from memory at every token; where the library lacks it, float32). `fused=False`: no
    one-call forward; `packed=False`: no oneDNN prepacking (what each costs: bench --profile)."""
    _check(model, weights, fused, packed)
    if model.runner is not None and not isinstance(model.runner, FusedRows):
        raise ValueError(f"accelerate needs a plain model, and this one runs {model.forward_kind!r}")
    if model.device.type != "cpu":
        return model
    fast_modules(model, packed)
    if weights == "float16" and not FusedForward.supports(model, "float16"):
        weights = "float32"
    model.runner = FusedRows(model, weights) if fused and FusedForward.supports(model, weights) else None
    return model


def fast_modules(model, packed=True):
    """Only the module swap: every `Linear` and `RMSNorm` in `model` (any nn.Module) for its fast
    twin, in place; no one-call forward. For a model whose blocks are not the decoder's (the
    EAGLE-3 draft's layer). Returns the model."""
    for module in list(model.modules()):
        for name, child in module.named_children():
            if type(child) is Linear:
                setattr(module, name, FastLinear(child, packed=packed))
            elif type(child) is RMSNorm:
                setattr(module, name, FastRMSNorm(child))
    return model


def accelerated(model, weights="float32", fused=True, packed=True):
    """A second model that shares `model`'s weights (no copy), made fast; `model` stays as it is.
    load_pair gives out these, so that one process can hold a plain and a fast forward of one model."""
    _check(model, weights, fused, packed)
    shared = {id(t): t for t in itertools.chain(model.parameters(), model.buffers())}
    tokenizer = getattr(model, "tokenizer", None)
    shared[id(tokenizer)] = tokenizer
    return accelerate(copy.deepcopy(model, shared), weights, fused, packed)


def is_accelerated(model) -> bool:
    return isinstance(model.runner, FusedRows) or any(isinstance(m, (FastLinear, FastRMSNorm)) for m in model.modules())


def unaccelerate(model):
    """Put the plain modules back and clear the seam; returns the model."""
    for module in list(model.modules()):
        for name, child in module.named_children():
            if isinstance(child, FastLinear):
                plain = Linear.__new__(Linear)
                torch.nn.Module.__init__(plain)
                plain.weight, plain.bias = child.weight, child.bias
                setattr(module, name, plain)
            elif isinstance(child, FastRMSNorm):
                plain = RMSNorm.__new__(RMSNorm)
                torch.nn.Module.__init__(plain)
                plain.eps, plain.weight = child.eps, child.weight
                setattr(module, name, plain)
    if isinstance(model.runner, FusedRows):
        model.runner = None
    return model


@contextmanager
def eager(model):
    """The plain PyTorch forward inside the block; the model as it was afterwards."""
    rows = model.runner if isinstance(model.runner, FusedRows) else None
    swapped = {n: type(m) for n, m in model.named_modules() if isinstance(m, (FastLinear, FastRMSNorm))}
    packed = next((m.packed for m in model.modules() if isinstance(m, FastLinear)), True)
    unaccelerate(model)
    try:
        yield model
    finally:
        if swapped or rows is not None:
            accelerate(model, weights=rows.weights if rows is not None else "float32",
                       fused=rows is not None, packed=packed)
