"""bench/peer.py: llama-server as the benchmark's peer, and the stored side-by-side run."""
import json
from pathlib import Path

import pytest

from specdec_lab.bench.peer import LlamaServer, PeerConfig, exported_draft_gguf, format_peer, llama_server_path
from specdec_lab.core.text import encode_prompt
from specdec_lab.io.assets import ensure_gguf

DOCS = Path(__file__).resolve().parents[1] / "docs"
# peer.json: the lab, llama.cpp and vLLM side by side (vLLM's compiled mode in a second wave);
# peer_llamacpp.json: the earlier run with llama.cpp alone, kept for docs/benchmarks.md's history
STORED = ["peer.json", "peer_llamacpp.json"]


def test_bad_configuration_is_refused():
    with pytest.raises(ValueError, match="k must be an int in \\[1, 16\\] with a draft, got 0"):
        LlamaServer("t.gguf", "d.gguf", 0)
    with pytest.raises(ValueError, match="threads must be an int >= 1, got 0"):
        LlamaServer("t.gguf", threads=0)
    with pytest.raises(ValueError, match="num_prompts must be an int >= 1, got 0"):
        PeerConfig(num_prompts=0)
    with pytest.raises(ValueError, match="at most 16"):
        PeerConfig(k=17)


def test_set_up_built_llama_server():
    assert llama_server_path().name == "llama-server"


@pytest.mark.slow
def test_llama_cpp_speculative_with_the_exported_draft_is_its_own_greedy_decode(default_target):
    """The exported draft drafts inside llama.cpp (tokens accepted), and llama.cpp's output with it
    is its autoregressive output: its verification is lossless for greedy drafts."""
    prompts = ["Why is the sky blue?", "Name three colours."]
    with LlamaServer(ensure_gguf()) as ar, LlamaServer(ensure_gguf(), exported_draft_gguf(), 3) as spec:
        accepted = 0
        for p in prompts:
            ids = encode_prompt(default_target.tokenizer, p)
            a, s = ar.complete(ids, 32), spec.complete(ids, 32)
            assert s["tokens"] == a["tokens"]
            assert s["timings"]["draft_n"] > 0
            accepted += s["timings"]["draft_n_accepted"]
    assert accepted > 0


@pytest.mark.parametrize("name", STORED)
def test_stored_peer_run_is_complete_and_consistent(name):
    doc = json.loads((DOCS / name).read_text())
    k, s = doc["config"]["k"], doc["config"]["self_k"]
    names = {"lab_ar", f"lab_spec_k{k}", f"lab_self_k{s}", "lab_int4_decode", "llamacpp_ar", f"llamacpp_spec_k{k}",
             f"llamacpp_spec_k{k}_f16", "llamacpp_draft_alone"}
    if doc["config"].get("vllm"):  # the EAGLE-3 draft in the lab and llama.cpp, and vLLM in each of its modes
        e = doc["config"]["eagle3_k"]
        names |= {f"lab_eagle3_k{e}", f"llamacpp_eagle3_k{e}"}
        vllm = {"vllm_ar", f"vllm_spec_k{k}", f"vllm_eagle3_k{e}"}
        names |= vllm | ({n + "_compiled" for n in vllm} if doc["config"]["vllm_compiled"] else set())
    assert set(doc["systems"]) == names
    rows = doc["systems"]
    assert rows["lab_ar"]["vs_lab_ar"]["ratio"] == pytest.approx(1.0)
    if doc["config"].get("vllm"):
        for name, row in rows.items():  # a second wave's rows are over its own baselines, timed again
            assert row["wave"] == (2 if name.endswith("_compiled") else 1), name
        for name in (n for n in rows if n.startswith("vllm_") and "_ar" not in n):  # vLLM's own counters
            assert 0 < rows[name]["accepted"] <= rows[name]["drafted"] and 1 < rows[name]["tokens_per_step"], name
            assert rows[name]["same_output_as_lab_ar"] >= 0.9, name  # vLLM runs the float32 target, as the lab does
    for name, row in rows.items():
        lo, hi = row["vs_lab_ar"]["ci95"] or (None, None)
        if lo is not None:
            assert lo <= row["vs_lab_ar"]["ratio"] <= hi, name
        assert row["tokens_per_second"] == pytest.approx(row["tokens"] / row["seconds"])
    # Lossless systems reproduce their own engine's greedy decode.
    assert rows[f"lab_spec_k{k}"]["same_output_as_lab_ar"] == 1.0
    assert rows[f"lab_self_k{s}"]["same_output_as_lab_ar"] == 1.0
    assert rows[f"llamacpp_spec_k{k}"]["same_output_as_llamacpp_ar"] == 1.0
    assert rows[f"llamacpp_spec_k{k}_f16"]["same_output_as_llamacpp_ar"] == 1.0
    # c from the servers' decode rates: the draft alone against the target alone
    rate = {n: rows[n]["server_decode_tokens_per_second"] for n in ("llamacpp_ar", "llamacpp_draft_alone")}
    c = rate["llamacpp_ar"] / rate["llamacpp_draft_alone"]
    assert doc["c"]["llamacpp"] == pytest.approx(c) and 0 < doc["c"]["lab"] < 1
    assert "llama-server" in rows["llamacpp_ar"]["command"][0]
    table = format_peer(doc)
    assert table.count("\n") == len(names) + 1 and "llama.cpp, exported draft" in table
