"""Weight conversion: Hugging Face layout <-> this project's fused (in, out) layout.

The shipped draft is saved with `to_hf_state_dict` + `config_to_hf`, so
transformers must load that folder and compute the same logits. Anything the
decoder cannot run must be refused with a ValueError that names it.
"""
import json

import pytest
import torch
import transformers
from safetensors.torch import save_file

from specdec_lab.core.config import ModelConfig
from specdec_lab.core.model import Transformer, init_weights
from specdec_lab.io.weights import build_model, config_from_hf, config_to_hf, from_hf_state_dict, load_hf_model, to_hf_state_dict

LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}


def project_model(tie, rope_scaling=None, seed=0):
    cfg = ModelConfig(vocab_size=97, dim=96, n_layers=2, n_heads=6, n_kv_heads=2, head_dim=16,
                      intermediate_size=192, rope_theta=10000.0, max_seq_len=256, tie_embeddings=tie,
                      rope_scaling=dict(rope_scaling) if rope_scaling else None, eos_token_ids=(96,))
    return init_weights(Transformer(cfg), seed=seed, std=0.1).eval().requires_grad_(False)


def save_hf_folder(model, folder):
    """What shipping the draft does: config.json + model.safetensors in Hugging Face layout."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config_to_hf(model.cfg)))
    save_file(to_hf_state_dict(model), str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


CASES = {"tied": (True, None), "untied": (False, None), "llama3-rope": (False, LLAMA3_ROPE)}


@pytest.mark.parametrize("case", list(CASES))
def test_saved_hf_folder_loads_in_transformers_with_the_same_logits(case, tmp_path):
    model = project_model(*CASES[case])
    hf = transformers.LlamaForCausalLM.from_pretrained(str(save_hf_folder(model, tmp_path / case)),
                                                       dtype=torch.float32).eval()
    assert hf.config.tie_word_embeddings == model.cfg.tie_embeddings
    ids = torch.randint(0, 97, (1, 150), generator=torch.Generator().manual_seed(2))  # beyond position 64
    with torch.no_grad():
        d = (model(ids) - hf(ids).logits).abs().max().item()
    assert d <= 1e-4, (f"{case}: transformers computes other logits ({d:.2e}) from the saved folder: "
                       "a transpose, the q/k/v or gate/up split, the tie or the rope config is lost on save")


@pytest.mark.parametrize("case", list(CASES))
def test_to_hf_then_from_hf_gives_back_every_tensor_exactly(case):
    model = project_model(*CASES[case])
    back = from_hf_state_dict(to_hf_state_dict(model), model.cfg)
    sd = model.state_dict()
    assert set(back) == set(sd), "the round trip loses or invents weights"
    for k, v in sd.items():
        assert torch.equal(back[k], v), f"{k} changes in the round trip"


@pytest.mark.parametrize("case", list(CASES))
def test_config_survives_config_to_hf_and_back(case):
    cfg = project_model(*CASES[case]).cfg
    back = config_from_hf(transformers.LlamaConfig(**config_to_hf(cfg)).to_dict())
    assert back == cfg, f"config changed in the round trip: {cfg} -> {back}"


def test_config_to_hf_does_not_share_the_rope_scaling_dict_with_the_live_model():
    cfg = project_model(False, LLAMA3_ROPE).cfg
    transformers.LlamaConfig(**config_to_hf(cfg))  # transformers adds rope_theta to the dict it is given
    assert cfg.rope_scaling == LLAMA3_ROPE, "config_to_hf hands out the model's own dict, and it gets edited"


def test_to_hf_state_dict_returns_independent_contiguous_tensors():
    model = project_model(True)
    sd = to_hf_state_dict(model)
    assert all(v.is_contiguous() for v in sd.values()), "safetensors refuses non-contiguous tensors"
    sd["model.norm.weight"].add_(1.0)
    assert torch.all(model.norm.weight == 1.0), "to_hf_state_dict aliases the live model's weights"


def test_config_from_hf_reads_eos_lists_and_adds_the_tokenizers_eos_once():
    hf = config_to_hf(project_model(True).cfg)
    hf["eos_token_id"] = [5, 7]
    assert config_from_hf(hf, eos_ids=[7, 9, None]).eos_token_ids == (5, 7, 9)
    hf["eos_token_id"] = 5
    assert config_from_hf(hf).eos_token_ids == (5,)


def test_unsupported_architecture_raises_value_error_naming_it():
    gpt2 = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50).to_dict()
    with pytest.raises(ValueError, match="gpt2"):
        config_from_hf(gpt2)
    with pytest.raises(ValueError, match="architecture"):
        config_from_hf({"hidden_size": 8})


def test_load_hf_model_refuses_an_unsupported_folder_before_loading_weights(tmp_path):
    transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50).save_pretrained(str(tmp_path))
    with pytest.raises(ValueError, match="gpt2"):
        load_hf_model(tmp_path)


def test_unsupported_rope_scaling_raises_value_error_naming_it():
    hf = config_to_hf(project_model(False).cfg)
    hf["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}
    with pytest.raises(ValueError, match="yarn"):
        cfg = config_from_hf(hf)
        build_model(cfg, from_hf_state_dict(to_hf_state_dict(project_model(False)), cfg))


def test_build_model_names_a_missing_weight():
    model = project_model(False)
    sd = dict(model.state_dict())
    del sd["layers.1.mlp.w2.weight"]
    with pytest.raises(ValueError, match="layers.1.mlp.w2.weight"):
        build_model(model.cfg, sd)


def test_build_model_names_a_weight_of_the_wrong_shape():
    model = project_model(False)
    sd = dict(model.state_dict())
    sd["layers.0.attn.wo.weight"] = torch.zeros(96, 97)
    with pytest.raises(ValueError, match=r"layers\.0\.attn\.wo\.weight.*\(96, 96\)"):
        build_model(model.cfg, sd)


def test_build_model_gives_the_requested_dtype_and_an_inference_model():
    model = project_model(True)
    built = build_model(model.cfg, dict(model.state_dict()), dtype=torch.bfloat16)
    assert built.dtype == torch.bfloat16
    assert not built.training and not any(p.requires_grad for p in built.parameters())
    assert built.rope_cos.device.type == "cpu" and not built.rope_cos.is_meta, "rope tables left on meta"
    assert built.cfg == model.cfg


def _save_sharded(model, folder, shards=3):
    """model in Hugging Face layout, split over `shards` safetensors files with an index."""
    folder.mkdir(parents=True, exist_ok=True)
    sd = to_hf_state_dict(model)
    names, weight_map = sorted(sd), {}
    for i in range(shards):
        part = names[i::shards]
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        save_file({n: sd[n] for n in part}, str(folder / file), metadata={"format": "pt"})
        weight_map.update({n: file for n in part})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    (folder / "config.json").write_text(json.dumps(config_to_hf(model.cfg)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sharded_safetensors_load_straight_to_the_dtype(tmp_path, dtype):
    from specdec_lab.io.pair import tiny_model
    from specdec_lab.io.weights import load_draft, load_model
    model = tiny_model(seed=3, tie_embeddings=False)
    _save_sharded(model, tmp_path / "sharded")
    for loaded in (load_model(tmp_path / "sharded", dtype=dtype)[0], load_draft(tmp_path / "sharded", dtype=dtype)):
        sd = loaded.state_dict()
        assert {v.dtype for v in sd.values()} == {dtype}
        for name, v in model.state_dict().items():
            assert torch.equal(sd[name], v.to(dtype)), name


def test_the_layout_file_maps_the_same_weights_and_a_write_stays_in_the_process(tmp_path):
    """write_layout stores a folder's weights in this project's layout; a float32 CPU load then maps it
    (io/weights.py) and gives the same tensors as reading the Hugging Face files. The map is private:
    a weight changed in place changes neither the file nor a second load. Another dtype reads the files."""
    from specdec_lab.cpu.linear import release_pages
    from specdec_lab.io.weights import LAYOUT, load_model, write_layout
    model = project_model(tie=True)
    folder = save_hf_folder(model, tmp_path / "tied")
    read = load_model(folder)[0].state_dict()
    write_layout(folder)
    assert (folder / LAYOUT).exists() and not list(folder.glob("lab/*.partial")), "a partial file was left"
    first, second = load_model(folder)[0], load_model(folder)[0]
    for name, v in read.items():
        assert torch.equal(first.state_dict()[name], v), f"{name}: the mapped layout holds other values"
    with torch.no_grad():
        first.head.weight.mul_(2)
    release_pages(first.head.weight)  # a written page is the process's own: handing pages back loses nothing
    assert torch.equal(first.head.weight, 2 * read["head.weight"]), "a write was lost"
    assert torch.equal(second.head.weight, read["head.weight"]), "a write reached another load"
    assert torch.equal(load_model(folder)[0].head.weight, read["head.weight"]), "a write reached the file"
    half = load_model(folder, dtype=torch.bfloat16)[0]
    assert half.head.weight.dtype == torch.bfloat16 and torch.equal(half.head.weight, read["head.weight"].bfloat16())


def test_release_pages_leaves_memory_that_no_file_backs():
    """Only a file's pages go back (they can be read again); the process's own memory is never advised."""
    from specdec_lab.cpu.linear import release_pages
    w = torch.randn(1024, 1024)
    before = w.clone()
    assert release_pages(w) == 0 and torch.equal(w, before)
