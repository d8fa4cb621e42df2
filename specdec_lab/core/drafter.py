"""The drafter protocol: the only thing the engine knows about whatever drafts.

A drafter proposes d_1..d_k and the q each was drawn from, and hears the
target's verdict. The engine calls, for one generation:

    drafter.prefill(prompt_ids, hidden)      once; the prompt's last token stays pending
    drafter.propose(k, sampling, generator)  -> (ids (k',) int64 on the target's device, k' <= k,
                                                 q (k', V) float32, or None: one-hot at the ids)
    drafter.commit(verdict, hidden)          after each step

and, for a wrapper such as prompt lookup (drafters/lookup.py) around another drafter,
`device`, `reset()` and `queue(tokens, hidden)`: the Drafter protocol below declares them all.

`host_syncs` counts the host reads and host-to-device copies the drafter has made so far
(an early stop reads q(d) per drafted token; prompt lookup copies its proposal to the device):
the engine adds what a step added to the step's own one read, so what it reports is counted
where it happens. A drafter that keeps its tokens on the device, as ModelDrafter does with the
verdict's device tensors, adds nothing.

`needs_hidden` is a declaration, not a method: a drafter that sets it reads the
target's final hidden states (an EAGLE-style feature draft), and the engine then
passes them: (len(prompt) - 1, dim) to prefill, the verification forward's
(k' + 1, dim) to commit. Otherwise `hidden` is None. `hidden_layers`, a second declaration
(absent or None for the others), names target layers (i, j, ...) whose residual-stream states
the drafter reads instead of the final ones (an EAGLE-3-style draft, arXiv 2503.01840): then
`hidden` is those layers' states concatenated, (rows, len(hidden_layers) * dim).

Drafters live in specdec_lab/drafters/ (a model, prompt lookup, a feature draft)
and cpu/ (the target read at low precision); api.make_drafter builds the right
one for what it is given.
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
        """Committed tokens (n,) on the device that another drafter proposed and the target accepted,
        with their target states where needs_hidden: fed with the next proposal (prompt lookup's
        inner drafter is told of steps it did not draft)."""

    def prefill(self, prompt_ids: list, hidden: torch.Tensor | None = None) -> None: ...

    def propose(self, k: int, sampling: SamplingConfig,
                generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor | None]: ...

    def commit(self, verdict: Verdict, hidden: torch.Tensor | None = None) -> None: ...
