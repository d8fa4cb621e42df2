"""Chapter 14's checks: the exports made live, each draft inside each engine, the stored peer run as the
prose reads it, the live answer, and the export computing in llama.cpp what the draft computes in the lab."""
import json
from pathlib import Path

from ...io.export import VLLM_EAGLE3_NAMES

DOCS = Path(__file__).resolve().parents[3] / "docs"
LAB_AND_VLLM = ("lab_spec_k2", "lab_self_k6", "lab_eagle3_k3", "vllm_ar", "vllm_spec_k2", "vllm_eagle3_k3")


def exports(same_tok, tok_keys, eagle3_names, cfg3):
    """The exports made in section 1: the GGUF draft carries the target's tokenizer, and the EAGLE-3
    folder holds the names vLLM's loader reads, renamed and nothing folded."""
    assert same_tok and len(tok_keys) >= 5, "the GGUF draft carries every tokenizer entry of the target"
    assert eagle3_names == VLLM_EAGLE3_NAMES, "the EAGLE-3 folder holds the names vLLM's loader reads"
    assert cfg3["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 15, 27]
    assert not any(cfg3.get(k) for k in ("fc_norm", "norm_output", "norm_before_fc")), "nothing folded: a renaming"


def engine_acceptance(tau):
    """Section 3: each draft inside each engine, from the engines' own counters, within 10% of the lab's."""
    for d, by_engine in tau.items():
        for e in ("vllm", "llamacpp"):
            assert abs(by_engine[e] / by_engine["lab"] - 1) < 0.10, f"{d} in {e}: tau within 10% of the lab's"
    assert tau["eagle3"]["lab"] > 1.3 and tau["token"]["lab"] > 1.3, "both drafts are accepted"


def draft_in_llamacpp(agreement, judge):
    """Section 2's pair, live, on the same tokens in both engines: `judge` (bench.peer's
    computes_the_labs_draft) holds when the export proposes the lab draft's token at 98% of the
    positions or more and parts only at near-ties."""
    assert judge(agreement), "the exported draft computes in llama.cpp what it does in the lab"


def stored_run(ns):
    """The stored run (docs/peer.json and the runs beside it) as the prose reads it. `ns` is the
    chapter's namespace: `peer`, `rows`, `over_own`, `share`, `c`, `step`, `three_rows`, `OWN`,
    `again`, `target_gguf`, `diff`, `fixed` and `by_load`."""
    peer, rows, over_own, share, c = ns["peer"], ns["rows"], ns["over_own"], ns["share"], ns["c"]
    assert peer["prompts"]["count"] == 24 and len(rows) == 16 and peer["config"]["k"] == 2 \
        and peer["config"]["eagle3_k"] == 3

    def vs(name, base="vs_lab_ar"):
        return rows[name][base]
    assert vs("llamacpp_ar")["ci95"][0] > 1 > vs("vllm_ar")["ci95"][1], "llama.cpp decodes faster than the lab, vLLM slower"
    for name in ("llamacpp_spec_k2", "llamacpp_spec_k2_f16"):
        assert vs(name, "vs_llamacpp_ar")["ci95"][1] < 1, f"{name}: llama.cpp's speculation ran slower than its decode"
    assert [f"{over_own(e, 'spec_k2'):.2f}" for e in ("lab", "vLLM", "llama.cpp")] == ["1.29", "1.21", "0.60"]
    assert [f"{rows[n]['tokens_per_step']:.2f}" for n in ("lab_spec_k2", "vllm_spec_k2", "llamacpp_spec_k2")] == \
        ["1.62", "1.64", "1.62"]
    assert f"{vs('llamacpp_ar')['ratio']:.2f} {vs('vllm_ar')['ratio']:.2f}" == "1.38 0.43"
    assert max(abs(x - share["lab_spec_k2"]) for x in share.values()) < 0.02, "the draft is accepted about as often"
    assert 2 * c["llamacpp"] < 0.25 and f"{ns['step'] - 2 * c['llamacpp']:.2f}" == "3.06", \
        "the drafts are cheap; the step is not"
    assert f"{ns['three_rows']:.2f}" == "1.13"
    assert max(over_own(e, "eagle3_k3") for e in ns["OWN"]) < 1.05 and f"{over_own('vLLM', 'eagle3_k3'):.2f}" == "1.04"
    assert f"{over_own('lab', 'eagle3_k3'):.2f}" == "0.76" and peer["measured_at"] < "2026-12-05", "the eager target's run"
    again = ns["again"]
    assert [again[n]["over_autoregressive"] for n in ("EAGLE-3 draft, K = 3", "shipped draft, K = 2")] == [1.131, 1.43]
    assert all(rows[n]["wave"] == 2 for n in rows if n.endswith("_compiled")), "vLLM compiled: the second wave"
    # The self-draft, quoted with its origin
    tensors = ns["target_gguf"].tensors
    expansion = 4 * sum(int(x.n_elements) for x in tensors) / sum(int(x.n_bytes) for x in tensors)
    assert f"{expansion:.1f}" == "5.6" and f"{rows['lab_self_k6']['tokens_per_step']:.2f}" == "6.39"
    assert f"{vs('lab_self_k6')['ratio']:.2f} {vs('lab_self_k6', 'vs_llamacpp_ar')['ratio']:.2f}" == "1.50 1.08"
    assert f"{vs('lab_int4_decode')['ratio']:.2f}" == "2.46" and vs("lab_int4_decode")["ratio"] > vs("lab_self_k6")["ratio"]
    assert vs("lab_self_k6", "vs_llamacpp_ar")["ci95"][0] > 1, "the 4-bit self-draft beats llama.cpp's decode"
    assert max(r["tokens_per_second"] for n, r in rows.items() if n.startswith("lab_") and n != "lab_int4_decode") \
        == rows["lab_self_k6"]["tokens_per_second"]
    # Where llama.cpp's greedy answers part from the lab's
    diff = ns["diff"]
    gaps = sorted(abs(d["logit_gap"]) for d in diff["first_differences"] if d is not None)
    assert len(gaps) == round(24 * (1 - diff["same_output_as_lab_ar"])) == 15, "they part on 15 of 24 prompts"
    assert f"{max(gaps):.2f}" == "0.53" and sum(g < 0.14 for g in gaps) >= len(gaps) / 2, "at near-ties"
    for name in LAB_AND_VLLM:
        assert rows[name]["same_output_as_lab_ar"] == 1.0, f"{name}: the lab's float32 answers"
    for name in ("vllm_spec_k2_compiled", "vllm_eagle3_k3_compiled"):
        assert rows[name]["same_output_as_lab_ar"] == 1.0 and rows[name]["same_output_as_llamacpp_ar"] < 1, name
    for name in ("llamacpp_spec_k2", "llamacpp_spec_k2_f16", "llamacpp_eagle3_k3"):
        assert rows[name]["same_output_as_llamacpp_ar"] == 1.0, f"{name}: lossless against llama.cpp's decode"
    assert round(ns["fixed"]["1"], 2) == 1.32 and round(ns["fixed"]["8"], 2) == 0.72, "fixed K at one request and at eight"
    assert round(ns["by_load"]["1"], 2) == 1.37 and round(ns["by_load"]["8"], 2) == 0.98, \
        "the goodput policy at one request and at eight"


def live_answer(ns):
    """Today's answer: one prompt, its accepted share inside the spread of the lab's shares by prompt,
    the lab's engine lossless on it. `ns` holds `answer`, `lab_same`, `lab_shares`, `live_share`,
    `share`, `peer`, `BENCH_PROMPTS` and `llama_server_path`."""
    answer, lab_shares = ns["answer"], ns["lab_shares"]
    assert ns["llama_server_path"]().is_file() and answer["timings"]["predicted_n"] == len(answer["tokens"]) > 0
    assert ns["lab_same"], "the lab's speculative answer must equal its greedy decode"
    assert "Why is the sky blue?" == ns["BENCH_PROMPTS"][0] and ns["peer"]["prompts"]["set"] == "bench"
    assert max(lab_shares.values()) - min(lab_shares.values()) > abs(ns["live_share"] - ns["share"]["llamacpp_spec_k2"]), \
        "one prompt's share lies within the spread between prompts"


def peer_noise():
    """The record the prose reads for section 2 (docs/peer_noise.json): two llama.cpp builds, one and two
    threads each, agreeing with the lab's draft everywhere in float32, at near-ties in float16, and at
    48% of the positions with Q and K in Hugging Face's order."""
    noise = json.loads((DOCS / "peer_noise.json").read_text())
    runs = list(noise["runs"].values())
    assert noise["config"]["prompts"] == 24 and noise["processor"]["avx512f"] and len(runs) == 4
    assert {r["agreement"][e]["positions"] for r in runs for e in r["agreement"]} == {880}
    assert all(r["agreement"]["f32"]["same_proposal"] == 1.0 for r in runs), "the float32 export: the same everywhere"
    assert sorted({len(r["agreement"]["f16"]["disagreement_gaps"]) for r in runs}) == [1, 2]
    assert max(abs(g) for r in runs for g in r["agreement"]["f16"]["disagreement_gaps"]) <= 0.002
    assert {f"{r['agreement']['hf_rope_order']['same_proposal']:.0%}" for r in runs} == {"48%"}
    first3 = [noise["runs"][f"{b}_t1"]["live"]["accepted_share"]["first_3"] for b in noise["config"]["builds"]]
    assert [f"{x:.0%}" for x in first3 + [noise["lab_accepted_share"]["first_3"]]] == ["22%", "28%", "30%"]
    assert max(sum(r["live"]["same_answer_as_lab"]) for r in runs) == 1, "at most one of eight answers the lab's"
