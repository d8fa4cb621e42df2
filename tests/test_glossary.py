"""The glossary (docs/glossary.md) defines every symbol and term once, and every chapter links to it.

- each chapter's first markdown cell links to ../docs/glossary.md, a path that resolves from notebooks/;
- each term of REQUIRED has an entry: a `### Name` or `### Name, $symbol$` heading;
- no name and no symbol has two entries, and the symbol table at the top lists each symbol once,
  naming the entry that defines it;
- every function or counter an entry names "in `specdec_lab/....py`" is in that file.
"""
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GLOSSARY = ROOT / "docs" / "glossary.md"
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
LINK = "(../docs/glossary.md)"

# term -> how its entry may spell it: a name (case-insensitive) or a symbol (exact, without the $).
REQUIRED = {
    "alpha": {"symbol": r"\alpha"},
    "accepted share": {"name": "accepted share"},
    "tau": {"symbol": r"\tau"},
    "c": {"symbol": "c"},
    "v_K": {"symbol": "v_K"},
    "speedup": {"name": "speedup"},
    "K": {"symbol": "K"},
    "p": {"symbol": "p"},
    "q": {"symbol": "q"},
    "correction token": {"name": "correction token"},
    "bonus token": {"name": "bonus token"},
    "step": {"name": "step"},
}

HEADING = re.compile(r"^### (?P<name>.+?)(?:, \$(?P<symbol>[^$]+)\$)?\s*$", re.MULTILINE)
TABLE_ROW = re.compile(r"^\| \$(?P<symbol>[^$]+)\$ \| (?P<name>[^|]+?) \|\s*$", re.MULTILINE)
REFERENCE = re.compile(r"`(?P<name>[A-Za-z_][\w.]*)(?:\([^`]*\))?` in\s+`(?P<path>specdec_lab/[\w/]+\.py)`")


def text():
    return GLOSSARY.read_text(encoding="utf-8")


def entries(markdown):
    """[(name, symbol or None)] of every entry heading, in order."""
    return [(m["name"].strip(), m["symbol"]) for m in HEADING.finditer(markdown)]


def first_markdown(path):
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return next("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")


def test_the_glossary_exists_and_there_are_chapters():
    assert GLOSSARY.is_file(), "docs/glossary.md is missing"
    assert len(NOTEBOOKS) >= 15, f"expected the 15 chapters in notebooks/, found {len(NOTEBOOKS)}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_every_chapter_links_to_the_glossary_in_its_first_cell(path):
    first = first_markdown(path)
    assert LINK in first, f"{path.name}: the first markdown cell does not link to the glossary {LINK}"
    target = (path.parent / LINK.strip("()")).resolve()
    assert target == GLOSSARY.resolve() and target.is_file(), f"{path.name}: {LINK} does not resolve"


@pytest.mark.parametrize("term", REQUIRED)
def test_the_glossary_defines_the_term(term):
    spelling = REQUIRED[term]
    found = entries(text())
    if "symbol" in spelling:
        hits = [e for e in found if e[1] == spelling["symbol"]]
    else:
        hits = [e for e in found if e[0].lower() == spelling["name"]]
    assert len(hits) == 1, f"{term!r}: expected exactly one entry heading for it, found {hits}"


def test_no_name_and_no_symbol_is_defined_twice():
    found = entries(text())
    assert len(found) >= len(REQUIRED)
    names = [name.lower() for name, _ in found]
    symbols = [symbol for _, symbol in found if symbol]
    twice = sorted({n for n in names if names.count(n) > 1} | {s for s in symbols if symbols.count(s) > 1})
    assert not twice, f"defined more than once: {twice}"


def test_the_symbol_table_points_each_symbol_at_its_one_entry():
    markdown = text()
    by_symbol = {symbol: name for name, symbol in entries(markdown) if symbol}
    rows = [(m["symbol"], m["name"].strip()) for m in TABLE_ROW.finditer(markdown)]
    listed = [symbol for symbol, _ in rows]
    assert sorted(listed) == sorted(by_symbol), (f"the table lists {sorted(listed)}, "
                                                f"the entries define {sorted(by_symbol)}")
    wrong = [(symbol, name) for symbol, name in rows if by_symbol[symbol] != name]
    assert not wrong, f"table rows that name another entry than the one defining the symbol: {wrong}"


def test_every_named_function_is_in_its_file():
    refs = [(m["name"], m["path"]) for m in REFERENCE.finditer(text())]
    assert refs, "the glossary names no function by its module"
    missing = []
    for name, path in refs:
        file = ROOT / path
        if not file.is_file() or not re.search(rf"\b{re.escape(name.split('.')[-1])}\b", file.read_text()):
            missing.append(f"{name} in {path}")
    assert not missing, f"the glossary names what its module does not hold: {missing}"


def test_the_checks_catch_what_they_guard_against():
    twice = "### Acceptance rate, $\\alpha$\n\ntext\n\n### Alpha again, $\\alpha$\n"
    symbols = [s for _, s in entries(twice)]
    assert symbols.count("\\alpha") == 2, "a symbol defined twice must be seen twice"
    assert entries("### Step\n") == [("Step", None)]
    assert entries("### Draft length, $K$\n") == [("Draft length", "K")]
    assert not REFERENCE.search("`nothing` here"), "a name without its module is not a reference"
