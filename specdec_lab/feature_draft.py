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
(model.VocabSubsetHead), as the shipped draft's is.

One ships for SmolLM2-135M-Instruct (feature_draft_smollm2/, whose README.md is its model card:
how it was trained and how it fared); `python -m specdec_lab distill-features` trains another into
the cache. On the project's CPU it agrees with the target more often than the shipped token-only
draft, but a drafted token reads 18 MB of weights in half precision (FeatureDrafter's one-call
path) against the shipped draft's 8 MB. Behind prompt lookup it ran level with the shipped draft
at temperature 0 and slower at 0.7 (the README has the side-by-side figures).
"""
import json
import math
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from tqdm.auto import tqdm

from . import kernels
from .kv_cache import KVCache
from .model import Linear, OneTokenDecoder, RMSNorm, Transformer, VocabSubsetHead, init_weights
from . import drafters
from .drafters import draft_token


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
    """The drafters.py interface for a FeatureDraft; the engine hands it the target's states.

    prefill(prompt_ids, feats)  feats (len - 1, dim): the target's states over the prompt but its last token
    commit(k, drafted, n, next_token, hidden)  hidden (k + 1, dim): the verification forward's states

    Cache invariant, like ModelDrafter's: the cache holds entries with true states for every
    committed token except those in `pending` (token, state) pairs, fed at the next proposal.
    """
    reads_target_hidden = True

    def __init__(self, model: FeatureDraft, capacity, cache_factory=KVCache.for_model, stop_below=None,
                 one_call=None):
        if stop_below is not None and (isinstance(stop_below, bool) or not isinstance(stop_below, (int, float))
                                       or not 0.0 < stop_below < 1.0):
            raise ValueError(f"stop_below must be None or a number in (0, 1), got {stop_below!r}")
        if one_call not in (None, True, False):
            raise ValueError(f"one_call must be None (where it applies), True or False, got {one_call!r}")
        self.model, self.stop_below = model, stop_below  # as ModelDrafter's: stop after an unsure token
        self.cache = cache_factory(model.body.cfg, capacity, dtype=model.dtype, device=model.device)
        self.pending_tokens, self.pending_feats = [], []
        # One call per drafted token, weights read in half precision (model.OneTokenDecoder): the layer
        # and the head are 36 MB in float32, and the eager forward streams them from memory every token.
        # one_call=None: wherever it applies, unless drafters.ONE_CALL is off (to compare with eager).
        self.one_call = None
        can = model.embed_weight.dtype == torch.float32 and OneTokenDecoder.supports(
            model.body, self.cache, by_token=False, weights="float16")
        if one_call and not can:
            raise ValueError("one_call=True needs a float32 CPU feature draft, a contiguous KVCache and the "
                             "kernel library's half-precision decode (kernels.has_half())")
        if can and (one_call or (one_call is None and drafters.ONE_CALL)):  # one switch for both drafters
            self.one_call = OneTokenDecoder(model.body, self.cache, by_token=False, weights="float16")
            dim = model.cfg.dim
            self._in_work, self._row = torch.empty(2 * dim), torch.empty(self.one_call.fused.padded(dim))

    def reset(self):
        self.cache.reset()
        self.pending_tokens, self.pending_feats = [], []

    def prefill(self, prompt_ids, feats):
        """Entry j = (t_j, f_{j-1}) for j >= 1; entry 0 has no state before it and is left out."""
        self.reset()
        dev = self.model.device
        if len(prompt_ids) > 2:
            self.model(torch.tensor([prompt_ids[1:-1]], device=dev), feats[None, :-1], cache=self.cache,
                       last_only=True)  # only the cache matters here
        if len(prompt_ids) > 1:
            self.pending_tokens, self.pending_feats = [prompt_ids[-1]], [feats[-1]]

    def _input_row(self, token: int, state):
        """FeatureDraft.inputs for one entry, in one call (csrc/panel_matmul.cpp, feature_input_half)."""
        m, dim = self.model, self.model.cfg.dim
        e, f = m.embed_weight[token].contiguous(), state.float().contiguous()  # a tied table: a column
        kernels.feature_input_half(e.data_ptr(), f.data_ptr(), m.embed_norm.weight.data_ptr(),
                                   m.feat_norm.weight.data_ptr(), m.embed_norm.eps,
                                   m.fc.panel_weight(torch.float16).data_ptr(),
                                   dim, self._in_work.data_ptr(), self._row.data_ptr())
        return self._row[:dim]

    def _feed(self, tokens, feats):
        """Feed entries (tokens[i], feats[i]) to the cache: the last one's (estimated state (dim,), logits (V,))."""
        if self.one_call is None:
            tok = tokens.view(1, -1) if torch.is_tensor(tokens) else torch.tensor([tokens], device=self.model.device)
            h, logits = self.model(tok, torch.stack(feats)[None], cache=self.cache, last_only=True)
            return h[0, -1], logits[0, -1]  # pending rows: the head runs on the last one only
        for i, (t, f) in enumerate(zip(tokens, feats)):
            logits = self.one_call.embedded(self._input_row(int(t), f), head=i == len(tokens) - 1)
        return self.one_call.state, logits  # state: a view the next call overwrites, after reading it

    def propose(self, k, sampling, generator):
        dev = self.model.device
        if not self.pending_tokens:  # a one-token prompt: no state to read yet; propose nothing
            return torch.empty(0, dtype=torch.long, device=dev), None
        tokens, feats = self.pending_tokens, self.pending_feats
        ids, qs = [], []
        for i in range(k):
            h, logits = self._feed(tokens, feats)
            d, q = draft_token(logits, sampling, generator, self.stop_below is not None)
            if not sampling.greedy:
                qs.append(q)
            ids.append(d)
            if i + 1 == k or (self.stop_below is not None and float(q[d]) < self.stop_below):
                break  # d_k (or the unsure token) is never fed: the cache holds pending + d_1..d_{k-1}
            tokens, feats = d.view(1), [h]  # the next entry reads the draft's own estimate
        return torch.stack(ids), (torch.stack(qs) if qs else None)

    def queue(self, tokens, hidden):
        """Committed tokens that someone else proposed (prompt lookup), with the target's states
        from the forward that verified them (hidden[i] predicted tokens[i]): fed with the next proposal."""
        self.pending_tokens = self.pending_tokens + list(tokens)
        self.pending_feats = self.pending_feats + list(hidden[:len(tokens)])

    def commit(self, k, drafted, num_accepted, next_token, hidden):
        """Keep the entries of the old pending tokens (true states); drop those of d_1..d_{k-1}
        (estimated states); pend d_1..d_n and the next token with the target's true states."""
        if k > 0 and self.pending_tokens:  # k is what was proposed, after any early stop
            fed = len(self.pending_tokens) + k - 1
            self.cache.rollback(self.cache.length - fed + len(self.pending_tokens))
            self.pending_tokens, self.pending_feats = [], []
        self.pending_tokens = self.pending_tokens + drafted[:num_accepted] + [next_token]
        self.pending_feats = self.pending_feats + list(hidden[:num_accepted + 1])


# ----------------------------------------------------------------------------- training data

def load_feature_shards(dirs, held_out):
    """(train, held) examples from generate_data(keep_hidden=True) shards:
    (tokens (L,) int64, states (L - 1, dim) float16, prompt length P, top ids (L - P, k), top log-probs)."""
    held_out = held_out if callable(held_out) else held_out.__contains__
    train, held = [], []
    for d in dirs:
        for path in sorted(Path(d).glob("round*.pt")):
            shard = torch.load(path)
            for j, idx in enumerate(shard["prompt_index"]):
                prompt, answer = shard["prompt_ids"][j].long(), shard["answer_ids"][j].long()
                if len(prompt) < 2 or len(answer) < 1:
                    continue
                ex = (torch.cat([prompt, answer]), shard["hidden"][j], len(prompt),
                      shard["top_ids"][j].long(), shard["top_logprobs"][j].float())
                (held if held_out(idx) else train).append(ex)
    return train, held


def collate_entries(examples, idx, subset_pos):
    """Right-padded entries for a batch. Entry e reads (t_{e+1}, f_e) and its output estimates
    f_{e+1}, which predicts t_{e+2}. Returns tokens (B, N), states (B, N, dim), and at answer
    positions (weight 1) the target's stored top-k as positions in the head's subset (-1: outside)."""
    N = max(len(examples[i][0]) for i in idx) - 1
    B, dim, k = len(idx), examples[idx[0]][1].shape[-1], examples[idx[0]][3].shape[-1]
    tok = torch.zeros(B, N, dtype=torch.long)
    feat = torch.zeros(B, N, dim, dtype=torch.float16)
    tgt_pos = torch.full((B, N, k), -1, dtype=torch.long)
    tgt_lp = torch.full((B, N, k), -1e4)
    weight = torch.zeros(B, N)
    for b, i in enumerate(idx):
        tokens, states, P, top_ids, top_lp = examples[i]
        L = len(tokens)
        tok[b, :L - 1] = tokens[1:]
        feat[b, :L - 1] = states
        # answer token s is drafted at entry P - 2 + s: the engine's prefill stops before the prompt's
        # last token, so the first answer token is drafted too, from (t_{P-1}, f_{P-2})
        n = L - P
        tgt_pos[b, P - 2:P - 2 + n] = subset_pos[top_ids]
        tgt_lp[b, P - 2:P - 2 + n] = top_lp
        weight[b, P - 2:P - 2 + n] = 1.0
    return tok, feat, tgt_pos, tgt_lp, weight


def feature_draft_loss(model, tok, feat, tgt_pos, tgt_lp, weight, unroll=2, cls_weight=0.1):
    """Cross-entropy from the target's stored top-k (within the head's subset, renormalised) to
    the draft, at answer positions; `unroll` passes, pass i + 1 reading pass i's estimates as its
    states (as drafting does from its second token on). The estimates also regress on the target's
    states (smooth L1, at every position with a next state, prompts included), with the
    cross-entropy weighted by cls_weight, as in EAGLE. Returns (loss, [agreement per pass])."""
    W = model.body.head.proj.weight  # (dim, S), frozen: a plain product keeps the gradient to h
    keep = weight > 0
    inside = tgt_pos[keep] >= 0  # (M, k)
    p = torch.where(inside, tgt_lp[keep], -1e4).softmax(-1)  # the target's top-k within the subset
    top_in = inside[:, 0]  # the target's choice is in the subset: the draft can agree with it
    loss, agree, states = 0.0, [], feat.float()
    has_next = feat[:, 1:].abs().amax(-1) > 0  # (B, N - 1): padded entries have all-zero states
    for _ in range(unroll):
        h = model.body.hidden(tok, embeds=model.inputs(tok, states))  # (B, N, dim)
        logq = (h[keep] @ W).log_softmax(-1)  # (M, S)
        ce = -(p * logq.gather(-1, tgt_pos[keep].clamp_min(0))).sum(-1).mean()
        reg = F.smooth_l1_loss(h[:, :-1][has_next], feat[:, 1:][has_next].float())
        loss = loss + reg + cls_weight * ce
        agree.append(((logq.argmax(-1) == tgt_pos[keep][:, 0]) & top_in).float().mean().item())
        states = torch.cat([states[:, :1], h[:, :-1]], 1)  # entry e now reads the estimate of f_e
    return loss / unroll, agree


def train_feature_draft(model, train, held, steps=600, lr=2e-3, max_tokens=4096, unroll=2, eval_every=100,
                        seed=0, progress=True, log=None, time_limit_s=None, save_to=None):
    """AdamW with warm-up and cosine decay over `steps`; returns (model, curve), curve a list of
    (step, held-out agreement at depth 1, at depth 2). `train` is a list of examples or a function
    returning the current list, called again at every epoch (answers still being generated join as
    they land). `save_to`: a folder the draft is saved to whenever held-out agreement at depth 1
    is the best so far."""
    from .distill import make_batches
    V = model.cfg.vocab_size
    subset_pos = torch.full((V,), -1, dtype=torch.long)
    subset_pos[model.body.head.ids.cpu()] = torch.arange(len(model.body.head.ids))
    g = torch.Generator().manual_seed(seed)
    params = [p.requires_grad_(True) for n, p in model.named_parameters() if not n.startswith("body.head.")]
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    warm = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps)))
    # the held-out entries as (tokens, examples of a batch) pairs, made once
    held_batches = make_batches(held, max_tokens, torch.Generator().manual_seed(1)) if held else []
    curve, batches, step, t0 = [], [], 0, time.time()
    bar = tqdm(total=steps, desc="feature draft", disable=not progress)
    model.train()
    while step < steps:
        if not batches:
            examples = train() if callable(train) else train
            batches = make_batches(examples, max_tokens, g)
        tok, feat, tgt_pos, tgt_lp, weight = collate_entries(examples, batches.pop(), subset_pos)
        loss, agree = feature_draft_loss(model, tok, feat, tgt_pos, tgt_lp, weight, unroll)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        step += 1
        last = step == steps or (time_limit_s is not None and time.time() - t0 > time_limit_s)
        if held_batches and (step % eval_every == 0 or last):
            model.eval()
            with torch.no_grad():
                sums, count = [0.0] * unroll, 0
                for idx in held_batches:
                    batch = collate_entries(held, idx, subset_pos)
                    _, a = feature_draft_loss(model, *batch, unroll=unroll)
                    n = int(batch[4].sum())
                    sums, count = [s + x * n for s, x in zip(sums, a)], count + n
            model.train()
            curve.append((step, *[s / max(count, 1) for s in sums]))
            if log:
                log(step, loss.item(), curve[-1])
            if save_to is not None and curve[-1][1] >= max(c[1] for c in curve):
                save_feature_draft(model, save_to)  # the best held-out agreement so far
        bar.set_postfix(loss=f"{loss.item():.3f}", agree=" ".join(f"{a:.2f}" for a in agree))
        bar.update(1)
        if last:
            break
    bar.close()
    return model.eval().requires_grad_(False), curve


# ----------------------------------------------------------------------------- saving and loading

def default_feature_draft_dir() -> Path:
    """Where `python -m specdec_lab distill-features` puts the default target's feature draft: in
    the cache, beside the one that ships (shipped_feature_draft_dir)."""
    from .assets import cache_dir
    return cache_dir() / "feature_draft_smollm2"


def shipped_feature_draft_dir() -> Path:
    """The feature draft that ships with the package for SmolLM2-135M-Instruct; README.md there
    is its model card."""
    return Path(__file__).parent / "feature_draft_smollm2"


def find_feature_draft_dir() -> Path:
    """The default target's feature draft: distill-features' output where it exists, else the shipped one."""
    trained = default_feature_draft_dir()
    return trained if (trained / "model.safetensors").exists() else shipped_feature_draft_dir()


def save_feature_draft(model, out_dir, card=None):
    """config.json (the layer count and the head's token ids) + model.safetensors in float16."""
    from safetensors.torch import save_file
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
    from safetensors.torch import load_file
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


# ----------------------------------------------------------------------------- the recipe

# The target answers three prompt sets (prompts.py), every prompt once per temperature, keeping
# its hidden states; every 10th prompt of each set is held out (prompts.is_held_out).
FEATURE_BUDGETS = {
    "tiny": dict(prompts_per_set=8, temperatures=(0.0,), max_new_tokens=8, steps=5, eval_every=5),
    "full": dict(prompts_per_set=None, temperatures=(0.0, 0.7), max_new_tokens=64, steps=1000, eval_every=100),
}


def feature_sets():
    from .prompts import chat_prompts, distill_prompts, task_prompts
    return (("tasks", task_prompts), ("chat", chat_prompts), ("general", distill_prompts))


def feature_main(budget="full", out_dir=None, work_dir=None, steps=None, lr=3e-3, data_minutes=None,
                 progress=True, log=print, init=None):
    """Target answers with states -> training -> a folder load_feature_draft reads. Resumable data.
    init: a saved feature draft's folder to start from (a second phase) instead of random weights."""
    from .assets import cache_dir, ensure_default_target
    from .pair import default_draft_dir, vocab_subset
    from .distill import generate_data
    from .prompts import is_held_out
    from .weights import load_model
    cfg_b = FEATURE_BUDGETS[budget]
    target, tok = load_model(ensure_default_target())
    work = Path(work_dir or cache_dir() / f"feature_draft_{budget}")
    dirs, t0 = [], time.time()
    for temp in cfg_b["temperatures"]:
        for name, prompts in feature_sets():
            ps = prompts()[:cfg_b["prompts_per_set"]] if cfg_b["prompts_per_set"] else prompts()
            d = work / f"{name}_t{temp:g}"
            left = None if data_minutes is None else max(0.0, data_minutes - (time.time() - t0) / 60)
            generate_data(target, tok, d, rounds=(temp,), batch_size=32, max_new_tokens=cfg_b["max_new_tokens"],
                          seed=700, prompts=ps, progress=progress, max_minutes=left, keep_hidden=True)
            dirs.append(d)
    train, held = load_feature_shards(dirs, is_held_out)
    if not train:
        raise ValueError(f"no training answers under {work}: let the data generation run longer")
    log(f"{len(train)} training answers ({sum(len(e[0]) - e[2] for e in train)} answer tokens), {len(held)} held out")
    model = FeatureDraft(target, vocab_subset(default_draft_dir())) if init is None else load_feature_draft(target, init)
    model, curve = train_feature_draft(model, train, held, steps=steps or cfg_b["steps"], lr=lr,
                                       eval_every=cfg_b["eval_every"], progress=progress,
                                       log=lambda s, loss, c: log(f"step {s}: loss {loss:.3f}, held-out "
                                                                  f"agreement by depth {c[1]:.3f} {c[2]:.3f}"))
    out = Path(out_dir or (default_feature_draft_dir() if budget == "full" else work / "feature_draft"))
    return save_feature_draft(model, out), curve
