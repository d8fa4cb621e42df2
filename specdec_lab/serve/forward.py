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
    input_pos, mask = _positions_and_mask(model, view, tokens)
    return model.hidden(tokens, input_pos, view, mask)


def logits(model, view, tokens: torch.Tensor) -> torch.Tensor:
    """tokens (B, T) -> logits (B, T, V) in float32; commits each row's real tokens."""
    input_pos, mask = _positions_and_mask(model, view, tokens)
    return model(tokens, input_pos, view, mask)


def _positions_and_mask(model, view, tokens):
    """The eager forward's (B, T) positions and (B, 1, T, S) mask, or (None, None) where the runner lays
    the view's rows out itself (it reads them from the view) and would not look at them."""
    applies = getattr(model.runner, "applies", None)
    if applies is not None and applies(tokens, None, view, None) == "batch":
        return None, None
    return view.input_pos(), view.mask(model.dtype)
