"""A draft that reads the target's hidden states (EAGLE, Li et al., arXiv 2401.15077).

The shipped draft (distill.py) guesses the target's next token from tokens alone. The
target's final hidden state at a position already decides its next token (the head is
one product away), and the verification forward computes it for every row anyway. A
feature draft is one decoder layer of the target's width. At each position j it reads
the token t_j and the target's state f_{j-1} (the state that predicted t_j), and it
estimates f_j; the target's own output head turns the estimate into a token.

    entry j:  (t_j, f_{j-1})  ->  h_j ~ f_j  ->  head(h_j) ~ p(t_{j+1})

While drafting, the true f of the tokens just drafted is not known yet, so draft token
i + 1 reads the draft's own estimate h for token i, and errors compound with depth.
After verification the drafter throws its estimates away and feeds the target's true
states for every committed token (FeatureDrafter.commit).

What is stored is the layer, a projection from [embedding, state] to the width, and two
norms (about 4M parameters). The token embedding and the output head are the target's,
taken at load; the head is restricted to the draft's frequent-token subset
(drafters.vocab_subset.VocabSubsetHead), as the shipped draft's is.

One ships for SmolLM2-135M-Instruct (specdec_lab/feature_draft_smollm2/, whose README.md is its
model card: how it was trained and how it fared); `python -m specdec_lab distill-features` trains
another into the cache (train/feature.py). On the project's CPU it agrees with the target more
often than the shipped token-only draft, but a drafted token reads more than twice the bytes.
Behind prompt lookup it ran level with the shipped draft at temperature 0 and slower at 0.7
(docs/benchmarks.md).
"""
import json
import math
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from ..core.config import cache_dir
from ..core.drafter import Verdict
from ..core.kv_cache import drop_rejected
from ..core.model import Linear, RMSNorm, Transformer, init_weights
from ..core.sampling import draft_token
from .vocab_subset import VocabSubsetHead


class FeatureDraft(nn.Module):
    """forward(tokens (B, T), feats (B, T, dim), cache) -> (states (B, T, dim), logits (B, T, V))."""

    def __init__(self, target, vocab_ids=None, n_layers=1, seed=0):
        super().__init__()
        tc = target.cfg
        self.cfg = replace(tc, n_layers=n_layers)  # the engine reads vocab_size and eos from it
        self.body = init_weights(Transformer(replace(tc, n_layers=n_layers, vocab_size=1)), seed)
        ids = torch.arange(tc.vocab_size) if vocab_ids is None else torch.as_tensor(vocab_ids)
        self.body.head = VocabSubsetHead(target.head, ids)  # the target's head, its subset columns
        self.embed_norm, self.feat_norm = RMSNorm(tc.dim, tc.norm_eps), RMSNorm(tc.dim, tc.norm_eps)
        self.fc = Linear(2 * tc.dim, tc.dim)
        with torch.no_grad():
            self.fc.weight.normal_(0, 1 / math.sqrt(2 * tc.dim), generator=torch.Generator().manual_seed(seed))
            self.body.norm.weight.copy_(target.norm.weight)  # the states it estimates went through this norm
        # The target's embedding (V, dim), borrowed: a plain attribute, so neither saved nor trained.
        self.embed_weight = (target.embed.weight if target.embed is not None else target.head.weight.t()).detach()
        self.to(target.device)

    @property
    def device(self):
        return self.fc.weight.device

    def new_cache(self, capacity, batch_size=1):
        """An empty cache for the draft's layers (the body's runner's kind where it has one)."""
        return self.body.new_cache(capacity, batch_size)

    @property
    def state_width(self):
        """The width of the target states it reads."""
        return self.fc.weight.shape[0] - self.cfg.dim

    @property
    def dtype(self):
        return self.fc.weight.dtype

    def inputs(self, tokens, feats):
        """The layer's input rows: [norm(embedding of t_j), norm(f_{j-1})] projected to the width."""
        e = self.embed_norm(F.embedding(tokens, self.embed_weight))
        return self.fc(torch.cat([e, self.feat_norm(feats.to(e.dtype))], -1))

    def forward(self, tokens, feats, cache=None, last_only=False):
        """last_only: logits (B, 1, V) for the last entry only; the states stay (B, T, dim)."""
        h = self.body.hidden(tokens, cache=cache, embeds=self.inputs(tokens, feats))  # (B, T, dim)
        return h, self.body.head(h[:, -1:] if last_only else h).float()

    def own_state_dict(self):
        """The trained parameters only: not the target's head that the model holds."""
        return {k: v for k, v in self.state_dict().items() if not k.startswith("body.head.")}


# ----------------------------------------------------------------------------- the drafter

class FeatureDrafter:
    """The drafter for a FeatureDraft (the protocol of core/drafter.py, with needs_hidden).

    prefill(prompt_ids, hidden)  hidden (len - 1, dim): the target's states over the prompt but its last token
    commit(verdict, hidden)      hidden (k + 1, dim): the verification forward's states

    Cache invariant, like ModelDrafter's: the cache holds entries with true states for every
    committed token except the pending ones (`pending_tokens` (T,) on the device, `pending_feats`
    their states), fed at the next proposal. The early stop reads q(d) to the host per drafted
    token (counted in `host_syncs`); nothing else leaves the device.
    """
    needs_hidden = True

    def __init__(self, model: FeatureDraft, capacity, cache_factory=None, stop_below=None):
        if stop_below is not None and (isinstance(stop_below, bool) or not isinstance(stop_below, (int, float))
                                       or not 0.0 < stop_below < 1.0):
            raise ValueError(f"stop_below must be None or a number in (0, 1), got {stop_below!r}")
        self.model, self.stop_below = model, stop_below  # as ModelDrafter's: stop after an unsure token
        self.cache_factory = cache_factory  # (cfg, capacity, dtype=, device=) -> a cache; None: body.new_cache
        self.host_syncs = 0
        self.fit(capacity)

    def fit(self, capacity):
        """A new, empty cache of `capacity` positions: the engine that owns the drafter sizes it."""
        model, factory = self.model, self.cache_factory
        self.cache = model.new_cache(capacity) if factory is None else factory(
            model.cfg, capacity, dtype=model.dtype, device=model.device)
        self.reset()

    @property
    def max_seq_len(self) -> int:
        """The positions it can hold: its cache's, within the draft body's rotary table."""
        return min(self.cache.capacity, self.model.cfg.max_seq_len)

    @property
    def device(self):
        return self.model.device

    def reset(self):
        self.cache.reset()
        self.pending_tokens = torch.empty(0, dtype=torch.long, device=self.model.device)
        self.pending_feats = []

    def prefill(self, prompt_ids, hidden=None):
        """Entry j = (t_j, f_{j-1}) for j >= 1; entry 0 has no state before it and is left out."""
        feats = hidden
        self.reset()
        prompt = torch.tensor(prompt_ids, device=self.model.device)  # the prompt's one copy to the device
        if len(prompt_ids) > 2:
            self.model(prompt[1:-1].view(1, -1), feats[None, :-1], cache=self.cache,
                       last_only=True)  # only the cache matters here
        if len(prompt_ids) > 1:
            self.pending_tokens, self.pending_feats = prompt[-1:], [feats[-1]]

    def _feed(self, tokens, feats):
        """Feed entries (tokens[i] (T,), feats[i]) to the cache: the last one's (estimated state (dim,), logits (V,))."""
        h, logits = self.model(tokens.view(1, -1), torch.stack(feats)[None], cache=self.cache, last_only=True)
        return h[0, -1], logits[0, -1]  # pending rows: the head runs on the last one only

    def propose(self, k, sampling, generator):
        dev = self.model.device
        if len(self.pending_tokens) == 0:  # a one-token prompt: no state to read yet; propose nothing
            return torch.empty(0, dtype=torch.long, device=dev), None
        tokens, feats = self.pending_tokens, self.pending_feats
        ids, qs = [], []
        for i in range(k):
            h, logits = self._feed(tokens, feats)
            d, q = draft_token(logits, sampling, generator, self.stop_below is not None)
            if not sampling.greedy:
                qs.append(q)
            ids.append(d)
            if i + 1 == k:
                break  # d_k is never fed: the cache holds pending + d_1..d_{k-1}
            if self.stop_below is not None:
                self.host_syncs += 1
                if float(q[d]) < self.stop_below:  # sync: one per drafted token, the price of the early stop
                    break  # neither is the unsure token
            tokens, feats = d.view(1), [h]  # the next entry reads the draft's own estimate
        return torch.stack(ids), (torch.stack(qs) if qs else None)

    def queue(self, tokens, hidden=None):
        """Committed tokens (n,) on the device that someone else proposed (prompt lookup), with the
        target's states from the forward that verified them (hidden[i] predicted tokens[i]): fed with
        the next proposal."""
        self.pending_tokens = torch.cat([self.pending_tokens, tokens])
        self.pending_feats = self.pending_feats + list(hidden[:len(tokens)])

    def commit(self, verdict: Verdict, hidden=None):
        """Keep the entries of the old pending tokens (true states); drop those of d_1..d_{k-1}
        (estimated states); pend d_1..d_n and the next token with the target's true states."""
        k, n = verdict.k, verdict.num_accepted
        if k > 0 and len(self.pending_tokens):  # k is what was proposed, after any early stop
            pending = len(self.pending_tokens)  # keep the pending entries, drop d_1..d_{k-1}'s
            drop_rejected(self.cache, fed=pending + k - 1, kept=pending)
            self.pending_tokens, self.pending_feats = self.pending_tokens[:0], []
        self.pending_tokens = torch.cat([self.pending_tokens, verdict.committed_ids(self.model.device)])
        self.pending_feats = self.pending_feats + list(hidden[:n + 1])


# ----------------------------------------------------------------------------- saving and loading

def default_feature_draft_dir() -> Path:
    """Where `python -m specdec_lab distill-features` puts the default target's feature draft: in
    the cache, beside the one that ships (shipped_feature_draft_dir)."""
    return cache_dir() / "feature_draft_smollm2"


def shipped_feature_draft_dir() -> Path:
    """The feature draft that ships with the package for SmolLM2-135M-Instruct; README.md there
    is its model card."""
    return Path(__file__).parent.parent / "feature_draft_smollm2"


def find_feature_draft_dir() -> Path:
    """The default target's feature draft: distill-features' output where it exists, else the shipped one."""
    trained = default_feature_draft_dir()
    return trained if (trained / "model.safetensors").exists() else shipped_feature_draft_dir()


def save_feature_draft(model, out_dir, card=None):
    """config.json (the layer count and the head's token ids) + model.safetensors in float16."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().half().contiguous() for k, v in model.own_state_dict().items()},
              str(out / "model.safetensors"))
    cfg = {"kind": "specdec_lab feature draft", "n_layers": model.cfg.n_layers, "dim": model.state_width,
           "vocab_ids": model.body.head.ids.tolist()}
    (out / "config.json").write_text(json.dumps(cfg))
    if card is not None:
        (out / "README.md").write_text(card)
    return out


def load_feature_draft(target, folder=None):
    """A FeatureDraft for `target` from save_feature_draft's folder, in the target's dtype (default,
    for SmolLM2-135M-Instruct: distill-features' output where it exists, else the shipped one)."""
    folder = Path(folder) if folder is not None else find_feature_draft_dir()
    if not (folder / "config.json").exists():
        raise ValueError(f"no feature draft in {folder}: `python -m specdec_lab distill-features` makes one")
    cfg = json.loads((folder / "config.json").read_text())
    if cfg.get("dim") != target.cfg.dim:
        raise ValueError(f"the feature draft in {folder} was made for width {cfg.get('dim')}, "
                         f"the target's is {target.cfg.dim}")
    model = FeatureDraft(target, cfg["vocab_ids"], n_layers=cfg["n_layers"])
    missing, unexpected = model.load_state_dict(load_file(str(folder / "model.safetensors")), strict=False)
    missing = [k for k in missing if not k.startswith("body.head.")]
    if missing or unexpected:
        raise ValueError(f"{folder}: missing {missing}, unexpected {unexpected}")
    return model.to(target.dtype).eval().requires_grad_(False)
