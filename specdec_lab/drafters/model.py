"""A small model drafts d_1..d_k, one forward per token (the drafter protocol: core/drafter.py).

The cache invariant: it holds every committed token except those in
`pending`, which are fed at the start of the next proposal. After a step with
n accepted out of k, the cache holds [.., c, d_1..d_{k-1}]: keep c, d_1..d_n.
When all k were accepted, d_k was drafted but never fed to the draft, so it
joins the next token in `pending`. (A rollback that keeps `accepted` entries
instead of `accepted + 1` and never feeds d_k lets the draft cache drift:
chapter 04 shows it, and docs/design.md lists it among the pitfalls.)
"""
import torch
import torch.nn.functional as F

from ..core.drafter import Verdict
from ..core.kv_cache import drop_rejected
from ..core.sampling import draft_token

class ModelDrafter:
    """A small model drafts d_1..d_k one forward at a time.

    stop_below: stop drafting early after a token the draft gave a probability below
    it: q(d) when sampling, its softmax at temperature 1 when greedy (q is one-hot
    there). An unsure draft is usually wrong, and every further token would cost a
    draft forward and a verification row for little chance of acceptance; k becomes
    a ceiling. It reads one number per drafted token to the host: on CUDA a sync per
    token, counted in `host_syncs`. Without it the drafter makes none: its pending
    tokens are the verdict's device tensors.
    """
    needs_hidden = False

    def __init__(self, model, capacity, cache_factory=None, stop_below=None):
        if stop_below is not None and (isinstance(stop_below, bool) or not isinstance(stop_below, (int, float))
                                       or not 0.0 < stop_below < 1.0):
            raise ValueError(f"stop_below must be None or a number in (0, 1), got {stop_below!r}")
        self.model, self.stop_below = model, stop_below
        self.cache_factory = cache_factory  # (cfg, capacity, dtype=, device=) -> a cache; None: model.new_cache
        self.host_syncs = 0  # host reads and copies so far (the early stop's)
        self.forced_drafted = self.forced_accepted = 0  # proposals a grammar forced (options/), and accepted
        self.fit(capacity)

    def fit(self, capacity):
        """A new, empty cache of `capacity` positions: the engine that owns the drafter sizes it."""
        model, factory = self.model, self.cache_factory
        self.cache = model.new_cache(capacity) if factory is None else factory(
            model.cfg, capacity, dtype=model.dtype, device=model.device)
        self.reset()

    @property
    def max_seq_len(self) -> int:
        """The positions it can hold: its cache's, within the draft's rotary table."""
        return min(self.cache.capacity, self.model.cfg.max_seq_len)

    def reset(self):
        self.cache.reset()
        self.pending = torch.empty(0, dtype=torch.long, device=self.model.device)  # (T,) committed, not in the cache

    def prefill(self, prompt_ids, hidden=None):
        self.reset()
        prompt = torch.tensor(prompt_ids, device=self.model.device)  # the prompt's one copy to the device
        if len(prompt_ids) > 1:
            self.model(prompt[:-1].view(1, -1), cache=self.cache, last_only=True)
        self.pending = prompt[-1:]

    def _feed(self, x):
        """Feed tokens x (1, T) to the draft's cache; its logits (V,) after the last one."""
        return self.model(x, cache=self.cache, last_only=True)[0, -1]

    def propose(self, k, sampling, generator):
        device = self.model.device
        x = self.pending.view(1, -1)  # (1, T) not yet fed: the pending tokens (1 or 2, more after lookup steps)
        ids, qs, forced_at = [], [], []
        processor = getattr(self, "processor", None)  # a request's grammar or penalties (options/)
        while len(ids) < k:
            forced = processor.forced([int(t) for t in ids])[:k - len(ids)] if processor is not None else []
            if forced:  # the grammar allows these and nothing else: proposed with no draft forward, q one-hot
                f = torch.tensor(forced, device=device)
                forced_at += range(len(ids), len(ids) + len(forced))
                ids += list(f)
                if not sampling.greedy:
                    qs += list(F.one_hot(f, self.model.cfg.vocab_size).float())
                x = torch.cat([x.view(-1), f]).view(1, -1)  # fed with the next draft forward
                continue
            logits = self._feed(x)
            if processor is not None:  # the draft proposes under them too, so that fewer drafts are refused
                logits = processor.draft(logits, [int(t) for t in ids])  # sync: a host int per drafted token
            d, q = draft_token(logits, sampling, generator, self.stop_below is not None)
            if not sampling.greedy:
                qs.append(q)
            ids.append(d)
            x = d.view(1, 1)
            if self.stop_below is not None and len(ids) < k:
                self.host_syncs += 1
                if float(q[d]) < self.stop_below:  # sync: one per drafted token, the price of the early stop
                    break
        if x.shape[1] > 1 and ids:  # forced tokens at the end: feed all but the last, as the invariant keeps it
            self.model(x[:, :-1], cache=self.cache, last_only=True)
        self.forced_at = forced_at  # which proposals the grammar made, for commit's count
        draft_ids = torch.stack(ids) if ids else torch.empty(0, dtype=torch.long, device=device)
        q = torch.stack(qs) if qs else None
        return draft_ids, q

    @property
    def device(self):
        return self.model.device

    def queue(self, tokens, hidden=None):
        """Committed tokens (n,) on the device that someone else proposed (prompt lookup): fed with
        the next proposal."""
        self.pending = torch.cat([self.pending, tokens])

    def commit(self, verdict: Verdict, hidden=None):
        forced = getattr(self, "forced_at", [])
        self.forced_drafted += len(forced)
        self.forced_accepted += sum(i < verdict.num_accepted for i in forced)
        self.forced_at = []
        committed = verdict.committed_ids(self.model.device)  # d_1..d_n, next: (n + 1,) on the device
        self.pending = commit_draft(self.cache, self.pending, verdict.k, verdict.num_accepted, committed)


def commit_draft(cache, pending, k, n, committed):
    """The cache invariant after a verdict (module docstring): roll `cache` back and return the new
    pending tokens. The draft fed pending + d_1..d_{k-1}; committed is d_1..d_n, next (n + 1,).
    The batched server (serve/engine.py) keeps each row's draft cache by the same rule."""
    if k == 0:
        return torch.cat([pending, committed])
    if n < k:  # the cache holds pending + d_1..d_{k-1}; keep pending + d_1..d_n
        drop_rejected(cache, fed=k - 1, kept=n)
        return committed[-1:]
    return committed[-2:]  # d_k, next: d_k was never fed to the draft
