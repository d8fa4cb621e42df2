"""Fixed shapes and torch.compile as a runner: the `Transformer.runner` seam, installed from outside.

`StaticRows` takes over every forward whose cache is a StaticKVCache. The Python bookkeeping
(the length, its check, the positions, an explicit mask padded to the capacity) stays here;
`static_forward` sees the same shapes at every step, and with compile=True it runs through
torch.compile for the row counts in `rows`:

    target: rows (1, K + 1)   the autoregressive forward and the verification forward
    draft:  rows (1,)         gpt-fast's scheme: a draft that must take two tokens after a step
                              that accepted everything feeds them one at a time

so a speculative run compiles three graphs per pair, and every other forward (the prompt,
a long run of pending tokens) runs the same function uncompiled. rows=None compiles any
count up to MAX_ROWS on its first call.
"""
import torch
import torch.nn.functional as F

from .cache import StaticKVCache

MAX_ROWS = 9  # rows=None compiles forwards of up to this many rows after the prompt
SPLIT_ROWS = 2  # a last-row-only forward of up to this many rows may run one row at a time
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def static_forward(model, tokens, input_pos, cache, mask=None, embeds=None, head=True, last_only=False,
                   layers=None):
    """The fixed-shape forward that torch.compile traces: logits (B, T or 1, V) with head=True,
    else the normalised hidden states (B, T, dim), and with `layers` (head=False) also the chosen
    layers' states as Transformer.hidden gives them. Writes the cache at input_pos; does not
    advance it."""
    if mask is None:
        mask = cache.mask_rows(input_pos)  # (1, 1, T, S) boolean, gathered from one mask
    x, taps = model.run_blocks(tokens, input_pos, cache, mask, embeds, layers)
    if not head:
        return x if layers is None else (x, taps)  # (B, T, dim), (B, T, n * dim)
    if last_only:
        x = x[:, -1:]  # (B, 1, dim)
    return model.head(x).float()


class StaticRows:
    """The runner: `name` "static" or "compiled"; caches made for the model are StaticKVCache of
    at least `capacity` slots, so all of them share one shape (fixed_shapes)."""
    fixed_shapes = True

    def __init__(self, model, compile=False, mode=None, rows=None, capacity=2048):
        if mode is not None and mode not in COMPILE_MODES:
            raise ValueError(f"mode must be None or one of {COMPILE_MODES}, got {mode!r}")
        if rows is not None and not (isinstance(rows, tuple) and rows and all(
                isinstance(r, int) and not isinstance(r, bool) and 1 <= r <= 64 for r in rows)):
            raise ValueError(f"rows must be None or a non-empty tuple of row counts in [1, 64], got {rows!r}")
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"capacity must be a positive int, got {capacity!r}")
        self.model, self.rows = model, rows
        self.capacity = min(capacity, model.cfg.max_seq_len)
        self.name = "compiled" if compile else "static"
        self.compiled = None
        if compile:
            mode = mode or ("reduce-overhead" if model.device.type == "cuda" else "default")
            # Each (model, row count) is one graph of the one function static_forward, and torch
            # counts a function's graphs together against a limit of 8, which a process holding
            # several models passes. torch has no public setting for it; fullgraph=True turns
            # reaching it into an error instead of a silent eager fallback.
            import torch._dynamo.config as dynamo_config
            dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, 64)
            self.compiled = torch.compile(static_forward, mode=mode, dynamic=False, fullgraph=True)

    def __deepcopy__(self, memo):  # a copied model gets its own runner, over the copy
        model = memo.get(id(self.model))
        if model is None:
            return None
        twin = StaticRows.__new__(StaticRows)
        twin.__dict__.update(self.__dict__, model=model)
        return twin

    def new_cache(self, capacity, batch_size=1):
        """A StaticKVCache of the runner's capacity (or of `capacity` where more is asked: another
        shape, so every graph compiles again for it), made outside inference mode: a compiled graph
        is shared by every call, and inference tensors would guard it differently."""
        m = self.model
        with torch.inference_mode(False):
            return StaticKVCache(m.cfg.n_layers, batch_size, m.cfg.n_kv_heads, max(capacity, self.capacity),
                                 m.cfg.head_dim, m.dtype, m.device)

    def compiles(self, T: int) -> bool:
        if self.compiled is None:
            return False
        return T <= MAX_ROWS if self.rows is None else T in self.rows

    def logits(self, tokens, input_pos, cache, mask, last_only):
        return self._run(tokens, input_pos, cache, mask, None, True, last_only, None)

    def hidden(self, tokens, input_pos, cache, mask, embeds, layers):
        return self._run(tokens, input_pos, cache, mask, embeds, False, False, layers)

    def _run(self, tokens, input_pos, cache, mask, embeds, head, last_only, layers):
        if not isinstance(cache, StaticKVCache):
            return None  # no cache (training) or another kind: the eager code runs
        m, T, start = self.model, tokens.shape[1], cache.length
        cache.reserve(T)  # raise before any layer writes
        if input_pos is None:
            input_pos = torch.arange(start, start + T, device=tokens.device)  # a kernel, not a copy
        if mask is not None:  # an explicit (B, 1, T, L+T) mask: extend it over the whole capacity
            mask = F.pad(mask.to(m.dtype), (0, cache.capacity - mask.shape[-1]), value=float("-inf"))
        plain = start > 0 and embeds is None and mask is None and input_pos.dim() == 1
        if plain and self.compiles(T):
            out = self.compiled(m, tokens, input_pos, cache, None, None, head, last_only, layers)
            # CUDA graphs replay into the same output buffer each call: the clone keeps this one.
            out = out.clone() if layers is None else tuple(o.clone() for o in out)
        elif plain and head and last_only and T <= SPLIT_ROWS and self.compiles(1):
            for i in range(T):  # one row at a time through the one-row graph; the last row's logits
                row = tokens[:, i:i + 1].clone(memory_format=torch.contiguous_format)  # strides (1, 1): no recompile
                out = self.compiled(m, row, input_pos[i:i + 1], cache, None, None, True, True, None).clone()
        else:
            out = static_forward(m, tokens, input_pos, cache, mask, embeds, head, last_only, layers)
        cache.advance(T)
        return out
