"""A feature draft that reads a low, a middle and a high layer of the target (EAGLE-3, Li et al.,
"EAGLE-3: Scaling up Inference Acceleration of Large Language Models via Training-Time Test",
arXiv 2503.01840).

The EAGLE-style draft (feature.py) reads the target's final state f_{j-1}, which is made to decide
the next token and little else. EAGLE-3 reads more of the target: the residual stream after a
low, a middle and a high layer (a_j, b_j, c_j), each brought to one scale and projected to the
width,

    g_j = W [rms(a_j), rms(b_j), rms(c_j)]                 (3 dim -> dim)
    entry j:  (t_j, g_{j-1})  ->  h_j  ->  head(h_j) ~ p(t_{j+1})

and it is trained on tokens only (train/eagle3.py): no loss pulls h_j towards any target state,
so h_j is whatever serves the next token best. While drafting, the entry of d_i reads the draft's
own h of the entry before in g's place, and training unrolls the draft the same way
("training-time test"), so the second and third drafted tokens learn from the first one's h.

Everything after the fusion is FeatureDraft's layer and FeatureDrafter's cache, unchanged: the
drafter fuses the target's layer states as they arrive and keeps dim-wide states pending. It
declares `hidden_layers`, so the engine asks the target for those layers' states
(core/drafter.py); on the CPU that forward runs the eager code, as the one-call path gives the
last layer only.
"""
import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from ..core.model import Linear, check_layers
from .feature import FeatureDraft, FeatureDrafter, save_feature_draft

KIND = "specdec_lab eagle3 draft"


def default_hidden_layers(n_layers: int) -> tuple:
    """EAGLE-3's low, middle and high layer: the residual stream after layers 1, n/2 - 1 and n - 4
    (counting from 0), clipped to the model and without repeats for a model of a few layers."""
    return tuple(sorted({min(max(i, 0), n_layers - 1) for i in (1, n_layers // 2 - 1, n_layers - 4)}))


class Eagle3Draft(FeatureDraft):
    """forward(tokens (B, T), feats (B, T, dim), cache) as FeatureDraft's; feats are fused states
    (fuse_states) or the draft's own estimates. `hidden_layers` are the target layers it reads."""

    def __init__(self, target, hidden_layers=None, vocab_ids=None, n_layers=1, seed=0):
        tc = target.cfg
        layers = default_hidden_layers(tc.n_layers) if hidden_layers is None else tuple(hidden_layers)
        check_layers(layers, tc.n_layers)
        super().__init__(target, vocab_ids, n_layers, seed)
        self.hidden_layers = layers
        self.fuse = Linear(len(layers) * tc.dim, tc.dim)
        with torch.no_grad():
            g = torch.Generator().manual_seed(seed + 1)
            self.fuse.weight.copy_(torch.randn(self.fuse.weight.shape, generator=g) / math.sqrt(len(layers) * tc.dim))
        self.to(target.device)

    @property
    def state_width(self):
        """The width of one target layer's states."""
        return self.fuse.weight.shape[0] // len(self.hidden_layers)

    def fuse_states(self, states):
        """The target's layer states (..., n * dim) -> g (..., dim), what an entry reads in f's place.
        Each layer is RMS-normalised first: the residual stream grows with depth, and the high
        layer would otherwise drown the low one."""
        n, dim = len(self.hidden_layers), self.state_width
        x = states.to(self.dtype).unflatten(-1, (n, dim))  # (..., n, dim)
        x = F.rms_norm(x, (dim,), eps=self.cfg.norm_eps)
        return self.fuse(x.flatten(-2))  # (..., dim)


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
    """save_feature_draft's folder, with the layers it reads in config.json."""
    out = save_feature_draft(model, out_dir, card)
    cfg = json.loads((out / "config.json").read_text())
    cfg.update(kind=KIND, hidden_layers=list(model.hidden_layers))
    (out / "config.json").write_text(json.dumps(cfg))
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
    model = Eagle3Draft(target, cfg["hidden_layers"], cfg["vocab_ids"], n_layers=cfg["n_layers"])
    missing, unexpected = model.load_state_dict(load_file(str(folder / "model.safetensors")), strict=False)
    missing = [k for k in missing if not k.startswith("body.head.")]
    if missing or unexpected:
        raise ValueError(f"{folder}: missing {missing}, unexpected {unexpected}")
    return model.to(target.dtype).eval().requires_grad_(False)
