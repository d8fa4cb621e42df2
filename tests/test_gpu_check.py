"""scripts/gpu_check.sh, run end to end in its smoke mode (tiny shapes on the CPU), so that the
prepared GPU check cannot rot between the runs on a GPU."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_gpu_check_smoke_runs_every_section(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    run = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--smoke"], env=env,
                         capture_output=True, text=True, timeout=1500)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    doc = json.loads((tmp_path / "gpu_check.json").read_text())
    assert (tmp_path / "gpu_check.log").read_text().strip().endswith("sections with errors: none")
    assert doc["mode"] == "smoke" and doc["environment"]["read_bandwidth_bytes_per_s"] > 0
    tiny = doc["synthetic_tiny"]
    for variant in ("eager", "compiled"):
        v = tiny[variant]
        assert 0 < v["c"] and v["ar_tokens_per_second"] > 0 and 0 < v["ar_fraction_of_bandwidth"]
        assert all(x > 0 for x in v["verify_cost"].values())
        assert set(v["predicted_speedup"]) == {"0.6", "0.7", "0.8"}
    # One host read per step, counted from outside, for the caches and for sampling; the early
    # stop costs one more per drafted token, as ModelDrafter documents.
    syncs = tiny["syncs"]
    for name in ("contiguous_greedy", "contiguous_sampling", "paged_greedy"):
        assert syncs[name]["counted_per_step_max"] == 1, (name, syncs[name])
        assert syncs[name]["engine_counted"] == 1.0
    assert syncs["stop_below_greedy"]["counted_per_step_max"] > 1
    assert tiny["compiled"]["syncs"]["contiguous_greedy"]["counted_per_step_max"] == 1
    pair = doc["default_pair"]
    assert pair["greedy_equal_to_autoregressive"] == 1.0
    assert set(pair["eager"]["speculative"]) == {"1", "2"} and set(pair["compiled"]["speculative"]) == {"2"}
