"""The record (docs/record.json, `python -m specdec_lab record`, specdec_lab/bench/record.py) and the
figures the chapters quote.

1. The stored record: its keys, each figure's text as its unit prints it, each value inside its noise,
   the machine figures docs/machine_profile.json holds, every other stored run listed with its date;
   a record compiled from stored runs (`record --from-stored`) names them and is what they give.
2. render_markdown: a tagged figure is rewritten from the record; an unknown name is an error.
3. The chapters. A figure in a chapter's markdown (a number before x, tokens/s, ms, GB/s, MB, GB, %
   or "tokens per step") is backed when
   - it carries a tag, `<!--record:NAME-->`, and its text is the record's figure NAME's, or
   - it is the record's figure of that unit at the precision printed, or
   - it is a figure of that unit in a stored run the chapter reads (a docs/*.json file its cells
     name; a key whose name fits the unit), or a figure its own cells or those of a chapter it
     names ("chapter 01") printed (the outputs stored in the notebooks, which nbval reruns), or
   - it is the result of arithmetic written out before it ("8,192 x 46,080 bytes = 377 MB").
   Skipped: prediction boxes (`> **Prediction.**`), paragraphs about another machine (a GPU,
   llama.cpp's or vLLM's own figures are theirs), paragraphs that label their figures as today's,
   and paragraphs that cite others' measurements (arXiv, "et al.", a pull request, a link).
   Every other figure fails, naming the chapter, the figure and its paragraph.
"""
import json
import re
from pathlib import Path

import pytest

from specdec_lab.bench import machine, record

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
RECORD = record.load_record()
KEYS = ["measured_at", "commit", "command", "machine", "seconds", "bench_config", "sources", "figures", "stored_runs"]
# the figures the core chapters quote as the ones to remember
CORE = ["rows_9", "c_token", "alpha_t0", "speedup_k2_t0", "speedup_k3_t0", "best_k_t0", "speedup_lookup_t0"]


# --------------------------------------------------------------------------- 1. the stored record

def test_the_record_has_its_keys_and_one_commit():
    assert list(RECORD) == KEYS
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2} UTC", RECORD["measured_at"])
    assert re.fullmatch(r"[0-9a-f]{12}", RECORD["commit"]), "measured on a commit, not on uncommitted changes"
    assert RECORD["machine"]["threads"] == 1
    if RECORD["sources"] == "this sitting":
        assert RECORD["seconds"] > 0 and RECORD["command"] == "python -m specdec_lab record"
    else:  # compiled from stored runs (record --from-stored): each named with the date it was measured
        assert RECORD["command"] == "python -m specdec_lab record --from-stored"
        assert [s["file"] for s in RECORD["sources"]] == record.FROM_STORED
        assert all(s["measured_at"] for s in RECORD["sources"])
        assert RECORD == {**record.record_from_stored(RECORD["commit"]), "measured_at": RECORD["measured_at"]}


@pytest.mark.parametrize("name", sorted(RECORD["figures"]))
def test_each_figure_prints_as_its_unit_says_and_lies_in_its_noise(name):
    f = RECORD["figures"][name]
    assert list(f) == ["value", "unit", "text", "noise", "what"] and f["what"]
    assert f["text"] == record.FORMATS[f["unit"]].format(f["value"])
    if f["noise"] is not None:
        low, high = f["noise"]
        assert low <= f["value"] <= high, f"{name} = {f['value']} outside its noise {f['noise']}"


def test_the_core_figures_are_there():
    assert set(CORE) <= set(RECORD["figures"])


def test_the_records_machine_figures_are_the_profiles():
    p, figures = machine.load_profile(), RECORD["figures"]
    for T, ratio in zip(p["forward"]["rows"][1:], p["forward"]["ratio_to_one_row"][1:]):
        assert figures[f"rows_{T}"]["value"] == ratio
    assert all(figures[f"c_{d}"]["value"] == p["c"][d] for d in machine.DRAFTS)
    assert figures["read_bandwidth"]["value"] == p["bandwidth_read"] / 1e9
    assert figures["ridge_rows"]["value"] == p["forward"]["ridge_rows"]
    assert RECORD["machine"]["cpu"] == p["cpu"]


def test_every_other_stored_run_is_listed_with_its_date():
    listed = {r["file"] for r in RECORD["stored_runs"]}
    on_disk = {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.json")} - {"docs/record.json",
                                                                          "docs/machine_profile.json"}
    assert listed == on_disk
    assert record.stored_runs() == RECORD["stored_runs"], "a stored run changed since the record: rerun it"


# --------------------------------------------------------------------------- 2. rendering

def test_render_rewrites_a_tagged_figure_from_the_record():
    r = {"figures": {"speedup_k2_t0": record.figure(1.3149, "x", "K = 2"),
                     "tokens_per_step_k2_t0": record.figure(1.6, "tokens per step", "tau")}}
    text = "ran <!--record:speedup_k2_t0-->9.99x with <!--record:tokens_per_step_k2_t0-->1.00 tokens per step, 2.5x"
    assert record.render_markdown(text, r) == ("ran <!--record:speedup_k2_t0-->1.31x with "
                                               "<!--record:tokens_per_step_k2_t0-->1.60 tokens per step, 2.5x")
    with pytest.raises(KeyError, match=r"<!--record:speedup_k9_t0--> names no figure of the record"):
        record.render_markdown("<!--record:speedup_k9_t0-->1.00x", r)


def test_a_missing_record_names_the_command(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"python -m specdec_lab record \(make record\) writes it"):
        record.load_record(tmp_path / "record.json")


# --------------------------------------------------------------------------- 3. the chapters

NUMBER = r"(\d[\d,]*(?:\.\d+)?)"
FIGURE = re.compile(r"(?<![\w.$\\/-])" + NUMBER + r"\s*((?:x\b|×)(?!\s*[\d($])|tokens/s\b|ms\b|GB/s|MB\b|GB\b|%|"
                    r"tokens per step)")  # "18 × 4" is a product, not a ratio
SCALES = {"x": [1], "tokens/s": [1], "ms": [1e3, 1], "GB/s": [1e-9, 1], "MB": [1e-6, 2 ** -20, 1],
          "GB": [1e-9, 2 ** -30, 1], "%": [100], "tokens per step": [1]}
# a stored figure backs a chapter's only under a key that names its kind
KEY_OF = {"x": r"vs_|over|ratio|speedup|cost|ci95|interval|gain",
          "tokens/s": r"tokens_per_second|rate|throughput",
          "ms": r"ms|seconds|latency|ttft|wall|itl|tpot|target_|draft_",
          "GB/s": r"bandwidth|bytes_per_s",
          "MB": r"bytes|rss|peak|resident", "GB": r"bytes|rss|peak|resident",
          "%": r"share|fraction|alpha|rate|agree|accept|error|equal|same",
          "tokens per step": r"tokens_per_step|tau|per_step"}
RECORD_UNIT = {"x": "x", "tokens/s": "tokens/s", "ms": "ms", "GB/s": "GB/s", "tokens per step": "tokens per step",
               "%": "share"}
# a printed figure backs a chapter's where its unit is on its line or on one of the 12 above (a table's header)
PRINTED_UNIT = {"x": r"\d(?:x|×)(?!\w)|over|ratio|speedup|/ ?plain|/ ?AR|vs", "tokens/s": r"tok(?:ens)?/s",
                "ms": r"ms\b", "GB/s": r"GB/s", "MB": r"MB\b", "GB": r"GB\b", "%": r"%|share|rate|fraction",
                "tokens per step": r"tokens\s*(?:per |a |/)\s*step|tok/step|tau|τ"}
SKIP = re.compile(r"\b(?:H100|H200|A100|GPUs?|CUDA|today|arXiv|et al\.|pull request|by others)|\]\(https?:|"
                  r"^> \*\*Prediction\.\*\*", re.M)
SHOWN = re.compile(r"=\s*\$?\s*$")  # the figure is the result of arithmetic written out before it


def _leaves(doc, key=""):
    if isinstance(doc, bool):
        return
    if isinstance(doc, (int, float)):
        yield key, float(doc)
    elif isinstance(doc, dict):
        for k, v in doc.items():
            yield from _leaves(v, str(k))
    elif isinstance(doc, list):
        for v in doc:
            yield from _leaves(v, key)


def _printed(text, unit, values) -> bool:
    decimals = len(text.split(".")[1]) if "." in text else 0
    x = float(text.replace(",", ""))
    return any(round(v * s, decimals) == x for v in values for s in SCALES[unit])


class Sources:
    """What may back one chapter's untagged figures: the stored runs it names, and its own and its cited
    chapters' outputs."""

    def __init__(self, nb):
        text = json.dumps(nb)
        names = sorted({n for n in re.findall(r"(\w+)\.json", text)
                        if (ROOT / "docs" / f"{n}.json").exists()} - {"record"})
        self.runs = [kv for n in names for kv in _leaves(json.loads((ROOT / "docs" / f"{n}.json").read_text()))]
        cited = {f"{n}_" for n in re.findall(r"[Cc]hapter (\d\d)", text)}
        chapters = [nb] + [json.loads(p.read_text()) for p in NOTEBOOKS if p.name[:3] in cited]
        self.outputs = "\n".join(_output_text(c) for n in chapters for c in n["cells"] if c["cell_type"] == "code")

    def backs(self, text, unit) -> bool:
        """A figure of the record is quoted through its tag (rendered, never copied), so only runs and outputs
        back an untagged figure."""
        if _printed(text, unit, [v for k, v in self.runs if re.search(KEY_OF[unit], k, re.I)]):
            return True
        number, unit_re = re.compile(r"(?<![\d.])" + re.escape(text) + r"(?![\d])"), re.compile(PRINTED_UNIT[unit])
        lines = self.outputs.splitlines()
        return any(number.search(line) and any(unit_re.search(l) for l in lines[max(0, i - 12):i + 1])
                   for i, line in enumerate(lines))


def _output_text(cell) -> str:
    parts = []
    for o in cell.get("outputs", []):
        parts.append("".join(o.get("text", "")))
        for kind in ("text/plain", "text/html", "text/markdown"):
            parts.append("".join(o.get("data", {}).get(kind, "")))
    return "\n".join(parts)


def unbacked(markdown, sources, rec=RECORD) -> list:
    """[(figure, paragraph)] for every figure of `markdown` nothing backs (the module's rules)."""
    found = []
    for para in re.split(r"\n\s*\n", markdown):
        for m in record.TAG.finditer(para):
            name, text = m.groups()
            if name not in rec["figures"] or rec["figures"][name]["text"] != text:
                found.append((f"<!--record:{name}-->{text}", "a tagged figure the record does not hold"))
        if SKIP.search(para):
            continue
        plain = record.TAG.sub("", para)
        for m in FIGURE.finditer(plain):
            unit = "x" if m.group(2) == "×" else m.group(2)
            if not SHOWN.search(plain[:m.start()]) and not sources.backs(m.group(1), unit):
                found.append((m.group(0), " ".join(para.split())[:300]))
    return found


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_figure_a_chapter_quotes_is_backed(path):
    nb = json.loads(path.read_text())
    sources = Sources(nb)
    bad = [(i, *u) for i, c in enumerate(nb["cells"]) if c["cell_type"] == "markdown"
           for u in unbacked("".join(c["source"]), sources)]
    assert not bad, f"{path.name}: figures nothing backs (cell, figure, paragraph):\n" + "\n".join(map(str, bad))


def test_a_figure_nothing_holds_fails_and_a_tagged_one_must_be_the_records():
    nb = json.loads((ROOT / "notebooks" / "02_speculative_sampling.ipynb").read_text())
    sources = Sources(nb)
    k2 = RECORD["figures"]["speedup_k2_t0"]["text"]
    assert unbacked(f"The shipped draft ran <!--record:speedup_k2_t0-->{k2} at K = 2.", sources) == []
    assert unbacked("The shipped draft ran 9.87x at K = 2.", sources) == [("9.87x", "The shipped draft ran 9.87x "
                                                                          "at K = 2.")]
    assert unbacked("The shipped draft ran <!--record:speedup_k2_t0-->9.87x.", sources)[0][1] == \
        "a tagged figure the record does not hold"
    assert unbacked("On the H100 it ran 9.87x.", sources) == [], "another machine's figure is its own"
    fake = {"figures": {"speedup_k2_t0": {**RECORD["figures"]["speedup_k2_t0"], "value": 9.87, "text": "9.87x"}}}
    assert unbacked("The shipped draft ran 9.87x at K = 2.", Sources(nb), rec=fake) != [], \
        "a record figure copied by hand, without its tag, is not backed"
    assert unbacked("It ran <!--record:speedup_k2_t0-->9.87x at K = 2.", Sources(nb), rec=fake) == []


def test_the_readme_quotes_the_record_through_its_tags():
    text = (ROOT / "README.md").read_text()
    assert record.render_markdown(text, RECORD) == text, "the README's tagged figures are not the record's"
    tagged = {m.group(1) for m in record.TAG.finditer(text)}
    assert {"speedup_k2_t0", "speedup_lookup_t0", "speedup_self_t0"} <= tagged
    assert unbacked(text, Sources({"cells": [{"cell_type": "markdown", "source": [text]}]})) == []


def test_the_chapters_tag_the_core_figures():
    tagged = {m.group(1) for p in NOTEBOOKS for c in json.loads(p.read_text())["cells"]
              if c["cell_type"] == "markdown" for m in record.TAG.finditer("".join(c["source"]))}
    assert set(CORE) <= tagged, f"core figures no chapter quotes from the record: {sorted(set(CORE) - tagged)}"


def test_a_sitting_on_a_day_unlike_the_profile_says_so():
    stored, said = machine.load_profile(), []
    assert not record.say_if_unlike({**stored, "bandwidth_read": stored["bandwidth_read"] * 1.1}, stored, said.append)
    assert said == []
    assert record.say_if_unlike({**stored, "bandwidth_read": stored["bandwidth_read"] / 2}, stored, said.append)
    assert len(said) == 1 and "GB/s today" in said[0] and "record --from-stored" in said[0]


def test_the_kept_sitting_holds_every_figure_the_record_names():
    sitting = json.loads((ROOT / "docs" / "record_sitting_2026-12-07.json").read_text())
    assert sitting["sources"] == "this sitting" and re.fullmatch(r"[0-9a-f]{12}", sitting["commit"])
    assert set(CORE) <= set(sitting["figures"])
    for name, f in sitting["figures"].items():
        assert f["text"] == record.FORMATS[f["unit"]].format(f["value"]), name
