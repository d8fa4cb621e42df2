"""The machine profile (docs/machine_profile.json, `python -m specdec_lab bench --machine`) and the
chapters that quote it.

1. The stored profile: its keys, and its figures consistent with one another (the ridge point read
   off its own ratios, the critical rows and the ridge intensity computed from its own rates).
2. The pure parts of specdec_lab/bench/machine.py: ridge_rows, format_profile, load_profile.
3. Every chapter's machine figures against the profile. A chapter may quote a figure of this machine
   only as the profile holds it; one it measures live it labels as today's. The rule, applied to the
   markdown cells of every notebook in notebooks/:

   - the markdown is split into paragraphs (blank lines), and paragraphs into sentences;
   - skipped whole: a blockquote whose first line starts with `> **Prediction.**` (the prediction
     form), a paragraph that names a GPU or another machine (H100, H200, A100, GPU, CUDA,
     llama.cpp, "another machine", "other machine": their figures are not this machine's), and a
     paragraph that labels its figures as today's or as a run's own (the words "today", "this run");
   - in every other sentence:
     * a number before `GB/s` is within 10% of one of the profile's bandwidths (bandwidth_read,
       bandwidth_copy, or their _all_cores variants);
     * a number before `GFLOP/s` is within 10% of matmul_flops or matmul_flops_all_cores;
     * an *attained* rate (the sentence says "attain..." or "runs at"/"ran at") is instead a rate
       the profile's forward reached: within 10% of T * flops_per_token(SmolLM2-135M, context) over
       the profile's median seconds at T rows, for some measured T (GFLOP/s), or of one token's
       float32 bytes (weights and cache) over those seconds (GB/s);
     * a ridge point written "ridge ... N rows" (no other number between) or "`ridge_rows` = N"
       equals forward.ridge_rows exactly;
     * a critical T written "critical ... N rows" or "critical ... N tokens" (no other number
       between) is within 10% of critical_rows_float32;
     * a draft's cost written "c = 0.xx" or "c of 0.xx" is within 25% of one of the profile's three
       c values (c depends on K and the prompts, so a chapter's own K may move it).

   A paragraph that names the second profile's machine ("AVX-512", "second profile") may quote
   either profile: each of its figures must be one of the two's (docs/machine_profile_avx512.json,
   the same command on an AVX-512 CPU of the same kind).

   A failure names the chapter, the cell and the sentence.
"""
import json
import re
from pathlib import Path

import pytest

from specdec_lab.analysis import roofline as rf
from specdec_lab.bench import machine
from specdec_lab.bench.machine import format_profile, forward_cost, load_profile, ridge_rows

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
PROFILE = load_profile()
SECOND = load_profile(machine.AVX512_PROFILE)
KEYS = ["date", "cpu", "threads", "cores", "bandwidth_read", "bandwidth_copy", "matmul_flops",
        "bandwidth_read_all_cores", "bandwidth_copy_all_cores", "matmul_flops_all_cores", "ridge_intensity",
        "critical_rows_float32", "forward", "c"]
FORWARD_KEYS = ["rows", "context", "rounds", "ms_median", "ratio_to_one_row", "ridge_rows", "what"]


# --------------------------------------------------------------------------- 1. the stored profile

def test_a_forward_between_two_measured_row_counts_is_priced_on_the_line_between_them():
    p = {"forward": {"rows": [1, 2, 4], "ratio_to_one_row": [1.0, 1.2, 2.0]}}
    assert forward_cost(p, 2) == 1.2 and forward_cost(p, 3) == pytest.approx(1.6)
    with pytest.raises(ValueError, match=r"rows must be an int in \[1, 4\] \(the profile's range\), got 5"):
        forward_cost(p, 5)


def test_the_stored_profile_has_its_keys():
    assert list(PROFILE) == KEYS
    assert list(PROFILE["forward"]) == FORWARD_KEYS
    assert list(PROFILE["c"]) == ["k", "temperature", *machine.DRAFTS]
    assert PROFILE["threads"] == 1 and PROFILE["cores"] >= 1
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", PROFILE["date"])


def test_the_rates_are_positive_and_the_derived_figures_follow_from_them():
    rates = [PROFILE[k] for k in KEYS[4:10]]
    assert all(isinstance(r, int) and r > 1e8 for r in rates), rates
    read, flops = PROFILE["bandwidth_read"], PROFILE["matmul_flops"]
    assert PROFILE["ridge_intensity"] == round(flops / read, 2)
    assert PROFILE["critical_rows_float32"] == round(rf.critical_batch_size(flops, read, 4), 1)


def test_the_forward_by_rows_reads_its_ridge_point_off_its_own_ratios():
    f = PROFILE["forward"]
    rows, ms, ratios = f["rows"], f["ms_median"], f["ratio_to_one_row"]
    assert rows == sorted(set(rows)) and rows[0] == 1 and rows == machine.ROWS
    assert len(ms) == len(ratios) == len(rows) and all(m > 0 for m in ms)
    assert ratios[0] == 1.0
    assert all(abs(r - m / ms[0]) < 2e-3 for r, m in zip(ratios, ms)), "each ratio is its median over one row's"
    assert f["ridge_rows"] == ridge_rows(rows, ratios) == max(T for T, r in zip(rows, ratios) if r <= 1.25)
    assert f["context"] == machine.CONTEXT and f["rounds"] >= 1


def test_each_shipped_draft_has_its_c():
    c = PROFILE["c"]
    assert c["k"] >= 1 and c["temperature"] == 0.0
    assert all(0 < c[d] < 1 for d in machine.DRAFTS), c


# --------------------------------------------------------------------------- 2. machine.py's pure parts

def test_ridge_rows_is_the_largest_row_count_within_the_limit():
    assert ridge_rows([1, 2, 3, 4], [1.0, 1.1, 1.3, 1.2]) == 4, "the largest T at most 1.25x, not the first above"
    assert ridge_rows([1, 2, 3], [1.0, 1.26, 1.5]) == 1
    assert ridge_rows([1, 2, 3], [1.0, 1.4, 1.5], limit=1.5) == 3
    with pytest.raises(ValueError):
        ridge_rows([1, 2], [1.3, 1.4])   # no row count within the limit


def test_format_profile_prints_the_figures_it_holds():
    text = format_profile(PROFILE)
    assert f"read bandwidth {PROFILE['bandwidth_read'] / 1e9:.1f} GB/s" in text
    assert f"float32 matmul {PROFILE['matmul_flops'] / 1e9:.1f} GFLOP/s" in text
    assert f"critical rows in float32: {PROFILE['critical_rows_float32']:.1f}" in text
    assert f"ridge_rows (last T at <= {machine.RIDGE_RATIO}x one row): {PROFILE['forward']['ridge_rows']}" in text
    assert all(f"{d} {PROFILE['c'][d]:.3f}" in text for d in machine.DRAFTS)
    assert len(text.splitlines()) == 7


def test_load_profile_names_the_command_when_the_file_is_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"python -m specdec_lab bench --machine writes it"):
        load_profile(tmp_path / "machine_profile.json")


def test_the_second_profile_is_the_same_measurement_on_an_avx512_cpu():
    assert list(SECOND) == KEYS and list(SECOND["forward"]) == FORWARD_KEYS
    assert "AVX-512" in SECOND["cpu"] and "AVX2" in PROFILE["cpu"], "each profile names its CPU's vector extension"
    f = SECOND["forward"]
    assert f["ridge_rows"] == ridge_rows(f["rows"], f["ratio_to_one_row"])
    assert f["ridge_rows"] > PROFILE["forward"]["ridge_rows"], "the wider registers hold more rows in one pass"


def test_write_and_load_round_trip(tmp_path):
    path = machine.write_profile(PROFILE, tmp_path / "profile.json")
    assert load_profile(path) == PROFILE == json.loads(machine.PROFILE.read_text())


# --------------------------------------------------------------------------- 3. the chapters against it

OTHER_MACHINE = re.compile(r"\b(?:H100|H200|A100|GPUs?|CUDA|llama\.cpp|another machine|other machines?)\b|"
                           r"\bllama\.cpp")
TODAY = re.compile(r"\btoday\b|\bthis run\b", re.IGNORECASE)
SECOND_MACHINE = re.compile(r"AVX-512|second profile", re.IGNORECASE)
ATTAINED = re.compile(r"\battain|\bruns at\b|\bran at\b", re.IGNORECASE)
NUMBER = r"(\d[\d,]*(?:\.\d+)?)"
GBS = re.compile(NUMBER + r"\s*\$?\s*GB/s")
GFLOPS = re.compile(NUMBER + r"\s*\$?\s*GFLOP/s")
RIDGE = re.compile(r"ridge[^\d.]{0,60}?" + NUMBER + r"\$?\s*rows|ridge_rows`?\s*(?:=|is|of)\s*\$?" + NUMBER)
CRITICAL = re.compile(r"critical[^\d.]{0,60}?" + NUMBER + r"\$?\s*(?:rows|tokens)")
DRAFT_COST = re.compile(r"(?<![\w\\])c\s*(?:=|of)\s*\$?\s*(0\.\d+)")
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z$`(*\[])")


def _value(text):
    return float(text.replace(",", ""))


def _near(x, targets, rel):
    return any(abs(x - t) <= rel * t for t in targets)


def attained_rates(profile):
    """(GFLOP/s, GB/s) the profile's forward attained at each measured row count."""
    f, cfg = profile["forward"], rf.SMOLLM2_135M
    flops, bytes_ = rf.flops_per_token(cfg, f["context"]), rf.bytes_per_token(cfg, f["context"], 4)
    seconds = [ms / 1e3 for ms in f["ms_median"]]
    return ([T * flops / s / 1e9 for T, s in zip(f["rows"], seconds)],
            [bytes_ / s / 1e9 for s in seconds])


def strip_predictions(markdown):
    """The markdown without its prediction blockquotes (a run of `>` lines whose first line starts
    with `> **Prediction.**`)."""
    out, quote = [], None
    for line in markdown.splitlines():
        if line.lstrip().startswith(">"):
            if quote is None:
                quote = line.lstrip().startswith("> **Prediction.**")
            if not quote:
                out.append(line)
            continue
        quote = None
        out.append(line)
    return "\n".join(out)


def checked_sentences(markdown):
    """(sentence, whether its paragraph names the second profile's machine) for the sentences whose
    figures must be a profile's (the module's skipping rules)."""
    for para in re.split(r"\n\s*\n", strip_predictions(markdown)):
        if OTHER_MACHINE.search(para) or TODAY.search(para):
            continue
        for sentence in SENTENCE_END.split(para):
            yield " ".join(sentence.split()), bool(SECOND_MACHINE.search(para))


def profile_figures(profiles):
    """The figures a sentence may quote from any of `profiles`, pooled, under short names."""
    pooled = {"bandwidths": [], "peaks": [], "flops_attained": [], "bytes_attained": [], "ridge": [],
              "critical": [], "costs": []}
    for p in profiles:
        pooled["bandwidths"] += [p[k] / 1e9 for k in ("bandwidth_read", "bandwidth_copy", "bandwidth_read_all_cores",
                                                      "bandwidth_copy_all_cores")]
        pooled["peaks"] += [p["matmul_flops"] / 1e9, p["matmul_flops_all_cores"] / 1e9]
        flops, bytes_ = attained_rates(p)
        pooled["flops_attained"] += flops
        pooled["bytes_attained"] += bytes_
        pooled["ridge"].append(p["forward"]["ridge_rows"])
        pooled["critical"].append(p["critical_rows_float32"])
        pooled["costs"] += [p["c"][d] for d in machine.DRAFTS]
    return pooled


def wrong_figures(markdown, profile=PROFILE, second=SECOND):
    """[(sentence, what is wrong)] for every machine figure of the markdown the profile does not hold
    (or, in a paragraph that names the second profile's machine, neither profile holds)."""
    found, pooled = [], {False: profile_figures((profile,)), True: profile_figures((profile, second))}
    for s, names_second in checked_sentences(markdown):
        fig = pooled[names_second]
        bandwidths, peaks, costs = fig["bandwidths"], fig["peaks"], fig["costs"]
        flops_attained, bytes_attained = fig["flops_attained"], fig["bytes_attained"]
        attained = bool(ATTAINED.search(s))
        for m in GBS.finditer(s):
            x = _value(m.group(1))
            if not _near(x, bytes_attained if attained else bandwidths, 0.10):
                found.append((s, f"{x} GB/s is not the profile's " + ("attained rate" if attained else
                              f"bandwidth ({', '.join(f'{b:.1f}' for b in bandwidths)} GB/s)")))
        for m in GFLOPS.finditer(s):
            x = _value(m.group(1))
            if not _near(x, flops_attained if attained else peaks, 0.10):
                found.append((s, f"{x} GFLOP/s is not the profile's " + ("attained rate" if attained else
                              f"matmul rate ({', '.join(f'{b:.1f}' for b in peaks)} GFLOP/s)")))
        for m in RIDGE.finditer(s):
            x = _value(m.group(1) or m.group(2))
            if x not in fig["ridge"]:
                found.append((s, f"ridge of {x:g} rows: the profile's ridge_rows is {fig['ridge'][0]}"))
        for m in CRITICAL.finditer(s):
            x = _value(m.group(1))
            if not _near(x, fig["critical"], 0.10):
                found.append((s, f"critical T of {x:g}: the profile's is {fig['critical'][0]}"))
        for m in DRAFT_COST.finditer(s):
            x = _value(m.group(1))
            if not _near(x, costs, 0.25):
                found.append((s, f"c = {x:g} is not within 25% of the profile's c ({costs})"))
    return found


def chapter_failures(path):
    nb = json.loads(path.read_text())
    return [f"{path.stem}, cell {i}: {why}: \"{sentence}\""
            for i, cell in enumerate(nb["cells"]) if cell["cell_type"] == "markdown"
            for sentence, why in wrong_figures("".join(cell["source"]))]


def test_there_are_chapters_to_check():
    assert len(NOTEBOOKS) >= 10


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_every_machine_figure_a_chapter_quotes_is_the_profiles(path):
    failures = chapter_failures(path)
    assert not failures, "machine figures that are not docs/machine_profile.json's (quote the profile, or label " \
                         "a live figure as today's):\n" + "\n".join(failures)


def test_the_checker_flags_a_wrong_figure_and_passes_a_labelled_or_a_right_one(tmp_path):
    read = PROFILE["bandwidth_read"] / 1e9
    flops = PROFILE["matmul_flops"] / 1e9
    ridge, critical, c = PROFILE["forward"]["ridge_rows"], PROFILE["critical_rows_float32"], PROFILE["c"]["token"]
    wrong = [
        "This machine reads 11.8 GB/s from memory.",
        f"Its float32 matmul runs {2.5 * flops:.0f} GFLOP/s.",
        f"The forward stays flat up to its ridge point of {ridge + 3} rows.",
        f"Read the ratios (`ridge_rows` = {ridge + 3}).",
        f"The roofline's critical $T$ is {3 * critical:.1f} rows in float32.",
        f"The draft costs little, $c = {c / 3:.3f}$ of a target forward.",
        f"Past the ridge the forward attains {2 * flops:.0f} GFLOP/s.",
    ]
    second_ridge = SECOND["forward"]["ridge_rows"]
    wrong.append(f"On the AVX-512 CPU (the second profile) the ridge lies at {second_ridge + 2} rows.")
    for text in wrong:
        assert len(wrong_figures(text)) == 1, f"the checker must flag: {text}"
    assert len(wrong_figures(f"The forward stays flat to its ridge of {SECOND['forward']['ridge_rows']} rows.")) == 1, \
        "the second profile's figure, not labelled as its, is flagged"
    right = [
        "today: 11.8 GB/s, against the profile's.",
        "In this run the decode moved 11.8 GB/s.",
        "> **Prediction.** On an H200 a forward streams 4,000 GB/s and reads 11.8 GB/s nowhere.",
        "On an H100 the ridge lies at 295 rows.",
        f"This machine reads {read:.1f} GB/s; its float32 matmul {flops:.1f} GFLOP/s.",
        f"The forward's ridge point is {ridge} rows (`ridge_rows` = {ridge}); the critical $T$, {critical} rows.",
        f"The token draft's $c = {c:.3f}$.",
        f"At 8 rows the forward attains {attained_rates(PROFILE)[0][PROFILE['forward']['rows'].index(8)]:.0f} GFLOP/s.",
        f"On the AVX-512 CPU the ridge lies at {SECOND['forward']['ridge_rows']} rows and it reads "
        f"{SECOND['bandwidth_read'] / 1e9:.1f} GB/s, against {ridge} rows and {read:.1f} GB/s here.",
    ]
    for text in right:
        assert wrong_figures(text) == [], f"the checker must pass: {text}"
    # the failure names the chapter, the cell and the sentence
    nb = {"cells": [{"cell_type": "markdown", "source": ["# A\n"]},
                    {"cell_type": "markdown", "source": ["The machine reads 11.8 GB/s. Then more."]}]}
    fake = tmp_path / "99_fake.ipynb"
    fake.write_text(json.dumps(nb))
    assert chapter_failures(fake) == [
        f"99_fake, cell 1: 11.8 GB/s is not the profile's bandwidth "
        f"({', '.join(f'{PROFILE[k] / 1e9:.1f}' for k in KEYS[4:6] + KEYS[7:9])} GB/s): "
        f"\"The machine reads 11.8 GB/s.\""]
