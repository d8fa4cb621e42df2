"""The chapters' structure: what every notebook in notebooks/ must have, and what none may do.

These read the stored notebooks; they execute nothing (nbval does that). Each claim is checked
per chapter, so a failure names the chapter:

- cells use the package's public names only, and never assign to its modules or classes;
- no chapter stores widget state over 100 KB in its metadata;
- no chapter speaks of documents that are not in the repository, and every repository path it names
  (specdec_lab/..., docs/..., scripts/..., tests/..., notebooks/...) exists;
- no chapter shows a private member (`x._name`) in its prose or outputs, and none reads as a work
  log or a roadmap ("in the time available", "not in this checkout", "once it has run on", ...);
- every plotly figure has a PNG beside it (viz.show), so the chapter reads where no JavaScript runs;
- every chapter ends with exercises whose answers are collapsed, then a recap in prose and one check cell
  of at most 15 lines that calls its module in specdec_lab/lab/checks/ and runs a broken variant;
- prose per chapter is counted and held to about 18,000 characters (about 3,000 words); a longer chapter is split;
- `make setup` installs the JupyterLab settings that keep the news prompt off the first chapter.

`python tests/test_chapters.py` prints the prose count per chapter.
"""
import ast
import json
import re
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))
PACKAGE = "specdec_lab"
CHECK_CELL_LINES = 15  # a chapter's check cell; its asserts live in specdec_lab/lab/checks/
RECAP_CHARS = 400  # a recap is a few sentences at least
WIDGET_STATE_LIMIT = 100_000  # bytes of JSON in the notebook's metadata["widgets"]
# Characters of markdown per chapter (about 3,000 words). A cap of 9,000 made the prose clipped: a chapter
# says what it needs in full sentences, and one that outgrows this is split in two rather than compressed.
PROSE_GUIDE = 18_000
# Names of what a reader of the repository cannot see, spelled in pieces so that this file does not
# itself cite them: a planning brief, the article the project grew from under a nickname, and a
# claim about the machine the chapters were written on.
FOREIGN = re.compile("|".join([r"DESIGN" + r"\.md", "seed" + " article", "no machine" + " here"]))
PLOTLY = "application/vnd.plotly.v1+json"
ROOT = Path(__file__).resolve().parents[1]
# A private member shown to the reader (a printed method body, an attribute in prose): `x._name`.
PRIVATE_SHOWN = re.compile(r"\b[A-Za-z_]\w*\._[a-z]\w*")
# A path into the repository: it must name something the repository holds.
REPO_PATH = re.compile(r"(?<![\w/.-])(?:specdec_lab|docs|scripts|tests|notebooks)/[\w./*-]*[\w*]")
# A lab log's or a roadmap's phrases: what happened while the work was done, or what is still to come.
LOG_PROSE = re.compile("|".join([r"in the time" + r" available", r"not in this" + r" checkout", r"once it has" + r" run on",
                                 r"no GPU" + r" ran this", r"at the time" + r" of writing"]), re.IGNORECASE)


def load(path):
    return json.loads(path.read_text())


def source(cell):
    return "".join(cell["source"])


def code_cells(nb):
    """(index, parsed tree) of every code cell, IPython magics turned into Python first."""
    from IPython.core.inputtransformer2 import TransformerManager
    transform = TransformerManager().transform_cell
    return [(i, ast.parse(transform(source(c)))) for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code"]


def package_names(trees):
    """Names the notebook binds by importing the package or anything in it."""
    names = set()
    for _, tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names |= {(a.asname or a.name).split(".")[0] for a in node.names if a.name.split(".")[0] == PACKAGE}
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == PACKAGE:
                names |= {a.asname or a.name for a in node.names}
    return names


def root_name(node):
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def private(name):
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_uses(trees):
    """'cell N: text' for every private name a cell reaches: an attribute with a leading
    underscore (on anything: a private name is not the lab's to teach with), or an import of
    one from the package."""
    found = []
    for i, tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and private(node.attr):
                found.append(f"cell {i}: {ast.unparse(node)}")
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == PACKAGE:
                parts = node.module.split(".") + [a.name for a in node.names]
                found += [f"cell {i}: from {node.module} import {a.name}" for a in node.names if any(map(private, parts))]
            elif isinstance(node, ast.Import):
                found += [f"cell {i}: import {a.name}" for a in node.names
                          if a.name.split(".")[0] == PACKAGE and any(map(private, a.name.split(".")))]
    return found


def package_assignments(trees):
    """'cell N: text' for every assignment to an attribute of something imported from the
    package (a module switch flipped, a class patched), by `=`, `+=`, `del` or setattr()."""
    names, found = package_names(trees), []
    for i, tree in trees:
        for node in ast.walk(tree):
            targets = []
            if isinstance(node, (ast.Assign, ast.Delete)):
                targets = node.targets
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                targets = [node.target]
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                  and node.func.id in ("setattr", "delattr") and node.args):
                if root_name(node.args[0]) in names:
                    found.append(f"cell {i}: {ast.unparse(node)}")
            for t in targets:
                for sub in ast.walk(t):
                    if isinstance(sub, ast.Attribute) and isinstance(sub.ctx, (ast.Store, ast.Del)) \
                            and root_name(sub) in names:
                        found.append(f"cell {i}: {ast.unparse(node).splitlines()[0]}")
    return found


def shown_text(nb):
    """(cell index, text) of what a reader sees: markdown, and every code cell's outputs as text
    (stream output, plain text, markdown and HTML, not images or figure JSON)."""
    out = []
    for i, c in enumerate(nb["cells"]):
        if c["cell_type"] == "markdown":
            out.append((i, source(c)))
        for o in c.get("outputs", []):
            texts = [o.get("text", "")] + [v for k, v in o.get("data", {}).items()
                                          if k in ("text/plain", "text/markdown", "text/html")]
            out += [(i, "".join(t) if isinstance(t, list) else t) for t in texts if t]
    return out


def private_shown(nb):
    """'cell N: x._name' for every private member a reader is shown, in prose or an output."""
    return [f"cell {i}: {m.group(0)}" for i, text in shown_text(nb) for m in PRIVATE_SHOWN.finditer(text)]


def dangling_paths(nb, root=ROOT):
    """'cell N: path' for every repository path in a cell (source or output) that names nothing
    the repository holds (a glob must match something)."""
    found = []
    for i, c in enumerate(nb["cells"]):
        texts = [source(c)] + [text for j, text in shown_text({"cells": [c]}) if c["cell_type"] == "code"]
        for m in (m for text in texts for m in REPO_PATH.finditer(text)):
            path = m.group(0).rstrip(".")
            if not (any(root.glob(path)) if "*" in path else (root / path).exists()):
                found.append(f"cell {i}: {path}")
    return sorted(set(found), key=found.index)


def prose_chars(nb):
    """Characters of markdown a reader sees: HTML comments (the record's tags) do not render."""
    return sum(len(re.sub(r"<!--.*?-->", "", source(c), flags=re.S)) for c in nb["cells"] if c["cell_type"] == "markdown")


def hidden(cell):
    return cell["metadata"].get("jupyter", {}).get("source_hidden") is True or "<details" in source(cell)


def heading_index(nb, pattern):
    """Index of the first markdown cell with a heading line matching pattern, else None."""
    rx = re.compile(rf"^#+ .*(?:{pattern})", re.IGNORECASE | re.MULTILINE)
    return next((i for i, c in enumerate(nb["cells"]) if c["cell_type"] == "markdown" and rx.search(source(c))),
                None)


ids = [p.stem for p in NOTEBOOKS]


def test_there_are_chapters_to_check():
    assert len(NOTEBOOKS) >= 10, f"expected the ten chapters in notebooks/, found {len(NOTEBOOKS)}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids)
def test_cells_use_only_public_names(path):
    found = private_uses(code_cells(load(path)))
    assert not found, f"{path.name} reaches private names; teach with the public API: {found}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids)
def test_cells_do_not_assign_to_the_package(path):
    found = package_assignments(code_cells(load(path)))
    assert not found, f"{path.name} changes the package from a cell (pass a parameter instead): {found}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids)
def test_widget_state_stays_small(path):
    size = len(json.dumps(load(path)["metadata"].get("widgets", {})))
    assert size <= WIDGET_STATE_LIMIT, (f"{path.name} stores {size:,} bytes of widget state; save it without "
                                        f"widget state (the limit is {WIDGET_STATE_LIMIT:,})")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids)
def test_no_reference_outside_the_repository(path):
    hits = [f"line {n}: {line.strip()[:80]}" for n, line in enumerate(path.read_text().splitlines(), 1)
            if FOREIGN.search(line)]
    assert not hits, f"{path.name} speaks of what a reader cannot find: {hits}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids)
def test_no_private_member_is_shown(path):
    found = private_shown(load(path))
    assert not found, (f"{path.name} shows private members a reader cannot look up (a printed method body, "
                       f"prose); teach with public names, or show what they hold: {found}")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids)
def test_every_repository_path_exists(path):
    found = dangling_paths(load(path))
    assert not found, f"{path.name} names paths the repository does not hold: {found}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids)
def test_no_lab_log_or_roadmap_prose(path):
    hits = [f"line {n}: {line.strip()[:80]}" for n, line in enumerate(path.read_text().splitlines(), 1)
            if LOG_PROSE.search(line)]
    assert not hits, f"{path.name} reads as a work log or a roadmap; state what the chapter shows: {hits}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids)
def test_every_plotly_figure_has_a_png_beside_it(path):
    bare = [i for i, c in enumerate(load(path)["cells"]) for o in c.get("outputs", [])
            if PLOTLY in o.get("data", {}) and "image/png" not in o["data"]]
    assert not bare, (f"{path.name}: cells {bare} store a plotly figure without a PNG, so GitHub and nbviewer "
                      f"show nothing; display it with viz.show(fig)")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids)
def test_exercises_with_collapsed_answers(path):
    nb = load(path)
    start = heading_index(nb, "exercise")
    assert start is not None, f"{path.name} has no exercises section (a markdown heading with 'Exercises')"
    answers = [i for i, c in enumerate(nb["cells"][start:], start) if hidden(c)]
    assert answers, (f"{path.name}: no collapsed answers after the exercises (cell {start}); put them in a cell "
                     f"whose metadata has \"jupyter\": {{\"source_hidden\": true}}, or in a <details> block")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids)
def test_ends_with_a_recap_and_one_short_check_cell(path):
    """The last two cells: a recap in prose, then one check cell of at most CHECK_CELL_LINES lines that
    calls the chapter's module in specdec_lab/lab/checks/ and runs a broken variant through must_fail."""
    *_, recap, check = load(path)["cells"]
    assert recap["cell_type"] == "markdown" and re.match(r"## Recap\n", source(recap)), \
        f"{path.name}: the second-last cell must be a markdown cell headed '## Recap'"
    assert len(source(recap)) > RECAP_CHARS, f"{path.name}: the recap says what paid, what did not and why, in prose"
    assert check["cell_type"] == "code", f"{path.name}: the last cell must be the check cell"
    lines = source(check).splitlines()
    assert len(lines) <= CHECK_CELL_LINES, f"{path.name}: the check cell has {len(lines)} lines; move asserts into its module"
    tree = ast.parse(source(check))
    modules = check_modules(tree)
    assert len(modules) == 1, f"{path.name}: the check cell imports one module of specdec_lab.lab.checks, not {modules}"
    calls = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    assert "must_fail" in calls, f"{path.name}: the check cell runs a broken variant through must_fail"
    assert (ROOT / "tests" / f"test_checks_{modules[0]}.py").exists(), f"{path.name}: tests/test_checks_{modules[0]}.py"
    shown = "".join("".join(o.get("text", "")) for o in check.get("outputs", []))
    assert "must" in shown and "all claims hold" in shown, \
        f"{path.name}: the saved check cell must show its broken variant failing and the claims holding"


def check_modules(tree):
    """The modules of specdec_lab.lab.checks a cell imports (their names, without the package)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "specdec_lab.lab.checks":
            found += [a.name for a in node.names if a.name not in ("must_fail", "take")]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("specdec_lab.lab.checks."):
            found.append(node.module.rsplit(".", 1)[1])
    return found


def test_every_check_module_belongs_to_one_chapter():
    used = [m for path in NOTEBOOKS for m in check_modules(ast.parse(source(load(path)["cells"][-1])))]
    modules = sorted(p.stem for p in (ROOT / "specdec_lab" / "lab" / "checks").glob("*.py") if p.stem != "__init__")
    assert sorted(used) == modules, f"each module in specdec_lab/lab/checks/ is one chapter's: {used} against {modules}"


def prose_table():
    rows = [(p.stem, prose_chars(load(p))) for p in NOTEBOOKS]
    lines = [f"{'chapter':32s} {'prose chars':>11s}"]
    lines += [f"{name:32s} {n:11,d}{'  over the guide' if n > PROSE_GUIDE else ''}" for name, n in rows]
    return rows, "\n".join(lines)


def test_prose_per_chapter_within_the_guide():
    rows, table = prose_table()
    print(f"\n{table}\n(guide: about {PROSE_GUIDE:,} characters of markdown per chapter)")
    over = {name: n for name, n in rows if n > PROSE_GUIDE}
    assert not over, f"a teaching chapter holds at most about {PROSE_GUIDE:,} characters of prose; split these: {over}"


def test_the_checks_catch_what_they_guard_against():
    """The detectors above, on cells written to break each rule (and on ones that keep it)."""
    def trees(*cells):
        return [(i, ast.parse(c)) for i, c in enumerate(cells)]
    bad = trees("import specdec_lab as sl\nfrom specdec_lab.io import pair as pair_module",
                "print(sl.SpeculativeEngine._step)", "pair_module.DRAFT_VOCAB_SUBSET = 512",
                "setattr(sl, 'x', 1)", "from specdec_lab.core import _private")
    assert private_uses(bad) == ["cell 1: sl.SpeculativeEngine._step",
                                 "cell 4: from specdec_lab.core import _private"]
    assert package_assignments(bad) == ["cell 2: pair_module.DRAFT_VOCAB_SUBSET = 512",
                                        "cell 3: setattr(sl, 'x', 1)"]
    good = trees("import specdec_lab as sl\nengine = sl.SpeculativeEngine(None, None, k=4)",
                 "engine.k = 3\nres = engine.generate('hi')\nprint(res.__class__)")
    assert private_uses(good) == [] and package_assignments(good) == []
    assert FOREIGN.search("see " + "DESIGN" + ".md section 3") and not FOREIGN.search("see docs/design.md")
    shown = {"cells": [{"cell_type": "markdown", "source": ["calls `self._alpha.update(n)`; the `_created` series"]},
                       {"cell_type": "code", "source": ["print(src)"],
                        "outputs": [{"output_type": "stream", "text": ["    x = self._draft_per_token\n"]}]}]}
    assert private_shown(shown) == ["cell 0: self._alpha", "cell 1: self._draft_per_token"], private_shown(shown)
    paths = {"cells": [{"cell_type": "markdown", "source": ["see `specdec_lab/core/verify.py`, docs/design.md and "
                                                              "notebooks/0*_*.ipynb, not specdec_lab/distill.py or "
                                                              "docs/gpu_" + "h200.json; https://x.org/docs/y.md"]},
                       {"cell_type": "code", "source": ["p = 1"],
                        "outputs": [{"output_type": "stream", "text": ["scripts/nothing.sh\n"]}]}]}
    assert dangling_paths(paths) == ["cell 0: specdec_lab/distill.py", "cell 0: docs/gpu_" + "h200.json",
                                     "cell 1: scripts/nothing.sh"], dangling_paths(paths)
    for bad in ("shortened to finish in the time" + " available", "docs/x.json is not in this" + " checkout yet",
                "stored once it has" + " run on an H200", "No GPU" + " ran this chapter"):
        assert LOG_PROSE.search(bad), bad
    for good in ("the time a step takes", "once it has accepted K drafts", "the GPU ran the same code"):
        assert not LOG_PROSE.search(good), good


def test_make_setup_installs_the_lab_settings_that_silence_the_news_prompt(tmp_path):
    """`make setup` copies scripts/jupyterlab_overrides.json where JupyterLab reads this environment's
    overrides; JupyterLab then serves fetchNews = "false" as the notification setting's default,
    so `make lab` opens without asking about Jupyter news."""
    from jupyterlab.commands import get_app_dir
    from jupyterlab_server.settings_utils import get_settings
    app = Path(get_app_dir())
    installed = app / "settings" / "overrides.json"
    shipped = Path(__file__).resolve().parents[1] / "scripts" / "jupyterlab_overrides.json"
    assert installed.is_file(), f"{installed} is missing: run `make setup`"
    assert json.loads(installed.read_text()) == json.loads(shipped.read_text()), f"{installed} is stale: run `make setup`"
    name = "@jupyterlab/apputils-extension:notification"
    setting, _ = get_settings(str(app / "settings"), str(app / "schemas"), str(tmp_path), schema_name=name)
    assert setting["schema"]["properties"]["fetchNews"]["default"] == "false", "JupyterLab would still ask"


if __name__ == "__main__":
    print(prose_table()[1])
