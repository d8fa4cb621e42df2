"""The decoder's forward over ragged rows: every row at its own positions, attention through a view.

`hidden(model, view, tokens)` runs the model's own forward (core/model.py) over tokens (B, T)
with the view's positions (B, T) and mask (B, 1, T, S): the rotary tables are indexed by a row
of positions per sequence, and each layer's attention is the view's `attend`, which stores the
new keys and values in each sequence's own memory. A runner installed on the model (the CPU's
one-call forward, the compiled path) declines a batched view with an explicit mask, so the
eager code runs, with whatever Linear modules the model has (the CPU's fast twins included).
"""
import torch


def hidden(model, view, tokens: torch.Tensor) -> torch.Tensor:
    """tokens (B, T) int64 on the model's device -> final states (B, T, dim); commits each row's
    real tokens."""
    return model.hidden(tokens, view.input_pos(), view, view.mask(model.dtype))
