"""bench/peer.py: llama-server as the benchmark's peer, and the stored side-by-side run."""
import json
from pathlib import Path

import pytest

from specdec_lab.bench.peer import LlamaServer, PeerConfig, exported_draft_gguf, format_peer, llama_server_path
from specdec_lab.core.text import encode_prompt
from specdec_lab.io.assets import ensure_gguf

DOC = Path(__file__).resolve().parents[1] / "docs" / "peer_llamacpp.json"


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


def test_stored_peer_run_is_complete_and_consistent():
    doc = json.loads(DOC.read_text())
    k, s = doc["config"]["k"], doc["config"]["self_k"]
    names = {"lab_ar", f"lab_spec_k{k}", f"lab_self_k{s}", "lab_int4_decode", "llamacpp_ar", f"llamacpp_spec_k{k}",
             f"llamacpp_spec_k{k}_f16", "llamacpp_draft_alone"}
    assert set(doc["systems"]) == names
    rows = doc["systems"]
    assert rows["lab_ar"]["vs_lab_ar"]["ratio"] == pytest.approx(1.0)
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
