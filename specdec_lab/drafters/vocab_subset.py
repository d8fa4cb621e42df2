"""A draft's output head over a subset of the vocabulary: a draft technique, installed on a model."""
import torch
import torch.nn as nn

from ..core.model import Linear


class VocabSubsetHead(nn.Module):
    """A draft's output head restricted to a subset of the vocabulary (FR-Spec, arXiv 2502.14856):
    logits for the `ids` columns only, -inf for every other token, so the draft proposes from the
    subset and gives the rest q = 0. Speculative sampling stays lossless for any q: a token the
    draft never proposes is reached through the residual max(p - q, 0) = p. The product reads
    len(ids) columns instead of V; for a small draft the head is the largest single cost."""

    def __init__(self, head: Linear, ids: torch.Tensor):
        super().__init__()
        ids = torch.as_tensor(ids, dtype=torch.long, device=head.weight.device)
        vocab_size = head.weight.shape[1]
        if ids.dim() != 1 or len(ids) == 0 or ids.unique().numel() != len(ids) \
                or int(ids.min()) < 0 or int(ids.max()) >= vocab_size:
            raise ValueError(f"ids must be distinct token ids in [0, {vocab_size}), got {len(ids)} of them")
        self.vocab_size = vocab_size
        self.proj = Linear(head.weight.shape[0], len(ids), bias=head.bias is not None)
        with torch.no_grad():
            self.proj.weight = nn.Parameter(head.weight.detach()[:, ids].contiguous(), requires_grad=False)
            if head.bias is not None:
                self.proj.bias = nn.Parameter(head.bias.detach()[ids].clone(), requires_grad=False)
        self.register_buffer("ids", ids, persistent=False)

    @property
    def weight(self):  # Transformer.device and .dtype read the head's weight
        return self.proj.weight

    def forward(self, x):
        y = self.proj(x)  # (..., N)
        return y.new_full(y.shape[:-1] + (self.vocab_size,), float("-inf")).index_copy_(-1, self.ids, y)


def restrict_vocab(model, ids):
    """Give `model` (a draft with untied embeddings) a VocabSubsetHead over `ids`, in place."""
    if model.embed is None:
        raise ValueError("restrict_vocab needs untied embeddings: a tied head is also the input embedding")
    if isinstance(model.head, VocabSubsetHead):
        raise ValueError("the model's head is already restricted")
    model.head = VocabSubsetHead(model.head, ids)
    return model
