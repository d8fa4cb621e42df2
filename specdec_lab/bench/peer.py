"""llama.cpp as the measured peer: its llama-server beside the lab's engine, in one run.

llama-server is built by the project's own set-up (scripts/build_llama_cpp.sh, `make peer`) into
the cache. `LlamaServer` starts one on a free local port and asks it for greedy completions of
token ids over HTTP (the standard library's urllib); `run_peer_bench` runs, prompt by prompt in
rotating order as the main benchmark does (run.run_systems), with one thread each:

    llamacpp_ar        llama-server on the target's Q4_1 GGUF, no draft
    llamacpp_spec_k{K} the same with the lab's draft exported to GGUF (io/export.py), K drafted per step
    llamacpp_spec_k{K}_f16  the same with the draft's matrices written in float16 (half the bytes)
    llamacpp_draft_alone    the float32 GGUF draft decoding alone: its speed against llamacpp_ar is 1 / c
    lab_ar             this engine's autoregressive decode (the target in float32, CPU kernels)
    lab_spec_k{K}      the shipped draft at the same K
    lab_self_k{S}      the self-draft in 4 bits: the best lossless system of docs/bench_fast_memory.json
    lab_int4_decode    the same 4-bit weights decoding alone, unverified (not lossless)
    lab_eagle3_k{E}, llamacpp_eagle3_k{E}  the EAGLE-3 draft in the lab and in llama.cpp
    vllm_ar, vllm_spec_k{K}, vllm_eagle3_k{E}  vLLM for CPU (.venv-vllm), eager; `_compiled` its
                       torch.compile path, in a second wave beside lab_ar and llamacpp_ar timed again

Every call is timed whole, from the request to the last token (prefill included), as the main
benchmark times its own calls; ratios have paired bootstrap intervals over the prompts
(run.ratio_interval). llama.cpp reads the Q4_1 file as stored and the lab reads it expanded to
float32, so the two targets' greedy answers may part; where they do, run.first_difference gives
the float32 target's logit gap between the two tokens.
"""
import contextlib
import json
import os
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

import torch

from ..analysis.timing import Clock
from ..api import SpeculativeEngine, autoregressive_generate, load_default_pair, load_eagle3_draft, load_pair
from ..core.config import cache_dir
from ..core.text import encode_prompt
from ..cpu import QuantizedDecoding, SelfDraft
from ..drafters.vocab_subset import VocabSubsetHead
from ..io.assets import ensure_default_target, ensure_gguf
from ..io.export import export_gguf_draft
from ..io.pair import default_draft_dir
from ..train.acceptance import measure_step_costs
from ..train.prompts import BENCH_PROMPTS
from .run import BenchConfig, first_difference, ratio_interval, run_systems
from .systems import System
from .exports import engine_files
from .vllm_server import VLLM_SOURCE, VllmServer, _free_port, counts_since

LLAMA_CPP_SOURCE = "llama.cpp vendored in llama-cpp-python 0.3.36 (PyPI sdist)"


def llama_server_path(arch="native") -> Path:
    """The llama-server that scripts/build_llama_cpp.sh built, or FileNotFoundError saying how to build it.
    arch: "native" (the build the lab runs), else the -march of a second build (LLAMA_ARCH=arch)."""
    path = cache_dir() / ("llama.cpp" if arch == "native" else f"llama.cpp-{arch}") / "bin" / "llama-server"
    if not os.access(path, os.X_OK):
        how = "`make peer` (bash scripts/build_llama_cpp.sh)" if arch == "native" else \
            f"LLAMA_ARCH={arch} bash scripts/build_llama_cpp.sh"
        raise FileNotFoundError(f"llama-server is not built ({path} is missing): run {how}")
    return path


def exported_draft_gguf(dtype="f32") -> Path:
    """The shipped draft as a GGUF beside the target's, written once into the cache (io/export.py)."""
    out = cache_dir() / "export" / f"specdec_lab_draft.{dtype}.gguf"
    src = default_draft_dir() / "model.safetensors"
    if not out.exists() or out.stat().st_mtime < src.stat().st_mtime:
        export_gguf_draft(default_draft_dir(), ensure_gguf(), out, dtype)
    return out


class LlamaServer:
    """One llama-server process: `with LlamaServer(model, draft, k) as s: s.complete(ids, n)`.

    threads: llama.cpp's -t and -tb, and the draft's; k: tokens drafted per step, always k: no
    minimum probability, no minimum length. spec_type: draft-simple for a token draft, draft-eagle3
    for an EAGLE-3 draft (which reads the target's layer states). arch: which build (llama_server_path)."""

    SPEC_TYPES = ("draft-simple", "draft-eagle3")

    def __init__(self, model, draft=None, k=None, threads=1, ctx=2048, spec_type="draft-simple", parallel=1,
                 arch="native"):
        if draft is not None and (isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= 16):
            raise ValueError(f"k must be an int in [1, 16] with a draft, got {k!r}")
        if spec_type not in self.SPEC_TYPES:
            raise ValueError(f"spec_type must be one of {self.SPEC_TYPES}, got {spec_type!r}")
        for name, v in (("threads", threads), ("parallel", parallel)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an int >= 1, got {v!r}")
        self.port = _free_port()
        self.command = [str(llama_server_path(arch)), "-m", str(model), "-t", str(threads), "-tb", str(threads),
                        "-c", str(ctx), "-np", str(parallel), "--host", "127.0.0.1", "--port", str(self.port), "--no-ui"]
        if draft is not None:
            self.command += ["-md", str(draft), "--spec-type", spec_type, "--spec-draft-n-max", str(k),
                             "--spec-draft-n-min", "0", "--spec-draft-p-min", "0", "-td", str(threads),
                             "-tbd", str(threads)]
        self.proc, self.log = None, None

    def __enter__(self):
        self.log = tempfile.TemporaryFile("w+")  # the server's log, shown when it fails to start
        self.proc = subprocess.Popen(self.command, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited with {self.proc.returncode}:\n{self._log_tail()}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass  # still loading the model (on a busy machine /health itself may time out)
            time.sleep(0.2)
        self.__exit__()
        raise RuntimeError(f"llama-server did not become healthy in 120 s:\n{self._log_tail()}")

    def _log_tail(self):
        self.log.flush()
        self.log.seek(0)
        return "".join(self.log.readlines()[-20:])

    def __exit__(self, *exc):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.log is not None:
            self.log.close()

    def complete(self, ids, max_new_tokens) -> dict:
        """Greedy continuation of the token ids: {"tokens", "timings"} (the server's timings: predicted_n,
        draft_n, draft_n_accepted, ...). No prompt cache: every call reads its prompt, as the lab's do."""
        body = {"prompt": list(ids), "n_predict": max_new_tokens, "temperature": 0.0, "top_k": 1,
                "cache_prompt": False, "return_tokens": True, "stream": False}
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/completion", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as r:
            out = json.loads(r.read())
        return {"tokens": list(out["tokens"]), "timings": out["timings"]}

    def proposals(self, ids, continuation) -> list:
        """The model's greedy next token after ids + continuation[:i], for every i < len(continuation):
        what it would propose at each position of a fixed token sequence. The prompt cache is on, so
        each request reads one new token (the model alone, no draft: start the server without one)."""
        out = []
        for i in range(len(continuation)):
            body = {"prompt": list(ids) + list(continuation[:i]), "n_predict": 1, "temperature": 0.0, "top_k": 1,
                    "cache_prompt": True, "return_tokens": True, "stream": False}
            req = urllib.request.Request(f"http://127.0.0.1:{self.port}/completion", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=600) as r:
                out.append(json.loads(r.read())["tokens"][0])
        return out


# What "the export computes the lab's draft" allows, from docs/peer_noise.json (scripts/peer_noise.py): two
# builds of llama.cpp on one machine (AVX-512 and AVX2), at one and two threads, asked for the float32
# export's proposal at every position of the lab's answers to 24 prompts. The float16 export, whose
# half-precision products round far more than a build's order of sums does, is the noise to stay above.
SAME_PROPOSAL_FLOOR = 0.98  # the share of positions where both propose the same token
NEAR_TIE = 0.05  # logits: the largest lab-draft gap allowed at a disagreement


def computes_the_labs_draft(agreement) -> bool:
    """Whether a draft_agreement result says the export computes the lab's draft: the same proposal almost
    everywhere, and every disagreement at a near-tie of the lab's draft (a rounding difference, not a bug)."""
    gaps = agreement["disagreement_gaps"]
    return agreement["same_proposal"] >= SAME_PROPOSAL_FLOOR and all(abs(g) < NEAR_TIE for g in gaps)


def whole_head_draft():
    """The shipped draft as its export holds it, with the whole vocabulary's head. The lab's engine restricts
    the head to the draft folder's vocab_subset.json; the exports carry every row, so that llama.cpp and vLLM
    need nothing of the lab's to run it."""
    return load_pair(ensure_default_target(), default_draft_dir(), vocab_subset_head=False).draft


def draft_agreement(draft, draft_gguf, sequences, threads=1, arch="native") -> dict:
    """The lab's draft and its GGUF export in llama-server, asked for their proposal at every position of
    the same token sequences: [(prompt ids, continuation)], the continuation the target's greedy answer.

    Compared on the same tokens, the two do not depend on where two engines' greedy answers part: each
    position is one question put to both. Returns the positions, the share where both propose the same
    token ("same_proposal"), each engine's share that is the target's next token ("alpha": the share a
    greedy target accepts position by position), and at each disagreement the lab draft's logit gap
    between its token and llama.cpp's (a near-tie is a rounding difference; a large gap, a wrong export).
    draft: the lab's model of what the GGUF holds (for the shipped draft, whole_head_draft())."""
    if isinstance(draft.head, VocabSubsetHead):
        raise ValueError("draft has its head restricted to a vocabulary subset, and the export holds the whole "
                         "head: compare with whole_head_draft()")
    if any(len(ids) == 0 for ids, _ in sequences):
        raise ValueError("every sequence needs a prompt of at least one token (the first proposal follows it)")
    lab, engine, gaps = [], [], []
    with LlamaServer(draft_gguf, threads=threads, arch=arch) as server:
        for ids, cont in sequences:
            x = torch.tensor([list(ids) + list(cont)[:-1]], device=draft.device)
            with torch.no_grad():
                logits = draft(x)[0, len(ids) - 1:]  # (len(cont), V): the proposal for each continuation token
            mine, theirs = logits.argmax(-1).tolist(), server.proposals(ids, cont)
            gaps += [float(logits[i, a] - logits[i, b]) for i, (a, b) in enumerate(zip(mine, theirs)) if a != b]
            lab += [a == t for a, t in zip(mine, cont)]
            engine += [b == t for b, t in zip(theirs, cont)]
    n = len(lab)
    if n == 0:
        raise ValueError("the sequences hold no continuation token: there is no proposal to compare")
    return {"positions": n, "same_proposal": 1 - len(gaps) / n, "alpha": {"lab": sum(lab) / n, "llamacpp": sum(engine) / n},
            "disagreement_gaps": sorted(gaps)}


# ----------------------------------------------------------------------------- the side-by-side run

# bench --peer --quick: every system but vLLM's compiled path, on 2 prompts x 16 tokens
PEER_QUICK = {"num_prompts": 2, "max_new_tokens": 16, "vllm_compiled": False}


@dataclass
class PeerConfig:
    num_prompts: int = 24  # the first N benchmark prompts (24: all of them)
    max_new_tokens: int = 64
    k: int = 2  # the token draft's K, for llama.cpp and the lab alike (the lab's best fixed K for it)
    self_k: int = 6  # the self-draft's K in the lab's best lossless system
    eagle3_k: int = 3  # the EAGLE-3 draft's K, in every engine
    threads: int = 1
    vllm: bool = True  # vLLM for CPU beside llama.cpp (.venv-vllm, `make peers`)
    vllm_compiled: bool = True  # also vLLM's compiled CPU path (torch.compile), where it starts

    def __post_init__(self):
        for name in ("num_prompts", "max_new_tokens", "k", "self_k", "eagle3_k", "threads"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an int >= 1, got {v!r}")
        if max(self.k, self.self_k, self.eagle3_k) > 16:
            raise ValueError(f"k, self_k and eagle3_k must be at most 16, got {self.k}, {self.self_k}, {self.eagle3_k}")
        for name in ("vllm", "vllm_compiled"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")


def _server_system(name, label, server, k, timings):
    """A System whose calls go to `server`; each call's server timings are appended to timings[name]."""
    timings[name] = []

    def run(ids, n, temperature, seed):
        out = server.complete(ids, n)
        timings[name].append(out["timings"])
        return out["tokens"], None
    return System(name, label, run, k=k, own=False, drafts=k is not None)


def _vllm_system(name, label, server, k, marks):
    """A System whose calls go to a VllmServer. Its speculative counters are read once, after the
    first call (run_systems' untimed warm-up), into marks[name]: the timed calls scrape nothing,
    and run_peer_bench reads the counters again at the end."""
    def run(ids, n, temperature, seed):
        tokens = server.complete(ids, n)
        if k is not None and name not in marks:
            marks[name] = (server, server.spec_counters())
        return tokens, None
    return System(name, label, run, k=k, own=False, drafts=k is not None)


def _start_vllm(stack, target_dir, specs, threads, modes, log) -> dict:
    """{name: ready VllmServer} for every (spec, mode), started side by side, each stopped by `stack`;
    one that does not start is left out with a line to `log`."""
    pending = {}
    for compiled in modes:
        for name, spec in specs.items():
            server = VllmServer(target_dir, spec, threads=threads, compiled=compiled)
            stack.callback(server.__exit__)
            pending[name + ("_compiled" if compiled else "")] = server.start()
    ready = {}
    for name, server in pending.items():
        try:
            ready[name] = server.wait_ready()
        except RuntimeError as e:  # vLLM's compiled CPU path needs a compiler toolchain it may not find
            log(f"vLLM {name} did not start: {str(e).splitlines()[0]}")
    return ready


def _lab_system(name, label, generate, k=None):
    def run(ids, n, temperature, seed):
        res = generate(ids, n)
        return res.tokens, res
    return System(name, label, run, k=k, drafts=k is not None)


def run_peer_bench(cfg: PeerConfig, log=None) -> dict:
    """Every system on every prompt, greedy; returns the JSON document (docs/peer_llamacpp.json)."""
    log = log or (lambda s: None)
    torch.set_num_threads(cfg.threads)
    log("loading the default pair ...")
    pair = load_default_pair()
    target, draft = pair.target, pair.draft
    prompt_ids = [encode_prompt(target.tokenizer, p) for p in BENCH_PROMPTS[:cfg.num_prompts]]
    bench_cfg = BenchConfig(num_prompts=cfg.num_prompts, max_new_tokens=cfg.max_new_tokens, temperatures=(0.0,),
                            ks=(cfg.k,), warmup_tokens=16)
    log("the target's .gguf and the draft exported to GGUF (float32 and float16) ...")
    target_gguf, draft_gguf, draft_f16 = ensure_gguf(), exported_draft_gguf(), exported_draft_gguf("f16")
    self_draft = SelfDraft(target, "int4")
    spec = SpeculativeEngine(target, draft, k=cfg.k)
    spec_self = SpeculativeEngine(target, self_draft, k=cfg.self_k)
    quantized = QuantizedDecoding(self_draft)
    files = engine_files(log)
    eagle3 = SpeculativeEngine(target, load_eagle3_draft(target), k=cfg.eagle3_k)
    timings, marks, vllm_commands, wave_of = {}, {}, {}, {}
    specs = {"vllm_ar": None,
             f"vllm_spec_k{cfg.k}": {"method": "draft_model", "model": str(files["token_hf"]),
                                    "num_speculative_tokens": cfg.k},
             f"vllm_eagle3_k{cfg.eagle3_k}": {"method": "eagle3", "model": str(files["eagle3_dir"]),
                                             "num_speculative_tokens": cfg.eagle3_k}}
    # vLLM's eager servers run beside every other system; its compiled servers, where asked for, in a
    # second wave beside the two autoregressive baselines again: six vLLM servers at once (about 2.7 GB
    # each) with the five llama-servers and the lab outgrow a 24 GB machine.
    modes = ([False] + ([True] if cfg.vllm_compiled else [])) if cfg.vllm else []
    log("starting five llama-servers (the target alone, with each exported draft, the draft alone) ...")
    with LlamaServer(target_gguf, threads=cfg.threads) as ar_server, \
            LlamaServer(target_gguf, draft_gguf, cfg.k, threads=cfg.threads) as spec_server, \
            LlamaServer(target_gguf, draft_f16, cfg.k, threads=cfg.threads) as spec16_server, \
            LlamaServer(draft_gguf, threads=cfg.threads) as draft_server, \
            LlamaServer(target_gguf, files["eagle3_gguf"], cfg.eagle3_k, threads=cfg.threads,
                        spec_type="draft-eagle3") as eagle3_server:
        def lab_ar_system():
            return _lab_system("lab_ar", "lab, autoregressive", lambda ids, n: autoregressive_generate(target, ids, n))
        first = [
            lab_ar_system(),
            _lab_system(f"lab_spec_k{cfg.k}", f"lab, shipped draft, K = {cfg.k}",
                        lambda ids, n: spec.generate(ids, max_new_tokens=n), cfg.k),
            _lab_system(f"lab_self_k{cfg.self_k}", f"lab, self-draft 4-bit, K = {cfg.self_k}",
                        lambda ids, n: spec_self.generate(ids, max_new_tokens=n), cfg.self_k),
            _lab_system("lab_int4_decode", "lab, 4-bit decode alone (unverified)",
                        lambda ids, n: autoregressive_generate(quantized, ids, n)),
            _server_system("llamacpp_ar", "llama.cpp, autoregressive (Q4_1)", ar_server, None, timings),
            _server_system(f"llamacpp_spec_k{cfg.k}", f"llama.cpp, exported draft, K = {cfg.k}", spec_server,
                           cfg.k, timings),
            _server_system(f"llamacpp_spec_k{cfg.k}_f16", f"llama.cpp, exported draft in float16, K = {cfg.k}",
                           spec16_server, cfg.k, timings),
            _server_system("llamacpp_draft_alone", "llama.cpp, the exported draft alone (not the target)",
                           draft_server, None, timings),
            _lab_system(f"lab_eagle3_k{cfg.eagle3_k}", f"lab, EAGLE-3 draft, K = {cfg.eagle3_k}",
                        lambda ids, n: eagle3.generate(ids, max_new_tokens=n), cfg.eagle3_k),
            _server_system(f"llamacpp_eagle3_k{cfg.eagle3_k}", f"llama.cpp, EAGLE-3 draft, K = {cfg.eagle3_k}",
                           eagle3_server, cfg.eagle3_k, timings),
        ]
        commands = {"llamacpp_ar": ar_server.command, f"llamacpp_spec_k{cfg.k}": spec_server.command,
                    f"llamacpp_spec_k{cfg.k}_f16": spec16_server.command, "llamacpp_draft_alone": draft_server.command,
                    f"llamacpp_eagle3_k{cfg.eagle3_k}": eagle3_server.command}
        systems, tallies, baselines, counts = list(first), {}, {}, {}
        for wave, compiled in enumerate(modes or [None], start=1):
            with contextlib.ExitStack() as stack:
                vllm_systems, started = [], {}
                if compiled is not None:
                    log(f"wave {wave}: starting {len(specs)} vLLM servers ({'compiled' if compiled else 'eager'}) "
                        "side by side (minutes) ...")
                    started = _start_vllm(stack, files["target_dir"], specs, cfg.threads, [compiled], log)
                for name, server in started.items():
                    how = specs[name.removesuffix("_compiled")]
                    k = how and how["num_speculative_tokens"]
                    what = ("autoregressive" if how is None else "exported draft" if how["method"] == "draft_model"
                            else "EAGLE-3 draft")
                    label = (f"vLLM{' compiled' if compiled else ''}, {what}" + (f", K = {k}" if k else "")
                             + " (float32)")
                    vllm_systems.append(_vllm_system(name, label, server, k, marks))
                    vllm_commands[name] = commands[name] = server.command
                    wave_of[name] = wave
                if wave > 1 and not vllm_systems:
                    log(f"wave {wave}: no vLLM server started, nothing to run")
                    continue
                # the first wave runs every system; a later one its vLLM servers beside both baselines again
                again = first if wave == 1 else [lab_ar_system(), _server_system(
                    "llamacpp_ar", "llama.cpp, autoregressive (Q4_1)", ar_server, None, {})]
                got = run_systems(again + vllm_systems, prompt_ids, bench_cfg, 0.0, Clock(target.device), log)
                baselines[wave] = (got["lab_ar"], got["llamacpp_ar"])
                tallies.update({s.name: got[s.name] for s in (first if wave == 1 else []) + vllm_systems})
                systems += vllm_systems
                for name in [name for name in marks if wave_of[name] == wave]:  # read before its server stops
                    server, after_warmup = marks.pop(name)
                    counts[name] = counts_since(after_warmup, server.spec_counters())
    for t in timings.values():
        del t[0]  # the warm-up call
    costs = measure_step_costs(target, draft, (cfg.k,), context=96, reps=10)  # the lab's c, for the same draft

    lab_ar = tallies["lab_ar"]

    def vs(t, base):
        (_, ta, sa), (_, tb, sb) = t.per_prompt(), base.per_prompt()
        ci = ratio_interval(ta, sa, tb, sb)
        return {"ratio": (t.tokens / t.seconds) / (base.tokens / base.seconds),
                "ci95": None if ci is None else list(ci)}

    def same(t, ref):
        return sum(a == b for a, b in zip(t.outputs, ref.outputs)) / len(ref.outputs)

    systems_doc = {}
    for s in systems:
        t, wave = tallies[s.name], wave_of.get(s.name, 1)
        base_lab, base_llama = baselines[wave]  # the two autoregressive decodes timed in the same wave
        row = {"label": s.label, "wave": wave, "tokens": t.tokens, "seconds": t.seconds,
               "tokens_per_second": t.tokens / t.seconds,
               "vs_lab_ar": vs(t, base_lab), "vs_llamacpp_ar": vs(t, base_llama),
               "same_output_as_lab_ar": same(t, base_lab), "same_output_as_llamacpp_ar": same(t, base_llama)}
        if s.name in timings:  # llama.cpp: one target forward per step commits the accepted drafts and one more
            tm = timings[s.name]
            predicted, accepted = sum(x["predicted_n"] for x in tm), sum(x.get("draft_n_accepted", 0) for x in tm)
            row.update(command=commands[s.name], drafted=sum(x.get("draft_n", 0) for x in tm), accepted=accepted,
                       tokens_per_step=predicted / (predicted - accepted),
                       server_decode_tokens_per_second=1000 * predicted / sum(x["predicted_ms"] for x in tm))
        elif s.name in vllm_commands:  # vLLM: its own counters over the timed calls
            row["command"] = commands[s.name]
            c = counts.get(s.name, {"drafts": 0, "draft_tokens": 0, "accepted": 0})
            row.update(drafted=c["draft_tokens"], accepted=c["accepted"],
                       tokens_per_step=1 + c["accepted"] / c["drafts"] if c["drafts"] else 1.0)
        else:
            row.update(tokens_per_step=t.tokens / t.steps, drafted=t.drafted, accepted=t.accepted)
        if s.name not in ("lab_ar", "llamacpp_draft_alone") and row["same_output_as_lab_ar"] < 1:
            diffs = [first_difference(target, prompt_ids[p], a, b)
                     for p, a, b in zip(lab_ar.call_prompts, lab_ar.outputs, t.outputs) if a != b]
            row["first_differences"] = diffs  # None where one answer is a prefix of the other (EOS)
            gaps = [abs(d["logit_gap"]) for d in diffs if d is not None]
            row["first_difference_positions"] = [d["position"] for d in diffs if d is not None]
            row["max_abs_logit_gap"] = max(gaps) if gaps else None
        systems_doc[s.name] = row

    return {
        "measured_at": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "config": asdict(cfg),
        "machine": {"cpus": os.cpu_count(), "threads_each": cfg.threads,
                    "note": "the project's shared machine, where other jobs may run: ratios come from one run, "
                            "side by side, absolute speeds do not carry over"},
        "waves": {"1": "every system; vLLM in eager mode",
                  "2": "vLLM's compiled mode, beside lab_ar and llamacpp_ar timed again (its rows' ratios use those)"}
        if len(modes) > 1 else {"1": "every system"},
        "peer": {"source": LLAMA_CPP_SOURCE, "vllm": VLLM_SOURCE + " (the target's float32 folder)" if cfg.vllm else None,
                 "target_gguf": target_gguf.name, "draft_gguf": draft_gguf.name,
                 "lab_target": str(ensure_default_target().name) + " (the Q4_1 GGUF expanded to float32)"},
        "prompts": {"set": "bench", "count": len(prompt_ids)},
        # c, a draft token's cost in target tokens: llama.cpp's from the two servers' decode rates, the
        # lab's from measure_step_costs (one forward each at 96 cached positions)
        "c": {"llamacpp": systems_doc["llamacpp_ar"]["server_decode_tokens_per_second"]
              / systems_doc["llamacpp_draft_alone"]["server_decode_tokens_per_second"],
              "lab": costs.c},
        "systems": systems_doc,
    }


def format_peer(doc) -> str:
    """The table of a run_peer_bench document."""
    lines = ["| system | tokens/s vs lab AR (95% interval) | vs llama.cpp AR (95% interval) | tokens/step | "
             "greedy = lab AR |", "| --- | --- | --- | --- | --- |"]
    for row in doc["systems"].values():
        a, b = row["vs_lab_ar"], row["vs_llamacpp_ar"]

        def f(r):
            return f"{r['ratio']:.2f}x ({r['ci95'][0]:.2f}-{r['ci95'][1]:.2f})" if r["ci95"] else f"{r['ratio']:.2f}x"
        label = row["label"] + (f" (wave {row['wave']})" if row.get("wave", 1) > 1 else "")
        lines.append(f"| {label} | {f(a)} | {f(b)} | {row['tokens_per_step']:.2f} | "
                     f"{row['same_output_as_lab_ar']:.0%} |")
    return "\n".join(lines)
