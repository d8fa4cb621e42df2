"""Presence, frequency and repetition penalties, applied at every scored position as if the drafts
before it had been generated.

As OpenAI and vLLM define them, on the raw logits before temperature: a token seen in the prompt or the
output so far has its logit divided by `repetition` when positive and multiplied by it when negative;
then each token loses `frequency` times its count in the output and `presence` once if it appears
there at all. Under speculation, row i of a step (the token after d_i) counts d_1..d_i as output: the
penalty a plain decode would have applied there. Counting only committed tokens would leave rows 1..K
penalised as if the drafts had not been written, and the output would follow another distribution.
"""
import math

import torch

from .processor import Processor


def _check(name, value, low, high):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not low <= value <= high:
        raise ValueError(f"{name} must be a number in [{low}, {high}], got {value!r}")


class Penalties(Processor):
    """presence and frequency in [-2, 2] (OpenAI's range); repetition in (0, 10], 1 for none."""

    def __init__(self, presence=0.0, frequency=0.0, repetition=1.0):
        _check("presence_penalty", presence, -2.0, 2.0)
        _check("frequency_penalty", frequency, -2.0, 2.0)
        _check("repetition_penalty", repetition, 1e-6, 10.0)
        self.presence, self.frequency, self.repetition = float(presence), float(frequency), float(repetition)
        self.prompt, self.output = [], []

    def reset(self, prompt_ids):
        self.prompt, self.output = list(prompt_ids), []

    def _apply(self, logits, extra_rows):
        """logits (R, V); extra_rows[r]: the drafted tokens row r also counts as output."""
        V, device = logits.shape[-1], logits.device
        counts = torch.bincount(torch.tensor(self.output, dtype=torch.long), minlength=V).float()  # (V,)
        counts = counts.expand(len(extra_rows), V).clone()
        for r, extra in enumerate(extra_rows):
            for t in extra:
                counts[r, t] += 1
        counts = counts.to(device)
        logits = logits.float()
        if self.repetition != 1.0:
            seen = counts > 0
            if self.prompt:
                seen[:, torch.tensor(self.prompt, device=device)] = True
            penalised = torch.where(logits > 0, logits / self.repetition, logits * self.repetition)
            logits = torch.where(seen, penalised, logits)
        return logits - self.frequency * counts - self.presence * (counts > 0).float()

    def draft(self, logits, drafted):
        return self._apply(logits.view(1, -1), [drafted])[0]

    def target(self, logits, drafted):
        return self._apply(logits, [drafted[:i] for i in range(logits.shape[0])])

    def commit(self, committed, raw):
        self.output += committed

    def mark(self):
        return len(self.output)

    def restore(self, mark):
        del self.output[mark:]
