"""The target's log-probability of each generated token, read from the verification pass itself.

Row i of a step's target logits is the distribution plain decoding would have computed for the i-th
committed token: verification already ran that forward, so the log-probabilities cost a log-softmax
and no extra forward. They are the raw model's (before temperature, penalties and a grammar's mask),
which is what vLLM reports by default and what OpenAI's `logprobs` means.
"""
import torch

from .processor import Processor

MAX_TOP_LOGPROBS = 20  # OpenAI's limit


class Logprobs(Processor):
    """`entries`: per generated token {"token", "logprob", "top": [(token, logprob), ...]}."""

    def __init__(self, top=0):
        if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= MAX_TOP_LOGPROBS:
            raise ValueError(f"top_logprobs must be an int in [0, {MAX_TOP_LOGPROBS}], got {top!r}")
        self.top, self.entries = top, []

    def reset(self, prompt_ids):
        self.entries = []

    def commit(self, committed, raw):
        lp = torch.log_softmax(raw[:len(committed)].float(), dim=-1)  # (n + 1, V)
        chosen = lp.gather(1, torch.tensor(committed, device=lp.device).view(-1, 1))[:, 0].tolist()
        tops = lp.topk(self.top, dim=-1) if self.top else None
        for i, (t, v) in enumerate(zip(committed, chosen)):
            top = list(zip(tops.indices[i].tolist(), tops.values[i].tolist())) if tops is not None else []
            self.entries.append({"token": t, "logprob": v, "top": top})

    def mark(self):
        return len(self.entries)

    def restore(self, mark):
        del self.entries[mark:]
