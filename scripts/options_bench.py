"""Structured output under speculation, measured: the lab beside vLLM for CPU on the same requests
(docs/options.json, docs/options.png, docs/benchmarks.md section 40).

    OMP_NUM_THREADS=1 python scripts/options_bench.py [--rounds 2] [--max-new-tokens 96] [--no-vllm]

Eight requests for a JSON record (a person, a book, a city, a planet), each with its JSON Schema, greedy,
on the default pair with K = 3 drafted per step. The lab's systems: plain decoding under the schema
(`autoregressive_generate` with the grammar's processor), speculative decoding under the schema with
the grammar drafter (the tokens the grammar forces proposed with no draft forward), without it, and
with the draft proposing without the mask (verification still masks p: exact, as vLLM drafts), and
speculative and plain decoding of the same requests as free text, no schema. Each call is timed whole,
prefill included, the systems in an order rotated from round to round; a request's figure is each
system's fastest round. Every schema answer is validated (jsonschema); every speculative answer is
compared with the plain decoding of the same request and schema, token for token.

Then vLLM for CPU (.venv-vllm, `make peers`) on the same target and the lab's draft exported for it,
K = 3, eager, one thread: the same requests through its OpenAI server with response_format json_schema
(its default structured-output backend) and without, one round; its own speculative counters for each
set, its answers validated, and compared with the lab's.
"""
import argparse
import json
import time
from datetime import datetime, timezone
from pathlib import Path

import jsonschema
import torch

import specdec_lab as sl
from specdec_lab.core.text import encode_prompt
from specdec_lab.options import GrammarProcessor, compile_grammar, request_processor

K = 3
STR = {"type": "string", "maxLength": 40}
LIST = {"type": "array", "items": {"type": "string", "maxLength": 30}, "maxItems": 3}


def obj(**props):
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


REQUESTS = [
    ("Give Ada Lovelace as JSON: her name, her age (36) and up to three languages she knew.",
     obj(name=STR, age={"type": "integer", "minimum": 0}, languages=LIST)),
    ("Describe Marie Curie as JSON with her name, her field and the year she was born.",
     obj(name=STR, field=STR, born={"type": "integer"})),
    ("Return the book Pride and Prejudice as JSON: title, author, year and up to three genres.",
     obj(title=STR, author=STR, year={"type": "integer"}, genres=LIST)),
    ("Give the novel Dune as a JSON record with its title, its author and whether it is science fiction.",
     obj(title=STR, author=STR, science_fiction={"type": "boolean"})),
    ("Describe Paris as JSON: name, country, population in millions and up to three landmarks.",
     obj(name=STR, country=STR, population_millions={"type": "number"}, landmarks=LIST)),
    ("Return Tokyo as a JSON object with its name, its country and the language spoken there.",
     obj(name=STR, country=STR, language=STR)),
    ("Describe the planet Mars as JSON: its name, its number of moons and whether it has rings.",
     obj(name=STR, moons={"type": "integer", "minimum": 0}, rings={"type": "boolean"})),
    ("Give Jupiter as JSON with its name, its position from the sun and up to three of its moons.",
     obj(name=STR, position={"type": "integer"}, moons=LIST)),
]
SYSTEMS = ("plain, schema", "speculative, schema", "speculative, schema, no grammar drafter",
           "speculative, schema, draft unmasked", "speculative, free text", "plain, free text")


def run_lab(pair, ids, schema, system, max_new):
    """One call of a system: (tokens, seconds, steps, forced drafted, forced accepted)."""
    target, tok, cfg = pair.target, pair.tokenizer, pair.target.cfg
    grammar = "schema" in system
    if system.startswith("plain"):
        proc = request_processor(tok, cfg.vocab_size, grammar=schema, eos_ids=cfg.eos_token_ids) if grammar else None
        t0 = time.perf_counter()
        out = sl.autoregressive_generate(target, ids, max_new_tokens=max_new, processor=proc)
        return out.tokens, time.perf_counter() - t0, out.stats.steps, 0, 0
    engine = run_lab.engine
    proc = None
    if grammar:
        free_draft = "draft unmasked" in system  # the draft proposes without the mask, as vLLM's does
        proc = GrammarProcessor(compile_grammar(schema, tok, cfg.vocab_size, cfg.eos_token_ids),
                                jump_forward="no grammar drafter" not in system and not free_draft,
                                mask_draft=not free_draft)
    d = engine.drafter
    before = (d.forced_drafted, d.forced_accepted)
    t0 = time.perf_counter()
    out = engine.generate(ids, max_new_tokens=max_new, processor=proc)
    seconds = time.perf_counter() - t0
    return out.tokens, seconds, out.stats.steps, d.forced_drafted - before[0], d.forced_accepted - before[1]


def valid(text, schema) -> bool:
    try:
        jsonschema.validate(json.loads(text), schema)
        return True
    except (ValueError, jsonschema.ValidationError):
        return False


def lab_side(pair, rounds, max_new, log):
    ids = [encode_prompt(pair.tokenizer, p) for p, _ in REQUESTS]
    run_lab.engine = sl.SpeculativeEngine(pair.target, pair.draft, k=K)
    best = {s: [None] * len(REQUESTS) for s in SYSTEMS}
    for r in range(rounds + 1):  # round 0 warms up (compiles the grammars, builds the kernels' copies)
        for i, (_, schema) in enumerate(REQUESTS):
            order = SYSTEMS[r % len(SYSTEMS):] + SYSTEMS[:r % len(SYSTEMS)]
            for s in order:
                got = run_lab(pair, ids[i], schema, s, max_new)
                if r and (best[s][i] is None or got[1] < best[s][i][1]):
                    best[s][i] = got
        log(f"round {r} of {rounds} done")
    out = {}
    for s in SYSTEMS:
        rows = best[s]
        tokens, seconds, steps = (sum(len(x[0]) for x in rows), sum(x[1] for x in rows), sum(x[2] for x in rows))
        out[s] = {"tokens": tokens, "seconds": round(seconds, 3), "tokens_per_second": round(tokens / seconds, 2),
                  "tokens_per_step": round(tokens / steps, 3), "steps": steps,
                  "forced_drafted": sum(x[3] for x in rows), "forced_accepted": sum(x[4] for x in rows),
                  "answers": [x[0] for x in rows]}
        if "schema" in s:
            out[s]["valid"] = sum(valid(pair.tokenizer.decode(x[0], skip_special_tokens=True), sch)
                                  for x, (_, sch) in zip(rows, REQUESTS))
    plain = out["plain, schema"]["answers"]
    for s in ("speculative, schema", "speculative, schema, no grammar drafter", "speculative, schema, draft unmasked"):
        out[s]["equal_to_plain"] = sum(a == b for a, b in zip(out[s]["answers"], plain))
    out["speculative, free text"]["equal_to_plain"] = sum(
        a == b for a, b in zip(out["speculative, free text"]["answers"], out["plain, free text"]["answers"]))
    return out


def vllm_side(pair, max_new, log):
    from specdec_lab.bench.exports import engine_files
    from specdec_lab.bench.vllm_server import VllmServer, counts_since
    import urllib.request
    files = engine_files(log)
    spec = {"method": "draft_model", "model": str(files["token_hf"]), "num_speculative_tokens": K}
    log("starting vLLM for CPU with the exported draft (a few minutes) ...")
    out = {}
    with VllmServer(files["target_dir"], spec, threads=1) as server:
        def ask(prompt, schema):
            body = {"model": str(files["target_dir"]), "messages": [{"role": "user", "content": prompt}],
                    "max_tokens": max_new, "temperature": 0.0, "return_token_ids": True}
            if schema is not None:
                body["response_format"] = {"type": "json_schema", "json_schema": {"name": "record", "schema": schema}}
            req = urllib.request.Request(f"{server.base_url}/v1/chat/completions", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
            t0 = time.perf_counter()
            with urllib.request.urlopen(req, timeout=600) as r:
                doc = json.loads(r.read())
            return doc["choices"][0], time.perf_counter() - t0
        ask(REQUESTS[0][0], REQUESTS[0][1])  # warm-up: the first grammar compiles
        for label, with_schema in (("vLLM speculative, schema", True), ("vLLM speculative, free text", False)):
            before = server.spec_counters()
            answers, seconds, tokens, ok = [], 0.0, 0, 0
            for prompt, schema in REQUESTS:
                choice, s = ask(prompt, schema if with_schema else None)
                ids = choice.get("token_ids") or []
                answers.append(ids)
                seconds, tokens = seconds + s, tokens + len(ids)
                ok += with_schema and valid(choice["message"]["content"], schema)
            c = counts_since(before, server.spec_counters())
            out[label] = {"tokens": tokens, "seconds": round(seconds, 3), "tokens_per_second": round(tokens / seconds, 2),
                          "drafts": c["drafts"], "draft_tokens": c["draft_tokens"], "accepted": c["accepted"],
                          "accepted_share": round(c["accepted"] / c["draft_tokens"], 3) if c["draft_tokens"] else None,
                          "tokens_per_step": round(1 + c["accepted"] / c["drafts"], 3) if c["drafts"] else None,
                          "answers": answers}
            if with_schema:
                out[label]["valid"] = ok
            log(f"{label}: {tokens} tokens in {seconds:.1f} s")
    return out


def figure(doc, path):
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots
    from specdec_lab.lab.static_figures import png
    systems = list(doc["lab"]) + list(doc.get("vllm", {}))
    rows = {**doc["lab"], **doc.get("vllm", {})}
    fig = make_subplots(rows=1, cols=2, subplot_titles=("tokens per second", "tokens per step"))
    colours = ["#4c78a8" if "schema" in s else "#9ecae9" for s in systems]
    fig.add_bar(y=systems, x=[rows[s]["tokens_per_second"] for s in systems], orientation="h", marker_color=colours,
                row=1, col=1, showlegend=False)
    fig.add_bar(y=systems, x=[rows[s]["tokens_per_step"] or 0 for s in systems], orientation="h",
                marker_color=colours, row=1, col=2, showlegend=False)
    fig.update_yaxes(autorange="reversed")
    fig.update_yaxes(showticklabels=False, row=1, col=2)  # the same systems, in the same order
    fig.update_layout(title="JSON Schema against free text, the same 8 requests, greedy, K = 3 (one thread)",
                      height=420, margin=dict(l=260))
    Path(path).write_bytes(png(fig, width=1100, height=420))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=2, help="timed rounds after a warm-up round (default 2)")
    p.add_argument("--max-new-tokens", type=int, default=96, help="each answer's budget (default 96)")
    p.add_argument("--no-vllm", action="store_true", help="leave vLLM out (default: run it)")
    p.add_argument("--out", default="docs/options.json", help="where to store the document (default docs/options.json)")
    args = p.parse_args()
    torch.set_num_threads(1)
    log = lambda s: print(s, flush=True)  # noqa: E731
    pair = sl.load_default_pair()
    doc = {"measured_at": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "command": "OMP_NUM_THREADS=1 python scripts/options_bench.py", "k": K, "threads": 1,
           "max_new_tokens": args.max_new_tokens, "requests": [p for p, _ in REQUESTS],
           "lab": lab_side(pair, args.rounds, args.max_new_tokens, log)}
    for s, row in doc["lab"].items():
        log(f"{s:42s} {row['tokens_per_second']:6.2f} tokens/s, {row['tokens_per_step']:.2f} tokens/step, "
            f"forced {row['forced_accepted']}/{row['forced_drafted']}, valid {row.get('valid', '-')}")
    if not args.no_vllm:
        try:
            doc["vllm"] = vllm_side(pair, args.max_new_tokens, log)
        except (RuntimeError, OSError, KeyError) as err:  # stored, so that the lab's side is kept and the cause said
            doc["vllm_error"] = f"{type(err).__name__}: {err}"[-3000:]
            log(f"vLLM's side failed: {doc['vllm_error']}")
        else:
            lab = doc["lab"]["speculative, schema"]["answers"]
            doc["vllm"]["vLLM speculative, schema"]["equal_to_lab"] = sum(
                a == b for a, b in zip(doc["vllm"]["vLLM speculative, schema"]["answers"], lab))
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    figure(doc, Path(args.out).with_suffix(".png"))
    log(f"stored {args.out} and {Path(args.out).with_suffix('.png')}")


if __name__ == "__main__":
    main()
