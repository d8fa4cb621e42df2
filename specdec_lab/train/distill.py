"""Distilling a small draft for a target: data on the target's own distribution, then KL.

Contract:
- `generate_data(target, tokenizer, out_dir, ...)` answers the project's prompt
  set (prompts.py) with the target, batched, and stores for every answer token
  the target's top-k log-probabilities, so that training needs no second
  target pass. Shards are written one batch at a time; a rerun skips what exists.
- `train_draft(...)` trains a small Llama-family draft with the forward KL
  against the stored target distribution (restricted to its top-k and
  renormalised), reporting held-out greedy agreement (alpha at temperature 0).

Why KL against the full distribution, not cross-entropy on sampled tokens: the
draft's acceptance is E[min(1, p/q)] = 1 - TV(p, q) (arXiv 2211.17192,
section 3.1), so it pays to match p everywhere, not only at the sampled token.
"""
import json
import math
from dataclasses import replace
from pathlib import Path

import torch
from tqdm.auto import tqdm

from safetensors.torch import save_file

from ..core.config import ModelConfig, cache_dir
from ..core.model import Transformer, init_weights
from ..cpu.linear import CAN_PACK_BF16
from ..io.assets import ensure_default_target
from ..io.weights import config_to_hf, load_draft, load_model, to_hf_state_dict
from .data import ShardData, collate, generate_data, make_batches
from .prompts import chat_prompts, distill_prompts, is_held_out, task_prompts


def draft_config(target_cfg, dim=128, n_layers=4, n_heads=4, n_kv_heads=2, intermediate_size=512):
    """A narrow, shallow Llama decoder with the target's vocabulary and rotary settings.

    Untied embeddings: with one matrix serving as both input embedding and output head,
    the draft learned several times slower here, whatever the learning rate or scale
    (an over-fitting probe on 151 tokens: 7-17% vs 79% agreement after 40 steps). Two
    matrices at width 128 cost the same bytes as one at 256, and stay under 30 MB in float16."""
    return ModelConfig(vocab_size=target_cfg.vocab_size, dim=dim, n_layers=n_layers, n_heads=n_heads,
                       n_kv_heads=n_kv_heads, head_dim=dim // n_heads, intermediate_size=intermediate_size,
                       norm_eps=target_cfg.norm_eps, rope_theta=target_cfg.rope_theta,
                       rope_scaling=target_cfg.rope_scaling, max_seq_len=min(target_cfg.max_seq_len, 4096),
                       tie_embeddings=False, eos_token_ids=target_cfg.eos_token_ids)


def pca_embeddings(target_embed: torch.Tensor, dim: int, std: float = 0.02) -> torch.Tensor:
    """Project the target's (V, dim_t) embeddings onto their top `dim` principal directions, (V, dim),
    scaled to `std`. Tokens that the target treats alike start alike in the draft."""
    E = target_embed.float()
    E = E - E.mean(0, keepdim=True)
    _, _, Vh = torch.linalg.svd(E, full_matrices=False)  # Vh (dim_t, dim_t)
    proj = E @ Vh[:dim].T  # (V, dim)
    return proj * (std / proj.std())


def init_draft(target, cfg, seed=0):
    """A draft whose input embedding (unit scale) and output head (small scale) both start
    as the PCA projection of the target's embedding."""
    draft = init_weights(Transformer(cfg), seed=seed)
    pca = pca_embeddings(target.head.weight.t(), cfg.dim, std=1.0)  # (V, dim)
    with torch.no_grad():
        draft.head.weight.copy_(0.02 * pca.t())
        if draft.embed is not None:
            draft.embed.weight.copy_(pca)
    return draft


def grow_draft(draft, n_layers):
    """A deeper copy of `draft` that computes the same function: new blocks are spread
    between the old ones (as in LLaMA Pro, arXiv 2401.02415), each with its two output
    projections (attention's wo, the MLP's w2) at zero, so that every new block adds
    nothing to the residual stream until training moves it."""
    old = draft.cfg.n_layers
    if n_layers < old:
        raise ValueError(f"n_layers must be at least the draft's {old}, got {n_layers}")
    grown = init_weights(Transformer(replace(draft.cfg, n_layers=n_layers)), seed=n_layers)
    extra = n_layers - old
    order = []  # the old block index in each slot of the grown draft, None for a new block
    for i in range(old):
        order.append(i)
        if extra and (i + 1) % max(1, old // extra) == 0 and order.count(None) < extra:
            order.append(None)
    order += [None] * (n_layers - len(order))
    with torch.no_grad():
        for name in ("embed", "norm", "head"):
            part = getattr(draft, name)
            if part is not None:
                getattr(grown, name).load_state_dict(part.state_dict())
        for slot, i in enumerate(order):
            if i is None:
                grown.layers[slot].attn.wo.weight.zero_()
                grown.layers[slot].mlp.w2.weight.zero_()
            else:
                grown.layers[slot].load_state_dict(draft.layers[i].state_dict())
    return grown


def kl_loss(logits, tgt_ids, tgt_lp, weight):
    """Forward KL(p || q) with p the target's top-k renormalised, averaged over answer positions.
    logits (..., V); tgt_ids, tgt_lp (..., k); weight (...) is 1 at answer positions."""
    logq = logits.float().log_softmax(-1).gather(-1, tgt_ids)  # (..., k)
    p = tgt_lp.softmax(-1)  # renormalise the stored top-k
    per_pos = (p * (p.clamp_min(1e-12).log() - logq)).sum(-1)  # (...)
    return torch.where(weight > 0, per_pos, 0.0).sum() / weight.sum().clamp_min(1)


def cpu_dtype() -> torch.dtype:
    """What the CPU computes fastest: bfloat16 where the processor has bfloat16 instructions
    (cpu.linear.CAN_PACK_BF16), float32 elsewhere. On an AVX2-only processor, one thread, a (32 x 576) @
    (576 x 1536) product took 46 ms in bfloat16 against 2.1 ms in float32, and a bfloat16-autocast
    (2048 x 128) @ (128 x 8192) 8.7-9.3 s against 0.16 s."""
    return torch.bfloat16 if CAN_PACK_BF16 else torch.float32


def draft_loss(draft, x, tgt_ids, tgt_lp, weight):
    """The KL at answer positions only: prompt and padding positions skip the (dim x V) head,
    which is most of a small draft's compute. Matmuls run in bfloat16 autocast on a CPU that
    computes bfloat16 natively (cpu_dtype), in float32 on one that does not."""
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=x.device.type == "cpu" and cpu_dtype() == torch.bfloat16):
        h = draft.hidden(x)  # (B, N, dim)
        keep = weight > 0  # (B, N)
        logits = draft.head(h[keep])  # (M, V)
    return kl_loss(logits, tgt_ids[keep], tgt_lp[keep], weight[keep])


@torch.no_grad()
def held_out_agreement(draft, examples, max_tokens=4096):
    """Greedy alpha on held-out answers: how often the draft's argmax equals the target's."""
    if not examples:
        return float("nan")
    hits = total = 0
    for idx in make_batches(examples, max_tokens, torch.Generator().manual_seed(0)):
        x, tgt_ids, _, weight = collate(examples, idx, draft.cfg.eos_token_ids[0])
        pred = draft(x).argmax(-1)  # (B, N)
        hits += ((pred == tgt_ids[..., 0]).float() * weight).sum().item()
        total += weight.sum().item()
    return hits / max(total, 1)


def train_draft(draft, examples, held, out_dir=None, epochs=4, lr=2e-3, max_tokens=4096, seed=0,
                eval_every=100, progress=True, log=None, total_steps=None, history=None):
    """Train `draft` (a Transformer) on stored target distributions; resumable from out_dir/ckpt.pt.

    `examples` is a list, or a function returning the current list: it is called again at every
    epoch, so that answers still being generated join the training as they land. With
    total_steps the run is that many optimizer steps (cosine schedule over them); otherwise
    `epochs` passes over the examples. Returns (draft, curve) with curve a list of
    (answer tokens seen, held-out greedy agreement) points; `history` = (seen, curve)
    continues the count and the curve of an earlier phase."""
    get = examples if callable(examples) else (lambda: examples)
    g = torch.Generator().manual_seed(seed)
    draft.train().requires_grad_(True)
    opt = torch.optim.AdamW(draft.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    data, pos = get(), 0
    batches = make_batches(data, max_tokens, g)
    total_steps = total_steps or epochs * len(batches)
    step, seen, curve = 0, 0, []
    if history is not None:  # a warm start: (answer tokens seen, curve) of the earlier phase
        seen, curve = history[0], list(history[1])
    ckpt = Path(out_dir) / "ckpt.pt" if out_dir else None
    if ckpt is not None:
        ckpt.parent.mkdir(parents=True, exist_ok=True)
    if ckpt is not None and ckpt.exists():
        state = torch.load(ckpt)
        draft.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step, seen, curve = state["step"], state["seen"], state["curve"]
    bar = tqdm(total=total_steps, initial=step, desc="distilling", disable=not progress)
    warmup = min(100, total_steps // 10 + 1)
    while step < total_steps:
        if pos == len(batches):  # a new epoch, over whatever data exists now
            data = get()
            batches, pos = make_batches(data, max_tokens, g), 0
        lr_now = lr * min(1.0, (step + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * step / total_steps))
        for group in opt.param_groups:
            group["lr"] = lr_now
        x, tgt_ids, tgt_lp, weight = collate(data, batches[pos], draft.cfg.eos_token_ids[0])
        pos += 1
        loss = draft_loss(draft, x, tgt_ids, tgt_lp, weight)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        opt.step()
        step += 1
        seen += int(weight.sum())
        if step % eval_every == 0 or step == total_steps:
            draft.eval()
            alpha = held_out_agreement(draft, held() if callable(held) else held)
            draft.train()
            curve.append((seen, alpha))
            if log:
                log(step, seen, loss.item(), alpha)
            if ckpt is not None:
                torch.save({"model": draft.state_dict(), "opt": opt.state_dict(), "step": step,
                            "seen": seen, "curve": curve}, ckpt)
        bar.set_postfix(loss=f"{loss.item():.3f}", alpha=f"{curve[-1][1]:.3f}" if curve else "-")
        bar.update(1)
    bar.close()
    return draft.eval().requires_grad_(False), curve


def save_draft(draft, out_dir, dtype=torch.float16, card: str | None = None):
    """Hugging Face format: config.json + model.safetensors (transformers can load it too)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    sd = {k: v.to(dtype) for k, v in to_hf_state_dict(draft).items()}
    save_file(sd, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    hf = config_to_hf(draft.cfg)
    hf["torch_dtype"] = str(dtype).replace("torch.", "")
    (out_dir / "config.json").write_text(json.dumps(hf, indent=2))
    if card:
        (out_dir / "README.md").write_text(card)
    return out_dir


def frequent_tokens(examples, n, vocab_size, always=()) -> tuple[list[int], float]:
    """(ids, coverage): the n token ids the target wrote most often in `examples`' answers, plus
    `always` (the EOS ids), sorted; coverage is the share of answer tokens they account for.
    A draft restricted to them (drafters.VocabSubsetHead) reads n head columns instead of V."""
    if not examples:
        raise ValueError("examples is empty: no answers to count tokens in")
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for ex in examples:
        counts += torch.bincount(ex[1].long(), minlength=vocab_size)
    top = counts.argsort(descending=True, stable=True)[:n]
    top = top[counts[top] > 0]
    ids = sorted(set(top.tolist()) | {int(t) for t in always})
    return ids, float(counts[ids].sum() / counts.sum())


def save_vocab_subset(out_dir, ids, coverage, source=""):
    """vocab_subset.json beside the draft's weights; pair.load_pair restricts the draft's head to it."""
    path = Path(out_dir) / "vocab_subset.json"
    path.write_text(json.dumps({"coverage": round(coverage, 4), "source": source, "ids": ids}))
    return path


# ----------------------------------------------------------------------------- the recipe

BUDGETS = {
    # rounds: one sampling temperature per pass over the prompts (0 = greedy); steps of ~2k answer tokens.
    "tiny": dict(num_prompts=24, rounds=(0.7,), max_new_tokens=32, steps=20, n_layers=1, eval_every=10),
    "full": dict(num_prompts=None, rounds=(0.7, 0.0, 1.0, 0.7, 0.0, 1.0), max_new_tokens=256, steps=750,
                 n_layers=4, eval_every=50),
}
# The task set (prompts.task_prompts): shorter answers, one greedy pass and five sampled ones.
TASK_DATA = dict(rounds=(0.0, 0.7, 1.0, 0.7, 1.0, 0.7), max_new_tokens=128, seed=200)
# The chat set (prompts.chat_prompts): the same passes, then four more sampled ones, another seed.
CHAT_DATA = dict(TASK_DATA, rounds=TASK_DATA["rounds"] + (0.7, 1.0, 0.7, 1.0), seed=300)
# The draft's head covers this many of the target's most frequent answer tokens (vocab_subset.json).
VOCAB_SUBSET_SIZE = 8192


CARD = """# specdec_lab draft for SmolLM2-135M-Instruct

A {n_layers}-layer, {dim}-wide Llama decoder ({params:.1f}M parameters, untied input
embedding and output head, stored in float16, {size_mb:.1f} MB) distilled from
SmolLM2-135M-Instruct by `python -m specdec_lab distill`, to serve as its
speculative-decoding draft. It shares the target's tokenizer (vocabulary 49152)
and loads in transformers (`LlamaForCausalLM.from_pretrained`) as well as in specdec_lab.

## Data
The target answered the project's prompt set (`specdec_lab/prompts.py`: {num_prompts}
instructions), one pass per temperature in {rounds} (0 = greedy), up to
{max_new_tokens} new tokens each, storing its top-64 log-probabilities for every
answer token. Every 10th prompt is held out. Training tokens: {train_tokens};
held-out tokens: {held_tokens}.

## Training
Forward KL from the stored top-64 distribution (renormalised), AdamW, cosine
schedule over {steps} steps of about 2k answer tokens.

## Head over frequent tokens
`vocab_subset.json` lists the {subset_size} tokens the target wrote most often in the training
answers ({coverage:.1%} of them); specdec_lab's `load_pair` restricts the draft's head to them.

## Measured
Held-out greedy agreement after training: {alpha:.3f}. Curve (answer tokens seen: alpha):
{curve}
"""


def _log_line(path):
    def log(step, seen, loss, alpha):
        with open(path, "a") as f:
            f.write(f"step {step} tokens {seen} loss {loss:.4f} held_out_alpha {alpha:.4f}\n")
    return log


def load_draft_weights(draft, source):
    """Warm start: weights from a training checkpoint (.pt) or a draft's Hugging Face folder.
    Returns the checkpoint's (answer tokens seen, curve), or None for a folder."""
    source = Path(source)
    history = None
    if source.suffix == ".pt":
        ckpt = torch.load(source)
        state, history = ckpt["model"], (ckpt["seen"], ckpt["curve"])
    else:
        state = load_draft(source).state_dict()
    draft.load_state_dict({k: v.float() for k, v in state.items()})
    return history


def layers_of(source) -> int:
    """How many blocks the weights in `source` (a ckpt.pt or a draft folder) have."""
    source = Path(source)
    if source.suffix == ".pt":
        keys = torch.load(source, map_location="cpu")["model"].keys()
        return 1 + max(int(k.split(".")[1]) for k in keys if k.startswith("layers."))
    return json.loads((source / "config.json").read_text())["num_hidden_layers"]


def distill_main(budget="full", out_dir=None, data_dir=None, work_dir=None, dtype_data=None,
                 data_dirs_extra=(), progress=True, data_minutes=None, steps=None, init_from=None, lr=3e-3,
                 task_data_dir=None, chat_data_dir=None, n_layers=None):
    """The whole recipe: target answers -> KL training -> Hugging Face folder with a model card.
    Data generation and training both resume where a previous run stopped. `init_from`
    (a checkpoint or a draft folder) starts training from those weights with a fresh
    optimizer and schedule: a second phase on more data. `task_data_dir` adds the target's
    answers to the task set (prompts.task_prompts, TASK_DATA), generated there first;
    `chat_data_dir` the same for the chat set (prompts.chat_prompts, CHAT_DATA). `n_layers`
    sets the draft's depth; with `init_from` it grows those weights to it (grow_draft). `dtype_data`
    ("bfloat16", "float32"): the target's dtype while it answers, by default cpu_dtype(). The draft is
    saved to `out_dir`, by default work_dir/draft in the cache (default_draft_dir() replaces the shipped one)."""
    if n_layers is not None and n_layers < 1:
        raise ValueError(f"n_layers must be >= 1, got {n_layers!r}")
    cfg_b = BUDGETS[budget]
    # The target answers in bfloat16 where the CPU computes it natively (the shipped draft's data), else float32.
    target, tok = load_model(ensure_default_target(), dtype=getattr(torch, dtype_data) if dtype_data else cpu_dtype())
    prompts = distill_prompts()[:cfg_b["num_prompts"]] if cfg_b["num_prompts"] else distill_prompts()
    work = Path(work_dir or cache_dir() / f"distill_{budget}")
    work.mkdir(parents=True, exist_ok=True)
    data = Path(data_dir or work / "data")
    generate_data(target, tok, data, rounds=cfg_b["rounds"], batch_size=32, max_new_tokens=cfg_b["max_new_tokens"],
                  seed=100, prompts=prompts, progress=progress, max_minutes=data_minutes)
    for extra_dir, settings, extra_prompts in ((task_data_dir, TASK_DATA, task_prompts),
                                               (chat_data_dir, CHAT_DATA, chat_prompts)):
        if extra_dir is not None:
            generate_data(target, tok, extra_dir, rounds=settings["rounds"], batch_size=32,
                          max_new_tokens=settings["max_new_tokens"], seed=settings["seed"], prompts=extra_prompts(),
                          progress=progress, max_minutes=data_minutes)
            data_dirs_extra = [*data_dirs_extra, extra_dir]
    del target
    shards = ShardData([data, *data_dirs_extra], is_held_out)
    _, held = shards.split()
    target_fp32, _ = load_model(ensure_default_target())
    layers = layers_of(init_from) if init_from is not None else (n_layers or cfg_b["n_layers"])
    draft = init_draft(target_fp32, draft_config(target_fp32.cfg, n_layers=layers))
    del target_fp32
    history = load_draft_weights(draft, init_from) if init_from is not None else None
    if n_layers is not None and n_layers != layers:
        draft = grow_draft(draft, n_layers)
    held_greedy = [ex for ex in held if ex[4] == 0.0] or held
    draft, curve = train_draft(draft, shards.train, held_greedy, out_dir=work, lr=lr, max_tokens=2048,
                               total_steps=steps or cfg_b["steps"], eval_every=cfg_b["eval_every"],
                               progress=progress, log=_log_line(work / "log.txt"), history=history)
    train, held = shards.split()
    # Never the shipped draft's folder by default: a first try must not overwrite it (pass it as out_dir).
    out = Path(out_dir or work / "draft")
    save_draft(draft, out)
    ids, coverage = frequent_tokens(train, VOCAB_SUBSET_SIZE, draft.cfg.vocab_size, always=draft.cfg.eos_token_ids)
    save_vocab_subset(out, ids, coverage, source=f"the {VOCAB_SUBSET_SIZE} tokens the target wrote most often "
                                                 "in the draft's training answers, and EOS")
    card = CARD.format(n_layers=draft.cfg.n_layers, dim=draft.cfg.dim, params=draft.cfg.num_params / 1e6,
                       size_mb=(out / "model.safetensors").stat().st_size / 1e6, num_prompts=len(prompts),
                       rounds=list(cfg_b["rounds"]), max_new_tokens=cfg_b["max_new_tokens"],
                       train_tokens=sum(len(e[1]) for e in train), held_tokens=sum(len(e[1]) for e in held),
                       steps=steps or cfg_b["steps"], alpha=curve[-1][1] if curve else float("nan"),
                       subset_size=len(ids), coverage=coverage,
                       curve=", ".join(f"{s}: {a:.3f}" for s, a in curve))
    (out / "README.md").write_text(card)
    return out, curve
