"""The record: the figures of this machine that the chapters quote as the ones to remember, measured in
one sitting on one commit, each with its noise.

    python -m specdec_lab record            # or `make record`; about 25 minutes on 2 cores, resumable
    python -m specdec_lab record --render   # rewrite the chapters' tagged figures from docs/record.json

One sitting, one thread, in two parts, each kept in the cache under the commit as it ends (a rerun on
the same commit resumes after the last finished part):
1. the machine profile (machine.py, also written to docs/machine_profile.json): bandwidth, the float32
   matmul rate, the target's forward by rows with the quartiles of each ratio over its rounds, and each
   shipped draft's c, measured twice (its noise: the two runs);
2. the default pair on the 24 benchmark prompts, 48 new tokens each, greedy and at temperature 0.7
   (run.run_bench): plain decoding, the shipped draft at K = 1..5, the default engine's adaptive K,
   prompt lookup with the draft, the self-draft and the feature draft. Every speedup is over plain
   decoding in the same run, with its 95% interval over the prompts.

docs/record.json holds the machine, the date, the commit, `figures` ({name: value, unit, text, noise,
what}: `text` is the figure as a chapter prints it, `noise` a [low, high] interval) and `stored_runs`:
the runs too long for one sitting (the peers, serving under load, training), each with the date it was
measured. A chapter quoting one of those reads it in its code cells.

A chapter quotes a record figure with a tag in front of it, `<!--record:speedup_k2_t0-->1.31x` (the tag
does not show when the markdown renders); `render_markdown` rewrites every tagged figure from the
record, and tests/test_record.py fails on a tagged figure the record does not hold and on an untagged
figure that neither the record nor a stored run the chapter reads holds.
"""
import datetime
import json
import os
import re
import statistics
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import torch

from ..core.config import cache_dir
from . import machine

ROOT = Path(__file__).resolve().parents[2]
RECORD = ROOT / "docs" / "record.json"
BENCH = dict(num_prompts=24, max_new_tokens=48, temperatures=(0.0, 0.7), ks=(1, 2, 3, 4, 5), adaptive=True,
             refinements=True, self_draft=True, hf=False, samples=1, cost_reps=20)
TEMPERATURES = {"t0": 0.0, "t07": 0.7}
# unit -> how a chapter prints a figure of it
FORMATS = {"x": "{:.2f}x", "GB/s": "{:.1f} GB/s", "GFLOP/s": "{:.0f} GFLOP/s", "ms": "{:.1f} ms",
           "tokens/s": "{:.1f} tokens/s", "tokens per step": "{:.2f} tokens per step", "c": "{:.3f}",
           "share": "{:.3f}", "K": "{:d}", "rows": "{:d}"}
TAG = re.compile(r"<!--record:([a-z0-9_]+)-->(\d+(?:[.,]\d+)*(?:x| GB/s| GFLOP/s| ms| tokens/s| tokens per step)?)")


def figure(value, unit, what, noise=None) -> dict:
    """One figure of the record: the value, its unit, the text a chapter prints, its noise interval."""
    if unit in ("K", "rows"):
        value = int(value)
    text = FORMATS[unit].format(value)
    return {"value": value, "unit": unit, "text": text, "noise": None if noise is None else [float(n) for n in noise],
            "what": what}


def commit() -> str:
    """HEAD's hash, with `+changes` when the working tree differs from it."""
    def git(*a):
        return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    head = git("rev-parse", "--short=12", "HEAD") or "unknown"
    return head + ("+changes" if git("status", "--porcelain", "--untracked-files=no") else "")


# --------------------------------------------------------------------------- the sitting

def measure_profile(log) -> dict:
    """The machine profile with the forward's quartiles, and the shipped drafts' c measured a second time."""
    torch.set_num_threads(os.cpu_count() or 1)  # the profile's all-core figures; it then sets one thread
    profile = machine.measure_machine(log=log, quartiles=True)
    if machine.PROFILE.exists():
        say_if_unlike(profile, machine.load_profile(), log)
    from ..api import load_default_pair, load_eagle3_draft, load_feature_draft
    pair = load_default_pair()
    log("each shipped draft's c again, for its noise ...")
    again = machine.measure_draft_costs(pair, load_feature_draft(pair.target), load_eagle3_draft(pair.target),
                                        log=log)
    return {"profile": profile, "c_again": again}


def say_if_unlike(today, stored, log, limit=1.25) -> bool:
    """Say when today's read bandwidth is more than `limit` times off the stored profile's: on such a day
    every ratio of the forward moves (on 2026-12-07, at half the bandwidth, the flat limit went from 3 rows
    to 6), and the sitting describes that day, not the machine the chapters were written on."""
    ratio = today["bandwidth_read"] / stored["bandwidth_read"]
    if 1 / limit <= ratio <= limit:
        return False
    log(f"warning: this machine reads memory at {today['bandwidth_read'] / 1e9:.1f} GB/s today, "
        f"{stored['bandwidth_read'] / 1e9:.1f} GB/s in the stored profile ({stored['date']}): the forward's ratios "
        f"and every figure built on them will differ from the chapters'. Keep this sitting as a stored run, "
        f"or compile the record from the stored runs (record --from-stored).")
    return True


def measure_pair(log) -> dict:
    """The default pair's run (the module's part 2), on one thread."""
    torch.set_num_threads(1)
    from ..api import load_default_pair
    from .main import load_bench_feature_draft
    from .run import BenchConfig, run_bench
    pair = load_default_pair()
    feature = load_bench_feature_draft(SimpleNamespace(no_feature_draft=False, feature_draft=None, target=None),
                                       pair.target, log)
    return run_bench(pair.target, pair.draft, BenchConfig(**BENCH), log=log, feature_draft=feature)


PARTS = {"profile": measure_profile, "pair": measure_pair}


def measure_record(log=print, checkpoint=None) -> tuple:
    """Both parts in one sitting on one thread (the profile's all-core figures apart), resuming after the
    parts the checkpoint holds: ({part: {"seconds", "doc"}}, the commit)."""
    sha = commit()
    checkpoint = Path(checkpoint or cache_dir() / "record" / f"{sha}.json")
    done = json.loads(checkpoint.read_text()) if checkpoint.exists() else {}
    start = time.perf_counter()
    for i, (name, measure) in enumerate(PARTS.items(), 1):
        if name in done:
            log(f"part {i}/{len(PARTS)} ({name}) was measured earlier on this commit: {checkpoint}")
            continue
        log(f"part {i}/{len(PARTS)}: {name} ...")
        t0 = time.perf_counter()
        doc = measure(log)
        done[name] = {"seconds": round(time.perf_counter() - t0), "doc": doc}
        checkpoint.parent.mkdir(parents=True, exist_ok=True)
        checkpoint.write_text(json.dumps(done))
    log(f"measured in {time.perf_counter() - start:.0f} s (parts already done not counted)")
    return done, sha


# --------------------------------------------------------------------------- the figures

def profile_figures(part) -> dict:
    p, again = part["profile"], part["c_again"]
    f = p["forward"]
    quartiles = f.get("ratio_quartiles") or [None] * len(f["rows"])
    out = {"read_bandwidth": figure(p["bandwidth_read"] / 1e9, "GB/s", "read bandwidth, one thread (best of 10)"),
           "matmul_gflops": figure(p["matmul_flops"] / 1e9, "GFLOP/s", "float32 1024-square matmul, one thread"),
           "forward_ms": figure(f["ms_median"][0], "ms", "one forward of the target for one row, after 64 "
                                "cached positions (median over the rounds)",
                                (f.get("ms_quartiles") or [None])[0]),
           "ridge_rows": figure(f["ridge_rows"], "rows", "the most rows a forward takes at <= 1.25x one row")}
    for T, r, q in zip(f["rows"], f["ratio_to_one_row"], quartiles):
        if T > 1:
            out[f"rows_{T}"] = figure(r, "x", f"a forward of {T} rows over one row (v_K for K = {T - 1})", q)
    for d in machine.DRAFTS:
        runs = (p["c"][d], again[d]) if again else None
        out[f"c_{d}"] = figure(p["c"][d], "c", f"the {d} draft's c as run (K = 2, greedy): its seconds per drafted "
                               f"token over plain decoding's per token", runs and (min(runs), max(runs)))
    return out


def pair_figures(doc) -> dict:
    rf = doc["roofline"]
    s = rf["bandwidth_samples"]
    out = {} if "bandwidth_samples" not in rf else {"ar_fraction_of_bandwidth": figure(rf["fraction_of_bandwidth"], "share", "plain decoding's bytes per "
                                              "second over the bandwidth measured during the run"),
           "run_bandwidth": figure(rf["bandwidth_bytes_per_s"] / 1e9, "GB/s", "bandwidth during the run",
                                   (s["min"] / 1e9, s["max"] / 1e9))}
    for tag, temperature in TEMPERATURES.items():
        res = next(r for r in doc["results"] if r["temperature"] == temperature)
        sy, n = res["systems"], res["alpha_positions"]
        a = res["alpha"]
        half = 1.96 * (a * (1 - a) / n) ** 0.5
        out[f"alpha_{tag}"] = figure(a, "share", f"alpha at T = {temperature}: the teacher-forced mean of "
                                     f"sum_v min(p_v, q_v) along plain decoding's answers", (a - half, a + half))
        out[f"ar_tokens_per_second_{tag}"] = figure(sy["ar"]["tokens_per_second"], "tokens/s",
                                                    f"plain decoding at T = {temperature}, one thread")
        ks = sorted(int(n[6:]) for n in sy if re.fullmatch(r"spec_k\d+", n))
        for k in ks:
            x = sy[f"spec_k{k}"]
            out[f"speedup_k{k}_{tag}"] = figure(x["vs_ar"], "x", f"the shipped draft at K = {k}, T = {temperature}: "
                                                f"tokens/s over plain decoding's", x["vs_ar_ci95"])
            out[f"tokens_per_step_k{k}_{tag}"] = figure(x["mean_tokens_per_step"], "tokens per step",
                                                        f"tokens per target forward at K = {k}, T = {temperature}")
            out[f"accepted_share_k{k}_{tag}"] = figure(x["accepted_share"], "share", f"accepted drafts over drafted"
                                                       f" ones at K = {k}, T = {temperature}")
        best = max(ks, key=lambda k: sy[f"spec_k{k}"]["vs_ar"])
        out[f"best_k_{tag}"] = figure(best, "K", f"the fixed K with the highest speedup at T = {temperature}")
        for name, key in (("default", "spec_adaptive"), ("lookup", "spec_lookup"), ("stop", "spec_stop")):
            if key in sy:
                out[f"speedup_{name}_{tag}"] = figure(sy[key]["vs_ar"], "x", f"{sy[key]['label']}, T = "
                                                      f"{temperature}, over plain decoding", sy[key]["vs_ar_ci95"])
        for family in ("self", "feat"):
            names = [n for n in sy if n.startswith(f"spec_{family}_")]
            if names:
                top = max(names, key=lambda n: sy[n]["vs_ar"])
                out[f"speedup_{family}_{tag}"] = figure(sy[top]["vs_ar"], "x", f"the best {sy[top]['label']} "
                                                        f"system, T = {temperature}", sy[top]["vs_ar_ci95"])
    return out


def stored_runs(folder=ROOT / "docs") -> list:
    """Every stored run but the record and the profile: its file and the date it was measured, where it says."""
    out = []
    for path in sorted(Path(folder).glob("*.json")):
        if path.name in (RECORD.name, machine.PROFILE.name):
            continue
        doc = json.loads(path.read_text())
        when = next((doc[k] for k in ("measured_at", "date") if isinstance(doc, dict) and k in doc), None)
        out.append({"file": f"docs/{path.name}", "measured_at": when})
    return out


def build_record(profile_part, pair_docs, sha, seconds=None, sources=None) -> dict:
    """The record from the profile part and the pair's run(s): a figure comes from the first run that has
    it. `sources` names stored runs the record was compiled from (None: this sitting measured it all)."""
    p = profile_part["profile"]
    figures = profile_figures(profile_part)
    for doc in pair_docs:
        figures.update({k: v for k, v in pair_figures(doc).items() if k not in figures})
    return {"measured_at": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "commit": sha, "command": "python -m specdec_lab record" + (" --from-stored" if sources else ""),
            "machine": {"cpu": p["cpu"], "cores": p["cores"], "threads": 1}, "seconds": seconds,
            "bench_config": pair_docs[0]["config"], "sources": sources or "this sitting", "figures": figures,
            "stored_runs": stored_runs()}


# the stored runs a record compiled without a sitting reads: the profile, then the benchmark runs the
# chapters quote (the self-draft's systems only run in the second)
FROM_STORED = ["docs/machine_profile.json", "docs/bench_full.json", "docs/bench_self_draft.json"]


def record_from_stored(sha) -> dict:
    """The record compiled from the stored runs of FROM_STORED, each named with its date: the profile's
    figures carry no noise (it kept medians only), the benchmark's their intervals over the prompts."""
    docs = [json.loads((ROOT / f).read_text()) for f in FROM_STORED]
    profile = docs[0]
    part = {"profile": profile, "c_again": None}
    sources = [{"file": f, "measured_at": d.get("measured_at") or d.get("date")} for f, d in zip(FROM_STORED, docs)]
    return build_record(part, docs[1:], sha, sources=sources)


# --------------------------------------------------------------------------- the chapters

def load_record(path=RECORD) -> dict:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist: python -m specdec_lab record (make record) writes it")
    return json.loads(path.read_text())


def render_markdown(text, record) -> str:
    """`text` with every tagged figure rewritten from the record; an unknown name is an error."""
    figures = record["figures"]

    def sub(m):
        if m.group(1) not in figures:
            raise KeyError(f"<!--record:{m.group(1)}--> names no figure of the record "
                           f"(it holds {', '.join(sorted(figures))})")
        return f"<!--record:{m.group(1)}-->{figures[m.group(1)]['text']}"
    return TAG.sub(sub, text)


def render_notebooks(record, folder=ROOT / "notebooks") -> list:
    """Rewrite the tagged figures of every chapter's markdown cells; the chapters changed."""
    changed = []
    for path in sorted(Path(folder).glob("*.ipynb")):
        nb = json.loads(path.read_text())
        edited = False
        for cell in nb["cells"]:
            if cell["cell_type"] == "markdown":
                old = "".join(cell["source"])
                new = render_markdown(old, record)
                if new != old:
                    cell["source"] = new.splitlines(keepends=True)
                    edited = True
        if edited:
            path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
            changed.append(path.name)
    return changed


def format_record(r) -> str:
    lines = [f"record of {r['measured_at']}, commit {r['commit']}, {r['machine']['cpu']}, one thread:"]
    for name, f in r["figures"].items():
        noise = "" if f["noise"] is None else f"  [{f['noise'][0]:.3g}, {f['noise'][1]:.3g}]"
        lines.append(f"  {name:28s} {f['text']:>22s}{noise}")
    return "\n".join(lines)


def record_main(args, log):
    """`record`: measure (resuming), write docs/record.json and the profile, print the figures; --render."""
    if args.render:
        rec = load_record()
        changed = render_notebooks(rec)
        readme = ROOT / "README.md"
        text = readme.read_text()
        rendered = render_markdown(text, rec)
        if rendered != text:
            readme.write_text(rendered)
            changed.append(readme.name)
        print(f"rewrote the tagged figures of {len(changed)} file(s): {', '.join(changed) or 'none'}")
        return
    if args.from_stored:
        r = record_from_stored(commit())
        RECORD.write_text(json.dumps(r, indent=1) + "\n")
        print(format_record(r))
        print(f"-> {RECORD}, compiled from " + ", ".join(f"{s['file']} ({s['measured_at']})" for s in r["sources"]))
        say_if_uncommitted(r["commit"])
        return
    parts, sha = measure_record(log=log)
    profile = parts["profile"]["doc"]["profile"]
    r = build_record(parts["profile"]["doc"], [parts["pair"]["doc"]], sha,
                     seconds=sum(p["seconds"] for p in parts.values()))
    forward = {k: v for k, v in profile["forward"].items() if not k.endswith("_quartiles")}
    machine.write_profile({**profile, "forward": forward})
    RECORD.write_text(json.dumps(r, indent=1) + "\n")
    print(format_record(r))
    print(f"-> {RECORD} and {machine.PROFILE}")
    say_if_uncommitted(r["commit"])


def say_if_uncommitted(sha):
    if sha.endswith("+changes"):
        print(f"warning: commit {sha} has uncommitted changes, and a record must name one commit; "
              "commit them, run this again, and commit docs/record.json (tests/test_record.py checks it)")
