"""Drafters: whatever proposes d_1..d_k, together with the q each was drawn from.

Interface (the engine relies on nothing else):
  prefill(prompt_ids)                  see the prompt; its last token stays pending
  propose(k, sampling, generator)      -> (draft_ids (k,) int64 on device, q (k, V) or None)
                                          q None means one-hot at the drafted tokens
  commit(k, drafted, num_accepted, next_token)
                                       the target's verdict (host ints); keep the cache consistent
  reset()

ModelDrafter's cache invariant: it holds every committed token except those in
`pending`, which are fed at the start of the next proposal. After a step with
n accepted out of k, the cache holds [.., c, d_1..d_{k-1}]: keep c, d_1..d_n.
When all k were accepted, d_k was drafted but never fed to the draft, so it
joins the next token in `pending`. (The seed article keeps `accepted` entries
instead of `accepted + 1` and never feeds d_k: its draft cache drifts.)
"""
import torch

from .kv_cache import KVCache
from .model import OneTokenDecoder
from .sampling import logits_to_probs, sample

# Feed the draft one token at a time through model.OneTokenDecoder where it applies (float32 on
# the CPU, a contiguous cache): up to ONE_CALL_UP_TO pending tokens that way, more in one forward.
# Set ONE_CALL = False before building a drafter (feature_draft.py's too) to compare with the eager
# forward. Why 3: for the shipped draft at 100 cached tokens (one thread) a one-call forward took
# 0.25 ms per token and an eager forward 0.90 ms for one token to 1.14 ms for eight; the two cross
# at four tokens.
ONE_CALL = True
ONE_CALL_UP_TO = 3
# The one call reads the draft's weights rounded to half precision where the library has it
# (kernels.has_half()). Between two drafting steps the target streams its 540 MB, so the draft's
# 8 MB come from memory again each step, and half precision halves that. In the speculative loop
# (lookup + stop, 12 benchmark prompts x 64 tokens, one thread) a draft call took 0.42 ms in the
# kernel against 0.80 ms in float32, and drafting 2.9 ms a step against 4.0, with the same tokens
# per step. The arithmetic stays float32; the proposals are the rounded draft's, and verification
# keeps the output the target's. "float32" reads the weights as they are.
ONE_CALL_WEIGHTS = "float16"


def one_call_weights(model, cache) -> str | None:
    """The weights a one-call draft forward reads for `model` and `cache`: ONE_CALL_WEIGHTS where
    the kernel library has them, float32 where only that applies, None where none does."""
    if not ONE_CALL:
        return None
    for weights in dict.fromkeys((ONE_CALL_WEIGHTS, "float32")):
        if OneTokenDecoder.supports(model, cache, weights=weights):
            return weights
    return None


def draft_token(logits, sampling, generator, need_q=False):
    """One drafted token from a draft's logits (V,): (token, q). Greedy takes the argmax and has q
    None unless need_q (the early stop reads it: the softmax at temperature 1); sampling draws
    from q, the processed distribution that verification divides by."""
    if sampling.greedy:
        return logits.argmax(-1), (torch.softmax(logits, -1) if need_q else None)
    q = logits_to_probs(logits, sampling.temperature, sampling.top_k, sampling.top_p)
    return sample(q, generator), q


class ModelDrafter:
    """A small model drafts d_1..d_k one forward at a time.

    stop_below: stop drafting early after a token the draft gave a probability below
    it: q(d) when sampling, its softmax at temperature 1 when greedy (q is one-hot
    there). An unsure draft is usually wrong, and every further token would cost a
    draft forward and a verification row for little chance of acceptance; k becomes
    a ceiling. It reads one number per draft token to the host: on CUDA that is a
    sync per token.
    """

    def __init__(self, model, capacity, cache_factory=KVCache.for_model, stop_below=None):
        if stop_below is not None and (isinstance(stop_below, bool) or not isinstance(stop_below, (int, float))
                                       or not 0.0 < stop_below < 1.0):
            raise ValueError(f"stop_below must be None or a number in (0, 1), got {stop_below!r}")
        self.model, self.stop_below = model, stop_below
        self.cache = cache_factory(model.cfg, capacity, dtype=model.dtype, device=model.device)
        self.pending = []  # committed tokens the draft's cache has not seen yet
        # One call per token instead of ~200 operator calls, where the model and cache allow (model.py)
        weights = one_call_weights(model, self.cache)
        self.one_call = OneTokenDecoder(model, self.cache, weights=weights) if weights else None

    def reset(self):
        self.cache.reset()
        self.pending = []

    def prefill(self, prompt_ids):
        self.reset()
        if len(prompt_ids) > 1:
            self.model(torch.tensor([prompt_ids[:-1]], device=self.model.device), cache=self.cache, last_only=True)
        self.pending = [prompt_ids[-1]]

    def _feed(self, x):
        """Feed tokens x (1, T) to the draft's cache; its logits (V,) after the last one."""
        if self.one_call is not None and x.shape[1] <= ONE_CALL_UP_TO:
            for t in x[0].tolist():  # host ints: the one-call path runs on the CPU only
                logits = self.one_call(t)
            return logits
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

    def queue(self, tokens):
        """Committed tokens that someone else proposed: fed with the next proposal."""
        self.pending = self.pending + list(tokens)

    def commit(self, k, drafted, num_accepted, next_token):
        # The cache now holds pending + d_1..d_{k-1}; keep pending + d_1..d_n.
        base = self.cache.length - (k - 1) if k > 0 else self.cache.length
        if k > 0 and num_accepted < k:
            self.cache.rollback(base + num_accepted)
            self.pending = [next_token]
        elif k > 0:
            self.pending = [drafted[-1], next_token]  # d_k was never fed to the draft
        else:
            self.pending = self.pending + [next_token]


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

    def __init__(self, max_ngram=3, min_ngram=1, device="cpu"):
        for name, value in (("max_ngram", max_ngram), ("min_ngram", min_ngram)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if min_ngram > max_ngram:
            raise ValueError(f"min_ngram ({min_ngram}) must not exceed max_ngram ({max_ngram})")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.device = torch.device(device)
        self.reset()

    def reset(self):
        self.context = []  # committed token ids, prompt included
        self.next_after = {}  # n-gram tuple -> index of the token after its latest occurrence

    def prefill(self, prompt_ids):
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
        draft_ids = torch.tensor(self.lookup(k), dtype=torch.long, device=self.device)  # (k',), k' in {0, k}
        return draft_ids, None

    def commit(self, k, drafted, num_accepted, next_token):
        self._extend(list(drafted[:num_accepted]) + [next_token])


class LookupThenModelDrafter:
    """Prompt lookup where the context repeats itself, the draft model everywhere else.

    Summaries, list edits and code copy spans of the prompt or of the answer so far;
    there an n-gram match of at least `min_match` tokens proposes k copied tokens for
    free. Where nothing matches, the model drafts. Both drafters see every committed
    token: the n-gram index at once, the model's cache through its `pending` tokens,
    fed in one forward when the model next drafts. Lookup proposals are one-hot (q
    None), so verification stays lossless at any temperature. `stop_below` is the model
    drafter's early stop (ModelDrafter). `draft` may be a feature draft
    (feature_draft.FeatureDraft): its drafter then receives the target's hidden states too. It may
    also be a drafter built already, with a `queue(tokens)` method and a `device`: the engine passes
    its self_draft.SelfDrafter for SelfDraft(target, lookup=True).
    """

    def __init__(self, draft, capacity=2048, min_match=2, max_ngram=4, stop_below=None):
        from .feature_draft import FeatureDraft, FeatureDrafter
        if hasattr(draft, "propose"):  # a drafter built already (the engine's self_draft.SelfDrafter)
            if stop_below is not None:
                raise ValueError("stop_below applies to a draft model, not to a drafter built already")
            self.model = draft
        else:
            inner = FeatureDrafter if isinstance(draft, FeatureDraft) else ModelDrafter
            self.model = inner(draft, capacity, stop_below=stop_below)  # checks stop_below
        self.reads_target_hidden = getattr(self.model, "reads_target_hidden", False)
        device = self.model.device if hasattr(self.model, "device") else self.model.model.device
        self.lookup = NGramDrafter(max_ngram=max_ngram, min_ngram=min_match, device=device)
        self.source = None  # who proposed the current step: "lookup" or "model"
        self.lookup_steps = self.model_steps = 0

    def reset(self):
        self.model.reset()
        self.lookup.reset()
        self.source = None

    def prefill(self, prompt_ids, *states):  # states: the target's, for a feature draft
        self.model.prefill(prompt_ids, *states)
        self.lookup.prefill(prompt_ids)
        self.source = None

    def propose(self, k, sampling, generator):
        copied = self.lookup.lookup(k)
        if copied:
            self.source, self.lookup_steps = "lookup", self.lookup_steps + 1
            return torch.tensor(copied, dtype=torch.long, device=self.lookup.device), None
        self.source, self.model_steps = "model", self.model_steps + 1
        return self.model.propose(k, sampling, generator)

    def commit(self, k, drafted, num_accepted, next_token, *hidden):
        self.lookup.commit(k, drafted, num_accepted, next_token)
        if self.source == "model":
            self.model.commit(k, drafted, num_accepted, next_token, *hidden)
        else:  # a copied step, or one with nothing drafted: the model saw none of it; queue it
            self.model.queue(list(drafted[:num_accepted]) + [next_token], *hidden)
        self.source = None
