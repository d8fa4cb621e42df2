"""Every GPU figure a chapter states is a prediction, a figure of others with its source, or a measurement here.

No GPU run is stored in the repository, so a chapter's figure about GPU behaviour is one of three things:

1. the lab's own model or roofline: it stands in a blockquote whose first line starts with
   `> **Prediction.**` (the prediction form), so a reader sees it is not a measurement;
2. a datasheet figure or a measurement by others: its paragraph names its source with one of the
   CITATION markers below (an arXiv id, "et al.", a datasheet, a pull request, a paper, a blog post,
   what a source "reports");
3. a measurement on a GPU stored by the GPU check: its paragraph names `gpu_h200.json`.

A paragraph "states a GPU figure" when it mentions a GPU (GPU_WORDS: GPU, H100, H200, A100, CUDA, HBM,
tensor core) and holds a number with a unit or a ratio (FIGURE: TB/s, GB/s, tokens/s, FLOP/s, ms, us,
rows, tokens, x, %, and their spellings). Paragraphs are a markdown cell's blocks between blank lines,
each list item and each heading on its own, so a citation in one bullet does not cover its neighbour;
a blockquote is one paragraph, and it passes only as a whole prediction. Fenced code is skipped.

The rule reads words, not meaning: a paragraph that cites a source passes whatever else it says, so the
prediction form stays the chapters' habit for anything the lab predicts. A failure names the chapter,
the cell and the paragraph. `python tests/test_chapter_prose.py` prints every paragraph that fails.
"""
import json
import re
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))

GPU_WORDS = re.compile(r"\b(?:GPUs?|H100|H200|A100|CUDA|HBM\d?e?|[Tt]ensor [Cc]ores?)\b")
_NUMBER = r"(?<![\w.^])\d[\d,]*(?:\.\d+)?"
FIGURE = re.compile(
    _NUMBER + r"(?:"
    r"[x×](?!\w)"  # a ratio: 9x, 1.51x
    r"|\s*%"  # a share: 12.6%, 76 %
    r"|\s*(?:TB/s|GB/s|MB/s|tokens?/s|[TGP]?FLOP/s|ms|us|µs|μs|rows?|tokens?)(?![\w/])"  # a unit
    r")")
CITATION = re.compile(r"arXiv|et al\.|data ?sheet|pull request|\bPR\s?#?\d+|\bpaper\b|blog post"
                      r"|\breport(?:s|ed)\b", re.IGNORECASE)
MEASURED_HERE = re.compile(r"gpu_h200\.json")
PREDICTION = re.compile(r"^>\s*\*\*Prediction\.\*\*")
LIST_ITEM = re.compile(r"^\s{0,3}(?:[-*+]|\d+[.)])\s")


def paragraphs(markdown):
    """The paragraphs of one markdown cell: blocks between blank lines, a list item or a heading each,
    a blockquote whole; fenced code left out."""
    out, block, fenced = [], [], False

    def close():
        if block:
            out.append("\n".join(block))
            block.clear()

    for line in markdown.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            close()
            continue
        if fenced:
            continue
        quoted = line.lstrip().startswith(">")
        if not line.strip() or line.lstrip().startswith("#") \
                or (LIST_ITEM.match(line) and not quoted) \
                or (block and quoted != block[0].lstrip().startswith(">")):
            close()
        if line.lstrip().startswith("#"):
            out.append(line)
        elif line.strip():
            block.append(line)
    close()
    return out


def states_gpu_figure(paragraph):
    return bool(GPU_WORDS.search(paragraph) and FIGURE.search(paragraph))


def allowed(paragraph):
    """In the prediction form, or citing its source, or citing the GPU check's stored run."""
    if paragraph.lstrip().startswith(">"):
        return bool(PREDICTION.match(paragraph.lstrip()))
    return bool(CITATION.search(paragraph) or MEASURED_HERE.search(paragraph))


def offending(nb):
    """'cell N: paragraph' for every paragraph of a markdown cell that states a GPU figure outside the rule."""
    found = []
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "markdown":
            continue
        for par in paragraphs("".join(cell["source"])):
            if states_gpu_figure(par) and not allowed(par):
                found.append(f"cell {i}: {par}")
    return found


def test_there_are_chapters_to_check():
    assert len(NOTEBOOKS) >= 13, f"expected the 13 chapters in notebooks/, found {len(NOTEBOOKS)}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_every_gpu_figure_is_a_prediction_or_cited(path):
    found = offending(json.loads(path.read_text()))
    assert not found, (f"{path.name}: a GPU figure neither in the prediction form ('> **Prediction.** ...'), "
                       f"nor citing its source, nor gpu_h200.json:\n\n" + "\n\n".join(found))


def cell(text):
    return {"cells": [{"cell_type": "markdown", "source": text.splitlines(keepends=True)}]}


def test_the_rule_flags_a_bare_gpu_figure_and_passes_its_prediction_form():
    bare = "a GPU verifies 200 rows for the price of one"
    assert offending(cell(bare)) == [f"cell 0: {bare}"]
    assert offending(cell(f"> **Prediction.** {bare[0].upper() + bare[1:]}; no GPU run is stored to confirm it.")) == []
    assert offending(cell(f"> **Prediction.** On an H200,\n> {bare}.")) == [], "a prediction may span lines"
    assert offending(cell(f"> Note: {bare}.")) != [], "a blockquote that is not a prediction is prose"
    assert offending(cell(f"Some text.\n\n> **Prediction.** Fine.\n\n{bare}.")) != [], "the form covers its own block"


def test_the_rule_reads_units_ratios_and_citations():
    for figure in ("graphs run at about 9x eager on a GPU", "an H200 reads 4.8 TB/s", "12.6% faster on the GPU",
                   "an A100 decodes 25.5 tokens/s", "a CUDA graph saves 39 µs", "989 TFLOP/s of tensor cores",
                   "an H100 step of 3.1 ms"):
        assert offending(cell(figure)), figure
    for fine in ("a GPU changes the picture", "20 rows on this CPU cost 2.64x one row", "an H200 at batch 1",
                 "the H200 datasheet gives 4.8 TB/s", "vLLM's pull request 22752 measured 12.6% on a GPU",
                 "Leviathan et al. report 2-3x on TPUs and GPUs", "a GPU step of 3 ms (gpu_h200.json)",
                 "```\nGPU 200 rows\n```", "a GPU with 80 GB"):
        assert not offending(cell(fine)), fine


def test_a_citation_covers_only_its_own_list_item():
    text = "- H200: 4.8 TB/s (datasheet).\n- a GPU verifies 200 rows for one forward."
    assert offending(cell(text)) == ["cell 0: - a GPU verifies 200 rows for one forward."]


if __name__ == "__main__":
    for nb_path in NOTEBOOKS:
        for line in offending(json.loads(nb_path.read_text())):
            print(f"{nb_path.name} {line}\n")
