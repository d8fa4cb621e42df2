"""scripts/gpu_check.sh in its smoke mode (tiny stand-ins of the same kinds, on the CPU), so that the
prepared GPU check cannot rot between runs on a GPU: every step runs, a compiled pair compiles three
graphs and none inside a timed or counted window, a run killed midway keeps what it measured, and
what the device needs travels within its limit."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "gpu_check.sh"


def smoke_env(out):
    return {**os.environ, "CHECK_OUT": str(out), "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}


def windows(doc):
    """Every dict in the document that records a graph count before and after a window."""
    found = []

    def walk(v, path):
        if isinstance(v, dict):
            if "graphs_before" in v:
                found.append((path, v))
            for k, x in v.items():
                walk(x, f"{path}/{k}")
    walk(doc, "")
    return found


@pytest.mark.slow
def test_gpu_check_smoke_runs_every_step(tmp_path):
    run = subprocess.run(["bash", str(SCRIPT), "--smoke"], env=smoke_env(tmp_path), capture_output=True, text=True,
                         timeout=1800)
    assert run.returncode == 0, run.stdout[-3000:] + (tmp_path / "stderr.log").read_text()[-3000:]
    doc = json.loads((tmp_path / "gpu_check.json").read_text())
    assert (tmp_path / "gpu_check.log").read_text().strip().endswith("steps with errors: none")
    assert doc["mode"] == "smoke" and doc["environment"]["read_bandwidth_bytes_per_s"] > 0
    assert doc["gpu_tests"]["returncode"] == 0 and "skipped" in doc["gpu_tests"]["summary"]  # no CUDA here
    assert [doc[f"synthetic_{p}"]["tied"] for p in ("tiny", "tiny-tied")] == [[False, True], [True, True]]
    for preset in ("tiny", "tiny-tied"):
        sec = doc[f"synthetic_{preset}"]
        eager, compiled = sec["eager"], sec["compiled"]
        for part in (eager, compiled):
            assert part["costs"]["c"] > 0 and all(x > 0 for x in part["costs"]["verify_cost"].values())
            assert part["ar"]["tokens_per_second"] > 0 and part["ar"]["fraction_of_bandwidth"] > 0
            assert set(part["predicted_speedup"]) == {"0.6", "0.7", "0.8"}
        assert compiled["ar"]["context_read"] == 256, "a static cache reads its whole capacity"
        assert compiled["warm_up"]["graphs"] == 3, compiled["warm_up"]
        assert compiled["tokens_vs_eager"]["ar_equal_to_eager"] and compiled["tokens_vs_eager"]["speculative_equal_to_eager"]
        # one host read per step, counted from outside, for both caches and for sampling; the
        # early stop costs one more per drafted token, as ModelDrafter documents
        for name in ("contiguous_greedy", "contiguous_sampling", "paged_greedy"):
            assert eager["syncs"][name]["counted_per_step_max"] == 1, (name, eager["syncs"][name])
            assert eager["syncs"][name]["engine_counted"] == 1.0
        assert eager["syncs"]["stop_below_greedy"]["counted_per_step_max"] > 1
        assert compiled["syncs"]["engine_counted"] == 1.0
        # the costs beyond one chain: the batched step at every B and K, the tree's verification by node count
        assert set(eager["batched_steps"]["step_costs"]) == {"1,0", "1,2", "2,0", "2,2"}
        assert all(v > 0 for v in eager["batched_steps"]["step_costs"].values())
        assert set(eager["batched_steps"]["predicted_over_plain"]["0.7"]) == {"1,2", "2,2"}
        assert set(eager["tree_verify"]["tree"]) == set(eager["tree_verify"]["chain"]) == {"1", "4", "8"}
        assert compiled["tree_verify"]["warm_up_graphs"] == 1 and compiled["tree_verify"]["tree"]["4"] > 0
    found = windows(doc)
    assert len(found) >= 10
    for path, w in found:
        assert w["graphs_after"] == w["graphs_before"], f"a graph compiled inside the window {path}"
    shipped = doc["shipped_draft"]
    assert shipped["eager"]["speculative_equal_to_autoregressive"] == 1.0
    assert shipped["compiled"]["graphs"] == 3 and shipped["compiled"]["speculative_equal_to_eager_ar"] == 1.0
    assert doc["default_pair"] == {"skipped": "smoke mode"}


@pytest.mark.slow
def test_a_check_killed_midway_keeps_what_it_measured(tmp_path):
    """Kill the whole run (SIGKILL, as a command limit does) once the compiled part has begun: the
    eager figures measured before it stay in the JSON, and the JSON is whole."""
    proc = subprocess.Popen(["bash", str(SCRIPT), "--smoke"], env=smoke_env(tmp_path), start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    log = tmp_path / "gpu_check.log"
    try:
        deadline = time.time() + 900
        while time.time() < deadline and not (log.exists() and "--- warm_up" in log.read_text()):
            assert proc.poll() is None, "the check ended before it reached its compiled part"
            time.sleep(0.5)
        assert "--- warm_up" in log.read_text()
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    doc = json.loads((tmp_path / "gpu_check.json").read_text())
    eager = doc["synthetic_tiny"]["eager"]
    assert eager["costs"]["c"] > 0 and eager["ar"]["tokens_per_second"] > 0
    assert eager["syncs"]["contiguous_greedy"]["counted_per_step_max"] == 1
    assert "warm_up" not in doc["synthetic_tiny"].get("compiled", {}), "the step under way when killed is not recorded"


def test_the_device_payload_is_the_tracked_tree_and_fits():
    """What travels to the device is the tracked tree alone (the script needs nothing else: no
    carried weights or wheels), and it stays under 60 MiB, inside the 64 MiB a transfer allows."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    size = sum((ROOT / f).stat().st_size for f in files.split("\0") if f and (ROOT / f).is_file())
    assert size < 60 * 2 ** 20, f"the tracked tree is {size / 2 ** 20:.1f} MiB"
    script = SCRIPT.read_text()
    for fetch in ("pip install", "pip download", ".gpu/", "curl ", "wget "):
        assert fetch not in script, f"the GPU check must not need {fetch!r}"
