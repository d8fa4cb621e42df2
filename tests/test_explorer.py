"""lab/explorer.py: the predicted curves follow Theorem 3.8 and this machine's v_K, and the sliders redraw."""
import pytest

from specdec_lab.analysis.roofline import expected_speedup
from specdec_lab.lab.explorer import SpeedupExplorer, speedup_curves, speedup_figure

VERIFY = {k: 1.0 + 0.2 * max(0, k - 2) for k in range(1, 13)}  # flat to K = 2, then a fifth of a forward a row


def test_the_curves_are_the_theorem_and_the_same_formula_with_v_k():
    curves = speedup_curves(0.8, 0.05, VERIFY)
    assert curves["theorem"][7] == pytest.approx(3.09, abs=0.005), "Theorem 3.8 at alpha 0.8, c 0.05, K = 8"
    assert curves["this machine"] == [expected_speedup(0.8, k, 0.05, VERIFY[k]) for k in range(1, 13)]
    assert curves["theorem"][:2] == curves["this machine"][:2], "where v_K = 1 the two agree"
    best = {name: ys.index(max(ys)) + 1 for name, ys in curves.items()}
    assert best["this machine"] < best["theorem"], "a verification that costs more moves the best K down"


def test_bad_inputs_are_refused_by_name():
    with pytest.raises(ValueError, match="alpha"):
        speedup_curves(1.0, 0.05, VERIFY)
    with pytest.raises(ValueError, match="verify_cost"):
        speedup_curves(0.5, 0.05, {1: 1.0})


def test_the_figure_marks_each_best_k_and_the_measured_dots_and_the_sliders_redraw():
    fig = speedup_figure(0.454, 0.026, VERIFY, measured={1: 1.25, 2: 1.33}, k_max=8)
    names = [t.name for t in fig.data if t.name]
    assert any("theorem (best K" in n for n in names) and "measured (stored run)" in names
    explorer = SpeedupExplorer(VERIFY, {1: 1.25, 9: 1.1}, alpha=0.454, c=0.026)
    assert [len(t.x) for t in explorer.figure.data if t.name == "measured (stored run)"] == [1], "K <= largest K"
    explorer.alpha.value = 0.9
    assert "alpha = 0.900" in explorer.figure.layout.title.text, "moving a slider redraws the figure"
    bundle = explorer.display_bundle()
    assert "image/png" in bundle and "application/vnd.jupyter.widget-view+json" in bundle, "live and saved, both"


def test_further_pricings_and_measured_series_are_drawn_under_their_own_names():
    run = {1: 1.04, 2: 1.09, 3: 1.13}  # a stored run's v_K, priced only to K = 3
    curves = speedup_curves(0.454, 0.026, VERIFY, k_max=8, label="AVX2 profile", others={"the run": run})
    assert list(curves) == ["theorem", "AVX2 profile", "the run"]
    assert curves["the run"] == [expected_speedup(0.454, k, 0.026, run[k]) for k in (1, 2, 3)], "only the K it prices"
    with pytest.raises(ValueError, match="own name"):
        speedup_curves(0.454, 0.026, VERIFY, others={"theorem": run})
    loop, whole = {1: 1.29, 2: 1.38, 9: 1.0}, {1: 1.25, 2: 1.33}
    explorer = SpeedupExplorer(VERIFY, {"S_loop": loop, "S": whole}, alpha=0.454, c=0.026, label="AVX2 profile",
                               others={"the run": run})
    names = [t.name for t in explorer.figure.data if t.name]
    assert names == ["predicted, theorem (best K 4)", "predicted, AVX2 profile (best K 2)",
                     "predicted, the run (best K 2)", "S_loop", "S"], names
    assert [len(t.x) for t in explorer.figure.data if t.name in ("S_loop", "S")] == [2, 2], "K <= largest K"
    fig = speedup_figure(0.454, 0.026, VERIFY, measured={1: 1.29}, measured_label="decode loops")
    assert "decode loops" in [t.name for t in fig.data], "one K -> ratio mapping takes measured_label"


def test_the_acceptance_explorer_normalises_its_weights_and_every_bar_still_ends_at_p():
    from specdec_lab.lab.explorer import AcceptanceExplorer
    explorer = AcceptanceExplorer([3, 1, 0, 0], [1, 1, 1, 1], labels=list("abcd"))
    p, q = explorer.distributions()
    assert p == pytest.approx([0.75, 0.25, 0, 0], abs=1e-3) and q == pytest.approx([0.25] * 4, abs=1e-3)
    explorer.q_weights[0].value = 3  # the draft moves toward the target's favourite
    accepted, residual = (list(t.y) for t in explorer.figure.data[:2])
    assert sum(accepted) == pytest.approx(sum(min(a, b) for a, b in zip(*explorer.distributions())))
    assert [a + r for a, r in zip(accepted, residual)] == pytest.approx(explorer.distributions()[0])
    for s in explorer.p_weights:
        s.value = 0
    assert explorer.distributions()[0] == [0.25] * 4, "all weights at zero read as uniform"
    with pytest.raises(ValueError, match="p and q"):
        AcceptanceExplorer([1.0], [1.0])
