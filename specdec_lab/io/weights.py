"""Loading weights: the one module that imports transformers.

Contract: `load_model(source)` takes a hub id, a local Hugging Face folder or a
.gguf file, reads it through transformers, and moves the weights into the
project's own `Transformer` with a shape check on every tensor. It returns
(model, tokenizer). Supported: the Llama family (Llama, Mistral, SmolLM2) and
Qwen2 (q/k/v biases). Anything else raises a ValueError naming it.

A folder that already holds config.json and safetensors weights (one
model.safetensors, or shards named by model.safetensors.index.json) is read
directly with safetensors, without building a transformers model: each tensor
goes straight to the device and the dtype asked for, so an 8B model in
bfloat16 never has a float32 copy on the host. A hub id is fetched as such a
folder when the hub has safetensors for it. This is how the converted default
target loads in a few seconds.

A folder may also hold its weights in this project's layout (`write_layout`,
lab/layout.pt: transposed and fused, as `from_hf_state_dict` makes them); a
float32 load on the CPU then maps that file instead of reading it. Nothing is
read until it is used, and the CPU's fast path, which reads each weight once
to build its own copy, hands the weight's pages back (cpu/linear.py): the
default target's weights are then resident once, not twice.
"""
import json
import os
from collections.abc import MutableMapping
from pathlib import Path

import torch

from ..core.config import ModelConfig
from ..core.model import Transformer, rope_table

SUPPORTED = ("llama", "mistral", "qwen2")


def config_from_hf(hf: dict, eos_ids=()) -> ModelConfig:
    """ModelConfig from a Hugging Face config dict (config.json or config.to_dict())."""
    arch = hf.get("model_type")
    if arch not in SUPPORTED:
        raise ValueError(f"model architecture {arch!r} is not supported; supported: {', '.join(SUPPORTED)}")
    rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    theta = rope.pop("rope_theta", hf.get("rope_theta", 10000.0))
    if rope.get("rope_type", rope.get("type", "default")) == "default":
        rope = None
    eos = hf.get("eos_token_id")
    eos = [eos] if isinstance(eos, int) else list(eos or [])
    heads = hf["num_attention_heads"]
    return ModelConfig(
        vocab_size=hf["vocab_size"], dim=hf["hidden_size"], n_layers=hf["num_hidden_layers"],
        n_heads=heads, n_kv_heads=hf.get("num_key_value_heads") or heads,
        head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
        intermediate_size=hf["intermediate_size"], norm_eps=hf.get("rms_norm_eps", 1e-5),
        rope_theta=float(theta), rope_scaling=rope, max_seq_len=min(hf.get("max_position_embeddings", 8192), 32768),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)), qkv_bias=(arch == "qwen2"),
        eos_token_ids=tuple(dict.fromkeys(eos + [e for e in eos_ids if e is not None])), architecture=arch)


def config_to_hf(cfg: ModelConfig) -> dict:
    """A config.json that transformers reads as a LlamaConfig (used to ship the draft)."""
    out = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.dim, "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads, "head_dim": cfg.head_dim,
        "intermediate_size": cfg.intermediate_size, "rms_norm_eps": cfg.norm_eps, "rope_theta": cfg.rope_theta,
        "max_position_embeddings": cfg.max_seq_len, "tie_word_embeddings": cfg.tie_embeddings,
        "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
        "bos_token_id": 1, "eos_token_id": list(cfg.eos_token_ids), "pad_token_id": cfg.eos_token_ids[0],
        "torch_dtype": "float32",
    }
    if cfg.rope_scaling:
        out["rope_scaling"] = dict(cfg.rope_scaling)  # a copy: transformers edits this dict in place
    return out


def from_hf_state_dict(sd: dict, cfg: ModelConfig) -> dict:
    """Rename, transpose to (in, out) and fuse a Hugging Face Llama state dict into this project's layout.
    Every tensor returned owns its memory, and each source tensor is looked up once: from a
    read_safetensors reader, the source is read a tensor at a time, and a state dict whose tensors are
    views of something larger (a memory-mapped file) keeps none of them alive."""
    out = {"norm.weight": sd["model.norm.weight"].clone()}
    head_name = "model.embed_tokens.weight" if cfg.tie_embeddings else "lm_head.weight"
    out["head.weight"] = sd[head_name].t().contiguous()  # (dim, V); the source is dropped at once
    if not cfg.tie_embeddings:
        out["embed.weight"] = sd["model.embed_tokens.weight"].clone()
    for i in range(cfg.n_layers):
        h, m = f"model.layers.{i}.", f"layers.{i}."
        qkv = [sd[h + f"self_attn.{n}_proj.weight"] for n in "qkv"]
        out[m + "attn.wqkv.weight"] = torch.cat(qkv, dim=0).t().contiguous()  # (dim, H*D + 2*Hkv*D)
        if cfg.qkv_bias:
            out[m + "attn.wqkv.bias"] = torch.cat([sd[h + f"self_attn.{n}_proj.bias"] for n in "qkv"])  # a copy
        out[m + "attn.wo.weight"] = sd[h + "self_attn.o_proj.weight"].t().contiguous()
        gate_up = torch.cat([sd[h + "mlp.gate_proj.weight"], sd[h + "mlp.up_proj.weight"]])
        out[m + "mlp.w13.weight"] = gate_up.t().contiguous()  # (dim, 2 * intermediate)
        out[m + "mlp.w2.weight"] = sd[h + "mlp.down_proj.weight"].t().contiguous()
        out[m + "attn_norm.weight"] = sd[h + "input_layernorm.weight"].clone()
        out[m + "mlp_norm.weight"] = sd[h + "post_attention_layernorm.weight"].clone()
    return out


def to_hf_state_dict(model: Transformer) -> dict:
    """The inverse of from_hf_state_dict, for saving in Hugging Face format."""
    cfg, sd = model.cfg, model.state_dict()
    q, kv = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    out = {"model.norm.weight": sd["norm.weight"]}
    out["model.embed_tokens.weight"] = sd["head.weight"].t() if cfg.tie_embeddings else sd["embed.weight"]
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = sd["head.weight"].t()
    for i in range(cfg.n_layers):
        h, m = f"model.layers.{i}.", f"layers.{i}."
        wq, wk, wv = sd[m + "attn.wqkv.weight"].t().split([q, kv, kv])
        gate, up = sd[m + "mlp.w13.weight"].t().chunk(2)
        out.update({h + "self_attn.q_proj.weight": wq, h + "self_attn.k_proj.weight": wk,
                    h + "self_attn.v_proj.weight": wv, h + "self_attn.o_proj.weight": sd[m + "attn.wo.weight"].t(),
                    h + "mlp.gate_proj.weight": gate, h + "mlp.up_proj.weight": up,
                    h + "mlp.down_proj.weight": sd[m + "mlp.w2.weight"].t(),
                    h + "input_layernorm.weight": sd[m + "attn_norm.weight"],
                    h + "post_attention_layernorm.weight": sd[m + "mlp_norm.weight"]})
    return {k: v.contiguous().clone() for k, v in out.items()}


def build_model(cfg: ModelConfig, state_dict: dict, device="cpu", dtype=torch.float32) -> Transformer:
    """A Transformer holding exactly these weights; every shape is checked."""
    with torch.device("meta"):
        model = Transformer(cfg)
    expected = {k: v.shape for k, v in model.state_dict().items()}
    if set(expected) != set(state_dict):
        missing, extra = set(expected) - set(state_dict), set(state_dict) - set(expected)
        raise ValueError(f"weights do not match the decoder: missing {sorted(missing)[:5]}, extra {sorted(extra)[:5]}")
    for k, shape in expected.items():
        if state_dict[k].shape != shape:
            raise ValueError(f"weight {k}: expected shape {tuple(shape)}, got {tuple(state_dict[k].shape)}")
    sd = {k: v.to(device=device, dtype=dtype) for k, v in state_dict.items()}
    model.load_state_dict(sd, strict=True, assign=True)
    cos, sin = rope_table(cfg)
    model.rope_cos, model.rope_sin = cos.to(device), sin.to(device)
    return model.eval().requires_grad_(False)


def release_freed_memory():
    """Hand the loader's freed buffers back to the system. glibc's allocator keeps freed memory for
    reuse, and after a load that read and converted tensor by tensor it kept about 90 MB of the
    default target's (measured: docs/benchmarks.md, section 35); malloc_trim returns it. A no-op where
    the C library has no malloc_trim."""
    import ctypes
    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
    if trim is not None:
        trim(0)


LAYOUT = Path("lab") / "layout.pt"


def write_layout(folder: Path):
    """Store the folder's weights in this project's layout at folder/lab/layout.pt, beside the
    Hugging Face files (which other engines read), so that a float32 load on the CPU maps them."""
    folder = Path(folder)
    cfg = config_from_hf(json.loads((folder / "config.json").read_text()))
    out = folder / LAYOUT
    out.parent.mkdir(exist_ok=True)
    tmp = out.with_name(f"{out.name}.{os.getpid()}.partial")
    torch.save(_read_lab_layout(folder, cfg), tmp)
    tmp.replace(out)  # atomic: a reader never maps a half-written file
    release_freed_memory()


def _read_lab_layout(folder, cfg, device="cpu", dtype=torch.float32) -> dict:
    """The folder's safetensors read a tensor at a time into this project's layout (from_hf_state_dict)."""
    sd = read_safetensors(folder, device, dtype)
    if cfg.tie_embeddings and "lm_head.weight" in sd:
        del sd["lm_head.weight"]
    return from_hf_state_dict(sd, cfg)


def _is_converted_folder(path: Path) -> bool:
    return path.is_dir() and (path / "config.json").exists() and bool(safetensors_files(path))


def safetensors_files(folder: Path) -> list:
    """The weight files of a folder: model.safetensors, or the shards its index names."""
    index = folder / "model.safetensors.index.json"
    if index.exists():
        return [folder / f for f in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
    return [folder / "model.safetensors"] if (folder / "model.safetensors").exists() else []


_SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
                       "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
                       "U8": torch.uint8, "BOOL": torch.bool}


class SafetensorsReader(MutableMapping):
    """The tensors of a folder's weight files by name, each read from disk when it is asked for, with
    plain reads into memory it owns: no memory map whose touched pages would stay resident beside the
    converted model. A loader that converts one tensor at a time (from_hf_state_dict) so holds the
    converted model and one source tensor, never the whole source beside it. `del` forgets a name."""

    def __init__(self, files, device="cpu", dtype=torch.float32):
        self.device, self.dtype, self._where = device, dtype, {}
        for file in files:
            with open(file, "rb") as f:
                n = int.from_bytes(f.read(8), "little")
                header = json.loads(f.read(n))
            for name, entry in header.items():
                if name != "__metadata__":
                    self._where[name] = (file, 8 + n, entry)

    def __getitem__(self, name):
        file, base, entry = self._where[name]
        if entry["dtype"] not in _SAFETENSORS_DTYPES:
            raise ValueError(f"{file}: tensor {name} has dtype {entry['dtype']}, which this reader does not take")
        begin, end = entry["data_offsets"]
        t = torch.empty(entry["shape"], dtype=_SAFETENSORS_DTYPES[entry["dtype"]])
        raw = t.reshape(-1).view(torch.uint8)
        if raw.numel() != end - begin:
            raise ValueError(f"{file}: tensor {name} holds {end - begin} bytes, its shape {entry['shape']} needs "
                             f"{raw.numel()}")
        with open(file, "rb") as f:
            f.seek(base + begin)
            if f.readinto(memoryview(raw.numpy())) != raw.numel():
                raise ValueError(f"{file} ends inside tensor {name}: the file is truncated")
        return t.to(device=self.device, dtype=self.dtype)

    def __setitem__(self, name, value):
        raise TypeError("the weights on disk are read, not written")

    def __delitem__(self, name):
        del self._where[name]

    def __iter__(self):
        return iter(self._where)

    def __len__(self):
        return len(self._where)


def read_safetensors(folder: Path, device="cpu", dtype=torch.float32) -> SafetensorsReader:
    """Every tensor of the folder's weight files, each read onto `device` and cast to `dtype` when it
    is looked up: the host holds one source tensor at a time, never the whole model in float32."""
    return SafetensorsReader(safetensors_files(folder), device, dtype)


def _hub_folder(source):
    """A local snapshot of a hub id's config, tokenizer and safetensors files, or None when the id
    has no safetensors (transformers then reads what there is)."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        return None
    folder = Path(snapshot_download(str(source), allow_patterns=["*.json", "*.safetensors", "tokenizer*"]))
    return folder if _is_converted_folder(folder) else None


def load_tokenizer(source, gguf_file=None):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(source), gguf_file=gguf_file)


def load_model(source, device="cpu", dtype=torch.float32):
    """(Transformer, tokenizer) from a hub id, a local folder or a .gguf file.
    A local folder without tokenizer files (the shipped draft: it uses its target's) gives None."""
    path = Path(os.path.expanduser(str(source)))
    if not path.exists() and path.suffix != ".gguf":
        path = _hub_folder(source) or path
    if _is_converted_folder(path):
        hf_cfg = json.loads((path / "config.json").read_text())
        has_tok = (path / "tokenizer.json").exists() or (path / "tokenizer.model").exists()
        tok = load_tokenizer(path) if has_tok else None
        cfg = config_from_hf(hf_cfg, eos_ids=[tok.eos_token_id] if tok is not None else [])
        if (path / LAYOUT).exists() and torch.device(device).type == "cpu" and dtype == torch.float32:
            return build_model(cfg, torch.load(path / LAYOUT, mmap=True, weights_only=True)), tok
        model = build_model(cfg, _read_lab_layout(path, cfg, device, dtype), device, dtype)
        release_freed_memory()
        return model, tok
    hf_model, tok = load_hf_model(source, dtype=dtype)  # GGUF dequantizes to float32 whatever is asked
    cfg = config_from_hf(hf_model.config.to_dict(), eos_ids=[tok.eos_token_id])
    return build_model(cfg, from_hf_state_dict(hf_model.state_dict(), cfg), device, dtype), tok


def load_hf_model(source, dtype=torch.float32):
    """The transformers model and tokenizer (used for conversion, and as the oracle in tests)."""
    from transformers import AutoConfig, AutoModelForCausalLM
    path = Path(os.path.expanduser(str(source)))
    folder, gguf = (path.parent, path.name) if path.suffix == ".gguf" else (source, None)
    if gguf is None:
        arch = AutoConfig.from_pretrained(str(folder)).model_type
        if arch not in SUPPORTED:
            raise ValueError(f"model architecture {arch!r} is not supported; supported: {', '.join(SUPPORTED)}")
    model = AutoModelForCausalLM.from_pretrained(str(folder), gguf_file=gguf, dtype=dtype)
    if model.config.model_type not in SUPPORTED:
        raise ValueError(f"model architecture {model.config.model_type!r} is not supported; "
                         f"supported: {', '.join(SUPPORTED)}")
    return model.eval(), load_tokenizer(folder, gguf)


def convert_gguf(gguf_path, out_dir):
    """Dequantize a .gguf once and save it as a Hugging Face folder (float32 safetensors)."""
    from safetensors.torch import save_file
    model, tok = load_hf_model(gguf_path)
    hf_cfg = model.config.to_dict()
    hf_cfg.pop("quantization_config", None)  # the saved weights are plain float32
    hf_cfg["architectures"] = [type(model).__name__]
    sd = model.state_dict()
    if hf_cfg.get("tie_word_embeddings"):
        sd.pop("lm_head.weight", None)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in sd.items()}, str(out_dir / "model.safetensors"),
              metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(hf_cfg, indent=2))
    tok.save_pretrained(str(out_dir))
    return out_dir


# ----------------------------------------------------------------------------- transformers as a baseline
# The benchmarks (bench/) time transformers' own generate and assisted generation
# against this project's engine; these two functions keep that import here.

def load_hf_causal_lm(source, device="cpu", dtype=torch.float32):
    """transformers' model alone, for a folder without a tokenizer (the shipped draft is one)."""
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(str(source), dtype=dtype)
    if model.config.model_type not in SUPPORTED:
        raise ValueError(f"model architecture {model.config.model_type!r} is not supported; "
                         f"supported: {', '.join(SUPPORTED)}")
    return model.to(device).eval()


@torch.no_grad()
def hf_generate(hf_model, ids, max_new_tokens, assistant=None, temperature=0.0, seed=0, eos_token_ids=()):
    """New token ids from transformers' `generate` (batch 1), or its assisted generation with
    `assistant` (`assistant_model=`) at transformers' defaults: up to 20 draft tokens per
    step, cut short when the assistant's confidence falls below an adaptive threshold
    (0.4 at first). Greedy at temperature 0; otherwise plain sampling (top-k, top-p off), seeded."""
    device = hf_model.device
    x = torch.tensor([list(ids)], device=device)  # (1, T)
    eos = list(eos_token_ids) or None
    kw = dict(max_new_tokens=max_new_tokens, attention_mask=torch.ones_like(x), eos_token_id=eos,
              pad_token_id=eos[0] if eos else None)
    if temperature > 0:
        kw.update(do_sample=True, temperature=float(temperature), top_k=0, top_p=1.0)
        torch.manual_seed(seed)
    else:
        kw.update(do_sample=False, temperature=None, top_k=None, top_p=None)
    if assistant is not None:
        kw["assistant_model"] = assistant
    out = hf_model.generate(x, **kw)
    return out[0, x.shape[1]:].tolist()


def load_draft(folder, device="cpu", dtype=torch.float32):
    """A draft from a Hugging Face folder that holds no tokenizer (train.distill.save_draft writes
    none): the draft shares the target's, so only the weights are read."""
    folder = Path(os.path.expanduser(str(folder)))
    cfg = config_from_hf(json.loads((folder / "config.json").read_text()))
    sd = read_safetensors(folder, device, dtype)
    if cfg.tie_embeddings:
        sd.pop("lm_head.weight", None)
    return build_model(cfg, from_hf_state_dict(sd, cfg), device, dtype)
