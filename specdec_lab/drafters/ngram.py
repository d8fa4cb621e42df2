"""Prompt lookup: a drafter with no model, which copies what followed an earlier match of the context's suffix.

Summaries, list edits and code repeat spans of the prompt or of the answer so far;
there a lookup proposes the continuation for free. Proposals are one-hot (q None):
verification keeps sampling lossless. `ngram_lookup_reference` is the readable scan;
`NGramDrafter` keeps an index so that a lookup costs O(max_ngram), and the tests hold
the two equal.
"""
import torch

from ..core.drafter import Verdict


def ngram_lookup_reference(context, k, max_ngram=3, min_ngram=1):
    """The readable twin of NGramDrafter's lookup: scan the context from the end.

    For n from max_ngram down to min_ngram, find the most recent earlier
    occurrence of the context's last n tokens and return up to k tokens that
    followed it, copying on past the end of the context as the continuation
    itself goes (an overlapping copy, as in LZ77). No match: [].
    """
    L = len(context)
    for n in range(max_ngram, min_ngram - 1, -1):
        if L < n + 1:
            continue
        suffix = context[L - n:]
        for start in range(L - n - 1, -1, -1):  # occurrences that end before the suffix does
            if context[start:start + n] == suffix:
                out = []
                for i in range(k):
                    j = start + n + i
                    out.append(context[j] if j < L else out[j - L])
                return out
    return []


class NGramDrafter:
    """Prompt lookup: propose the tokens that followed the latest earlier match of the context's suffix.

    No model and no cache: the drafter keeps the committed token ids (prompt
    included) and an index from each n-gram (min_ngram <= n <= max_ngram) to the
    position right after its most recent occurrence that has a successor, so a
    lookup costs O(max_ngram) instead of a scan. Proposals are one-hot (q None):
    the engine's verification keeps sampling lossless. With no match it proposes
    nothing and the engine takes a plain one-token target step.
    """

    needs_hidden = False

    def __init__(self, max_ngram=3, min_ngram=1, device="cpu"):
        for name, value in (("max_ngram", max_ngram), ("min_ngram", min_ngram)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if min_ngram > max_ngram:
            raise ValueError(f"min_ngram ({min_ngram}) must not exceed max_ngram ({max_ngram})")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.device = torch.device(device)
        self.host_syncs = 0  # copies of proposals from the host to the device so far
        self.reset()

    def reset(self):
        self.context = []  # committed token ids, prompt included
        self.next_after = {}  # n-gram tuple -> index of the token after its latest occurrence

    def prefill(self, prompt_ids, hidden=None):
        self.reset()
        self._extend(prompt_ids)

    def _extend(self, tokens):
        for t in tokens:
            self.context.append(int(t))
            L = len(self.context)
            # The n-grams that end just before the new token now have a successor at L - 1.
            for n in range(self.min_ngram, min(self.max_ngram, L - 1) + 1):
                self.next_after[tuple(self.context[L - 1 - n:L - 1])] = L - 1

    def lookup(self, k) -> list:
        """Up to k token ids (host ints) that followed the longest matching suffix; [] without a match."""
        ctx, L = self.context, len(self.context)
        for n in range(min(self.max_ngram, L), self.min_ngram - 1, -1):
            start = self.next_after.get(tuple(ctx[L - n:]))
            if start is not None:
                out = []
                for i in range(k):
                    j = start + i
                    out.append(ctx[j] if j < L else out[j - L])  # copy on through the proposal itself
                return out
        return []

    def propose(self, k, sampling, generator):
        copied = self.lookup(k)  # k or 0 host ints: the index lives on the host
        if not copied:
            return torch.empty(0, dtype=torch.long, device=self.device), None
        self.host_syncs += 1
        return torch.tensor(copied, device=self.device), None  # sync: the proposal's copy to the device

    def commit(self, verdict: Verdict, hidden=None):
        self._extend(verdict.committed)
