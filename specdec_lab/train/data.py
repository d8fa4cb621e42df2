"""The draft's training data: the target answers the prompt sets, and each answer token keeps the
target's top-k log-probabilities, so that training needs no second target pass.

`generate_data` writes one shard per batch into a folder; a rerun skips what exists, so a long
run resumes where it stopped. `ShardData` reads the shards (new ones join as they land),
`make_batches` groups examples by length under a token budget, `collate` pads a batch.
"""
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ..core.kv_cache import KVCache
from ..core.sampling import logits_to_probs, make_generator, sample
from ..core.text import encode_prompt
from .handwritten import is_held_out_text
from .prompts import distill_prompts


def _prefill_mask(pad: torch.Tensor, n: int) -> torch.Tensor:
    """Causal (B, 1, n, n) mask that also hides each row's left padding.
    A pad row still sees itself, so no softmax row is all -inf (that would put NaN in the cache)."""
    row = torch.arange(n).view(1, n, 1)
    col = torch.arange(n).view(1, 1, n)
    allowed = (col <= row) & ((col >= pad.view(-1, 1, 1)) | (col == row))  # (B, n, n)
    return torch.zeros(allowed.shape).masked_fill(~allowed, float("-inf")).unsqueeze(1)


@torch.no_grad()
def sample_batch(model, prompts: list[list[int]], max_new_tokens: int, temperature: float,
                 generator: torch.Generator, top_k_store: int = 64, keep_hidden: bool = False,
                 keep_layers: tuple | None = None):
    """Answer a batch of prompts; returns per prompt (answer ids, top-k ids, top-k log-probs), and
    with keep_hidden a fourth item: the target's final hidden states (prompt + answer - 1, dim) in
    float16, at every position it read (train/feature.py trains on them). With keep_layers, the
    fourth item is instead the residual stream after those layers, (prompt + answer - 1,
    len(keep_layers) * dim), what an EAGLE-3-style draft reads (train/eagle3.py)."""
    keep_hidden = keep_hidden or keep_layers is not None

    def forward(x, mask):  # (final states, what to keep)
        if keep_layers is None:
            h = model.hidden(x, cache=cache, mask=mask)
            return h, h
        return model.hidden(x, cache=cache, mask=mask, layers=keep_layers)

    B, n = len(prompts), max(len(p) for p in prompts)
    eos = torch.tensor(model.cfg.eos_token_ids)
    pad = torch.tensor([n - len(p) for p in prompts])
    tokens = torch.full((B, n), int(eos[0]))
    for b, p in enumerate(prompts):
        tokens[b, n - len(p):] = torch.tensor(p)
    cache = KVCache.for_model(model.cfg, n + max_new_tokens, batch_size=B, dtype=model.dtype)
    h, kept = forward(tokens, _prefill_mask(pad, n))  # (B, n, dim)
    logits = model.head(h[:, -1]).float()  # (B, V)
    hidden = [kept.half()] if keep_hidden else None
    out, top_ids, top_lp = [], [], []
    done = torch.zeros(B, dtype=torch.bool)
    for _ in range(max_new_tokens):
        lp = logits.log_softmax(-1).topk(min(top_k_store, logits.shape[-1]), dim=-1)
        top_ids.append(lp.indices.to(torch.int32))
        top_lp.append(lp.values.half())
        nxt = sample(logits_to_probs(logits, temperature), generator)
        nxt = torch.where(done, eos[0], nxt)
        out.append(nxt)
        done |= torch.isin(nxt, eos)
        if bool(done.all()):  # sync: fine here, data generation is offline
            break
        col = torch.arange(cache.length + 1)
        mask = torch.zeros(B, 1, 1, cache.length + 1).masked_fill(col < pad.view(-1, 1, 1, 1), float("-inf"))
        h, kept = forward(nxt[:, None], mask)  # (B, 1, dim)
        logits = model.head(h[:, -1]).float()
        if keep_hidden:
            hidden.append(kept.half())
    out, top_ids, top_lp = torch.stack(out, 1), torch.stack(top_ids, 1), torch.stack(top_lp, 1)
    hidden = torch.cat(hidden, 1) if keep_hidden else None  # (B, n + steps - 1, dim)
    results = []
    for b in range(B):
        ids = out[b].tolist()
        stop = next((i + 1 for i, t in enumerate(ids) if t in model.cfg.eos_token_ids), len(ids))
        res = (out[b, :stop].clone(), top_ids[b, :stop].clone(), top_lp[b, :stop].clone())
        if keep_hidden:  # the prompt's positions (without left padding) and the answer's but the last
            res += (hidden[b, int(pad[b]):n + stop - 1].clone(),)
        results.append(res)
    return results


def generate_data(target, tokenizer, out_dir, rounds=(0.7, 0.0, 1.0), batch_size=16,
                  max_new_tokens=256, top_k_store=64, seed=0, prompts=None, progress=True, max_minutes=None,
                  keep_hidden=False, keep_layers=None):
    """Write shards round{r}_{i}.pt under out_dir. Each round answers every prompt once at its temperature.
    With max_minutes, stop starting new batches after that long (a rerun resumes where it stopped).
    keep_hidden also stores the target's hidden states (sample_batch) under "hidden"; keep_layers, the
    states after those layers instead (and the layers under "layers")."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    prompts = prompts if prompts is not None else distill_prompts()
    leaked = [p for p in prompts if isinstance(p, str) and is_held_out_text(p)]
    if leaked:  # refused, not dropped: dropping would shift the prompt indices that shards store
        raise ValueError(f"prompts must not contain the hand-written held-out prompts (train/handwritten.py); "
                         f"got {len(leaked)} of them, e.g. {leaked[0]!r}")
    encoded = [encode_prompt(tokenizer, p) for p in prompts]
    order = sorted(range(len(prompts)), key=lambda i: len(encoded[i]))  # similar lengths batch together
    batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    total = len(rounds) * len(batches)
    bar = tqdm(total=total, desc="target answers", disable=not progress)
    t0, n_tokens = time.time(), 0
    for r, temp in enumerate(rounds):
        g = make_generator(seed + 1000 * r, "cpu")
        for i, idx in enumerate(batches):
            path = out_dir / f"round{r}_{i:04d}.pt"
            if path.exists():
                bar.update(1)
                continue
            if max_minutes is not None and time.time() - t0 > 60 * max_minutes:
                bar.close()
                return out_dir
            res = sample_batch(target, [encoded[j] for j in idx], max_new_tokens, temp, g, top_k_store, keep_hidden,
                               keep_layers)
            shard = {"prompt_index": idx, "temperature": temp,
                     "prompt_ids": [torch.tensor(encoded[j], dtype=torch.int32) for j in idx],
                     "answer_ids": [r[0].to(torch.int32) for r in res],
                     "top_ids": [r[1] for r in res], "top_logprobs": [r[2] for r in res]}
            if keep_hidden or keep_layers is not None:
                shard["hidden"] = [r[3] for r in res]
            if keep_layers is not None:
                shard["layers"] = list(keep_layers)
            torch.save(shard, str(path) + ".partial")
            Path(str(path) + ".partial").replace(path)
            n_tokens += sum(len(r[0]) for r in res)
            bar.update(1)
            bar.set_postfix(round=r, temp=temp, tok_s=f"{n_tokens / (time.time() - t0):.0f}")
    bar.close()
    return out_dir


# ----------------------------------------------------------------------------- training

def load_shards(data_dir, held_out):
    """(train, held) lists of examples (prompt_ids, answer_ids, top_ids, top_logprobs, temperature).
    held_out: the held-out prompt indices, a set or a predicate."""
    held_out = held_out if callable(held_out) else held_out.__contains__
    train, held = [], []
    for path in sorted(Path(data_dir).glob("round*.pt")):
        shard = torch.load(path)
        for j, idx in enumerate(shard["prompt_index"]):
            ex = (shard["prompt_ids"][j].long(), shard["answer_ids"][j].long(), shard["top_ids"][j].long(),
                  shard["top_logprobs"][j].float(), shard["temperature"])
            (held if held_out(idx) else train).append(ex)
    return train, held


def make_batches(examples, max_tokens, generator, length=None):
    """Length-sorted batches of about max_tokens tokens, shuffled batch order. `length`: an example's
    length in tokens (default: prompt + answer, load_shards' examples)."""
    length = length or (lambda ex: len(ex[0]) + len(ex[1]))
    order = sorted(range(len(examples)), key=lambda i: length(examples[i]))
    batches, cur, cur_len = [], [], 0
    for i in order:
        n = length(examples[i])
        if cur and (len(cur) + 1) * max(cur_len, n) > max_tokens:
            batches.append(cur)
            cur, cur_len = [], 0
        cur.append(i)
        cur_len = max(cur_len, n)
    if cur:
        batches.append(cur)
    perm = torch.randperm(len(batches), generator=generator).tolist()
    return [batches[i] for i in perm]


def collate(examples, idx, pad_id):
    """Right-padded inputs (B, N), and for every answer position its target top-k and a weight."""
    seqs = [torch.cat([examples[i][0], examples[i][1]]) for i in idx]
    N = max(len(s) for s in seqs) - 1
    k = examples[idx[0]][2].shape[-1]
    x = torch.full((len(idx), N), pad_id, dtype=torch.long)
    tgt_ids = torch.zeros(len(idx), N, k, dtype=torch.long)
    tgt_lp = torch.zeros(len(idx), N, k)  # padding positions get weight 0; finite so no NaN appears
    weight = torch.zeros(len(idx), N)
    for b, i in enumerate(idx):
        prompt, answer, top_ids, top_lp, _ = examples[i]
        s = seqs[b][:-1]
        x[b, :len(s)] = s
        start = len(prompt) - 1  # the position whose output predicts answer[0]
        tgt_ids[b, start:start + len(answer)] = top_ids
        tgt_lp[b, start:start + len(answer)] = top_lp
        weight[b, start:start + len(answer)] = 1.0
    return x, tgt_ids, tgt_lp, weight


class ShardData:
    """The (train, held) split of every shard under some folders, reloaded when shards are added:
    `train()` is what train_draft calls at each epoch, so answers still being generated by
    another process join the training as they land."""

    def __init__(self, dirs, held_idx):
        self.dirs, self.held_idx, self._files, self._split = [Path(d) for d in dirs], held_idx, None, ([], [])

    def split(self):
        files = sorted(str(f) for d in self.dirs for f in d.glob("round*.pt"))
        if files != self._files:
            train, held = [], []
            for d in self.dirs:
                t, h = load_shards(d, self.held_idx)
                train, held = train + t, held + h
            self._files, self._split = files, (train, held)
        return self._split

    def train(self):
        return self.split()[0]
