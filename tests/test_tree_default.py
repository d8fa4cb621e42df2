"""TreeEngine on the default pair: greedy trees give the target's own greedy output (float32)."""
import pytest

import specdec_lab as sl
from specdec_lab.tree.draft import DynamicTree
from specdec_lab.tree.engine import TreeEngine

pytestmark = pytest.mark.slow

PROMPTS = ["Why is the sky blue?", "Write a Python function that adds two numbers.",
           "Name three rivers in Africa and one fact about each."]


@pytest.fixture(scope="module")
def pair():
    return sl.load_default_pair()


@pytest.fixture(scope="module")
def baselines(pair):
    return {p: sl.autoregressive_generate(pair.target, p, max_new_tokens=32).tokens for p in PROMPTS}


@pytest.mark.parametrize("tree,cache", [((4, 2, 1), "contiguous"), (DynamicTree(4, 4, 12), "contiguous"),
                                        ((3, 2, 1), "paged")], ids=str)
def test_greedy_trees_equal_autoregressive_on_the_default_pair(pair, baselines, tree, cache):
    engine = TreeEngine(pair.target, pair.draft, tree=tree, cache=cache)
    accepted = 0
    for p in PROMPTS:
        res = engine.generate(p, max_new_tokens=32)
        assert res.tokens == baselines[p], f"{tree}: diverged from greedy decoding on {p!r}"
        accepted += res.stats.accepted
    assert accepted > len(PROMPTS) * 5, "the shipped draft should have had some paths accepted"


def test_the_tree_equality_script_writes_its_document_and_resumes(tmp_path):
    """scripts/tree_equality.py on one prompt: every system identical, and a second run resumes from its
    checkpoint instead of decoding again."""
    import json
    import subprocess
    import sys
    from pathlib import Path
    script = Path(__file__).resolve().parents[1] / "scripts" / "tree_equality.py"
    args = [sys.executable, str(script), "--prompts", "1", "--max-new-tokens", "6", "--out", str(tmp_path / "eq.json"),
            "--checkpoint", str(tmp_path / "eq.jsonl")]
    for _ in range(2):
        run = subprocess.run(args, capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stderr[-2000:]
    doc = json.loads((tmp_path / "eq.json").read_text())
    assert doc["prompts"] == 1 and len(doc["identical"]) == 4 and set(doc["identical"].values()) == {1}
    assert len((tmp_path / "eq.jsonl").read_text().splitlines()) == 1, "the second run decoded nothing again"
