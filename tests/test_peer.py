"""bench/peer.py: llama-server as the benchmark's peer, and the stored side-by-side run."""
import json
from pathlib import Path

import pytest

import specdec_lab as sl
from specdec_lab.bench.peer import (NEAR_TIE, SAME_PROPOSAL_FLOOR, LlamaServer, PeerConfig, computes_the_labs_draft,
                                    draft_agreement, exported_draft_gguf, format_peer, llama_server_path,
                                    whole_head_draft)
from specdec_lab.core.text import encode_prompt
from specdec_lab.io.assets import ensure_gguf
from specdec_lab.io.pair import default_draft_dir
from specdec_lab.lab.pitfalls import export_gguf_draft_hf_rope_order
from specdec_lab.train.prompts import BENCH_PROMPTS

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


def test_an_export_computes_the_labs_draft_only_if_it_parts_rarely_and_only_at_near_ties():
    row = lambda same, gaps: {"same_proposal": same, "disagreement_gaps": gaps}
    assert computes_the_labs_draft(row(1.0, []))
    assert computes_the_labs_draft(row(SAME_PROPOSAL_FLOOR, [0.001, -0.002]))
    assert not computes_the_labs_draft(row(SAME_PROPOSAL_FLOOR - 0.001, [0.001]))  # too many disagreements
    assert not computes_the_labs_draft(row(0.999, [NEAR_TIE * 2]))  # one, but no near-tie: another function


@pytest.mark.slow
def test_the_exported_draft_proposes_in_llama_cpp_what_it_proposes_in_the_lab_and_a_broken_export_does_not(
        tmp_path):
    """Chapter 14's claim, on other prompts: both engines asked for the draft's proposal at every position
    of the same answers (the lab target's), so where two engines' greedy answers part does not matter."""
    pair = sl.load_default_pair()
    sequences = []
    for p in BENCH_PROMPTS[8:12]:  # prompts the chapter's claim does not use; about 190 positions, so that
        ids = encode_prompt(pair.tokenizer, p)  # the 98% floor allows three near-tie disagreements
        sequences.append((ids, sl.autoregressive_generate(pair.target, ids, 48).tokens))
    with pytest.raises(ValueError, match="compare with whole_head_draft"):
        draft_agreement(pair.draft, exported_draft_gguf(), sequences)  # the engine's draft: a subset head
    good = draft_agreement(whole_head_draft(), exported_draft_gguf(), sequences)
    broken = export_gguf_draft_hf_rope_order(default_draft_dir(), ensure_gguf(), tmp_path / "hf_order.gguf")
    bad = draft_agreement(whole_head_draft(), broken, sequences)
    assert good["positions"] == bad["positions"] == sum(len(c) for _, c in sequences)
    assert good["alpha"]["lab"] == bad["alpha"]["lab"] > 0.2, "the lab's side is one computation"
    assert computes_the_labs_draft(good), good
    assert not computes_the_labs_draft(bad), bad
    assert bad["alpha"]["llamacpp"] < good["alpha"]["llamacpp"], "the broken export proposes the answer less often"


def test_the_stored_noise_record_puts_the_claims_bounds_between_rounding_and_a_broken_export():
    """docs/peer_noise.json (scripts/peer_noise.py): two builds at one and two threads. The float32 export and
    the float16 one (a far larger rounding than a build's) pass the claim in every run; the broken export
    fails it in every run, by a wide margin. The old comparison, live shares with the Q4_1 target, moved."""
    doc = json.loads((DOCS / "peer_noise.json").read_text())
    assert len(doc["config"]["builds"]) == 2 and len(doc["runs"]) == 4
    for name, run in doc["runs"].items():
        a = run["agreement"]
        assert a["f32"]["positions"] == a["f16"]["positions"] >= 30 * doc["config"]["prompts"], name
        assert computes_the_labs_draft(a["f32"]) and computes_the_labs_draft(a["f16"]), name
        assert not computes_the_labs_draft(a["hf_rope_order"]), name
        assert a["hf_rope_order"]["same_proposal"] < SAME_PROPOSAL_FLOOR - 0.3, name
        assert max(map(abs, a["f16"]["disagreement_gaps"]), default=0) < NEAR_TIE / 2, name


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
