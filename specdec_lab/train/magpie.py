"""Prompts the target writes itself (Magpie, Xu et al., arXiv 2406.08464).

An instruct model's chat template, cut just after the start of a user turn, asks the model
to write the user's message: sampled, an aligned model writes realistic requests across many
topics, and it needs no dataset. Each attempt samples one user turn until the end-of-turn
token; what comes back is filtered and deduplicated:

    empty          nothing but white space
    runaway        reached the length cap without ending its turn
    template       leaked chat markup or the system prompt
    not_request    too short, repetitive, in the assistant's voice, or neither a question
                   nor an instruction
    held_out       matches a hand-written held-out prompt (handwritten.py): kept out of training
    duplicate      the same text as a kept prompt (after normalize)
    near_duplicate word 3-gram Jaccard >= `near_duplicate` with a kept prompt

Attempt i samples with its own seed (seed * 10**6 + i; with batches, batch b with
seed * 10**6 + b), so a run is the same whether it stopped and resumed or not: every attempt
is appended to a partial file as it lands, and a rerun replays it through the same filters
and carries on at the next attempt.

Which sampler is fastest here (SmolLM2-135M, one thread, temperature 1, 64-token cap, the
shared 2-core machine under load): one turn at a time, the speculative engine at K = 2 made
12.1 tokens/s against 10.2 for autoregressive_generate (16 turns each, alternating). At
`nice -n 19`, one turn at a time through the engine (K = 3) made 16 attempts in about 5
minutes, and 16 turns side by side (sample_turns) 560 attempts in 46 minutes: about four
times as many. So the command line batches by default.
"""
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ..api import SpeculativeEngine, autoregressive_generate
from ..core.kv_cache import KVCache
from ..core.sampling import logits_to_probs, make_generator, sample
from .handwritten import NearDuplicateIndex, is_held_out_text, normalize

REASONS = ("empty", "runaway", "template", "not_request", "held_out", "duplicate", "near_duplicate")
ATTEMPTS_PER_SEED = 10**6  # attempt seeds seed * 10**6 + i never collide between runs of nearby seeds


@dataclass
class SynthesisConfig:
    n: int  # prompts to keep
    seed: int = 0  # attempt i samples with seed * 10**6 + i
    temperature: float = 1.0  # Magpie samples the user turn at 1.0: the diversity is the point
    top_p: float = 0.95  # cuts the far tail, where a 135M model's text falls apart
    max_new_tokens: int = 64  # the length cap; a turn that reaches it is a runaway
    max_attempts: int = 0  # stop after this many attempts even if short of n; 0 means 20 n
    near_duplicate: float = 0.5  # word 3-gram Jaccard at or above which two prompts are one
    min_words: int = 3  # shorter turns are not requests
    batch_size: int = 1  # turns sampled side by side (sample_turns); 1: one at a time through the engine

    def check(self):
        for name in ("n", "seed", "max_new_tokens", "max_attempts", "min_words", "batch_size"):
            v = getattr(self, name)
            low = 1 if name in ("n", "max_new_tokens", "batch_size") else 0
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                what = "n (prompts to keep, --synthesize)" if name == "n" else name
                raise ValueError(f"{what} must be an int >= {low}, got {v!r}")
        if not 0 <= self.temperature <= 10:
            raise ValueError(f"temperature must be in [0, 10], got {self.temperature!r}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not 0 < self.near_duplicate <= 1:
            raise ValueError(f"near_duplicate must be in (0, 1], got {self.near_duplicate!r}")
        if self.seed >= 2**63 // ATTEMPTS_PER_SEED:
            raise ValueError(f"seed must be < {2**63 // ATTEMPTS_PER_SEED}, got {self.seed}")

    @property
    def attempts(self) -> int:
        return self.max_attempts or 20 * self.n


def magpie_prefix(tokenizer) -> list[int]:
    """The chat template's ids up to the start of a user turn's text: the system turn the template
    adds by itself, then the user header. Raises ValueError for a tokenizer without a template."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("tokenizer must have a chat template (an instruct model's); this one has none")
    marker = "\u2063MAGPIE\u2063"  # a text no template contains
    text = tokenizer.apply_chat_template([{"role": "user", "content": marker}], tokenize=False)
    return tokenizer.encode(text[:text.index(marker)], add_special_tokens=False)


# ----------------------------------------------------------------------------- filters

REQUEST_OPENERS = {
    "what", "why", "how", "when", "where", "who", "which", "whose", "is", "are", "can", "could", "would",
    "should", "do", "does", "did", "will", "write", "explain", "give", "list", "describe", "create", "tell",
    "summarize", "summarise", "translate", "generate", "provide", "help", "make", "suggest", "compare",
    "calculate", "find", "show", "draft", "compose", "plan", "design", "recommend", "convert", "rewrite",
    "edit", "fix", "name", "define", "outline", "analyze", "analyse", "classify", "sort", "identify",
    "imagine", "pretend", "act", "please", "implement", "solve", "build", "develop", "prepare", "check",
}
REQUEST_PHRASES = ("i need", "i want", "i'd like", "i would like", "i'm looking for", "i am looking for",
                   "help me", "can you", "could you", "would you", "please")
ASSISTANT_OPENERS = ("sure", "certainly", "of course", "as an ai", "i'm sorry", "i am sorry", "absolutely",
                     "great question", "i'm glad", "hello! how can i", "how can i assist", "how can i help")


def is_repetitive(words: list[str]) -> bool:
    """A word three times in a row, or a long text of few distinct words: a sampling loop."""
    if any(words[i] == words[i + 1] == words[i + 2] for i in range(len(words) - 2)):
        return True
    return len(words) >= 12 and len(set(words)) / len(words) < 0.4


def looks_like_request(text: str, min_words: int = 3) -> bool:
    """A user's request: at least `min_words` words, mostly ASCII, not a loop, not the assistant
    speaking, and a question or an instruction (an opening verb, a question word or a phrase such
    as 'can you'). A heuristic: it keeps some stories and drops some odd requests."""
    words = normalize(text).split()
    if len(words) < min_words or is_repetitive(words):
        return False
    if sum(not ch.isascii() for ch in text) > 0.1 * len(text):
        return False
    low = text.strip().lower()
    if low.startswith(ASSISTANT_OPENERS):
        return False
    first = low.split()[0].strip(".,:;!?\"'()*-")
    return "?" in text or first in REQUEST_OPENERS or any(p in low for p in REQUEST_PHRASES)


def reject_reason(text: str, hit_cap: bool, min_words: int = 3) -> str | None:
    """Why a sampled turn is not a prompt, before any deduplication; None when it is one."""
    if not text.strip():
        return "empty"
    if hit_cap:
        return "runaway"
    if "<|" in text or "|>" in text or "helpful ai assistant" in text.lower():
        return "template"
    if not looks_like_request(text, min_words):
        return "not_request"
    if is_held_out_text(text):
        return "held_out"
    return None


class PromptFilter:
    """The filters and both deduplications, fed one sampled turn at a time, in attempt order."""

    def __init__(self, cfg: SynthesisConfig, avoid=()):
        """avoid: prompts kept elsewhere (an earlier file): a turn that matches one, exactly or
        nearly, is rejected as a duplicate, so a second file adds only new requests."""
        self.cfg, self.index = cfg, NearDuplicateIndex(threshold=cfg.near_duplicate)
        self.kept, self.kept_tokens, self.rejected = [], [], dict.fromkeys(REASONS, 0)
        for text in avoid:
            self.index.add(text.strip())

    def add(self, text: str, num_tokens: int, hit_cap: bool) -> str | None:
        """Keep `text` or count why not; returns the reason, None when kept."""
        text = text.strip()
        reason = reject_reason(text, hit_cap, self.cfg.min_words)
        if reason is None:
            match = self.index.match(text)
            reason = {"exact": "duplicate", "near": "near_duplicate"}.get(match)
        if reason is None:
            self.index.add(text)
            self.kept.append(text)
            self.kept_tokens.append(num_tokens)
        else:
            self.rejected[reason] += 1
        return reason


# ----------------------------------------------------------------------------- statistics

def quantiles(xs: list, qs=(0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0)) -> dict:
    """Nearest-rank quantiles of xs (q = 0 is the minimum, 1 the maximum)."""
    s = sorted(xs)
    return {f"p{round(100 * q)}": (s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))] if s else None)
            for q in qs}


def prompt_statistics(prompts: list[str], num_tokens: list[int]) -> dict:
    """Count, distinct word 3-grams (and their share of all 3-grams), and the length distribution
    in words and in tokens."""
    grams = [g for p in prompts for g in _all_ngrams(p)]
    words = [len(normalize(p).split()) for p in prompts]
    return {"count": len(prompts), "distinct_3grams": len(set(grams)),
            "distinct_3gram_share": len(set(grams)) / len(grams) if grams else 0.0,
            "words": {**quantiles(words), "mean": sum(words) / len(words) if words else None},
            "tokens": {**quantiles(num_tokens), "mean": sum(num_tokens) / len(num_tokens) if num_tokens else None}}


def _all_ngrams(text: str, n: int = 3) -> list:
    words = normalize(text).split()
    return [tuple(words[i:i + n]) for i in range(len(words) - n + 1)]


# ----------------------------------------------------------------------------- the run

RESUME_FREE = ("n", "max_attempts")  # settings that only say when to stop: a rerun may change them


def _read_partial(path: Path, cfg: SynthesisConfig) -> list[dict]:
    """The attempts a stopped run wrote; ValueError when its sampling settings differ from cfg's."""
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    if not lines:
        return []
    saved, now = lines[0]["settings"], asdict(cfg)
    if any(saved.get(key) != v for key, v in now.items() if key not in RESUME_FREE):
        raise ValueError(f"{path} was written with settings {saved}, not {now}; "
                         "rerun with those settings or delete it")
    return lines[1:]


@torch.no_grad()
def sample_turns(target, prefix_ids, cfg, batch_index) -> list[tuple[list[int], bool]]:
    """cfg.batch_size turns after the same prefix, side by side: one target forward per token for
    the whole batch, which on a CPU costs little more than for one row (the weights are read once).
    Returns per row (ids up to its end-of-turn token, excluded; whether it ended). The batch draws
    from its own generator, seeded by (cfg.seed, batch_index)."""
    B, eos = cfg.batch_size, torch.tensor(target.cfg.eos_token_ids, device=target.device)
    g = make_generator(cfg.seed * ATTEMPTS_PER_SEED + batch_index, target.device)
    cache = KVCache.for_model(target.cfg, len(prefix_ids) + cfg.max_new_tokens, batch_size=B, dtype=target.dtype,
                              device=target.device)
    x = torch.tensor([prefix_ids], device=target.device).expand(B, -1)  # (B, P): every row the same prefix
    out, done = [], torch.zeros(B, dtype=torch.bool, device=target.device)
    for _ in range(cfg.max_new_tokens):
        logits = target(x, cache=cache, last_only=True)[:, -1]  # (B, V)
        x = sample(logits_to_probs(logits, cfg.temperature, top_p=cfg.top_p), g).view(B, 1)  # (B, 1)
        out.append(x[:, 0])
        done |= torch.isin(x[:, 0], eos)
        if bool(done.all()):  # sync: one per token; offline data generation
            break
    rows = torch.stack(out, 1).tolist()  # sync: the batch's tokens, once
    turns = []
    for row in rows:
        end = next((i for i, t in enumerate(row) if t in target.cfg.eos_token_ids), None)
        turns.append((row if end is None else row[:end], end is not None))
    return turns


def _sample(target, engine, prefix_ids, cfg, attempt):
    """One turn through the engine or autoregressive_generate: (ids without the end-of-turn token, ended)."""
    kw = dict(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, top_p=cfg.top_p,
              seed=cfg.seed * ATTEMPTS_PER_SEED + attempt)
    res = engine.generate(prefix_ids, **kw) if engine else autoregressive_generate(target, prefix_ids, **kw)
    ended = bool(res.tokens) and res.tokens[-1] in target.cfg.eos_token_ids
    return (res.tokens[:-1] if ended else res.tokens), ended


def synthesize_prompts(target, prefix_ids, decode, cfg: SynthesisConfig, out, draft=None, k=3,
                       max_minutes=None, stop_after=None, progress=True, avoid=()) -> dict:
    """Sample user turns after `prefix_ids` until cfg.n are kept or cfg.attempts are spent; then write
    {"seed", "settings", "complete", "attempts", "rejected", "stats", "prompts"} as JSON to `out` and return it.

    decode: ids (without the end-of-turn token) -> text. With cfg.batch_size > 1 the target samples
    that many turns side by side (sample_turns); else one at a time, through the speculative engine
    at K = k with `draft` (the same distribution: speculative sampling is lossless), or with
    autoregressive_generate. Attempts go to `out`.partial as they land. After `max_minutes`, or
    `stop_after` attempts in this call, it returns what it has and leaves the partial file, which
    a rerun resumes from; `out` is written only when the run is complete, with exactly cfg.n
    prompts (a batch's turns beyond the n-th kept count as "beyond_n"), and the attempts are kept
    in `out`.attempts.jsonl, so a rerun (with the same or a larger n) starts from them instead of
    sampling again. `avoid`: prompts of earlier files, which count as duplicates here (PromptFilter)."""
    cfg.check()
    out, t0 = Path(out), time.perf_counter()
    partial, finished = Path(str(out) + ".partial"), attempts_log(out)
    from_finished = not partial.exists() and finished.exists()  # a complete run's attempts: resume from them
    lines = _read_partial(finished if from_finished else partial, cfg)
    done = lines[:len(lines) - len(lines) % cfg.batch_size]  # a batch cut short by a kill is sampled again
    avoid = list(avoid)
    filt = PromptFilter(cfg, avoid)
    for a in done:
        filt.add(a["text"], a["tokens"], a["hit_cap"])
    out.parent.mkdir(parents=True, exist_ok=True)
    if from_finished or not done or len(done) < len(lines):  # a fresh file, or one without the cut batch
        partial.write_text("".join(json.dumps(x) + "\n" for x in [{"settings": asdict(cfg)}, *done]))
    engine = SpeculativeEngine(target, draft, k=k) if draft is not None and cfg.batch_size == 1 else None
    attempts, stopped = len(done), False
    bar = tqdm(total=cfg.n, initial=min(len(filt.kept), cfg.n), desc="prompts kept", disable=not progress)
    with partial.open("a") as f:
        while len(filt.kept) < cfg.n and attempts < cfg.attempts:
            late = max_minutes is not None and time.perf_counter() - t0 > 60 * max_minutes
            if late or (stop_after is not None and attempts - len(done) >= stop_after):
                stopped = True
                break
            if cfg.batch_size == 1:
                turns = [_sample(target, engine, prefix_ids, cfg, attempts)]
            else:
                turns = sample_turns(target, prefix_ids, cfg, attempts // cfg.batch_size)
            for ids, ended in turns:  # a batch's turns are attempts in row order
                text = decode(ids)
                f.write(json.dumps({"attempt": attempts, "text": text, "tokens": len(ids), "hit_cap": not ended})
                        + "\n")
                attempts += 1
                filt.add(text, len(ids), not ended)
            bar.update(min(len(filt.kept), cfg.n) - bar.n)  # a batch may keep more than n: the file keeps n
            f.flush()
            bar.set_postfix(attempts=attempts)
    bar.close()
    sampler = (f"sample_turns, batches of {cfg.batch_size}" if cfg.batch_size > 1 else
               f"SpeculativeEngine, K = {k}" if engine else "autoregressive_generate")
    doc = {"seed": cfg.seed, "settings": asdict(cfg), "sampler": sampler, "complete": not stopped,
           "avoided": len(avoid),
           "attempts": attempts,
           "rejected": {**filt.rejected, "beyond_n": max(0, len(filt.kept) - cfg.n)},
           "stats": prompt_statistics(filt.kept[:cfg.n], filt.kept_tokens[:cfg.n]), "prompts": filt.kept[:cfg.n]}
    if not stopped:
        out.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
        partial.replace(finished)
    return doc


def attempts_log(out) -> Path:
    """Where a complete run of synthesize_prompts keeps its attempts, for a rerun to start from."""
    return Path(str(out) + ".attempts.jsonl")


def load_prompt_file(path) -> list[str]:
    """The prompts of a file that synthesize_prompts wrote."""
    doc = json.loads(Path(path).read_text())
    if not isinstance(doc, dict) or not isinstance(doc.get("prompts"), list):
        raise ValueError(f"path must be a prompt file written by `prompts --synthesize`, got {path}")
    return doc["prompts"]
