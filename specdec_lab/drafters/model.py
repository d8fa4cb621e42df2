"""A small model drafts d_1..d_k, one forward per token (the drafter protocol: core/drafter.py).

The cache invariant: it holds every committed token except those in
`pending`, which are fed at the start of the next proposal. After a step with
n accepted out of k, the cache holds [.., c, d_1..d_{k-1}]: keep c, d_1..d_n.
When all k were accepted, d_k was drafted but never fed to the draft, so it
joins the next token in `pending`. (A rollback that keeps `accepted` entries
instead of `accepted + 1` and never feeds d_k lets the draft cache drift:
chapter 03 shows it, and docs/design.md lists it among the pitfalls.)
"""
import torch

from ..core.drafter import Verdict
from ..core.kv_cache import KVCache
from ..core.sampling import draft_token

class ModelDrafter:
    """A small model drafts d_1..d_k one forward at a time.

    stop_below: stop drafting early after a token the draft gave a probability below
    it: q(d) when sampling, its softmax at temperature 1 when greedy (q is one-hot
    there). An unsure draft is usually wrong, and every further token would cost a
    draft forward and a verification row for little chance of acceptance; k becomes
    a ceiling. It reads one number per draft token to the host: on CUDA that is a
    sync per token.
    """
    needs_hidden = False

    def __init__(self, model, capacity, cache_factory=KVCache.for_model, stop_below=None):
        if stop_below is not None and (isinstance(stop_below, bool) or not isinstance(stop_below, (int, float))
                                       or not 0.0 < stop_below < 1.0):
            raise ValueError(f"stop_below must be None or a number in (0, 1), got {stop_below!r}")
        self.model, self.stop_below = model, stop_below
        self.cache = cache_factory(model.cfg, capacity, dtype=model.dtype, device=model.device)
        self.pending = []  # committed tokens the draft's cache has not seen yet

    def reset(self):
        self.cache.reset()
        self.pending = []

    def prefill(self, prompt_ids, hidden=None):
        self.reset()
        if len(prompt_ids) > 1:
            self.model(torch.tensor([prompt_ids[:-1]], device=self.model.device), cache=self.cache, last_only=True)
        self.pending = [prompt_ids[-1]]

    def _feed(self, x):
        """Feed tokens x (1, T) to the draft's cache; its logits (V,) after the last one."""
        return self.model(x, cache=self.cache, last_only=True)[0, -1]

    def propose(self, k, sampling, generator):
        device = self.model.device
        x = torch.tensor([self.pending], device=device)  # (1, T): 1 or 2 tokens, more after lookup steps
        ids, qs = [], []
        for i in range(k):
            d, q = draft_token(self._feed(x), sampling, generator, self.stop_below is not None)
            if not sampling.greedy:
                qs.append(q)
            ids.append(d)
            x = d.view(1, 1)
            if self.stop_below is not None and i + 1 < k and float(q[d]) < self.stop_below:
                break
        draft_ids = torch.stack(ids) if ids else torch.empty(0, dtype=torch.long, device=device)
        q = torch.stack(qs) if qs else None
        return draft_ids, q

    @property
    def device(self):
        return self.model.device

    def queue(self, tokens, hidden=None):
        """Committed tokens that someone else proposed (prompt lookup): fed with the next proposal."""
        self.pending = self.pending + list(tokens)

    def commit(self, verdict: Verdict, hidden=None):
        k, n = verdict.k, verdict.num_accepted
        if k == 0:
            self.pending = self.pending + [verdict.next_token]
        elif n < k:  # the cache holds pending + d_1..d_{k-1}; keep pending + d_1..d_n
            self.cache.rollback(self.cache.length - (k - 1) + n)
            self.pending = [verdict.next_token]
        else:
            self.pending = [verdict.drafted[-1], verdict.next_token]  # d_k was never fed to the draft
