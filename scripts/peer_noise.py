"""How far llama.cpp's answers move between builds, and what a claim about them may pin (docs/peer_noise.json).

    OMP_NUM_THREADS=1 python scripts/peer_noise.py [--prompts 24] [--arch x86-64-v3] [--out docs/peer_noise.json]

llama-server is built for the processor it is built on (-march=native), so two machines of the same
kind run different arithmetic: AVX-512 on one, AVX2 on another. Where the target's two best tokens
are close, the two builds' greedy answers part, and from there the engines decode different tokens
and accept different shares of the same draft. This measures, on one machine, the native build and
a second one for an older processor level (`LLAMA_ARCH=x86-64-v3 bash scripts/build_llama_cpp.sh`,
AVX2 and FMA, no AVX-512), each with one and two threads:

  1. what chapter 14 once compared: llama-server's accepted share with the Q4_1 target and the
     exported draft (K = 2), pooled over the first 3 and the first 8 prompts, beside the lab's, and
     how many of llama.cpp's greedy answers equal the lab's;
  2. what it compares now (bench.peer.draft_agreement): the draft asked, in the lab and in
     llama.cpp, for its proposal at every position of the same sequences (the lab target's greedy
     answers; the draft with its whole head, as the exports hold it), for the float32 export, the float16 one (llama.cpp then multiplies in half precision,
     a far larger rounding than any build's) and the export with Q and K left in Hugging Face's
     rotary order (the broken export the chapter's claim must catch).
"""
import argparse
import json
from datetime import datetime, timezone
from pathlib import Path

import torch

import specdec_lab as sl
from specdec_lab.bench.peer import LlamaServer, draft_agreement, exported_draft_gguf, llama_server_path, whole_head_draft
from specdec_lab.core.text import encode_prompt
from specdec_lab.io.assets import ensure_gguf
from specdec_lab.io.pair import default_draft_dir
from specdec_lab.lab.pitfalls import export_gguf_draft_hf_rope_order
from specdec_lab.train.prompts import BENCH_PROMPTS

K, TOKENS = 2, 48  # chapter 14's pair and answer length


def simd_flags():
    """Which of the vector extensions llama.cpp's native build can use this processor has (/proc/cpuinfo)."""
    flags = set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    return {name: name in flags for name in ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni")}


def live_share(arch, threads, prompts, reference):
    """llama-server's accepted share of drafted tokens, pooled over the first 3 and first 8 prompts, and
    which of its greedy answers equal the lab's."""
    shares, same = {}, []
    accepted = drafted = 0
    with LlamaServer(ensure_gguf(), exported_draft_gguf(), k=K, threads=threads, arch=arch) as s:
        for i, (ids, ref) in enumerate(zip(prompts, reference), 1):
            out = s.complete(ids, TOKENS)
            accepted, drafted = accepted + out["timings"]["draft_n_accepted"], drafted + out["timings"]["draft_n"]
            same.append(out["tokens"] == ref)
            if i in (3, 8) or i == len(prompts):
                shares[f"first_{i}"] = accepted / drafted
    return {"accepted_share": shares, "same_answer_as_lab": same[:8]}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--prompts", type=int, default=24, help="first N bench prompts for the agreement (default 24)")
    p.add_argument("--arch", default="x86-64-v3", help="the second build's -march (default %(default)s)")
    p.add_argument("--out", default="docs/peer_noise.json", help="where to store the document")
    args = p.parse_args()
    torch.set_num_threads(1)
    pair = sl.load_default_pair()
    engine = sl.SpeculativeEngine(pair.target, pair.draft, k=K)
    prompts = [encode_prompt(pair.tokenizer, t) for t in BENCH_PROMPTS[:args.prompts]]
    print(f"the lab's answers to {len(prompts)} prompts ...", flush=True)
    runs = [engine.generate(ids, max_new_tokens=TOKENS) for ids in prompts]
    reference = [r.tokens for r in runs]
    cuts = sorted({n for n in (3, 8) if n <= len(runs)} | {len(runs)})
    lab = {f"first_{n}": sum(r.stats.accepted for r in runs[:n]) / sum(r.stats.drafted for r in runs[:n])
           for n in cuts}
    broken = export_gguf_draft_hf_rope_order(default_draft_dir(), ensure_gguf(),
                                             exported_draft_gguf().with_name("draft_hf_rope_order.gguf"))
    exports = {"f32": exported_draft_gguf(), "f16": exported_draft_gguf("f16"), "hf_rope_order": broken}
    builds = ["native"] + ([args.arch] if args.arch else [])
    for b in builds:
        llama_server_path(b)  # fails early, saying how to build it
    doc = {"measured_at": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "command": f"python scripts/peer_noise.py --prompts {args.prompts} --arch {args.arch}",
           "config": {"k": K, "max_new_tokens": TOKENS, "prompts": len(prompts), "builds": builds},
           "processor": simd_flags(),
           "lab_accepted_share": lab, "runs": {}}
    for b in builds:
        for threads in (1, 2):
            name = f"{b}_t{threads}"
            print(f"{name}: llama-server with the Q4_1 target and the draft, K = {K} ...", flush=True)
            row = {"live": live_share(b, threads, prompts, reference), "agreement": {}}
            for e, path in exports.items():
                a = draft_agreement(whole_head_draft(), path, list(zip(prompts, reference)), threads=threads, arch=b)
                row["agreement"][e] = a
                print(f"  {e:14s} same proposal {a['same_proposal']:.4f} over {a['positions']} positions; alpha "
                      f"lab {a['alpha']['lab']:.3f}, llama.cpp {a['alpha']['llamacpp']:.3f}; largest gap at a "
                      f"disagreement {max(map(abs, a['disagreement_gaps']), default=0):.3f}", flush=True)
            live = row["live"]
            print("  live share, " + ", ".join(f"{k.replace('_', ' ')}: {v:.3f} (the lab {lab[k]:.3f})"
                                              for k, v in live["accepted_share"].items())
                  + f"; answers equal to the lab's: {sum(live['same_answer_as_lab'])} of {len(live['same_answer_as_lab'])}")
            doc["runs"][name] = row
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(f"stored {args.out}")


if __name__ == "__main__":
    main()
