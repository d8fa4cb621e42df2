"""Chapter 08's checks (specdec_lab/lab/checks/metrics_and_lookup.py): they pass on the chapter's own results
and on a prompt-lookup engine, and fail on the off-by-one target cache and on a result changed."""
from pathlib import Path
from types import SimpleNamespace

import pytest

from specdec_lab.api import SpeculativeEngine
from specdec_lab.drafters import NGramDrafter
from specdec_lab.lab import pitfalls
from specdec_lab.lab.checks import metrics_and_lookup as checks

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "08_metrics_and_lookup.ipynb"
# the chapter's cells that compute what the metrics checks read: the pair, the scrape, its rows against
# RunStats, the registry and the unregistered counter
CELLS = ("c8e34b53", "c03", "c05", "c07", "c09", "c11")


def lookup_result(tokens_per_step, accepted):
    return SimpleNamespace(stats=SimpleNamespace(mean_tokens_per_step=tokens_per_step, accepted=accepted))


# prompt lookup's table as the chapter's stored run printed it
NGRAM = {"chat": lookup_result(1.0, 0), "copy": lookup_result(3.3, 24)}
# a tiny workload of token ids: a prompt with a repeated list to copy, and one without
TINY_WORKLOAD = [("chat", [3, 9, 14, 27, 5], 12), ("copy", [7, 1, 2, 3, 4, 5, 6, 8, 1, 2, 3], 16)]


@pytest.fixture(scope="module")
def ns(notebook_cells):
    """The notebook's namespace after its metrics cells (the default pair, about 20 s)."""
    return notebook_cells(NOTEBOOK, CELLS)


def test_lookup_lossless_holds_and_catches_the_off_by_one_cache(tiny_pair):
    target = tiny_pair.target
    checks.lookup_lossless(SpeculativeEngine(target, NGramDrafter(), k=4), target, TINY_WORKLOAD)
    broken = pitfalls.off_by_one_rollback_engine(target, NGramDrafter(), k=4)
    with pytest.raises(AssertionError, match="prompt lookup changed the greedy output"):
        checks.lookup_lossless(broken, target, TINY_WORKLOAD)
    with pytest.raises(AssertionError, match="prompt lookup changed the greedy output"):
        checks.lookup_lossless(SpeculativeEngine(target, NGramDrafter(), k=4), tiny_pair.draft, TINY_WORKLOAD)


@pytest.mark.slow
def test_the_chapters_results_hold(ns):
    checks.scrape_matches_stats(ns["checks"], ns["st"])
    checks.every_metric_exported(ns["exposed"], ns["made"], ns["missing"], ns["families"], ns["demo_scrape"])
    checks.served_on_loopback(ns["scraped"], ns["exporter"].exposition(), ns["server"].host, ns["still_serving"])



@pytest.mark.slow
def test_a_changed_result_fails(ns):
    rows = dict(ns["checks"], **{"tokens drafted": (67.0, ns["st"].drafted)})
    with pytest.raises(AssertionError, match="tokens drafted"):
        checks.scrape_matches_stats(rows, ns["st"])
    with pytest.raises(AssertionError):
        checks.every_metric_exported(ns["exposed"] - {"specdec_tokens_drafted"}, ns["made"], ns["missing"],
                                     ns["families"], ns["demo_scrape"])
    with pytest.raises(AssertionError):
        checks.every_metric_exported(ns["exposed"], ns["made"], ns["missing"], ns["families"],
                                     ns["demo_scrape"] + "demo_tokens_drafted_total 8.0\n")
    with pytest.raises(AssertionError):
        checks.served_on_loopback(ns["scraped"], ns["exporter"].exposition(), "0.0.0.0", ns["still_serving"])
    with pytest.raises(AssertionError):
        checks.served_on_loopback(ns["scraped"] + "x", ns["exporter"].exposition(), ns["server"].host, False)


def test_lookup_figures_hold_on_the_stored_table_and_not_on_a_changed_one():
    checks.lookup_figures(NGRAM)
    for changed in ({"copy": NGRAM["chat"], "chat": NGRAM["copy"]}, dict(NGRAM, copy=lookup_result(1.4, 4)),
                    dict(NGRAM, chat=lookup_result(1.0, 1))):
        with pytest.raises(AssertionError):
            checks.lookup_figures(changed)
