"""Chapter 06's checks (specdec_lab/lab/checks/verification_on_device.py): they pass on the chapter's own
results and on `verify`, and fail on chapter 02's bug and on a copy of the results with one figure changed."""
import copy
from pathlib import Path

import pytest

from specdec_lab.core.verify import verify
from specdec_lab.lab import pitfalls
from specdec_lab.lab.checks import must_fail, verification_on_device as checks

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "06_verification_on_device.ipynb"
# the chapter's cells that compute what the checks read: imports, the experiment's settings, the agreement
# cases, the sync counts, the engine's syncs, the launch counts, the GPU model and the break-even
CELLS = ("c01", "c06", "c07", "c09", "c11", "c20", "c22", "c23b")


@pytest.fixture(scope="module")
def ns(notebook_cells):
    """The notebook's namespace after its computing cells (about 10 s)."""
    return notebook_cells(NOTEBOOK, CELLS)


def test_decides_like_reference_passes_verify_and_fails_the_bug():
    checks.decides_like_reference(verify, 40, 4096)
    with pytest.raises(AssertionError, match="decide exactly as the reference loop"):
        checks.decides_like_reference(pitfalls.verify_resample_from_p, 40, 4096)
    assert "as the reference loop" in must_fail(checks.decides_like_reference, pitfalls.verify_resample_from_p,
                                                40, 4096, name="the verifier that draws the correction from p")


def test_the_chapters_figures_hold(ns):
    checks.agreement(ns["agree"], ns["agree_wrong"], ns["N_CASES"], ns["outcomes"])
    checks.sync_counts(ns["KS"], ns["syncs_ref"], ns["syncs_vec"])
    checks.engine_syncs(ns["ref_stats"], ns["dev_stats"], ns["dev_counted"], ns["ref_tokens"] == ns["dev_tokens"])
    checks.gpu_model(ns)
    checks.breakeven_with_launches(ns["vec_launches"], ns["loop_launches"], ns["gpu_breakeven"])


def test_a_changed_figure_fails(ns):
    with pytest.raises(AssertionError):
        checks.agreement(ns["N_CASES"] - 1, ns["agree_wrong"], ns["N_CASES"], ns["outcomes"])
    with pytest.raises(AssertionError):
        checks.sync_counts(ns["KS"], ns["syncs_ref"], [1] * len(ns["KS"]))
    with pytest.raises(AssertionError):
        checks.engine_syncs(ns["ref_stats"], ns["dev_stats"], ns["dev_counted"] + 1, True)
    changed = dict(ns, gpu=copy.deepcopy(ns["gpu"]))
    changed["gpu"]["CUDA graphs"]["c"] = 0.3
    with pytest.raises(AssertionError):
        checks.gpu_model(changed)
    with pytest.raises(AssertionError):
        checks.gpu_model(dict(ns, HOST_PER_LAUNCH=ns["HOST_PER_LAUNCH"] / 2))
    with pytest.raises(AssertionError):
        checks.breakeven_with_launches(ns["vec_launches"], ns["loop_launches"], {**ns["gpu_breakeven"], 8: 1e-6})
