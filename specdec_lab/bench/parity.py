"""`bench --parity`: does every shape the lab verifies run as fast as the single chain?

The engines verify in four shapes: one sequence's chain (the single engine), the same request inside
the batched server, a token tree, and a chain whose forward also hands out layer states (EAGLE-3's
target). All four go through the CPU's one call (cpu/fused.py); this measures that they cost what
the chain costs, side by side in one run, so that a comparison between methods measures the methods:

  server / engine   the Server at batch 1 over the single engine on the same greedy request, tokens/s,
                    plain decoding and K = 2 and 4 (the answers must be the same tokens)
  tree / chain      the chain (1, 1, 1, 1) run as a tree over SpeculativeEngine with K = 4, tokens/s
  eagle3 / plain    the target's forward over K + 1 rows with EAGLE-3's layer states and the head,
                    over the plain forward of the same rows, seconds
  batch rows        one batched target forward over B sequences x (K + 1) rows, seconds, over B = 1

Each ratio comes with a paired bootstrap interval over its rounds (bench.run.ratio_interval): the
two systems run one after the other in each round, in alternating order.
"""
import time

import torch

from ..api import SpeculativeEngine
from ..core.engine import autoregressive_generate
from ..core.text import encode_prompt
from ..drafters.eagle3 import default_hidden_layers
from ..serve import BatchEngine, Server
from ..serve.engine import make_sequence
from ..serve.forward import logits as batch_logits
from ..train.handwritten import HANDWRITTEN_PROMPTS
from ..tree.engine import TreeEngine
from .run import ratio_interval

QUICK_PARITY = {"prompts": 2, "max_new_tokens": 16, "rounds": 5}
KS = (0, 2, 4)
BATCHES = (1, 2, 4, 8)


def _clock(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def _paired(run_a, run_b, items):
    """Run a and b on every item, alternating which goes first; returns per-item (tokens, seconds) lists."""
    a_tok, a_sec, b_tok, b_sec = [], [], [], []
    for i, item in enumerate(items):
        order = [(run_a, a_tok, a_sec), (run_b, b_tok, b_sec)]
        for run, toks, secs in (order if i % 2 == 0 else order[::-1]):
            seconds, tokens = _clock(lambda: run(item))
            toks.append(tokens)
            secs.append(seconds)
    return a_tok, a_sec, b_tok, b_sec


def _ratio(a_tok, a_sec, b_tok, b_sec) -> dict:
    """(a's tokens/s) / (b's tokens/s) with its paired interval."""
    value = (sum(a_tok) / sum(a_sec)) / (sum(b_tok) / sum(b_sec))
    return {"ratio": round(value, 4), "interval": [round(x, 4) for x in ratio_interval(a_tok, a_sec, b_tok, b_sec)
                                                   or (value, value)], "rounds": len(a_tok)}


def server_over_engine(target, draft, prompts, k, tokens, log) -> dict:
    """The Server at batch 1 over the single engine, greedy, on the same prompts: tokens/s."""
    engine = None if k == 0 else SpeculativeEngine(target, draft, k=k, max_seq_len=1024)
    server = Server(target, draft if k else None, max_batch=1, k=k, max_seq_len=1024)
    answers = {}

    def single(x):
        out = (autoregressive_generate(target, x, max_new_tokens=tokens) if engine is None
               else engine.generate(x, max_new_tokens=tokens)).tokens
        answers.setdefault(id(x), {})["engine"] = out
        return len(out)

    def served(x):
        h = server.submit(x, max_new_tokens=tokens)
        server.run_until_idle()
        out = h.result().tokens
        answers.setdefault(id(x), {})["server"] = out
        return len(out)

    single(prompts[0]), served(prompts[0])  # warm-up: panels, buffers, the pool
    result = _ratio(*_paired(served, single, prompts))
    result["same_answers"] = all(a["engine"] == a["server"] for a in answers.values())
    log(f"server / engine, K = {k}: {result['ratio']:.3f} {result['interval']}")
    return result


def tree_over_chain(target, draft, prompts, tokens, log) -> dict:
    """The chain (1, 1, 1, 1) as a tree over the chain engine with K = 4: tokens/s."""
    tree = TreeEngine(target, draft, tree=(1, 1, 1, 1), max_seq_len=1024)
    chain = SpeculativeEngine(target, draft, k=4, max_seq_len=1024)
    run_tree = lambda x: len(tree.generate(x, max_new_tokens=tokens).tokens)  # noqa: E731
    run_chain = lambda x: len(chain.generate(x, max_new_tokens=tokens).tokens)  # noqa: E731
    run_tree(prompts[0]), run_chain(prompts[0])
    result = _ratio(*_paired(run_tree, run_chain, prompts))
    log(f"tree (1, 1, 1, 1) / chain K = 4: {result['ratio']:.3f} {result['interval']}")
    return result


def _forward_seconds(fn, rounds):
    """Per round, the seconds of one call of fn (after one warm-up call)."""
    fn()
    return [_clock(fn)[0] for _ in range(rounds)]


def eagle3_over_plain(target, k, context, rounds, log) -> dict:
    """The target's forward over K + 1 rows after `context` positions with EAGLE-3's layer states
    (and the head over the final states, as the engine's step runs it) over the plain forward."""
    layers = default_hidden_layers(target.cfg.n_layers)
    g = torch.Generator().manual_seed(0)
    V = target.cfg.vocab_size
    cache = target.new_cache(context + k + 1)
    target(torch.randint(0, V, (1, context), generator=g), cache=cache)
    x = torch.randint(0, V, (1, k + 1), generator=g)

    def states():
        final, _ = target.hidden(x, cache=cache, layers=layers)
        target.head(final[0]).float()
        cache.rollback(context)
        return k + 1

    def plain():
        target(x, cache=cache)
        cache.rollback(context)
        return k + 1

    a_tok, a_sec, b_tok, b_sec = _paired(lambda _: states(), lambda _: plain(), range(rounds))
    result = _ratio(b_tok, b_sec, a_tok, a_sec)  # seconds of a over seconds of b: the inverse of tokens/s
    result["layers"] = list(layers)
    log(f"EAGLE-3 target forward / plain, {k + 1} rows at {context}: {result['ratio']:.3f} {result['interval']}")
    return result


def batch_rows(target, k, context, rounds, log) -> dict:
    """One batched target forward over B sequences x (K + 1) rows after `context` positions each:
    seconds at each B, and over B = 1 (with its paired interval)."""
    engine = BatchEngine(target, None, num_blocks=max(BATCHES) * (context // 16 + 2), max_seq_len=1024)
    g = torch.Generator().manual_seed(1)
    V = target.cfg.vocab_size
    seqs = [make_sequence(torch.randint(0, V, (context,), generator=g).tolist(), 2) for _ in range(max(BATCHES))]
    engine.prefill(seqs)
    ids = [s.seq_id for s in seqs]

    def forward(B):
        x = torch.randint(0, V, (B, k + 1), generator=g)
        batch_logits(target, engine.target_kv.view(ids[:B], [k + 1] * B), x)
        for s in ids[:B]:
            engine.target_kv.rollback(s, context - 1)
        return 1

    out = {}
    for B in BATCHES[1:]:
        a_tok, a_sec, b_tok, b_sec = _paired(lambda _: forward(B), lambda _: forward(1), range(rounds))
        r = _ratio(b_tok, b_sec, a_tok, a_sec)
        out[str(B)] = {"rows": B * (k + 1), "seconds_over_batch_1": r["ratio"], "interval": r["interval"],
                       "batch_1_ms": round(1e3 * sorted(b_sec)[len(b_sec) // 2], 2),
                       "ms": round(1e3 * sorted(a_sec)[len(a_sec) // 2], 2)}
        log(f"batched forward, {B} x {k + 1} rows / 1 x {k + 1}: {r['ratio']:.3f}")
    engine.release(seqs)
    return out


@torch.inference_mode()
def run_parity(target, draft, prompts=6, max_new_tokens=48, rounds=15, context=256, log=print) -> dict:
    """Every measurement above; prompts from the hand-written held-out set, in the chat template."""
    texts = HANDWRITTEN_PROMPTS[:prompts]
    ids = [encode_prompt(getattr(target, "tokenizer", None), t) for t in texts]
    doc = {"threads": torch.get_num_threads(), "prompts": len(ids), "max_new_tokens": max_new_tokens,
           "rounds": rounds, "context": context, "forward_kind": target.forward_kind}
    doc["server_over_engine"] = {str(k): server_over_engine(target, draft, ids, k, max_new_tokens, log) for k in KS}
    doc["tree_over_chain"] = tree_over_chain(target, draft, ids, max_new_tokens, log)
    doc["eagle3_over_plain"] = eagle3_over_plain(target, 4, context, rounds, log)
    doc["batch_rows"] = batch_rows(target, 4, context, rounds, log)
    return doc


def format_parity(doc) -> str:
    def cell(r):
        lo, hi = r["interval"]
        return f"{r['ratio']:.3f} [{lo:.3f}, {hi:.3f}]"
    lines = [f"parity ({doc['threads']} thread(s), {doc['prompts']} prompts x {doc['max_new_tokens']} tokens, "
             f"forward {doc['forward_kind']}): ratio [95% paired interval]"]
    for k, r in doc["server_over_engine"].items():
        same = "same answers" if r["same_answers"] else "ANSWERS DIFFER"
        lines.append(f"  server batch 1 / engine, {'plain' if k == '0' else 'K = ' + k}: {cell(r)}  "
                     f"(tokens/s; {same})")
    lines.append(f"  tree (1, 1, 1, 1) / chain K = 4: {cell(doc['tree_over_chain'])}  (tokens/s)")
    lines.append(f"  EAGLE-3 target forward / plain forward, 5 rows at {doc['context']}: "
                 f"{cell(doc['eagle3_over_plain'])}  (seconds)")
    for B, r in doc["batch_rows"].items():
        lines.append(f"  batched forward, {B} sequences x 5 rows / 1 x 5: {r['seconds_over_batch_1']:.3f} "
                     f"({r['ms']:.1f} ms vs {r['batch_1_ms']:.1f} ms)")
    return "\n".join(lines)
