"""A speculative run as a table: one row per step, read from the engine's StepRecords.

    with record_forward_inputs(target) as seen:       # what the target really received
        res = engine.generate(prompt, max_new_tokens=32)
    rows = trace_rows(res.steps, tokenizer, res.prompt_ids, seen)
    print(format_trace(rows))

A row says what one step did (the algorithm's step: docs/design.md): the target's input
[x0, d_1..d_K], the drafts it accepted (d_1..d_n), the one it rejected (d_{n+1}),
the ones discarded unverified after it (d_{n+2}..d_K), and the next token: a
*correction* drawn from the residual when n < K, a *bonus* drawn from p_{K+1} when
n = K. The next token becomes the following step's x0 (the pending token), the first token of its
verification pass, so it never costs a target forward of its own; the
`target_input` column, recorded from the target's forward calls rather than
rebuilt from the records, lets a reader check that.

Plain Python over lists and dicts: no plotting (viz.py draws these rows).
"""
import re
from contextlib import contextmanager


def step_kind(rec) -> str:
    """'plain' (k = 0: a target step with no drafts), 'bonus' (all k accepted) or 'correction'."""
    if rec.k == 0:
        return "plain"
    return "bonus" if rec.num_accepted == rec.k else "correction"


@contextmanager
def record_forward_inputs(model):
    """Record the token ids of every forward call of `model` inside the block.

    Yields a list that fills with one list of ids per call (batch row 0), in call order.
    A forward pre-hook sees the tensor the caller passed, so this checks the engine from
    the outside. The hook is removed on leaving the block. When the draft is the same
    module as the target, its calls are recorded too.
    """
    calls = []

    def hook(module, args, kwargs):
        tokens = args[0] if args else kwargs["tokens"]
        calls.append([int(t) for t in tokens[0].tolist()])  # sync: tracing only, off the timed path

    handle = model.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield calls
    finally:
        handle.remove()


def _piece(tokenizer, token_id) -> str:
    return tokenizer.decode([token_id]) if tokenizer is not None else str(token_id)


def trace_rows(steps, tokenizer=None, prompt_ids=None, target_inputs=None) -> list[dict]:
    """One dict per StepRecord (see the module docstring for the columns).

    `prompt_ids` gives step 0's x0 (the prompt's last token, which the prefill leaves
    unseen). `target_inputs` is what `record_forward_inputs(target)` collected during
    the run: its last len(steps) calls are the steps' verification passes (a prefill,
    when the prompt has more than one token, comes first). Without a tokenizer the
    text columns hold the ids as strings.
    """
    if target_inputs is not None and len(target_inputs) < len(steps):
        raise ValueError(f"target_inputs holds {len(target_inputs)} forward calls, fewer than the "
                         f"{len(steps)} steps; record the whole run")
    passes = target_inputs[len(target_inputs) - len(steps):] if target_inputs is not None else None
    rows, x0 = [], (prompt_ids[-1] if prompt_ids else None)
    for i, rec in enumerate(steps):
        n, d = rec.num_accepted, list(rec.drafted)
        row = {
            "step": rec.step, "k": rec.k, "x0": x0, "drafted": d, "num_accepted": n,
            "accepted": d[:n], "rejected": d[n:n + 1], "discarded": d[n + 1:],
            "next_token": rec.next_token, "kind": step_kind(rec), "committed": list(rec.committed),
            "target_input": passes[i] if passes is not None else None,
        }
        for key in ("accepted", "rejected", "discarded", "committed"):
            row[key + "_text"] = [_piece(tokenizer, t) for t in row[key]]
        row["x0_text"] = _piece(tokenizer, x0) if x0 is not None else None
        row["next_text"] = _piece(tokenizer, rec.next_token)
        rows.append(row)
        x0 = rec.next_token
    return rows


def show_piece(piece: str) -> str:
    """A token's text made visible: escapes as repr writes them (a newline is \\n), a space as the
    open-box character, '' for a token that decodes to nothing."""
    if not piece:
        return "''"
    return "".join(ch if ch.isprintable() else "?" for ch in repr(piece)[1:-1]).replace(" ", "\u2423")


def _cell(pieces, width) -> str:
    text = " ".join(show_piece(p) for p in pieces) if pieces else "-"
    return text if len(text) <= width else text[:width - 1] + "~"


def format_trace(rows, width=22, max_rows=None) -> str:
    """A fixed-width text table of trace_rows, each token's text shown by show_piece."""
    cols = [("x0", "x0_text", 10), ("accepted d_1..d_n", "accepted_text", width),
            ("rejected", "rejected_text", 12), ("discarded", "discarded_text", width), ("next", "next_text", 12)]
    head = f"{'step':>4} {'K':>2} {'n':>2}  " + "  ".join(f"{name:{w}s}" for name, _, w in cols) + "  kind"
    lines = [head, "-" * len(head)]
    for row in rows[:max_rows]:
        cells = []
        for _, key, w in cols:
            value = row[key]
            pieces = [value] if isinstance(value, str) else (value or [])
            cells.append(f"{_cell(pieces, w):{w}s}")
        lines.append(f"{row['step']:4d} {row['k']:2d} {row['num_accepted']:2d}  " + "  ".join(cells)
                     + f"  {row['kind']}")
    if max_rows is not None and len(rows) > max_rows:
        lines.append(f"... {len(rows) - max_rows} more steps")
    return "\n".join(lines)


def check_fed_forward(rows) -> list[str]:
    """The claims of the `target_input` column, as a list of violations (empty when all hold):
    each step's verification pass is [x0, d_1..d_K], and x0 is the previous step's next token."""
    problems = []
    for prev, row in zip([None] + rows[:-1], rows):
        seen = row["target_input"]
        if seen is None:
            return ["no target_input recorded"]
        if seen != [row["x0"]] + row["drafted"]:
            problems.append(f"step {row['step']}: the target got {seen}, not [x0] + drafts")
        if prev is not None and seen[0] != prev["next_token"]:
            problems.append(f"step {row['step']}: first input {seen[0]} is not step {prev['step']}'s "
                            f"next token {prev['next_token']}")
    return problems


def card_curve(card: str) -> list[tuple[int, float]]:
    """The held-out alpha curve a draft's model card lists, as (training tokens, alpha) pairs.

    train/distill.py's card writes a line with the word 'Curve', then pairs 'tokens: alpha, ...' on the
    same line or the next; the pairs are read up to the next blank line. A card without one gives []."""
    m = re.search(r"\bCurve\b", card)
    if not m:
        return []
    block = re.split(r"\n\s*\n|\n#", card[m.end():])[0]
    return [(int(t), float(a)) for t, a in re.findall(r"(\d+)\s*:\s*(\d+\.\d+|\d+)", block)]
