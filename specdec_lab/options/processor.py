"""The seam between a request's options and the speculative step (core/engine.py calls it).

A processor sees three things, in this order, every step:

    draft(logits (V,), drafted)        the draft's logits for its next token, drafted = d_1..d_j so far
    target(logits (K+1, V), drafted)   the target's rows; row i as if c, d_1..d_i had been generated
    commit(committed, raw (K+1, V))    d_1..d_n and the next token, with the target's unprocessed rows

plus `reset(prompt_ids)` before a generation, `forced(drafted)` (the tokens a grammar leaves no choice
about, which the drafter proposes for free), and `mark()` / `restore(mark)`, which the batched server's
step uses to put a processor back as it was when the step fails (serve/engine.py). Row i of the target's logits predicts the token after
d_i; the step then draws from (or verifies against) the processed rows, and the draft draws from its
processed logits, so both p and q are the distributions plain decoding with the same options would
use at that position. That is all speculative sampling needs to stay exact (arXiv 2211.17192 holds for
any pair of distributions); a processor that forgets a draft before a row, or changes only one side,
breaks it (tests/test_options.py has the broken variants).
"""
import torch


class Processor:
    """Changes nothing: the base of every request option."""

    def reset(self, prompt_ids: list) -> None:
        pass

    def draft(self, logits: torch.Tensor, drafted: list) -> torch.Tensor:
        return logits

    def target(self, logits: torch.Tensor, drafted: list) -> torch.Tensor:
        return logits

    def commit(self, committed: list, raw: torch.Tensor) -> None:
        pass

    def forced(self, drafted: list) -> list:
        """Tokens the next positions must hold whatever the model says (a grammar's), after `drafted`: a
        drafter proposes them with no forward of its own (jump-forward)."""
        return []

    def mark(self):
        """What restore() needs to undo every call since."""
        return None

    def restore(self, mark) -> None:
        pass


class Chain(Processor):
    """Processors applied in turn (penalties before a grammar's mask, as vLLM orders them); each hears
    every reset and commit."""

    def __init__(self, *processors):
        self.processors = [p for p in processors if p is not None]

    def reset(self, prompt_ids):
        for p in self.processors:
            p.reset(prompt_ids)

    def draft(self, logits, drafted):
        for p in self.processors:
            logits = p.draft(logits, drafted)
        return logits

    def target(self, logits, drafted):
        for p in self.processors:
            logits = p.target(logits, drafted)
        return logits

    def commit(self, committed, raw):
        for p in self.processors:
            p.commit(committed, raw)

    def forced(self, drafted):
        return next((f for p in self.processors if (f := p.forced(drafted))), [])

    def mark(self):
        return [p.mark() for p in self.processors]

    def restore(self, mark):
        for p, m in zip(self.processors, mark):
            p.restore(m)

    def find(self, kind):
        """The first processor of this class, in this chain or a chain inside it, or None."""
        for p in self.processors:
            found = p if isinstance(p, kind) else p.find(kind) if isinstance(p, Chain) else None
            if found is not None:
                return found
        return None
