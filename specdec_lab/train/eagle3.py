"""Training an EAGLE-3-style draft (drafters/eagle3.py): token-level loss and training-time test
(Li et al., "EAGLE-3: Scaling up Inference Acceleration of Large Language Models via
Training-Time Test", arXiv 2503.01840).

Data: the target's own answers as train/data.py stores them (`load_shards` examples). No states
are stored: each step runs the target over the batch without gradient, for the states of the
draft's layers and for the target's distribution. Three layers' states would triple the shards
of train/feature.py, and one target forward over a batch is cheap next to the draft's unrolled
passes and their backward.

Training-time test. Drafting from a base entry c (the last one that read a true state g_c), the
draft makes entries c+1, c+2, ... that read its own h of the entry before, and that attend to
the true entries 0..c and to the drafted ones. Pass s (0 <= s < unroll) computes, for every
entry e at once, the entry drafted s steps after the base c = e - s:

    pass 0:  entry e reads (t_{e+1}, g_e)            keys: pass 0's entries 0..e
    pass s:  entry e reads (t_{e+1}, h^{s-1}_{e-1})  keys: pass 0's entries 0..e-s, and pass r's
                                                           entry e-s+r for r = 1..s (itself at r = s)

The token is the true one (teacher forcing: a later draft matters only where the earlier ones
were right), the state the draft's own. Every pass predicts t_{e+2}; its loss is the
cross-entropy from the target's distribution there (over the head's token subset, renormalised)
to the draft's, at entries whose base is at or after the prompt's last token and whose token
is an answer token. No loss pulls h towards a target state. `unroll_reference` computes one
drafted chain the way the drafter does, entry by entry through a KVCache, and the tests check
that the passes agree with it.
"""
import math
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ..core.config import cache_dir
from ..core.kv_cache import KVCache
from ..drafters.eagle3 import Eagle3Draft, save_eagle3_draft
from ..io.assets import ensure_default_target
from ..io.pair import default_draft_dir, vocab_subset
from ..io.weights import load_model
from .data import generate_data, load_shards, make_batches
from .prompts import is_held_out


class UnrollKeys:
    """The keys and values of the passes so far, per layer, in the cache interface that attention
    calls (write_layer, reserve, advance, length). Concatenated rather than written in place, so
    autograd keeps every pass: a later pass's loss reaches the earlier passes through their keys."""
    static = False

    def __init__(self, n_layers):
        self.k, self.v, self.length = [None] * n_layers, [None] * n_layers, 0

    def reserve(self, T):
        pass  # it grows: nothing to overflow

    def write_layer(self, layer, k, v):
        """k, v (B, Hkv, T, D) -> this layer's keys and values of every pass so far (B, Hkv, L+T, D)."""
        if self.k[layer] is not None:
            k, v = torch.cat([self.k[layer], k], 2), torch.cat([self.v[layer], v], 2)
        self.k[layer], self.v[layer] = k, v
        return k, v

    def advance(self, T):
        self.length += T


def unroll_mask(N, s, device=None):
    """Pass s's additive mask (1, 1, N, (s + 1) N) over the keys of passes 0..s (see the module
    docstring). Row e < s has no base entry; it sees itself, so no row is all -inf."""
    e = torch.arange(N, device=device).view(N, 1)
    j = torch.arange(N, device=device).view(1, N)
    allowed = torch.cat([j <= e - s] + [j == e - s + r for r in range(1, s + 1)], 1)  # (N, (s+1) N)
    return torch.zeros(allowed.shape, device=device).masked_fill(~allowed, float("-inf"))[None, None]


def check_unroll(unroll):
    if isinstance(unroll, bool) or not isinstance(unroll, int) or not 1 <= unroll <= 8:
        raise ValueError(f"unroll must be an int in [1, 8], got {unroll!r}")


def collate_sequences(examples, idx, pad_id):
    """Right-padded prompt + answer tokens (B, L) and their (prompt length, length) per row."""
    seqs = [torch.cat([examples[i][0], examples[i][1]]) for i in idx]
    x = torch.full((len(idx), max(len(s) for s in seqs)), pad_id, dtype=torch.long)
    for b, s in enumerate(seqs):
        x[b, :len(s)] = s
    return x, [(len(examples[i][0]), len(s)) for i, s in zip(idx, seqs)]


@torch.no_grad()
def target_view(target, model, x):
    """The target over x (B, L): the draft's inputs g (B, L - 1, dim) at entries 0..L-2, the
    target's distribution over the head's subset at positions 1..L-1 (B, L - 1, S), and where its
    top token sits in the subset (B, L - 1), -1 where it is outside."""
    final, states = target.hidden(x, layers=model.hidden_layers)  # (B, L, dim), (B, L, n * dim)
    logits = target.head(final[:, 1:]).float()  # (B, L - 1, V)
    ids = model.body.head.ids
    pos = torch.full((logits.shape[-1],), -1, dtype=torch.long, device=x.device)
    pos[ids] = torch.arange(len(ids), device=x.device)
    return states[:, :-1], logits[..., ids].softmax(-1), pos[logits.argmax(-1)]


def eagle3_loss(model, target, x, lengths, unroll=3):
    """The training-time-test loss over a batch x (B, L) of prompt + answer rows with their
    (prompt length, length): (mean of the passes' losses, [loss per pass], [agreement per pass]),
    agreement the share of trained entries where the draft's top token is the target's."""
    check_unroll(unroll)
    states, p, top = target_view(target, model, x)
    tok, N = x[:, 1:], x.shape[1] - 1
    g = model.fuse_states(states)  # (B, N, dim): with gradient, the fusion is trained
    W = model.body.head.proj.weight  # (dim, S), frozen
    e = torch.arange(N, device=x.device)
    keys, pos = UnrollKeys(model.body.cfg.n_layers), e
    total, losses, agree = 0.0, [], []
    for s in range(unroll):
        h = model.body.hidden(tok, input_pos=pos, cache=keys, mask=unroll_mask(N, s, x.device),
                              embeds=model.inputs(tok, g))  # (B, N, dim)
        # entry e predicts token e + 2 of the row: an answer token, from a base e - s at or after P - 2
        w = torch.stack([(e >= P - 2 + s) & (e <= L - 3) for P, L in lengths]).float()  # (B, N)
        logq = (h @ W).float().log_softmax(-1)  # (B, N, S)
        ce = -(p * logq).sum(-1)  # (B, N)
        loss = (ce * w).sum() / w.sum().clamp_min(1)
        hit = (logq.argmax(-1) == top).float()
        total, losses = total + loss, losses + [loss.item()]
        agree.append(((hit * w).sum() / w.sum().clamp_min(1)).item())
        g = torch.cat([g[:, :1], h[:, :-1]], 1)  # entry e now reads h of entry e - 1
    return total / unroll, losses, agree


@torch.no_grad()
def unroll_reference(model, target, seq, base, depth):
    """The reference twin of the passes: what the drafter computes for the chain drafted from entry
    `base` of `seq` (a list of token ids), one entry at a time through a KVCache, fed the true next
    tokens. Returns the draft's log-probabilities over the subset (depth, S)."""
    x = torch.tensor([seq], device=model.device)
    states, _, _ = target_view(target, model, x)
    g = model.fuse_states(states)[0]  # (N, dim)
    cache = KVCache.for_model(model.body.cfg, len(seq), dtype=model.dtype, device=model.device)
    h, _ = model(x[:, 1:base + 2], g[None, :base + 1], cache=cache)  # entries 0..base: true states
    h, out = h[0, -1], []
    for i in range(depth):
        out.append((h @ model.body.head.proj.weight).float().log_softmax(-1))
        if i + 1 < depth:
            h, _ = model(x[:, base + 2 + i:base + 3 + i], h.view(1, 1, -1), cache=cache)
            h = h[0, -1]
    return torch.stack(out)


def evaluate(model, target, held, max_tokens, unroll, pad_id):
    """Held-out agreement per pass: each batch's agreement weighted by its answer tokens."""
    sums, count = [0.0] * unroll, 0
    with torch.no_grad():
        for idx in make_batches(held, max_tokens, torch.Generator().manual_seed(1)):
            x, lengths = collate_sequences(held, idx, pad_id)
            _, _, agree = eagle3_loss(model, target, x.to(model.device), lengths, unroll)
            n = sum(L - P for P, L in lengths)
            sums, count = [a + b * n for a, b in zip(sums, agree)], count + n
    return [a / max(count, 1) for a in sums]


def train_eagle3_draft(model: Eagle3Draft, target, train, held=(), steps=600, lr=2e-3, max_tokens=4096, unroll=3,
                       eval_every=100, seed=0, progress=True, log=None, work_dir=None, save_to=None):
    """AdamW with warm-up and cosine decay over `steps`. Returns (model, history, curve): history a
    list of (step, [training loss per pass]), curve a list of (step, [held-out agreement per pass]).
    `train` is a list of load_shards examples or a function returning the current list (called
    at every epoch). `work_dir`: ckpt.pt there at every evaluation, and a rerun resumes from it.
    `save_to`: the draft is saved there whenever held-out agreement at depth 1 is the best so far."""
    check_unroll(unroll)
    pad_id = target.cfg.eos_token_ids[0] if target.cfg.eos_token_ids else 0
    g = torch.Generator().manual_seed(seed)
    params = [p.requires_grad_(True) for n, p in model.named_parameters() if not n.startswith("body.head.")]
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    warm = max(1, steps // 20)

    def schedule(s):  # linear warm-up, then cosine decay to 0 at `steps`
        return min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps))

    step, history, curve = 0, [], []
    ckpt = Path(work_dir) / "ckpt.pt" if work_dir is not None else None
    if ckpt is not None and ckpt.exists():
        state = torch.load(ckpt)
        model.load_state_dict(state["model"], strict=False)
        opt.load_state_dict(state["opt"])
        step, history, curve = state["step"], state["history"], state["curve"]
    bar = tqdm(total=steps, initial=step, desc="eagle3 draft", disable=not progress)
    model.train()
    batches, t0 = [], time.time()
    while step < steps:
        if not batches:
            examples = train() if callable(train) else train
            batches = make_batches(examples, max_tokens, g)
        x, lengths = collate_sequences(examples, batches.pop(), pad_id)
        for group in opt.param_groups:
            group["lr"] = lr * schedule(step)
        loss, losses, agree = eagle3_loss(model, target, x.to(model.device), lengths, unroll)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        history.append((step, losses))
        if held and (step % eval_every == 0 or step == steps):
            model.eval()
            curve.append((step, evaluate(model, target, held, max_tokens, unroll, pad_id)))
            model.train()
            if log:
                log(step, loss.item(), curve[-1][1], time.time() - t0)
            if save_to is not None and curve[-1][1][0] >= max(c[1][0] for c in curve):
                save_eagle3_draft(model, save_to)  # the best held-out agreement so far
        if ckpt is not None and (step % eval_every == 0 or step == steps):
            ckpt.parent.mkdir(parents=True, exist_ok=True)
            torch.save({"model": model.own_state_dict(), "opt": opt.state_dict(), "step": step,
                        "history": history, "curve": curve}, str(ckpt) + ".partial")
            Path(str(ckpt) + ".partial").replace(ckpt)
        bar.set_postfix(loss=" ".join(f"{v:.2f}" for v in losses), agree=" ".join(f"{a:.2f}" for a in agree))
        bar.update(1)
    bar.close()
    return model.eval().requires_grad_(False), history, curve


# The same prompts and answers as train/feature.py's budgets, without the states: the target
# recomputes them at each step.
EAGLE3_BUDGETS = {
    "tiny": dict(prompts_per_set=8, temperatures=(0.0,), max_new_tokens=8, steps=5, eval_every=5),
    "full": dict(prompts_per_set=None, temperatures=(0.0, 0.7), max_new_tokens=64, steps=1000, eval_every=100),
}


def eagle3_main(budget="full", out_dir=None, work_dir=None, data_dirs=None, steps=None, lr=3e-3, unroll=3,
                data_minutes=None, device="cpu", progress=True, log=print):
    """`python -m specdec_lab distill-features --recipe eagle3`: the target's answers (generated
    into work_dir, resumable, or the shards already under `data_dirs`), then training (resumable
    from work_dir/train/ckpt.pt), then a folder load_eagle3_draft reads. Every 10th prompt of
    each set is held out (prompts.is_held_out). Returns (folder, curve)."""
    from .feature import feature_sets  # the prompt sets train/feature.py answers
    cfg_b = EAGLE3_BUDGETS[budget]
    target, tok = load_model(ensure_default_target(), device=device)
    work = Path(work_dir or cache_dir() / f"eagle3_draft_{budget}")
    dirs, t0 = [Path(d) for d in data_dirs or []], time.time()
    if not dirs:
        for temp in cfg_b["temperatures"]:
            for name, prompts in feature_sets():
                ps = prompts()[:cfg_b["prompts_per_set"]] if cfg_b["prompts_per_set"] else prompts()
                left = None if data_minutes is None else max(0.0, data_minutes - (time.time() - t0) / 60)
                dirs.append(generate_data(target, tok, work / f"{name}_t{temp:g}", rounds=(temp,), batch_size=32,
                                          max_new_tokens=cfg_b["max_new_tokens"], seed=700, prompts=ps,
                                          progress=progress, max_minutes=left))
    train, held = [], []
    for d in dirs:
        t, h = load_shards(d, is_held_out)
        train, held = train + t, held + h
    if not train:
        raise ValueError(f"no training answers under {[str(d) for d in dirs]}: let the data generation run longer")
    log(f"{len(train)} training answers ({sum(len(e[1]) for e in train)} answer tokens), {len(held)} held out")
    model = Eagle3Draft(target, vocab_ids=vocab_subset(default_draft_dir()))
    model, _, curve = train_eagle3_draft(
        model, target, train, held, steps=steps or cfg_b["steps"], lr=lr, unroll=unroll,
        eval_every=cfg_b["eval_every"], progress=progress, work_dir=work / "train",
        log=lambda step, loss, agree, sec: log(f"step {step}: loss {loss:.3f}, held-out agreement by depth "
                                               + " ".join(f"{a:.3f}" for a in agree) + f" ({sec:.0f} s)"))
    return save_eagle3_draft(model, out_dir or work / "eagle3_draft"), curve
