"""A model's forward over a few rows in one call into the kernel library (build.py).

FusedForward runs decode's one token, verification's K+1 rows, a token tree, or several
sequences' rows at once through every layer in one ctypes call. A `Layout` says, row by row,
where its key goes and which keys it reads (a flattened batch, as vLLM runs every shape):
`chain` makes one sequence's, `from_mask` a tree's (any additive mask), and a batch of
sequences over paged blocks brings its own (serve/kv.py, `BatchView.fused_layout`).
OneTokenDecoder feeds it one row at a time into a fixed cache; FusedRows is what `accelerate`
installs as a Transformer's `runner` (the seam of core/model.py), so that the model's own
forward takes the one call wherever it applies and its eager code elsewhere.
"""
import ctypes
import threading
from typing import NamedTuple

import torch

from ..core.kv_cache import KVCache
from ..core.model import Linear
from . import build as kernels
from .linear import panel_weight
from .prefill import chunk_applies, chunked_hidden, chunked_logits


FORWARD_MAX_ROWS = 64  # rows one call takes: a batch of 8 sequences' K+1 = 5 rows, a tree of 64 nodes


class Layout(NamedTuple):
    """Where each of a call's R rows writes its key and value, and which keys it attends over
    (csrc/panel_matmul.cpp, the one-call forward). A key row is D floats of head 0 in one layer of
    k (or v), whose first dimension is the layers; head g's row is head_stride rows further."""
    k: torch.Tensor  # (L, ...) float32, contiguous: the cache's keys, layers first
    v: torch.Tensor  # the same for values
    head_stride: int  # key rows between one head's row and the next head's
    pos: torch.Tensor  # (R,) int64: each row's rotary position
    write: torch.Tensor  # (R,) int64: the key row each row's key and value go to
    start: torch.Tensor  # (R,) int64: where each row's key rows begin in `keys`
    count: torch.Tensor  # (R,) int64: how many it attends over (its own included)
    keys: torch.Tensor  # (M,) int64: key rows, row by row, in the order attention sums them
    max_keys: int  # the largest count
    mask: torch.Tensor = None  # (R, max_keys) float32 or None: added to each row's scores; -inf leaves a key out


_ARANGE = {}  # capacity -> arange(capacity + 1): a chain's positions, written rows and counts, as views
_ZEROS = torch.zeros(FORWARD_MAX_ROWS, dtype=torch.long)  # a chain's starts: every row reads from key 0


def chain(cache: KVCache, R: int) -> Layout:
    """R rows of one sequence after cache.length in a contiguous batch-1 cache: row r at position
    L + r, written there, attending over positions 0..L + r. Views of one cached arange: no new tensor."""
    L, S = cache.length, cache.capacity
    ar = _ARANGE.get(S)
    if ar is None:
        ar = _ARANGE[S] = torch.arange(S + 1)
    return Layout(cache.k, cache.v, S, ar[L:L + R], ar[L:L + R], _ZEROS[:R], ar[L + 1:L + R + 1], ar[:L + R],
                  L + R)


def from_mask(cache: KVCache, input_pos: torch.Tensor, mask: torch.Tensor) -> Layout:
    """R rows after cache.length in a contiguous batch-1 cache, at positions input_pos (R,), written
    at L..L + R - 1 (where the eager forward writes them), each attending over the columns its row of
    the additive mask (1, 1, R, L + R) does not hold at -inf (a token tree's), with that row's values
    added to its scores. The kernel reads the mask itself: nothing here reads a tensor's values."""
    R, L = mask.shape[2], cache.length
    lay = chain(cache, R)
    ar = _ARANGE[cache.capacity]
    return lay._replace(pos=input_pos.reshape(R).long().contiguous(), count=ar[L + R:L + R + 1].expand(R).contiguous(),
                        mask=mask[0, 0].float().contiguous())


def is_subset_head(head) -> bool:
    """A head over a subset of the vocabulary (drafters.VocabSubsetHead): a product `proj` over the
    columns `ids`, the rest -inf. Read by its parts, as cpu/ does not import the drafters."""
    return hasattr(head, "proj") and hasattr(head, "ids") and hasattr(head, "vocab_size")


class FusedForward:
    """A model's forward over a few rows as one call into the kernel library (build.py,
    `forward_rows`). `fused(rows, cache)` runs decode's one token or verification's K+1 after a
    contiguous batch-1 KVCache's length and advances it; `fused.run(rows, layout)` runs rows laid
    out by a `Layout` (a tree's, a batch of sequences'), which the caller commits.

    The eager forward of the default target is some 450 operator calls a token; this runs the
    same arithmetic with none in between (docs/benchmarks.md has what that bought). Each row's
    result is bit-for-bit the same whatever the other rows are, so a token decoded alone and the
    same token inside a verification pass, a tree or a batch get the same logits, given the same
    keys; all agree with the eager path to rounding in attention. `FusedForward.supports` says
    which models it takes: float32 on the CPU, no biases, and the kernel library.

    weights="float16" reads the products' weights rounded to half precision (`forward_rows_half`),
    weights="int8" rounded to int8 against a scale per output column (`forward_rows_int8`): half or
    a quarter of the bytes, the arithmetic still in float32, the logits no longer the eager
    path's. weights="int4" reads the layers' weights in 4 bits with a scale and offset per column
    and group of 32 inputs, and the head in int8 with a scale per group (`forward_rows_int4`): a
    sixth of the bytes. For a draft whose weights stream from memory for every token, or the target
    itself as its own draft (self_draft.py). A draft's proposals only need to be likely;
    verification keeps the output the target's.
    Weights are re-read on every call, so a model trained after this was built is seen as it is.
    Threads may share one: each has its own scratch memory, so two engines over one target can
    decode at once, each with its own cache."""

    WEIGHTS = {"float32": torch.float32, "float16": torch.float16, "int8": torch.int8, "int4": torch.uint4}
    HEAD = {"int4": torch.qint8}  # the head's precision where it is not the layers'; see forward_rows_int4

    @staticmethod
    def supports(model, weights="float32") -> bool:
        """The model and the kernel library: float32 on the CPU, no biases, and for weights="float16"
        / "int8" / "int4" the library's forward for them (kernels.has_half(), kernels.has_int8(),
        kernels.has_int4()); "int4" also needs every product's inputs (the head's too) in groups of 32."""
        if weights not in FusedForward.WEIGHTS:
            raise ValueError(f"weights must be one of {sorted(FusedForward.WEIGHTS)}, got {weights!r}")
        head = model.head.proj if is_subset_head(model.head) else model.head
        linears = [head] + [m for b in model.layers for m in (b.attn.wqkv, b.attn.wo, b.mlp.w13, b.mlp.w2)]
        built = {"float32": kernels.available, "float16": kernels.has_half, "int8": kernels.has_int8,
                 "int4": kernels.has_int4}[weights]
        grouped = weights != "int4" or all(m.weight.shape[0] % kernels.INT4_GROUP == 0
                                           and m.weight.shape[0] <= kernels.INT4_MAX_K for m in linears)
        # The device first: on CUDA the kernel library is never built
        return (model.device.type == "cpu" and model.dtype == torch.float32 and built()
                and all(m.bias is None and m.weight.is_contiguous() for m in linears) and grouped)

    @staticmethod
    def supports_cache(cache) -> bool:
        """A contiguous batch-1 float32 KVCache (not a paged one)."""
        return (type(cache) is KVCache and cache.k.shape[1] == 1 and cache.k.dtype == torch.float32
                and cache.k.is_contiguous() and cache.v.is_contiguous())

    def __init__(self, model, weights="float32"):
        if not FusedForward.supports(model, weights):
            raise ValueError("FusedForward needs a float32 CPU model without biases and the kernel library "
                             "(kernels.available(); weights='float16' needs kernels.has_half(), 'int8' "
                             "kernels.has_int8(), 'int4' kernels.has_int4() and inputs in groups of 32)")
        self.model, self.weights = model, weights
        # Scratch memory is each thread's own: the kernel runs without the GIL, and two engines may
        # share a model. `work` holds a call's hidden states and attention scores, `rows` its row count.
        self._scratch = threading.local()
        self._built = (None, None)  # (freshness key, pointer arrays with the panels they point into)
        self._tap_tables = {}  # layers -> the kernel's tap slot per layer
        self._forward = {"float32": kernels.forward_rows, "float16": kernels.forward_rows_half,
                         "int8": kernels.forward_rows_int8, "int4": kernels.forward_rows_int4}[weights]
        self.padded = lambda n, pw=kernels.panel_width(): -(-n // pw) * pw

    def _parts(self):
        """The norms and products the call reads, in forward order (attn_norm, wqkv, wo, mlp_norm, w13,
        w2 per layer, then the final norm and the head), found through the modules' own dictionaries.
        Private nn.Module dictionaries, not attribute access: nn.Module.__getattr__ made this walk
        up to a tenth of an int8 self-draft token (docs/benchmarks.md)."""
        mods = self.model._modules
        head = mods["head"]
        if is_subset_head(head):
            head = head._modules["proj"]
        out = []
        for b in mods["layers"]._modules.values():
            bm = b._modules
            am, mm = bm["attn"]._modules, bm["mlp"]._modules
            out += (bm["attn_norm"], am["wqkv"], am["wo"], bm["mlp_norm"], mm["w13"], mm["w2"])
        return out + [mods["norm"], head]

    def _build(self, parts):
        """The pointer arrays the kernel reads: one per kind of layer weight, then the final norm,
        the head's panels, the head's width and the layer count. Norms are read as they are,
        products from their panels at this forward's precision."""
        dt = FusedForward.WEIGHTS[self.weights]
        held = [panel_weight(m, dt) if isinstance(m, Linear) else m._parameters["weight"] for m in parts[:-1]]
        held.append(panel_weight(parts[-1], self.HEAD.get(self.weights, dt)))
        n_layers = (len(parts) - 2) // 6
        groups = [(ctypes.c_void_p * n_layers)(*[t.data_ptr() for t in held[i:-2:6]]) for i in range(6)]
        # `held` keeps what the pointers point into alive while any call still reads them
        return groups, held[-2].data_ptr(), held[-1].data_ptr(), parts[-1].weight.shape[1], n_layers, held

    def __call__(self, rows: torch.Tensor, cache: KVCache, head: bool = True):
        """rows (R, dim) float32: input rows (token embeddings, or a feature draft's own) at positions
        cache.length .. + R - 1 of a contiguous batch-1 cache, which advances by R. Returns the logits
        (R, V), or None with head=False (a row whose logits nobody reads costs only the layers);
        `hidden_states()` gives the final normalised hidden states either way."""
        self._check_rows(rows, kernels.MAX_ROWS)
        if not FusedForward.supports_cache(cache):
            raise ValueError("cache must be a contiguous batch-1 float32 KVCache")
        R = rows.shape[0]
        cache.reserve(R)
        if cache.length + R > self.model.rope_cos.shape[0]:
            raise ValueError(f"positions up to {cache.length + R} exceed the rotary table "
                             f"({self.model.rope_cos.shape[0]})")
        y = self._run(rows, chain(cache, R), head, None)
        cache.advance(R)
        return y

    def run(self, rows: torch.Tensor, layout: Layout, head: bool = True, layers=None):
        """rows (R, dim) float32 placed by `layout` (its caches are not advanced: the caller commits).
        Returns the logits (R, V), or None with head=False. `layers`, increasing layer indices: the
        residual stream after each is kept for `layer_states()`."""
        self._check_rows(rows, FORWARD_MAX_ROWS)
        self._check_layout(layout, rows.shape[0])
        return self._run(rows, layout, head, layers)

    def _check_rows(self, rows, limit):
        dim = self.model.cfg.dim
        if rows.dim() != 2 or rows.shape[1] != dim or rows.dtype != torch.float32 or not rows.is_contiguous():
            raise ValueError(f"rows must be a contiguous float32 tensor of shape (R, {dim}), "
                             f"got {tuple(rows.shape)} {rows.dtype}")
        if not 1 <= rows.shape[0] <= limit:
            raise ValueError(f"rows must hold 1 to {limit} rows, got {rows.shape[0]}")

    def _check_layout(self, lay, R):
        """What the kernel trusts: shapes, dtypes and every index inside the cache and the rotary table."""
        cfg = self.model.cfg
        ints = (lay.pos, lay.write, lay.start, lay.count)
        if not all(t.shape == (R,) and t.dtype == torch.long and t.is_contiguous() for t in ints):
            raise ValueError(f"layout: pos, write, start and count must be contiguous int64 tensors of shape ({R},)")
        if lay.keys.dim() != 1 or lay.keys.dtype != torch.long or not lay.keys.is_contiguous():
            raise ValueError("layout: keys must be a contiguous int64 tensor of one dimension")
        if not (lay.k.shape == lay.v.shape and lay.k.dtype == lay.v.dtype == torch.float32 and lay.k.is_contiguous()
                and lay.v.is_contiguous() and lay.k.shape[0] == cfg.n_layers and lay.k.shape[-1] == cfg.head_dim):
            raise ValueError(f"layout: k and v must be contiguous float32 tensors of the same shape "
                             f"({cfg.n_layers}, ..., {cfg.head_dim})")
        key_rows = lay.k[0].numel() // cfg.head_dim - (cfg.n_kv_heads - 1) * lay.head_stride  # head 0's rows
        span = [(lay.write, key_rows), (lay.keys, key_rows), (lay.pos, self.model.rope_cos.shape[0])]
        for name, (t, n) in zip(("write", "keys", "pos"), span):
            if t.numel() and not (0 <= int(t.min()) and int(t.max()) < n):
                raise ValueError(f"layout: {name} must lie in [0, {n}), got {int(t.min())}..{int(t.max())}")
        if lay.mask is not None and not (lay.mask.dim() == 2 and lay.mask.shape[0] == R and lay.mask.is_contiguous()
                                         and lay.mask.dtype == torch.float32 and lay.mask.shape[1] >= lay.max_keys):
            raise ValueError(f"layout: mask must be a contiguous float32 tensor of shape ({R}, >= max_keys)")
        end = lay.start + lay.count
        if int(lay.count.min()) < 1 or int(lay.start.min()) < 0 or int(end.max()) > lay.keys.numel() \
                or int(lay.count.max()) > lay.max_keys:
            raise ValueError(f"layout: every row needs 1 to max_keys={lay.max_keys} keys inside keys "
                             f"({lay.keys.numel()})")

    def _taps(self, layers):
        """The kernel's per-layer tap slots for `layers` (None: no taps), made once per tuple."""
        if layers is None:
            return None
        taps = self._tap_tables.get(layers)
        if taps is None:
            taps = torch.full((self.model.cfg.n_layers,), -1, dtype=torch.long)
            taps[list(layers)] = torch.arange(len(layers))
            taps = self._tap_tables[layers] = taps
        return taps

    def _run(self, rows, lay, head, layers):
        m, cfg = self.model, self.model.cfg
        R = rows.shape[0]
        # Panels and pointer arrays are rebuilt only when a weight changed: another tensor, or written
        parts = self._parts()
        key = [(w.data_ptr(), w._version) for w in (m._parameters["weight"] for m in parts)]
        built_key, pointers = self._built
        if key != built_key:
            pointers = self._build(parts)
            self._built = (key, pointers)  # one assignment: another thread sees the old pair or the new
        groups, norm_ptr, head_ptr, n, n_layers, _held = pointers
        H, Hkv, D = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        need = kernels.forward_work(R, cfg.dim, H, Hkv, D, cfg.intermediate_size, lay.max_keys,
                                    torch.get_num_threads())
        scratch = self._scratch
        if getattr(scratch, "work", None) is None or scratch.work.numel() < need:
            scratch.work = torch.empty(need)
        taps = self._taps(layers)
        scratch.taps = None if taps is None else torch.empty(R, len(layers) * cfg.dim)
        n_out = self.padded(n) if head else 0
        logits = torch.empty(R, n_out)
        status = self._forward(
            rows.data_ptr(), R, n_layers, *groups, norm_ptr, head_ptr, n_out,
            lay.k.data_ptr(), lay.v.data_ptr(), lay.k[0].numel(), lay.head_stride,
            lay.pos.data_ptr(), lay.write.data_ptr(), lay.start.data_ptr(), lay.count.data_ptr(),
            lay.keys.data_ptr(), lay.max_keys, None if lay.mask is None else lay.mask.data_ptr(),
            0 if lay.mask is None else lay.mask.shape[1], m.rope_cos.data_ptr(), m.rope_sin.data_ptr(),
            m.rope_cos.shape[0], cfg.dim, H, Hkv, D, cfg.intermediate_size, cfg.norm_eps,
            None if taps is None else taps.data_ptr(), 0 if taps is None else len(layers),
            None if taps is None else scratch.taps.data_ptr(), scratch.work.data_ptr(), logits.data_ptr())
        if status:  # checked before anything was written
            raise IndexError(f"input_pos: row {status - 1}'s position lies outside the rotary table "
                             f"({m.rope_cos.shape[0]} positions)")
        scratch.rows = R
        if not head:
            return None
        y = logits[:, :n]
        if is_subset_head(m.head):
            return y.new_full((R, m.head.vocab_size), float("-inf")).index_copy_(1, m.head.ids, y)
        return y

    def layer_states(self) -> torch.Tensor:
        """This thread's last call's residual stream after the layers it was asked for, concatenated
        (R, len(layers) * dim): what Transformer.hidden(layers=...) returns beside the final states."""
        taps = getattr(self._scratch, "taps", None)
        if taps is None:
            raise RuntimeError("layer_states() reads the last call's layers: this thread's last call asked for none")
        return taps

    def hidden_states(self) -> torch.Tensor:
        """This thread's last call's final normalised hidden states (R, dim): what Transformer.hidden
        returns for those rows. A view of the thread's work buffer, overwritten by its next call."""
        dim, R = self.model.cfg.dim, getattr(self._scratch, "rows", 0)
        if R == 0:
            raise RuntimeError("hidden_states() reads the last call's rows: this thread has made no call yet")
        return self._scratch.work[R * dim:2 * R * dim].view(R, dim)


class OneTokenDecoder:
    """One token at a time through FusedForward, into a cache fixed at construction: how the
    self-draft runs (self_draft.py). A draft of a few narrow
    layers spends its eager forward launching some 200 small operator calls, not reading its few
    megabytes of weights. `OneTokenDecoder(model, cache)(token)` returns what
    `model(token, cache=cache, last_only=True)[0, -1]` returns (to rounding in attention) and
    advances the cache by one; `embedded(row)` takes an input row in place of a token.
    `OneTokenDecoder.supports` says which models and caches it takes: FusedForward's, with a
    contiguous embedding table of the model's own for by_token calls (not a tied one)."""

    WEIGHTS = FusedForward.WEIGHTS

    @staticmethod
    def supports(model, cache, by_token=True, weights="float32") -> bool:
        """by_token=False: only `embedded` calls, which need no embedding table of the model's own.
        weights="float16" / "int8" / "int4": also the kernel library's forward for them
        (kernels.has_half(), kernels.has_int8(), kernels.has_int4())."""
        return (FusedForward.supports(model, weights) and FusedForward.supports_cache(cache)
                and (not by_token or (model.embed is not None and model.embed.weight.is_contiguous()
                                      and model.embed.weight.dtype == torch.float32)))

    def __init__(self, model, cache, by_token=True, weights="float32"):
        if not OneTokenDecoder.supports(model, cache, by_token, weights):
            raise ValueError("OneTokenDecoder needs a float32 CPU model with untied embeddings (or by_token=False) "
                             "and no biases, a contiguous batch-1 float32 KVCache, and the kernel library "
                             "(kernels.available(); weights='float16' needs kernels.has_half(), 'int8' "
                             "kernels.has_int8(), 'int4' kernels.has_int4())")
        self.model, self.cache, self.by_token, self.weights = model, cache, by_token, weights
        self.fused = FusedForward(model, weights)

    def __call__(self, token: int) -> torch.Tensor:
        if not self.by_token:
            raise ValueError("this OneTokenDecoder was built with by_token=False: call embedded(row)")
        if not 0 <= token < self.model.cfg.vocab_size:
            raise ValueError(f"token must be in [0, {self.model.cfg.vocab_size}), got {token}")
        return self.embedded(self.model.embed.weight[token])

    @property
    def state(self) -> torch.Tensor:
        """The last call's final normalised hidden state (dim,): what Transformer.hidden returns
        for that row. A view of the work buffer, overwritten by the next call."""
        return self.fused.hidden_states()[0]

    def embedded(self, row: torch.Tensor, head: bool = True):
        """The same forward from an input row (dim,) float32 in place of a token's embedding
        (a feature draft builds its own). head=False skips the output head and returns None:
        a row whose logits nobody reads costs only the layers."""
        dim = self.model.cfg.dim
        if row.shape != (dim,) or row.dtype != torch.float32 or not row.is_contiguous():
            raise ValueError(f"row must be a contiguous float32 tensor of shape ({dim},), "
                             f"got {tuple(row.shape)} {row.dtype}")
        y = self.fused(row.view(1, dim), self.cache, head)
        return None if y is None else y[0]


class FusedRows:
    """The `runner` seam of a Transformer (core/model.py): its forward through FusedForward wherever
    the rows can be laid out (`Layout`): one sequence's chain of 1..MAX_ROWS tokens after a contiguous
    float32 cache's length, rows at their own positions under an explicit 0/-inf mask over such a
    cache (a token tree), or a batch of sequences whose cache lays out its own rows
    (`fused_layout`, serve/kv.py), with nothing to differentiate and the layer states on request;
    a long prompt in chunks of rows (prefill.py); None elsewhere, so the model runs its eager code."""

    name = "cpu-fused"

    def __init__(self, model, weights="float32"):
        self.model, self.weights = model, weights
        self.fused = FusedForward(model, weights)

    def __deepcopy__(self, memo):  # a copied model gets its own: the copy's weights, not these
        model = memo.get(id(self.model))
        return FusedRows(model, self.weights) if model is not None else None

    def applies(self, tokens, input_pos, cache, mask, embeds=None):
        """Which layout takes this forward: "chain", "mask" (a tree's), "batch" (a cache that lays
        out its own rows), or None where the eager code runs. Changes nothing."""
        m = self.model
        if (torch.is_grad_enabled() and m.head.weight.requires_grad) or m.dtype != torch.float32 \
                or m.device.type != "cpu" or not (kernels.threaded() or torch.get_num_threads() == 1) \
                or (embeds is not None and embeds.dtype != torch.float32):
            return None
        B, T = tokens.shape
        if hasattr(cache, "fused_layout"):  # several sequences, each over its own memory
            fits = (embeds is None and cache.kv.k.dtype == torch.float32 and sum(cache.real) <= FORWARD_MAX_ROWS
                    and max(cache.real) <= kernels.MAX_ROWS)  # a prompt's many rows: eager (panel products)
            return "batch" if fits else None
        if B != 1 or not FusedForward.supports_cache(cache):
            return None
        L, top = cache.length, min(cache.capacity, m.rope_cos.shape[0])
        if mask is None:
            chained = 1 <= T <= kernels.MAX_ROWS and L + T <= top and (
                input_pos is None or input_pos.tolist() == list(range(L, L + T)))  # sync: CPU
            return "chain" if chained else None
        fits = (T <= FORWARD_MAX_ROWS and mask.shape == (1, 1, T, L + T) and L + T <= cache.capacity
                and (input_pos is None or input_pos.numel() == T))  # the kernel checks the positions
        return "mask" if fits else None

    def _layout(self, tokens, input_pos, cache, mask, embeds):
        """(layout, where its rows sit in the (B, T) grid or None for all of them, how to commit), or
        None where the one call does not apply."""
        kind = self.applies(tokens, input_pos, cache, mask, embeds)
        T = tokens.shape[1]
        if kind == "batch":
            return cache.fused_layout(T)  # reserves each sequence's memory; commits with view.advance
        if kind == "chain":
            cache.reserve(T)
            return chain(cache, T), None, lambda: cache.advance(T)
        if input_pos is None and kind == "mask":
            input_pos = torch.arange(cache.length, cache.length + T)
        if kind is None:
            return None
        return from_mask(cache, input_pos, mask), None, lambda: cache.advance(T)

    def _run(self, tokens, input_pos, cache, mask, embeds, head, layers):
        """The model's output over (B, T) through one call: (logits or None, final states, layer
        states or None), each (B, T, ...), or None where the call does not apply."""
        planned = self._layout(tokens, input_pos, cache, mask, embeds)
        if planned is None:
            return None
        lay, flat, commit = planned
        B, T = tokens.shape
        x = self.model.embed_tokens(tokens) if embeds is None else embeds  # (B, T, dim)
        x = x.reshape(B * T, -1)
        if flat is not None:
            x = x.index_select(0, flat)  # the real rows of a padded batch
        y = self.fused._run(x.contiguous(), lay, head, layers)
        commit()
        outs = (y, self.fused.hidden_states(), None if layers is None else self.fused.layer_states())
        if flat is None:
            return tuple(None if o is None else o.unsqueeze(0) if B == 1 else o.view(B, T, -1) for o in outs)
        # a padded batch: a padded slot repeats its row's last real one, as the eager forward's query does
        return tuple(None if o is None else padded_rows(o, flat, B, T) for o in outs)

    def logits(self, tokens, input_pos, cache, mask, last_only):
        if chunk_applies(self.model, tokens, input_pos, cache, mask):  # a long prompt: in chunks
            return chunked_logits(self.model, tokens, cache, last_only)  # (B, T or 1, V)
        out = self._run(tokens, input_pos, cache, mask, None, True, None)
        if out is None:
            return None
        y = out[0]  # (B, T, V)
        return (y[:, -1:] if last_only else y).float()  # (B, T or 1, V)

    def hidden(self, tokens, input_pos, cache, mask, embeds, layers=None):
        if chunk_applies(self.model, tokens, input_pos, cache, mask):
            return chunked_hidden(self.model, tokens, cache, embeds, layers)  # every prompt position's states
        out = self._run(tokens, input_pos, cache, mask, embeds, False, layers)
        if out is None:
            return None
        _, x, taps = out
        return x.clone() if layers is None else (x.clone(), taps)  # (B, T, dim): a copy of the work buffer


def padded_rows(o: torch.Tensor, flat: torch.Tensor, B: int, T: int) -> torch.Tensor:
    """(B, T, ...) from the real rows o (N, ...) that sit at `flat` in the (B, T) grid, each row's
    real rows first: slot (b, t) gets row b's last real row at or before t."""
    grid = torch.full((B * T,), -1, dtype=torch.long)
    grid[flat] = torch.arange(flat.numel())
    grid = grid.view(B, T).cummax(1).values  # a padded slot takes the last real row before it
    return o.index_select(0, grid.reshape(-1)).view(B, T, *o.shape[1:])
