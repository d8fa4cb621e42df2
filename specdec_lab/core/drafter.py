"""The drafter protocol: the only thing the engine knows about whatever drafts.

A drafter proposes d_1..d_k and the q each was drawn from, and hears the target's verdict:

    drafter.prefill(prompt_ids, hidden)      once; the prompt's last token stays pending
    drafter.propose(k, sampling, generator)  -> (ids (k',) int64 on the target's device, k' <= k,
                                                 q (k', V) float32, or None: one-hot at the ids)
    drafter.commit(verdict, hidden)          after each step

plus `device`, `reset()` and `queue(tokens, hidden)` for a wrapper such as prompt lookup
(drafters/lookup.py), and `max_seq_len` (optional) for the positions it can hold, which the
engine checks a request against. `host_syncs` counts the host reads and copies it has made
(an early stop reads q(d) per token): the engine adds them to the step's own one read.
`needs_hidden`: it reads the target's final states, (len(prompt) - 1, dim) at prefill and the
verification forward's (k' + 1, dim) at commit; `hidden_layers` (else None) names the target
layers whose residual-stream states it reads instead, concatenated (EAGLE-3, arXiv 2503.01840).
The engine sets `processor` (a request's grammar, penalties: options/) before each generation; a
drafter with logits of its own passes them through `processor.draft(logits, drafted so far)`, one
that has none ignores it.
"""
from dataclasses import dataclass
from typing import Protocol

import torch

from .config import SamplingConfig


@dataclass
class Verdict:
    """What the target decided about one step's proposal: host ints, and the same tokens on the
    device, so that a drafter can feed them without copying them back."""
    drafted: list  # d_1..d_k' as proposed
    num_accepted: int  # n: d_1..d_n were accepted
    next_token: int  # the correction (n < k') or the bonus token (n = k')
    ids: torch.Tensor | None = None  # (k',) the proposed ids on the device
    next: torch.Tensor | None = None  # (1,) the next token on the device

    @property
    def k(self) -> int:
        return len(self.drafted)

    @property
    def committed(self) -> list:
        """d_1..d_n and the next token: what the step adds to the sequence (before any EOS cut)."""
        return list(self.drafted[:self.num_accepted]) + [self.next_token]

    def committed_ids(self, device=None) -> torch.Tensor:
        """`committed` as a (n + 1,) tensor: on the device with no copy where the engine gave `ids`
        and `next`, else made from the host ints on `device` (a host-to-device copy)."""
        if self.next is None:
            return torch.tensor(self.committed, device=device)
        return torch.cat([self.ids[:self.num_accepted], self.next]) if self.num_accepted else self.next


class Drafter(Protocol):
    """Everything the engine, or a drafter wrapping another (drafters.LookupDrafter), calls."""
    needs_hidden: bool
    host_syncs: int
    hidden_layers: tuple | None = None  # with needs_hidden: the target layers whose states it reads

    @property
    def device(self) -> torch.device: ...  # where its proposals live

    def reset(self) -> None: ...  # forget the sequence (prefill does it too)

    def queue(self, tokens: torch.Tensor, hidden: torch.Tensor | None = None) -> None:
        """Committed tokens (n,) another drafter proposed (and states): fed with the next proposal."""

    def prefill(self, prompt_ids: list, hidden: torch.Tensor | None = None) -> None: ...

    def propose(self, k: int, sampling: SamplingConfig,
                generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor | None]: ...

    def commit(self, verdict: Verdict, hidden: torch.Tensor | None = None) -> None: ...
