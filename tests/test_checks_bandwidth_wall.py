"""Chapter 01's checks (specdec_lab/lab/checks/bandwidth_wall.py) pass on the chapter's pieces and fail on
broken ones: a ceiling from float32 weights counted as 32 bytes, and stored figures with one value changed."""
import copy
import json

import gguf
import pytest

from specdec_lab.analysis import roofline as rf
from specdec_lab.io import assets
from specdec_lab.lab.checks import bandwidth_wall as checks

KV_RESERVE = 32768 * rf.kv_bytes_per_position(rf.LLAMA_3_70B)
PREFILL = rf.matmul_intensity(2048, 8192, 28672, 2)
PROFILE = json.loads((checks.DOCS / "machine_profile.json").read_text())
FLOPS_PER_ROW = rf.flops_per_token(rf.SMOLLM2_135M, PROFILE["forward"]["context"])
LIVE = {T: r for T, r in zip(PROFILE["forward"]["rows"], PROFILE["forward"]["ratio_to_one_row"])
        if T in (1, 2, 3, 5, 6, 8, 12, 17)}


def test_datasheet_holds_and_rejects_a_wrong_figure():
    checks.datasheet(rf.HARDWARE, KV_RESERVE, PREFILL)
    with pytest.raises(AssertionError, match="about 1,550"):
        checks.datasheet(rf.HARDWARE, KV_RESERVE, rf.arithmetic_intensity(2048, 2))   # the approximation 2T/b
    with pytest.raises(AssertionError, match="32k cache"):
        checks.datasheet(rf.HARDWARE, 0, PREFILL)


def test_the_ceiling_catches_bits_counted_as_bytes():
    args = rf.SMOLLM2_135M, 64, 25.9e9, 12.3   # the chapter's stored run: 47.9 tokens/s ceiling, 12.3 measured
    checks.decode_under_ceiling(4, *args)
    with pytest.raises(AssertionError, match="bytes miscounted"):
        checks.decode_under_ceiling(32, *args)


def test_plain_forward_rejects_eight_rows_at_eight_times_the_price():
    with pytest.raises(AssertionError, match="weight read should be shared"):
        checks.plain_forward(None, {1: 0.066, 8: 8 * 0.066}, 64)


@pytest.mark.slow
def test_plain_forward_holds_on_the_default_target(default_target):
    checks.plain_forward(default_target, {1: 0.0663, 8: 0.1748}, 64)


def file_figures():
    held = {}
    for t in gguf.GGUFReader(str(assets.ensure_gguf())).tensors:
        n, b = held.get(t.tensor_type.name, (0, 0))
        held[t.tensor_type.name] = (n + int(t.n_elements), b + int(t.n_bytes))
    return held, sum(b for _, b in held.values()), 4 * sum(n for n, _ in held.values())


def test_stored_figures_hold_and_reject_a_changed_copy(tmp_path, monkeypatch):
    held, file_bytes, expanded = file_figures()
    checks.stored_figures(held, file_bytes, expanded)
    with pytest.raises(AssertionError):
        checks.stored_figures(held, file_bytes, 2 * expanded)   # float32 counted as 8 bytes
    bench = json.loads((checks.DOCS / "bench_fast_memory.json").read_text())
    bench["results"][0]["systems"]["spec_self_k6"]["mean_tokens_per_step"] = 5.39
    (tmp_path / "bench_fast_memory.json").write_text(json.dumps(bench))
    monkeypatch.setattr(checks, "DOCS", tmp_path)
    with pytest.raises(AssertionError):
        checks.stored_figures(held, file_bytes, expanded)


def test_machine_profile_holds_and_rejects_a_changed_copy():
    checks.machine_profile(PROFILE, FLOPS_PER_ROW, LIVE)
    changed = copy.deepcopy(PROFILE)
    changed["forward"]["ratio_to_one_row"][changed["forward"]["rows"].index(8)] = 2.46
    with pytest.raises(AssertionError):
        checks.machine_profile(changed, FLOPS_PER_ROW, LIVE)
    with pytest.raises(AssertionError, match="the shape changed"):
        checks.machine_profile(PROFILE, FLOPS_PER_ROW, dict.fromkeys(LIVE, 1.0))   # a flat forward today
