"""Chapter 09's checks (specdec_lab/lab/checks/training_a_draft.py): they pass on the chapter's own results,
its stored figures and the shipped draft, and fail on targets one position late and on a figure changed."""
import copy
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from specdec_lab.api import SpeculativeEngine, with_vocab_subset
from specdec_lab.io.pair import default_draft_dir, load_model_cached, tiny_model
from specdec_lab.lab import pitfalls
from specdec_lab.lab.checks import must_fail, training_a_draft as checks

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "09_training_a_draft.ipynb"
PROFILE = json.loads((ROOT / "docs" / "machine_profile.json").read_text())
# the chapter's cells the checks read, but for the toy's engine runs (18 s) and the default pair: the imports,
# the shuffled vocabulary, the objective's table, the toy's data and training, and the model card
CELLS = ("c01", "c08", "c12", "c14", "c15", "c16", "b00f8ee2")
# the toy's engine runs as the chapter's stored run printed them
TRAINED = {"alpha": 0.905, "formula": 4.14, "from_positions": 3.76, "full_steps": 3.76, "tokens_per_step": 3.62,
           "by_position": [0.75, 0.91, 0.98, 0.98], "after_bonus": 0.66, "short_steps": 23, "steps": 265,
           "periods": [9, 9, 6, 9, 6, 6, 6, 6, 6, 6, 2, 9, 9, 9, 9, 9, 6, 6, 6, 6], "same_as_greedy": True}
UNTRAINED = dict(TRAINED, alpha=0.001, formula=1.0, from_positions=1.0, full_steps=1.0, tokens_per_step=1.0)
# the live check of the shipped draft as the chapter's stored run printed it
SUBSET_RUNS = {"whole head": {"alpha": 0.51, "c": 0.024, "outputs": [[1, 2]]},
               "subset head": {"alpha": 0.51, "c": 0.017, "outputs": [[1, 2]]}}


@pytest.fixture(scope="module")
def ns(notebook_cells):
    """The notebook's namespace after those cells (about 10 s)."""
    return notebook_cells(NOTEBOOK, CELLS)


def test_vocabulary_and_objective(ns):
    try:
        SpeculativeEngine(tiny_model(0, vocab_size=49152, dim=32), tiny_model(0, vocab_size=32000, dim=32), k=4)
    except ValueError as e:
        error = str(e)
    checks.vocabulary(error, ns["res_self"], ns["res_shuffled"], ns["toy_greedy"].tokens)
    with pytest.raises(AssertionError):
        checks.vocabulary(None, ns["res_self"], ns["res_shuffled"], ns["toy_greedy"].tokens)
    with pytest.raises(AssertionError, match="shuffled"):
        checks.vocabulary(error, ns["res_self"], ns["res_self"], ns["toy_greedy"].tokens)
    checks.objective(ns["identity_gap"], ns["pinsker_ok"])
    with pytest.raises(AssertionError):
        checks.objective(1e-3, ns["pinsker_ok"])


def test_learns_the_bigram_holds_and_fails_on_targets_one_position_late(ns):
    args = ns["untrained"], ns["held_greedy"], ns["EPOCHS"], ns["LR"]
    checks.learns_the_bigram(ns["train"], *args)
    assert must_fail(checks.learns_the_bigram, pitfalls.targets_one_position_late(ns["train"]), *args,
                     name="the recipe with targets one position late") == "the toy draft should learn the bigram target"


def test_toy_runs_hold_on_the_stored_run_and_not_on_a_changed_one():
    runs, curve = {"untrained": UNTRAINED, "trained": TRAINED}, [(100, 0.5), (1000, 0.905)]
    checks.toy_runs(runs, curve, 0.001, 0.905, bigram=True)
    checks.toy_runs(runs, curve, 0.001, 0.905, bigram=False)
    for key, value in (("after_bonus", 0.8), ("from_positions", 3.7), ("tokens_per_step", 4.0), ("periods", [None])):
        with pytest.raises(AssertionError):
            checks.toy_runs({"untrained": UNTRAINED, "trained": dict(TRAINED, **{key: value})}, curve, 0.001, 0.905,
                            bigram=True)
    with pytest.raises(AssertionError, match="learn the bigram"):
        checks.toy_runs(runs, [(1000, 0.2)], 0.001, 0.2, bigram=True)


def test_shipped_card_holds_and_not_on_a_changed_card(ns):
    checks.shipped_card(ns["card"], ns["classic"], ns["agreement"], ns["curve_card"])
    with pytest.raises(AssertionError):
        checks.shipped_card(ns["card"], ns["classic"].replace("alpha = 0.604", "alpha = 0.804"), ns["agreement"],
                            ns["curve_card"])
    with pytest.raises(AssertionError):
        checks.shipped_card(ns["card"], ns["classic"], dict(ns["agreement"], benchmark=0.3), ns["curve_card"])
    with pytest.raises(AssertionError):
        checks.shipped_card(ns["card"], ns["classic"], ns["agreement"], ns["curve_card"][::-1])


def test_shipped_draft_holds_and_not_with_the_whole_head():
    whole = load_model_cached(default_draft_dir())
    subset = json.loads((default_draft_dir() / "vocab_subset.json").read_text())
    weights = default_draft_dir() / "model.safetensors"
    target = SimpleNamespace(cfg=SimpleNamespace(vocab_size=49152))
    shipped = with_vocab_subset(copy.deepcopy(whole), default_draft_dir())
    checks.shipped_draft(SimpleNamespace(target=target, draft=shipped), weights, subset, PROFILE)
    with pytest.raises(AssertionError, match="subset's head columns"):
        checks.shipped_draft(SimpleNamespace(target=target, draft=whole), weights, subset, PROFILE)
    changed = copy.deepcopy(PROFILE)
    changed["c"]["token"] = 0.031
    with pytest.raises(AssertionError, match="machine profile"):
        checks.shipped_draft(SimpleNamespace(target=target, draft=shipped), weights, subset, changed)


def test_shipped_live_holds_on_the_stored_run_and_not_on_a_changed_one():
    checks.shipped_live(0.51, 1.92, True, SUBSET_RUNS)
    with pytest.raises(AssertionError):
        checks.shipped_live(0.51, 5.5, True, SUBSET_RUNS)
    with pytest.raises(AssertionError):
        checks.shipped_live(0.51, 1.92, False, SUBSET_RUNS)
    swapped = {"whole head": SUBSET_RUNS["subset head"], "subset head": SUBSET_RUNS["whole head"]}
    with pytest.raises(AssertionError, match="narrower head"):
        checks.shipped_live(0.51, 1.92, True, swapped)
