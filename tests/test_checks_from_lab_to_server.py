"""Chapter 14's checks (specdec_lab/lab/checks/from_lab_to_server.py) on the stored runs they read: the
export in llama.cpp passes where it computes the lab's draft and fails in Hugging Face's rotary order."""
import json
from pathlib import Path

import pytest

from specdec_lab.bench.peer import computes_the_labs_draft
from specdec_lab.io.export import VLLM_EAGLE3_NAMES
from specdec_lab.lab.checks import from_lab_to_server as checks

DOCS = Path(__file__).resolve().parents[1] / "docs"


def test_the_draft_in_llamacpp_passes_for_the_export_and_fails_in_hugging_faces_rotary_order():
    noise = json.loads((DOCS / "peer_noise.json").read_text())
    for run in noise["runs"].values():
        checks.draft_in_llamacpp(run["agreement"]["f32"], computes_the_labs_draft)
        with pytest.raises(AssertionError, match="computes in llama.cpp"):
            checks.draft_in_llamacpp(run["agreement"]["hf_rope_order"], computes_the_labs_draft)
    checks.peer_noise()


def test_each_draft_in_each_engine_within_ten_percent_of_the_lab():
    engines = json.loads((DOCS / "engine_acceptance.json").read_text())
    tau = {d: {e: r["tau"] for e, r in engines["drafts"][d]["engines"].items()} for d in engines["drafts"]}
    checks.engine_acceptance(tau)
    off = {**tau, "token": {**tau["token"], "vllm": tau["token"]["lab"] * 0.85}}
    with pytest.raises(AssertionError, match="within 10%"):
        checks.engine_acceptance(off)


def test_the_exports_hold_for_vllms_names_and_fail_for_a_folded_norm_or_a_missing_name():
    cfg3 = {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 15, 27]}}
    checks.exports(True, ["tokenizer.ggml.model"] * 5, VLLM_EAGLE3_NAMES, cfg3)
    with pytest.raises(AssertionError, match="names vLLM's loader reads"):
        checks.exports(True, ["tokenizer.ggml.model"] * 5, VLLM_EAGLE3_NAMES[1:], cfg3)
    with pytest.raises(AssertionError, match="nothing folded"):
        checks.exports(True, ["tokenizer.ggml.model"] * 5, VLLM_EAGLE3_NAMES, {**cfg3, "fc_norm": True})
    with pytest.raises(AssertionError, match="tokenizer"):
        checks.exports(False, ["tokenizer.ggml.model"] * 5, VLLM_EAGLE3_NAMES, cfg3)
