"""A draft that reads a low, a middle and a high layer of the target (EAGLE-3, Li et al.,
"EAGLE-3: Scaling up Inference Acceleration of Large Language Models via Training-Time Test",
arXiv 2503.01840), in the architecture the serving engines run: vLLM's `Eagle3LlamaForCausalLM`
(vllm/model_executor/models/llama_eagle3.py), SpecForge's `LlamaForCausalLMEagle3` and llama.cpp's
`eagle3` model (src/models/eagle3.cpp). The weights the lab trains are the weights those engines
load, under other names (io/export.py): what the draft accepts in the lab it accepts there.

The EAGLE-style draft (feature.py) reads the target's final state. EAGLE-3 reads more of it: the
residual stream after a low, a middle and a high layer (a_j, b_j, c_j), concatenated and
projected to the width by `fc`,

    g_j = fc([a_j, b_j, c_j])                              (3 dim -> dim)

and one decoder layer whose attention reads two things side by side, the token's embedding and
the fused state, each through its own norm, and whose residual stream starts at g itself:

    x   = [embed_norm(e(t_{j+1})), state_norm(g_j)]       (2 dim: q, k and v read both)
    r   = g_j + attn(x)                                    (state_norm(g_j) with norm_before_residual)
    h_j = r + mlp(mlp_norm(r))                             the state before the output norm
    p(t_{j+2}) ~ head(norm(h_j))

While drafting, the entry after a drafted token reads the draft's own h_j in g's place (the
state before the norm, as vLLM and llama.cpp feed it back), and training unrolls the draft the
same way ("training-time test", train/eagle3.py): the second and third drafted tokens learn from
the first one's h. It is trained on tokens only: no loss pulls h towards any target state.

The token embedding and the output head are the target's, borrowed at load; the head is
restricted to the draft's frequent-token subset (vLLM's `d2t`, llama.cpp's `d2t`). The drafter
is FeatureDrafter's: the engine asks the target for `hidden_layers`' states (core/drafter.py),
and the drafter fuses them as they arrive.
"""
import json
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from ..core.kv_cache import KVCache
from ..core.masks import verification_mask
from ..core.model import MLP, Attention, Linear, RMSNorm, check_layers, init_weights, rope_table
from .feature import FeatureDrafter
from .vocab_subset import VocabSubsetHead

KIND = "specdec_lab eagle3 draft"
LAYOUT = 2  # 1: the layout before the engines' architecture (a projection in front of a standard block)


def default_hidden_layers(n_layers: int) -> tuple:
    """EAGLE-3's low, middle and high layer: the residual stream after layers 1, n/2 - 1 and n - 4
    (counting from 0), clipped to the model and without repeats for a model of a few layers. vLLM
    counts the same states as the inputs of layers 2, n/2 and n - 3 (`eagle_aux_hidden_state_layer_ids`)."""
    return tuple(sorted({min(max(i, 0), n_layers - 1) for i in (1, n_layers // 2 - 1, n_layers - 4)}))


class Eagle3Layer(nn.Module):
    """The one decoder layer: attention over [embed_norm(e), state_norm(g)] (2 dim wide), the
    residual stream started at g (or at state_norm(g)), then the MLP as in any Llama block."""

    def __init__(self, cfg, norm_before_residual=False):
        super().__init__()
        self.norm_before_residual = norm_before_residual
        self.embed_norm, self.state_norm = RMSNorm(cfg.dim, cfg.norm_eps), RMSNorm(cfg.dim, cfg.norm_eps)
        self.attn = Attention(cfg)
        q_out, kv_out = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
        self.attn.wqkv = Linear(2 * cfg.dim, q_out + 2 * kv_out)  # q, k and v read both halves
        self.mlp_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, e, g, cos, sin, cache, mask, input_pos):
        """e (B, T, dim) token embeddings, g (B, T, dim) fused states -> h (B, T, dim), before any norm."""
        gn = self.state_norm(g)
        x = torch.cat([self.embed_norm(e), gn], -1)  # (B, T, 2 dim)
        r = (gn if self.norm_before_residual else g) + self.attn(x, cos, sin, 0, cache, mask, input_pos)
        return r + self.mlp(self.mlp_norm(r))


class Eagle3Draft(nn.Module):
    """forward(tokens (B, T), feats (B, T, dim), cache) -> (states (B, T, dim), logits (B, T, V)).
    feats are fused states (fuse_states) or the draft's own states; the states returned are h,
    before the output norm, which the next entry reads. `hidden_layers`: the target layers it reads."""

    def __init__(self, target, hidden_layers=None, vocab_ids=None, seed=0, norm_before_residual=False):
        super().__init__()
        tc = target.cfg
        layers = default_hidden_layers(tc.n_layers) if hidden_layers is None else tuple(hidden_layers)
        check_layers(layers, tc.n_layers)
        self.hidden_layers = layers
        self.cfg = replace(tc, n_layers=1)  # the engine reads vocab_size and eos from it; the cache, n_layers
        self.fc = Linear(len(layers) * tc.dim, tc.dim)
        self.layer = Eagle3Layer(self.cfg, norm_before_residual)
        self.norm = RMSNorm(tc.dim, tc.norm_eps)
        ids = torch.arange(tc.vocab_size) if vocab_ids is None else torch.as_tensor(vocab_ids)
        self.head = VocabSubsetHead(target.head, ids)  # the target's head, its subset columns
        init_weights(self, seed)  # every product random (std 0.02), every norm 1; the head stays the target's
        with torch.no_grad():
            self.head.proj.weight.copy_(target.head.weight.detach()[:, self.head.ids.to(target.head.weight.device)])
            self.norm.weight.copy_(target.norm.weight)  # the head was made to read states through this norm
        # The target's embedding (V, dim), borrowed: a plain attribute, so neither saved nor trained.
        self.embed_weight = (target.embed.weight if target.embed is not None else target.head.weight.t()).detach()
        cos, sin = rope_table(self.cfg)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.to(target.device)

    @property
    def device(self):
        return self.fc.weight.device

    @property
    def dtype(self):
        return self.fc.weight.dtype

    @property
    def norm_before_residual(self):
        return self.layer.norm_before_residual

    @property
    def state_width(self):
        """The width of one target layer's states."""
        return self.fc.weight.shape[0] // len(self.hidden_layers)

    def new_cache(self, capacity, batch_size=1):
        """An empty cache for the draft's one layer."""
        return KVCache.for_model(self.cfg, capacity, batch_size, dtype=self.dtype, device=self.device)

    def fuse_states(self, states):
        """The target's layer states (..., n * dim), concatenated as Transformer.hidden(layers=...)
        gives them -> g (..., dim), what an entry reads. The raw residual stream, as the engines
        take it: no norm before fc."""
        return self.fc(states.to(self.dtype))

    def states(self, tokens, feats, cache=None, input_pos=None, mask=None):
        """h (B, T, dim) for entries (tokens, feats), through `cache` (any object with Transformer's
        cache interface) or none. Positions default to those after the cache's length, and the mask
        to the causal one after it."""
        B, T = tokens.shape
        start = cache.length if cache is not None else 0
        if input_pos is None:
            input_pos = torch.arange(start, start + T, device=tokens.device)
        if cache is not None:
            cache.reserve(T)  # raise before the layer writes
            if mask is None and T > 1:
                mask = verification_mask(start, T, device=tokens.device, dtype=self.dtype)
        cos = self.rope_cos[input_pos].to(self.dtype).unsqueeze(-2)  # (T, 1, D) or (B, T, 1, D): over heads
        sin = self.rope_sin[input_pos].to(self.dtype).unsqueeze(-2)
        e = F.embedding(tokens, self.embed_weight).to(self.dtype)  # (B, T, dim)
        h = self.layer(e, feats.to(self.dtype), cos, sin, cache, mask, input_pos)
        if cache is not None:
            cache.advance(T)
        return h

    def logits(self, h):
        """h (..., dim) -> logits (..., V) in float32: the output norm, then the head."""
        return self.head(self.norm(h)).float()

    def forward(self, tokens, feats, cache=None, last_only=False):
        """last_only: logits (B, 1, V) for the last entry only; the states stay (B, T, dim)."""
        h = self.states(tokens, feats, cache)  # (B, T, dim)
        return h, self.logits(h[:, -1:] if last_only else h)

    def own_state_dict(self):
        """The trained parameters only: not the target's head that the model holds."""
        return {k: v for k, v in self.state_dict().items() if not k.startswith("head.")}


class Eagle3Drafter(FeatureDrafter):
    """FeatureDrafter for an Eagle3Draft: `hidden` is the target's states of `hidden_layers`,
    (rows, layers * dim), fused on arrival; the cache and the pending rows are FeatureDrafter's.
    The fusion is device work: the host syncs per step are FeatureDrafter's."""

    def __init__(self, model: Eagle3Draft, capacity, cache_factory=None, stop_below=None):
        super().__init__(model, capacity, cache_factory, stop_below)
        self.hidden_layers = model.hidden_layers

    def prefill(self, prompt_ids, hidden=None):
        super().prefill(prompt_ids, None if hidden is None else self.model.fuse_states(hidden))

    def queue(self, tokens, hidden=None):
        super().queue(tokens, self.model.fuse_states(hidden[:len(tokens)]))

    def commit(self, verdict, hidden=None):
        super().commit(verdict, self.model.fuse_states(hidden[:verdict.num_accepted + 1]))


def save_eagle3_draft(model, out_dir, card=None):
    """config.json (the layers it reads, the width, the head's token ids) + model.safetensors in float16."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().half().contiguous() for k, v in model.own_state_dict().items()},
              str(out / "model.safetensors"))
    cfg = {"kind": KIND, "layout": LAYOUT, "n_layers": 1, "dim": model.state_width,
           "hidden_layers": list(model.hidden_layers), "norm_before_residual": model.norm_before_residual,
           "vocab_ids": model.head.ids.tolist()}
    (out / "config.json").write_text(json.dumps(cfg))
    if card is not None:
        (out / "README.md").write_text(card)
    return out


def shipped_eagle3_draft_dir() -> Path:
    """The EAGLE-3-style draft that ships with the package for SmolLM2-135M-Instruct; README.md
    there is its model card."""
    return Path(__file__).resolve().parents[1] / "eagle3_draft_smollm2"


def is_eagle3_folder(folder) -> bool:
    """Whether `folder` holds a draft save_eagle3_draft wrote."""
    cfg = Path(folder) / "config.json"
    return cfg.exists() and json.loads(cfg.read_text()).get("kind") == KIND


def load_eagle3_draft(target, folder=None):
    """An Eagle3Draft for `target` from save_eagle3_draft's folder, in the target's dtype (default:
    the shipped one, for SmolLM2-135M-Instruct)."""
    folder = Path(folder) if folder is not None else shipped_eagle3_draft_dir()
    cfg = json.loads((folder / "config.json").read_text()) if (folder / "config.json").exists() else {}
    if cfg.get("kind") != KIND:
        raise ValueError(f"no EAGLE-3 draft in {folder} (config.json kind {cfg.get('kind')!r}, want {KIND!r})")
    if cfg["dim"] != target.cfg.dim or max(cfg["hidden_layers"]) >= target.cfg.n_layers:
        raise ValueError(f"the draft in {folder} was made for width {cfg['dim']} and layers {cfg['hidden_layers']}; "
                         f"the target has width {target.cfg.dim} and {target.cfg.n_layers} layers")
    if cfg.get("layout") != LAYOUT:
        raise ValueError(f"the draft in {folder} is in the lab's earlier layout {cfg.get('layout', 1)}, which no "
                         f"serving engine runs; this version reads layout {LAYOUT} (the engines' architecture): "
                         f"retrain it with `python -m specdec_lab distill-features --recipe eagle3`")
    model = Eagle3Draft(target, cfg["hidden_layers"], cfg["vocab_ids"],
                        norm_before_residual=cfg.get("norm_before_residual", False))
    missing, unexpected = model.load_state_dict(load_file(str(folder / "model.safetensors")), strict=False)
    missing = [k for k in missing if not k.startswith("head.")]
    if missing or unexpected:
        raise ValueError(f"{folder}: missing {missing}, unexpected {unexpected}")
    return model.to(target.dtype).eval().requires_grad_(False)
