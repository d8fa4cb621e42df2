"""The benchmark's tables: what `python -m specdec_lab bench` prints before its JSON line."""


def _f(x, spec):
    """format(x, spec), or a dash as wide as the spec when there is no value."""
    if x is None:
        width = spec.split(".")[0]
        return "-".rjust(int(width)) if width.isdigit() else "-"
    return format(x, spec)


def format_table(doc) -> str:
    m, c, rf = doc["machine"], doc["costs"], doc["roofline"]
    mt, md, mf = doc["models"]["target"], doc["models"]["draft"], doc["models"].get("feature_draft")
    feature = f", feature draft {mf['params'] / 1e6:.1f}M" if mf else ""
    if doc["models"].get("self_draft"):
        feature += f", self-draft {doc['models']['self_draft']} (pred+v from its own alpha and c)"
    rows = [f"{m['device_name']}, {m['threads']} threads, {m['dtype']}; target {mt['params'] / 1e6:.0f}M "
            f"params, draft {md['params'] / 1e6:.1f}M{feature}; {doc['config']['num_prompts']} prompts, "
            f"up to {doc['config']['max_new_tokens']} new tokens each",
            f"step costs at {c['context']} cached tokens: target {c['target_forward_seconds'] * 1e3:.2f} ms, "
            f"draft {c['draft_forward_seconds'] * 1e3:.2f} ms, c = {c['c']:.3f}; verify K+1 over 1 token: "
            + " ".join(f"K{k}:{v:.2f}" for k, v in c["verify_cost"].items())]
    head = (f"{'system':30s} {'tok/s':>7s} {'vs AR':>6s} {'95% CI':>9s} {'vs HF':>6s} {'vs asst':>7s} "
            f"{'K':>4s} {'alpha':>6s} {'tok/step':>8s} {'c':>6s} {'pred':>5s} {'pred+v':>6s} {'meas':>5s} {'loop':>5s}")
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
                        f"{_f(s.get('mean_k'), '4.1f')} "
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
    rows.append("targets (docs/design.md; the best speculative system per temperature):")
    for n, v in doc["targets"].items():
        if isinstance(v, dict):
            rel = "<=" if "prediction_error" in n else ">="
            ci = f"  (95% over prompts: {v['ci95'][0]:.2f}-{v['ci95'][1]:.2f})" if v.get("ci95") else ""
            rows.append(f"  {n:45s} {_f(v['value'], '6.2f')}  target {rel} {v['target']:<5}"
                        f"{'met' if v['met'] else 'NOT met'}{ci}")
        else:
            rows.append(f"  {n:45s} {v}")
    rows.append("pred: Theorem 3.8 of arXiv 2211.17192 from alpha and c; pred+v: with the measured cost of "
                "verifying K+1 tokens; meas: measured speedup over this engine's autoregressive decode, prefill "
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
