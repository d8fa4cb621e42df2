"""A long prompt's forward in chunks of rows: what the CPU runner (fused.FusedRows) runs for a prefill.

Past PREFILL_CHUNK rows, `chunked_hidden` feeds the prompt to the model's eager code PREFILL_CHUNK
rows at a time. Each chunk writes its keys and values into the cache and attends over the cache and
itself under the causal mask shifted by the cache's length (core/masks.py), so the cache ends as one
forward over the whole prompt leaves it, and every row's state is that forward's to rounding.
`Transformer.eager_hidden` over the whole prompt is the reference twin (tests/test_prefill.py).

Why chunks: a chunk's queries see only the keys before its end, so the attention computes about half
of the (T, T) scores a single masked forward computes and then masks away, and a chunk's activations
(its (C, intermediate) MLP rows) stay small. On the default target, one thread, 1,785 prompt tokens
in chunks of 256 rows took 0.86x the time of one forward; 128 to 1,024 rows were within 7% of each
other (docs/benchmarks.md, section 26).
"""
import torch

PREFILL_CHUNK = 256


def chunk_applies(model, tokens, input_pos, cache, mask) -> bool:
    """A prefill the chunks reproduce: one row of more than PREFILL_CHUNK tokens into a cache (a batch
    of several comes with its own positions and masks), at the cache's own positions, with the default
    causal mask, nothing to differentiate, and positions inside the rotary table (else the whole
    forward runs, and fails, as it always did, before anything is written)."""
    B, T = tokens.shape
    if not (B == 1 and T > PREFILL_CHUNK and cache is not None and mask is None
            and not (torch.is_grad_enabled() and model.head.weight.requires_grad)
            and cache.length + T <= model.rope_cos.shape[0]):
        return False
    return input_pos is None or (input_pos.dim() == 1  # sync: a CPU tensor's values
                                 and input_pos.tolist() == list(range(cache.length, cache.length + T)))


def chunked_hidden(model, tokens, cache, embeds=None, layers=None, chunk=PREFILL_CHUNK):
    """model.eager_hidden(tokens, cache=cache, embeds=embeds, layers=layers), `chunk` rows per forward.
    tokens (B, T); embeds (B, T, dim) or None. Returns the final states (B, T, dim), and with `layers`
    also the residual stream after those layers (B, T, len(layers) * dim): every prompt position's."""
    T = tokens.shape[1]
    cache.reserve(T)  # raise before the first chunk writes, as the one forward does
    states, taps = [], []
    for s in range(0, T, chunk):
        part = None if embeds is None else embeds[:, s:s + chunk]  # (B, C, dim)
        out = model.eager_hidden(tokens[:, s:s + chunk], cache=cache, embeds=part, layers=layers)
        x, tap = out if layers is not None else (out, None)  # (B, C, dim), (B, C, n * dim) or None
        states.append(x)
        taps.append(tap)
    x = torch.cat(states, dim=1)  # (B, T, dim)
    return x if layers is None else (x, torch.cat(taps, dim=1))


def chunked_logits(model, tokens, cache, last_only):
    """Transformer.forward's logits (B, T or 1, V) in float32 from chunked_hidden's states."""
    x = chunked_hidden(model, tokens, cache)
    return model.head(x[:, -1:] if last_only else x).float()
