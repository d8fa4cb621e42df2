"""Training an EAGLE-style feature draft (drafters/feature.py) on the target's own answers and states.

`python -m specdec_lab distill-features` runs `feature_main`: the target answers the prompt
sets keeping its hidden states (train/distill.py's resumable data generation), then
`train_feature_draft` fits the draft, saving the best held-out agreement so far.
"""
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from ..core.config import cache_dir
from ..drafters.feature import FeatureDraft, default_feature_draft_dir, load_feature_draft, save_feature_draft
from ..io.assets import ensure_default_target
from ..io.pair import default_draft_dir, vocab_subset
from ..io.weights import load_model
from .distill import generate_data, make_batches
from .prompts import chat_prompts, distill_prompts, is_held_out, task_prompts


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


# The target answers three prompt sets (prompts.py), every prompt once per temperature, keeping
# its hidden states; every 10th prompt of each set is held out (prompts.is_held_out).
FEATURE_BUDGETS = {
    "tiny": dict(prompts_per_set=8, temperatures=(0.0,), max_new_tokens=8, steps=5, eval_every=5),
    "full": dict(prompts_per_set=None, temperatures=(0.0, 0.7), max_new_tokens=64, steps=1000, eval_every=100),
}


def feature_sets():
    return (("tasks", task_prompts), ("chat", chat_prompts), ("general", distill_prompts))


def feature_main(budget="full", out_dir=None, work_dir=None, steps=None, lr=3e-3, data_minutes=None,
                 progress=True, log=print, init=None):
    """Target answers with states -> training -> a folder load_feature_draft reads. Resumable data.
    init: a saved feature draft's folder to start from (a second phase) instead of random weights."""
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
