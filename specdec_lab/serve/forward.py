"""The decoder's forward over ragged rows: every row at its own positions, attention through a view.

`hidden(model, view, tokens)` and `logits(...)` run the model's own forward (core/model.py) over
tokens (B, T) with the view's positions (B, T) and mask (B, 1, T, S): the rotary tables are indexed
by a row of positions per sequence, and each layer's attention is the view's `attend`, which stores
the new keys and values in each sequence's own memory. The CPU's one-call forward (cpu/fused.py)
takes the view's real rows as they lie instead (`BatchView.fused_layout`): every row of every
sequence in one call, padding left out, each row's result bit for bit what it is alone. Where it
does not apply (a GPU, a prompt of many rows), the eager code runs.
"""
import torch


def hidden(model, view, tokens: torch.Tensor) -> torch.Tensor:
    """tokens (B, T) int64 on the model's device -> final states (B, T, dim); commits each row's
    real tokens."""
    return model.hidden(tokens, view.input_pos(), view, view.mask(model.dtype))


def logits(model, view, tokens: torch.Tensor) -> torch.Tensor:
    """tokens (B, T) -> logits (B, T, V) in float32; commits each row's real tokens."""
    return model(tokens, view.input_pos(), view, view.mask(model.dtype))
