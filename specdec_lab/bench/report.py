"""The benchmark's tables: what `python -m specdec_lab bench` prints before its JSON line, and
the prediction taken apart against the measurement (prediction_rows), as chapter 11 reads it."""
import json
from pathlib import Path

from ..analysis.roofline import expected_tokens_per_step


def _f(x, spec):
    """format(x, spec), or a dash as wide as the spec when there is no value."""
    if x is None:
        width = spec.split(".")[0]
        return "-".rjust(int(width)) if width.isdigit() else "-"
    return format(x, spec)


def _k_set(k) -> str:
    """The K a system was set to (an int, "adaptive", "<=6"), not the mean it drafted: that is "mean K"."""
    return "-" if k is None else str(k)


def format_table(doc) -> str:
    m, c, rf = doc["machine"], doc["costs"], doc["roofline"]
    mt, md, mf = doc["models"]["target"], doc["models"]["draft"], doc["models"].get("feature_draft")
    feature = f", feature draft {mf['params'] / 1e6:.1f}M" if mf else ""
    if doc["models"].get("self_draft"):
        feature += f", self-draft {doc['models']['self_draft']} (pred+v from its own alpha and c)"
    rows = [f"{m['device_name']}, {m['threads']} threads, {m['dtype']}; target {mt['params'] / 1e6:.0f}M "
            f"params, draft {md['params'] / 1e6:.1f}M{feature}; {_prompt_count(doc)} prompts, "
            f"up to {doc['config']['max_new_tokens']} new tokens each",
            f"step costs at {c['context']} cached tokens: target {c['target_forward_seconds'] * 1e3:.2f} ms, "
            f"draft {c['draft_forward_seconds'] * 1e3:.2f} ms, c = {c['c']:.3f}; verify K+1 over 1 token: "
            + " ".join(f"K{k}:{v:.2f}" for k, v in c["verify_cost"].items())]
    head = (f"{'system':30s} {'tok/s':>7s} {'vs AR':>6s} {'95% CI':>9s} {'vs HF':>6s} {'vs asst':>7s} "
            f"{'K':>5s} {'mean K':>6s} {'alpha':>6s} {'tok/step':>8s} {'c':>6s} {'pred':>5s} {'pred+v':>6s} {'meas':>5s} {'loop':>5s}")
    for r in doc["results"]:
        n = r.get("samples_per_prompt", 1)
        drawn = f"; {n} samples per prompt" if n > 1 else ""
        rows += ["", f"temperature {r['temperature']:g}: alpha = {r['alpha']:.3f} (teacher-forced, "
                     f"{r['alpha_positions']} positions){drawn}", head]
        for s in r["systems"].values():
            ci = s.get("vs_ar_ci95")
            ci = f"{ci[0]:.2f}-{ci[1]:.2f}" if ci else "-"
            rows.append(f"{s['label']:30s} {s['tokens_per_second']:7.1f} {_f(s['vs_ar'], '6.2f')} {ci:>9s} "
                        f"{_f(s['vs_hf_generate'], '6.2f')} {_f(s['vs_hf_assisted'], '7.2f')} "
                        f"{_k_set(s.get('k')):>5s} {_f(s.get('mean_k'), '6.2f')} "
                        f"{_f(s.get('alpha'), '6.3f')} {_f(s.get('mean_tokens_per_step'), '8.2f')} "
                        f"{_f(s.get('c'), '6.3f')} {_f(s.get('predicted_speedup'), '5.2f')} "
                        f"{_f(s.get('predicted_speedup_with_verify_cost', s.get('predicted_speedup_own')), '6.2f')} "
                        f"{_f(s.get('measured_speedup'), '5.2f')} "
                        f"{_f(s.get('decode_speedup'), '5.2f')}")
        kinds = list(next(iter(r["systems"].values()))["by_kind"])
        rows += ["", "speedup over AR by kind of prompt" + " " * 2 + "".join(f"{k:>9s}" for k in kinds)]
        for name, s in r["systems"].items():
            if name != "ar":
                rows.append(f"  {s['label']:33s}" + "".join(_f(s["by_kind"][k]["vs_ar"], "9.2f") for k in kinds))
    bw = rf["bandwidth_samples"]
    spread = f"{bw['min'] / 1e9:.1f}-{bw['max'] / 1e9:.1f}" if bw["n"] else "-"
    rows += ["", f"roofline: memory read bandwidth {rf['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s (median of "
                 f"{bw['n']} samples between prompts, {spread}; {rf['bandwidth_at_start'] / 1e9:.1f} at the start "
                 f"by {rf['bandwidth_source']});\n  AR decode reads {rf['bytes_per_token'] / 1e6:.0f} MB/token "
                 f"at {rf['ar_decode_tokens_per_second']:.1f} tokens/s = {rf['achieved_bytes_per_s'] / 1e9:.1f} GB/s, "
                 f"{100 * rf['fraction_of_bandwidth']:.0f}% of it "
                 f"(ceiling {rf['ceiling_tokens_per_second']:.0f} tokens/s)"]
    not_judged = doc["targets"].get("not_judged")
    rows.append("targets (docs/design.md; the best speculative system per temperature)"
                + (f": NOT JUDGED, {not_judged}" if not_judged else ":"))
    for n, v in doc["targets"].items():
        if isinstance(v, dict):
            rel = "<=" if "prediction_error" in n else ">="
            ci = f"  (95% over prompts: {v['ci95'][0]:.2f}-{v['ci95'][1]:.2f})" if v.get("ci95") else ""
            verdict = "not judged" if v["met"] is None else "met" if v["met"] else "NOT met"
            rows.append(f"  {n:45s} {_f(v['value'], '6.2f')}  target {rel} {v['target']:<5}{verdict}{ci}")
        elif n != "not_judged":
            rows.append(f"  {n:45s} {v}")
    rows.append("pred: Theorem 3.8 of arXiv 2211.17192 from alpha and c; pred+v: with the measured cost of "
                "verifying K+1 tokens; K: the draft length set, mean K: the mean drafted per step; alpha: E[min(1, p/q)] per "
                "drafted token, estimated from the steps (not the accepted share, accepted / drafted, which "
                "`generate` prints); meas: measured speedup over this engine's autoregressive decode, prefill "
                "included; loop: the same, decode loops only; 95% CI: a paired bootstrap of vs AR over the prompts")
    return "\n".join(rows)


def format_synthetic(doc) -> str:
    c, rf, m = doc["costs"], doc["roofline"], doc["models"]
    rows = [f"synthetic {doc['synthetic']} on {doc['machine']['device_name']} ({doc['machine']['dtype']}): target "
            f"{m['target']['params'] / 1e9:.2f}B params, draft {m['draft']['params'] / 1e9:.2f}B",
            f"step costs at {c['context']} cached tokens: target {c['target_forward_seconds'] * 1e3:.2f} ms, "
            f"draft {c['draft_forward_seconds'] * 1e3:.2f} ms, c = {c['c']:.3f}",
            "verify K+1 tokens over 1: " + " ".join(f"K{k}:{v:.2f}" for k, v in c["verify_cost"].items()),
            f"AR decode {rf['ar_decode_tokens_per_second']:.1f} tokens/s x "
            f"{rf['bytes_per_token'] / 1e9:.2f} GB/token = "
            f"{rf['achieved_bytes_per_s'] / 1e9:.0f} GB/s, {100 * rf['fraction_of_bandwidth']:.0f}% of the measured "
            f"{rf['bandwidth_bytes_per_s'] / 1e9:.0f} GB/s",
            f"host syncs per speculative step (K={doc['syncs']['k']}): engine counts "
            f"{doc['syncs']['engine_counted_syncs_per_step']:.2f}, CUDA reports "
            f"{_f(doc['syncs']['cuda_reported_syncs_per_step'], '.2f')}",
            "predicted speedup (Theorem 3.8 / with measured verify cost):"]
    for a, per_k in doc["predicted"].items():
        rows.append(f"  alpha {a}: " + " ".join(f"K{k}:{v['speedup']:.2f}/{v['speedup_with_verify_cost']:.2f}"
                                               for k, v in per_k.items()))
    return "\n".join(rows)


def prediction_rows(doc, temperature_index: int = 0) -> list[dict]:
    """Theorem 3.8's prediction beside the measurement, term by term, for each fixed K of a run.

    All costs are per speculative step in units of one autoregressive decode token of the same
    run (its decode loop's seconds per token), so that the two sides read alike:

      predicted: tokens (1 - alpha^(K+1)) / (1 - alpha) from the teacher-forced alpha; draft K c
        with the c timed alone; target v_K, the timed K+1-token forward over a one-token one.
      measured: tokens per step as the loop committed them; draft mean_K x c as the loop ran it;
        target the step's target phase (the K+1 forward, verification, the sync and the commit);
        step the whole decode loop per step (tokens per step / loop speedup), so `other` is the
        loop's time outside both phases.
      speedups: pred (Theorem 3.8, v_K = 1), pred_v (v_K in place of 1), loop (decode loops
        only) and call (whole calls, prefill included, with its 95% interval over the prompts).
    """
    results = doc["results"]
    if isinstance(temperature_index, bool) or not isinstance(temperature_index, int) \
            or not 0 <= temperature_index < len(results):
        raise ValueError(f"temperature_index must be an int in [0, {len(results)}), got {temperature_index!r}")
    r, costs = results[temperature_index], doc["costs"]
    sy, alpha, c = r["systems"], r["alpha"], costs["c"]
    ar_token_s = 1.0 / sy["ar"]["decode_tokens_per_second"]
    rows = []
    for k in doc["config"]["ks"]:
        s = sy.get(f"spec_k{k}")
        if s is None:
            continue
        v = costs["verify_cost"][str(k)] if str(k) in costs["verify_cost"] else costs["verify_cost"][k]
        step = s["mean_tokens_per_step"] / s["decode_speedup"]
        draft, target = s["mean_k"] * s["c"], s["target_seconds_per_step"] / ar_token_s
        rows.append({"k": k, "alpha": alpha, "c": c, "v": v,
                     "tokens_predicted": expected_tokens_per_step(alpha, k), "tokens": s["mean_tokens_per_step"],
                     "draft_predicted": k * c, "draft": draft, "c_loop": s["c"],
                     "target_predicted": v, "target": target, "step_predicted": k * c + v, "step": step,
                     "other": step - draft - target,
                     "pred": s["predicted_speedup"], "pred_v": s["predicted_speedup_with_verify_cost"],
                     "loop": s["decode_speedup"], "call": s["vs_ar"], "call_ci95": s.get("vs_ar_ci95")})
    return rows


def format_prediction(doc, temperature_index: int = 0) -> str:
    """prediction_rows as a table: tokens per step, step cost by phase, and the four speedups."""
    r = doc["results"][temperature_index]
    rows = [f"temperature {r['temperature']:g}: alpha = {r['alpha']:.3f} (teacher-forced), c = "
            f"{doc['costs']['c']:.3f} (timed alone); costs per step in AR decode tokens; predicted / measured",
            f"{'K':>2s} {'tokens/step':>11s} {'draft':>11s} {'target':>11s} {'other':>6s} {'step':>11s}   "
            f"{'pred':>5s} {'pred_v':>6s} {'loop':>5s} {'call':>5s} {'95% CI':>9s}"]
    for x in prediction_rows(doc, temperature_index):
        ci = x["call_ci95"]
        ci = f"{ci[0]:.2f}-{ci[1]:.2f}" if ci else "-"
        rows.append(f"{x['k']:2d} {x['tokens_predicted']:5.2f}/{x['tokens']:<5.2f} "
                    f"{x['draft_predicted']:5.3f}/{x['draft']:<5.3f} {x['target_predicted']:5.2f}/{x['target']:<5.2f} "
                    f"{x['other']:6.3f} {x['step_predicted']:5.2f}/{x['step']:<5.2f}   "
                    f"{x['pred']:5.2f} {x['pred_v']:6.2f} {x['loop']:5.2f} {x['call']:5.2f} {ci:>9s}")
    return "\n".join(rows)


def prediction_gap(row: dict) -> list[tuple[str, float]]:
    """From Theorem 3.8 to the measured whole calls, one assumption replaced by its measurement at
    a time: (what changed, the speedup after it) for one of prediction_rows' rows. The sixth value
    is the measured decode-loop speedup and the last the measured whole-call one."""
    t, tm, v, kc = row["tokens_predicted"], row["tokens"], row["v"], row["draft_predicted"]
    return [("Theorem 3.8 (v_K = 1)", t / (kc + 1.0)),
            ("verification costs v_K", t / (kc + v)),
            ("tokens per step as committed", tm / (kc + v)),
            ("the draft as it ran in the loop", tm / (row["draft"] + v)),
            ("the target phase as it ran", tm / (row["draft"] + row["target"])),
            ("the rest of the loop = loop", tm / row["step"]),
            ("prefill included = whole calls", row["call"])]


def format_prediction_gap(doc, temperature_index: int = 0) -> str:
    """prediction_gap for every fixed K of a run, one column per K."""
    rows = prediction_rows(doc, temperature_index)
    chains = [prediction_gap(x) for x in rows]
    out = [f"{'speedup after replacing':34s}" + "".join(f"{'K=' + str(x['k']):>7s}" for x in rows)]
    for i, (name, _) in enumerate(chains[0] if chains else []):
        out.append(f"{name:34s}" + "".join(f"{chain[i][1]:7.2f}" for chain in chains))
    return "\n".join(out)


def _prompt_count(doc) -> str:
    """'24 bench' for a run's prompts; documents stored before the prompt sets say only the count."""
    p = doc.get("prompts")
    return f"{p['count']} {p['set']}" if p else f"{doc['config']['num_prompts']}"


def emit(doc, table, out=print, path="", json_only=False):
    """A bench module's ending: store the document at `path` (if any), print the table (unless
    json_only), then the document as the last line."""
    if path:
        Path(path).write_text(json.dumps(doc, indent=1) + "\n")
    if not json_only:
        out(table)
    out(json.dumps(doc))
    return doc
