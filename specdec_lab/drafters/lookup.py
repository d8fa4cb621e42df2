"""Prompt lookup in front of any drafter: copy where the context repeats, draft elsewhere."""

from ..core.drafter import Verdict
from .ngram import NGramDrafter


class LookupDrafter:
    """Prompt lookup where the context repeats itself, the draft model everywhere else.

    Summaries, list edits and code copy spans of the prompt or of the answer so far;
    there an n-gram match of at least `min_match` tokens proposes k copied tokens for
    free. Where nothing matches, the inner drafter drafts. Both see every committed
    token: the n-gram index at once, the inner drafter through `queue(tokens, hidden)`,
    which it feeds when it next drafts. Lookup proposals are one-hot (q None), so
    verification stays lossless at any temperature.

    `drafter` is a drafter with `queue` and `device` (drafters.model.ModelDrafter,
    drafters.feature.FeatureDrafter, cpu.SelfDrafter). `sl.LookupThenModelDrafter(draft, ...)`
    builds one from a draft model (api.py).
    """

    def __init__(self, drafter, min_match=2, max_ngram=4):
        self.model = drafter
        self.needs_hidden = drafter.needs_hidden
        self.hidden_layers = getattr(drafter, "hidden_layers", None)
        self.lookup = NGramDrafter(max_ngram=max_ngram, min_ngram=min_match, device=drafter.device)
        self.source = None  # who proposed the current step: "lookup" or "model"
        self.lookup_steps = self.model_steps = 0

    @property
    def max_seq_len(self):
        return getattr(self.model, "max_seq_len", None)  # the inner drafter's positions (None: no limit of its own)

    def fit(self, capacity):
        if callable(getattr(self.model, "fit", None)):
            self.model.fit(capacity)
        self.reset()

    @property
    def host_syncs(self) -> int:
        return self.lookup.host_syncs + self.model.host_syncs

    def reset(self):
        self.model.reset()
        self.lookup.reset()
        self.source = None

    def prefill(self, prompt_ids, hidden=None):
        self.model.prefill(prompt_ids, hidden)
        self.lookup.prefill(prompt_ids)
        self.source = None

    def propose(self, k, sampling, generator):
        draft_ids, q = self.lookup.propose(k, sampling, generator)
        if len(draft_ids):
            self.source, self.lookup_steps = "lookup", self.lookup_steps + 1
            return draft_ids, q
        self.source, self.model_steps = "model", self.model_steps + 1
        return self.model.propose(k, sampling, generator)

    def commit(self, verdict: Verdict, hidden=None):
        self.lookup.commit(verdict)
        if self.source == "model":
            self.model.commit(verdict, hidden)
        else:  # a copied step, or one with nothing drafted: the model saw none of it; queue it
            self.model.queue(verdict.committed_ids(self.model.device), hidden)
        self.source = None
