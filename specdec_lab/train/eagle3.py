"""Training an EAGLE-3-style draft (drafters/eagle3.py): token-level loss and training-time test
(Li et al., "EAGLE-3: Scaling up Inference Acceleration of Large Language Models via
Training-Time Test", arXiv 2503.01840).

Data: the target's own answers with its states after the draft's layers, stored while it answers
(train/data.py's generate_data with keep_layers), in the examples of train/feature.py's
load_feature_shards. Storing them costs 3 * 576 * 2 bytes per position for SmolLM2-135M and
saves a target forward over every batch at every step: with that forward inside the step, a step
of 4096 tokens took about 31 s on the project's 2-core CPU; without it, a step of 2048 positions
unrolled 3 deep takes about 2.5 s on one of its threads.

Training-time test. Drafting from a base entry c (the last one that read a true state g_c), the
draft makes entries c+1, c+2, ... that read its own h of the entry before, and that attend to
the true entries 0..c and to the drafted ones. Pass s (0 <= s < unroll) computes, for every
entry e at once, the entry drafted s steps after the base c = e - s:

    pass 0:  entry e reads (t_{e+1}, g_e)            keys: pass 0's entries 0..e
    pass s:  entry e reads (t_{e+1}, h^{s-1}_{e-1})  keys: pass 0's entries 0..e-s, and pass r's
                                                           entry e-s+r for r = 1..s (itself at r = s)

The token is the true one (teacher forcing: a later draft matters only where the earlier ones
were right), the state the draft's own. Every pass predicts t_{e+2}; its loss is the
cross-entropy from the target's stored top-k there (within the head's token subset,
renormalised) to the draft's, at entries whose base is at or after the prompt's last token and
whose token is an answer token. No loss pulls h towards a target state. `unroll_reference`
computes one drafted chain the way the drafter does, entry by entry through a KVCache, and the
tests check that the passes agree with it.
"""
import json
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from tqdm.auto import tqdm

from ..core.attention import grouped_attention
from ..core.config import cache_dir
from ..drafters.eagle3 import (LAYOUT, Eagle3Draft, default_hidden_layers, is_eagle3_folder, load_eagle3_draft,
                               save_eagle3_draft)
from ..io.assets import ensure_default_target
from ..io.pair import default_draft_dir, vocab_subset
from ..io.weights import load_model
from .data import generate_data, make_batches
from .feature import collate_entries, feature_sets, load_feature_shards
from .magpie import load_prompt_file
from .prompts import is_held_out


class UnrollKeys:
    """The keys and values of the passes so far, per layer, in the cache interface that attention
    calls (reserve, attend, advance, length). Concatenated rather than written in place, so
    autograd keeps every pass: a later pass's loss reaches the earlier passes through their keys."""

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

    def attend(self, layer, q, k, v, mask, input_pos=None):
        k, v = self.write_layer(layer, k, v)
        return grouped_attention(q, k, v, mask)

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


@torch.no_grad()
def target_view(target, model, x):
    """The target over x (B, L): the draft's inputs (B, L - 1, n * dim) at entries 0..L-2, the
    target's distribution over the head's subset at positions 1..L-1 (B, L - 1, S), and where its
    top token sits in the subset (B, L - 1), -1 where it is outside. What the stored shards hold,
    computed afresh: unroll_reference and the tests use it."""
    final, states = target.hidden(x, layers=model.hidden_layers)  # (B, L, dim), (B, L, n * dim)
    logits = target.head(final[:, 1:]).float()  # (B, L - 1, V)
    ids = model.head.ids
    pos = torch.full((logits.shape[-1],), -1, dtype=torch.long, device=x.device)
    pos[ids] = torch.arange(len(ids), device=x.device)
    return states[:, :-1], logits[..., ids].softmax(-1), pos[logits.argmax(-1)]


def eagle3_loss(model, tok, states, tgt_pos, tgt_lp, weight, unroll=3):
    """The training-time-test loss over a batch from collate_entries: tokens (B, N), the target's
    layer states (B, N, n * dim), its top-k at answer entries as subset positions (B, N, k) with
    their log-probabilities, weight (B, N) 1 at answer entries. Returns (mean of the passes'
    losses, [loss per pass], [agreement per pass]), agreement the share of trained entries where
    the draft's top token is the target's."""
    check_unroll(unroll)
    B, N = tok.shape
    g = model.fuse_states(states)  # (B, N, dim): with gradient, the fusion is trained
    p = torch.where(tgt_pos >= 0, tgt_lp, -1e4).softmax(-1)  # the target's top-k within the subset
    e = torch.arange(N, device=tok.device)
    keys = UnrollKeys(model.cfg.n_layers)
    total, losses, agree = 0.0, [], []
    for s in range(unroll):
        h = model.states(tok, g, cache=keys, input_pos=e, mask=unroll_mask(N, s, tok.device))  # (B, N, dim)
        # entry e predicts an answer token from a base e - s that is an answer entry too
        keep = (weight > 0) & (torch.cat([weight.new_zeros(B, s), weight[:, :N - s]], 1) > 0)  # (B, N)
        logq = model.head.proj(model.norm(h[keep])).float().log_softmax(-1)  # (M, S): the head's subset
        loss = -(p[keep] * logq.gather(-1, tgt_pos[keep].clamp_min(0))).sum(-1).mean()
        top = tgt_pos[keep][:, 0]
        total, losses = total + loss, losses + [loss.item()]
        agree.append(((logq.argmax(-1) == top) & (top >= 0)).float().mean().item())
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
    cache = model.new_cache(len(seq))
    h, _ = model(x[:, 1:base + 2], g[None, :base + 1], cache=cache)  # entries 0..base: true states
    h, out = h[0, -1], []
    for i in range(depth):
        out.append(model.head.proj(model.norm(h)).float().log_softmax(-1))
        if i + 1 < depth:
            h, _ = model(x[:, base + 2 + i:base + 3 + i], h.view(1, 1, -1), cache=cache)
            h = h[0, -1]
    return torch.stack(out)


def entries(example):
    """The length make_batches counts for a load_feature_shards example: its tokens."""
    return len(example[0])


def subset_positions(model):
    """(V,) the position of each token id in the head's subset, -1 outside it."""
    pos = torch.full((model.cfg.vocab_size,), -1, dtype=torch.long)
    pos[model.head.ids.cpu()] = torch.arange(len(model.head.ids))
    return pos


def evaluate(model, held, max_tokens, unroll):
    """Held-out agreement per pass: each batch's agreement weighted by its trained entries."""
    sums, count, subset_pos = [0.0] * unroll, 0, subset_positions(model)
    with torch.no_grad():
        for idx in make_batches(held, max_tokens, torch.Generator().manual_seed(1), length=entries):
            batch = [t.to(model.device) for t in collate_entries(held, idx, subset_pos)]
            _, _, agree = eagle3_loss(model, *batch, unroll=unroll)
            n = int(batch[4].sum())
            sums, count = [a + b * n for a, b in zip(sums, agree)], count + n
    return [a / max(count, 1) for a in sums]


def typical_rms(x):
    """The mean over rows of each row's root mean square: x (..., dim) -> a float."""
    return float(x.float().pow(2).mean(-1).sqrt().mean())


@torch.no_grad()
def init_by_folding(model: Eagle3Draft, target, folder, sample):
    """Start from a draft in the lab's earlier layout: an EAGLE-style feature draft
    (drafters/feature.py's folder) or an EAGLE-3-style draft of layout 1, which read
    x = fc_in([norm(e), norm(g)]) and ran a standard pre-norm block on x, with g made from
    RMS-normalised layer states. Their weights are folded into this layout: fc_in and the
    attention norm's scale into q, k and v, divided by x's typical RMS (the norm the fold drops);
    the fusion divided by each layer's typical RMS (the norm this layout drops); the MLP, its norm
    and the output norm copied. What cannot be folded is the residual stream, which starts at g
    here and at x there: training takes it from there. `sample`: (tokens (N,), layer states
    (N, n * dim)) of a few answers, to measure the typical RMS. A feature draft has no fusion: g
    starts as the target's final-norm scale on the highest layer's states."""
    sd = {k: v.float() for k, v in load_file(str(Path(folder) / "model.safetensors")).items()}
    cfg = json.loads((Path(folder) / "config.json").read_text())
    if cfg.get("n_layers") != 1 or not torch.equal(torch.tensor(cfg["vocab_ids"]), model.head.ids.cpu()) \
            or cfg.get("layout", 1) != 1 or "fc.weight" not in sd:
        raise ValueError(f"{folder} holds no one-layer draft of the earlier layout with this draft's token subset: "
                         f"it cannot start it")
    tokens, states = sample
    n, dim = len(model.hidden_layers), model.state_width
    layer_rms = [typical_rms(x) for x in states.float().unflatten(-1, (n, dim)).unbind(-2)]
    if "fuse.weight" in sd:  # (n dim, dim): an EAGLE-3 draft of layout 1
        fuse = sd["fuse.weight"]
    else:  # a feature draft read the final state: start from the highest layer, through the final norm's scale
        fuse = torch.zeros(n * dim, dim)
        fuse[(n - 1) * dim:] = torch.diag(target.norm.weight.detach().float().cpu())
    fc = torch.cat([fuse[i * dim:(i + 1) * dim] / layer_rms[i] for i in range(n)])  # (n dim, dim)
    # the earlier x over the sample, for its typical RMS
    g = F.rms_norm(states.float().unflatten(-1, (n, dim)), (dim,)).flatten(-2) @ fuse  # (N, dim)
    e = F.embedding(tokens.to(model.embed_weight.device), model.embed_weight).float().cpu()
    z = torch.cat([F.rms_norm(e, (dim,), sd["embed_norm.weight"]), F.rms_norm(g, (dim,), sd["feat_norm.weight"])], -1)
    x = z @ sd["fc.weight"]  # (N, dim)
    wqkv = sd["fc.weight"] @ (sd["body.layers.0.attn_norm.weight"][:, None] * sd["body.layers.0.attn.wqkv.weight"])
    folded = {"fc.weight": fc, "layer.embed_norm.weight": sd["embed_norm.weight"],
              "layer.state_norm.weight": sd["feat_norm.weight"], "layer.attn.wqkv.weight": wqkv / typical_rms(x),
              "layer.attn.wo.weight": sd["body.layers.0.attn.wo.weight"],
              "layer.mlp_norm.weight": sd["body.layers.0.mlp_norm.weight"],
              "layer.mlp.w13.weight": sd["body.layers.0.mlp.w13.weight"],
              "layer.mlp.w2.weight": sd["body.layers.0.mlp.w2.weight"], "norm.weight": sd["body.norm.weight"]}
    own = model.state_dict()
    for k, v in folded.items():
        own[k].copy_(v.to(own[k].dtype))
    return model


def train_eagle3_draft(model: Eagle3Draft, train, held=(), steps=600, lr=2e-3, max_tokens=4096, unroll=3,
                       eval_every=100, seed=0, progress=True, log=None, work_dir=None, save_to=None):
    """AdamW with warm-up and cosine decay over `steps`. Returns (model, history, curve): history a
    list of (step, [training loss per pass]), curve a list of (step, [held-out agreement per pass]).
    `train` is a list of load_feature_shards examples (with the draft's layers' states) or a
    function returning the current list (called at every epoch). `work_dir`: ckpt.pt there at
    every evaluation, and a rerun resumes from it. `save_to`: the draft is saved there whenever
    held-out agreement at depth 1 is the best so far."""
    check_unroll(unroll)
    subset_pos = subset_positions(model)
    g = torch.Generator().manual_seed(seed)
    params = [p.requires_grad_(True) for n, p in model.named_parameters() if not n.startswith("head.")]
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
            batches = make_batches(examples, max_tokens, g, length=entries)
        batch = [t.to(model.device) for t in collate_entries(examples, batches.pop(), subset_pos)]
        for group in opt.param_groups:
            group["lr"] = lr * schedule(step)
        loss, losses, agree = eagle3_loss(model, *batch, unroll=unroll)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        history.append((step, losses))
        if held and (step % eval_every == 0 or step == steps):
            model.eval()
            curve.append((step, evaluate(model, held, max_tokens, unroll)))
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


# Prompt sets and answers. "full" answers the prompt files given (train/magpie.py's; without
# any, train/feature.py's three template sets), each prompt once per temperature.
EAGLE3_BUDGETS = {
    "tiny": dict(prompts_per_set=10, temperatures=(0.0,), max_new_tokens=8, steps=5, eval_every=5),
    "full": dict(prompts_per_set=None, temperatures=(0.0, 0.7, 1.0), max_new_tokens=128, steps=1000, eval_every=50),
}


def eagle3_sources(prompt_files, prompts_per_set=None):
    """(name, prompts) per source: the prompt files (named by their stem), or without any the
    template sets train/feature.py answers."""
    if prompt_files:
        sets = [(Path(f).stem, (lambda f=f: load_prompt_file(f))) for f in prompt_files]
    else:
        sets = list(feature_sets())
    return [(name, prompts()[:prompts_per_set] if prompts_per_set else prompts()) for name, prompts in sets]


def eagle3_main(budget="full", out_dir=None, work_dir=None, data_dirs=None, prompt_files=None, temperatures=None,
                max_new_tokens=None, data_dtype=None, steps=None, lr=3e-3, unroll=3, max_tokens=None, init=None,
                data_minutes=None, device="cpu", progress=True, log=print, command=None):
    """`python -m specdec_lab distill-features --recipe eagle3`: the target's answers with its
    layer states (generated into work_dir, resumable; or the shards already under `data_dirs`),
    then training (resumable from work_dir/train_{out's name}/ckpt.pt), then a folder
    load_eagle3_draft reads, with a model card that records `command` and the held-out curve. Every 10th prompt of each
    source is held out (prompts.is_held_out). `data_dtype`: the target's precision while it
    answers (bfloat16 about doubles the answers per second on the CPU). `init`: a folder to start
    from, an EAGLE-3 draft's (a second phase, with a fresh optimizer and schedule) or a feature
    draft's (init_from_feature_draft). Returns (folder, curve)."""
    cfg_b = EAGLE3_BUDGETS[budget]
    temperatures = tuple(temperatures) if temperatures is not None else cfg_b["temperatures"]
    max_new_tokens, max_tokens = max_new_tokens or cfg_b["max_new_tokens"], max_tokens or 2048
    target, tok = load_model(ensure_default_target(), device=device)
    layers = default_hidden_layers(target.cfg.n_layers)
    work = Path(work_dir or cache_dir() / f"eagle3_draft_{budget}")
    dirs, t0 = [Path(d) for d in data_dirs or []], time.time()
    if not dirs:
        answerer = target if data_dtype in (None, target.dtype) else load_model(
            ensure_default_target(), device=device, dtype=data_dtype)[0]
        for name, prompts in eagle3_sources(prompt_files, cfg_b["prompts_per_set"]):
            for temp in temperatures:
                left = None if data_minutes is None else max(0.0, data_minutes - (time.time() - t0) / 60)
                dirs.append(generate_data(answerer, tok, work / f"{name}_t{temp:g}", rounds=(temp,), batch_size=32,
                                          max_new_tokens=max_new_tokens, seed=700, prompts=prompts,
                                          progress=progress, max_minutes=left, keep_layers=layers))
        del answerer
    train, held = load_feature_shards(dirs, is_held_out)
    if not train:
        raise ValueError(f"no training answers under {[str(d) for d in dirs]}: let the data generation run longer")
    width = train[0][1].shape[-1]
    if width != len(layers) * target.cfg.dim:
        raise ValueError(f"the shards under {[str(d) for d in dirs]} hold states {width} wide; an EAGLE-3 draft of "
                         f"layers {layers} needs {len(layers) * target.cfg.dim} (made with keep_layers)")
    n_train, out = sum(len(e[0]) - e[2] for e in train), Path(out_dir or work / "eagle3_draft")
    log(f"{len(train)} training answers ({n_train} answer tokens), {len(held)} held out")
    model = Eagle3Draft(target, layers, vocab_ids=vocab_subset(default_draft_dir()))
    if init is not None and is_eagle3_folder(init) and json.loads((Path(init) / "config.json").read_text()).get(
            "layout") == LAYOUT:  # a second phase: go on from an EAGLE-3 draft's weights
        model.load_state_dict(load_eagle3_draft(target, init).state_dict())
    elif init is not None:  # a draft of the earlier layout, folded into this one
        sample = train[:64]
        init_by_folding(model, target, init, (torch.cat([t[1:] for t, *_ in sample]),
                                              torch.cat([x for _, x, *_ in sample])))

    def on_eval(step, loss, agree, sec):
        log(f"step {step}: loss {loss:.3f}, held-out agreement by depth " + " ".join(f"{a:.3f}" for a in agree)
            + f" ({sec:.0f} s)")

    model, history, curve = train_eagle3_draft(
        model, train, held, steps=steps or cfg_b["steps"], lr=lr, unroll=unroll, max_tokens=max_tokens,
        eval_every=cfg_b["eval_every"], progress=progress, work_dir=work / f"train_{Path(out).name}", log=on_eval,
        save_to=out)
    card = eagle3_card(command, dirs, len(train), n_train, len(held), layers, curve, init, lr, unroll, max_tokens)
    return save_eagle3_draft(model, out, card), curve


def _started_from(init) -> str:
    if init is None:
        return "from random weights"
    return f"started from the {'EAGLE-3-style' if is_eagle3_folder(init) else 'feature'} draft in {init}"


def eagle3_card(command, dirs, n_answers, n_tokens, n_held, layers, curve, init, lr, unroll, max_tokens):
    """The model card's recipe part: data, settings, command, and the held-out curve by depth."""
    rows = "\n".join(f"| {step} | " + " | ".join(f"{a:.3f}" for a in agree) + " |" for step, agree in curve)
    depth = len(curve[0][1]) if curve else unroll
    return (f"# An EAGLE-3-style draft for SmolLM2-135M-Instruct\n\n"
            f"Reads the target's residual stream after layers {', '.join(map(str, layers))} (drafters/eagle3.py), "
            f"trained with train/eagle3.py: token loss from the target's stored top-64, training-time test "
            f"unrolled {unroll} deep, AdamW, peak learning rate {lr:g}, batches of at most {max_tokens} positions, "
            f"{_started_from(init)}.\n\n"
            f"Data: {n_answers} training answers ({n_tokens} answer tokens) and {n_held} held-out answers "
            f"(every 10th prompt of each source), from {', '.join(d.name for d in dirs)}.\n\n"
            f"Command:\n\n    {command or '(called from Python)'}\n\n"
            f"Held-out agreement along the stored answers, by depth: the share of answer tokens where the "
            f"draft's top token is the target's, drafting d tokens ahead of the last true state (the true "
            f"tokens fed, the draft's own states read d - 1 times), over every held-out position:\n\n"
            f"| step | " + " | ".join(f"depth {i + 1}" for i in range(depth)) + " |\n"
            "| --- |" + " --- |" * depth + "\n" + rows + "\n")
