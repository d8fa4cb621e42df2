"""Exercise "step": one whole speculative step on the library's own pieces (core/engine.py's Engine._step,
without its records and timings).

The learner writes fn(target, cache, drafter, x0, k, sampling, generator) -> (committed, next_x0) with
the drafter protocol (core/drafter.py), the target's forward and core.verify's rule. The checker
prefills a tiny random target and a draft that is a slightly perturbed copy of it (so some steps
accept everything and some reject early), calls the learner's step in a loop at temperature 0, and
after every step checks what the protocol fixes: the target's cache holds every committed token but
the new x0 (the pending token), the drafter heard the verdict once, and the tokens are the target's own greedy decoding
(core.engine.autoregressive_generate). At the end the tokens per step must be the reference step's.
"""
import copy

import torch

from ...core.config import SamplingConfig
from ...core.drafter import Verdict
from ...core.engine import autoregressive_generate
from ...core.verify import target_draws, verify
from ...drafters import ModelDrafter
from ...io.pair import tiny_model
from .report import Exercise, Failure, call

PROMPT = [1, 2, 3]
NEW_TOKENS = 40  # tokens the check compares with the target's greedy decoding
K = 3
CAPACITY = 128  # positions in each cache: the prompt, the new tokens and a step's lookahead fit


def step(target, cache, drafter, x0, k, sampling, generator):
    """One speculative step.

    target     a Transformer: target(x, cache=cache), x (1, T) int64, returns logits (1, T, V) and
               appends the T positions to the cache
    cache      the target's KVCache: it holds every committed token but x0; cache.length is its
               length, cache.rollback(length) forgets every position from `length` on
    drafter    a drafter (core/drafter.py): drafter.propose(k, sampling, generator) returns
               (draft_ids (k,) int64, q (k, V) or None); tell it the verdict with
               drafter.commit(Verdict(drafted_list, num_accepted, next_token))
    x0         (1,) int64: the pending token, the last committed one, which the target has not read yet
    k          how many tokens to draft
    sampling   a SamplingConfig (temperature 0 is greedy)
    generator  the torch.Generator for every random draw
    Returns (committed, next_x0): the tokens the step commits, d_1..d_n and the next token (a list of
    ints), and the next token as a (1,) int64 tensor, the next step's x0.
    """
    draft_ids, q = drafter.propose(k, sampling, generator)  # 1. draft
    k = draft_ids.shape[0]  # a drafter may propose fewer
    x = torch.cat([x0, draft_ids]).view(1, k + 1)  # (1, K+1)
    logits = target(x, cache=cache)[0]  # 2. one target forward: (K+1, V)
    p, u, e = target_draws(logits, sampling, k, generator)
    n, token = verify(draft_ids, p, q, u, e, greedy=sampling.greedy).tolist()  # 3. verify
    cache.rollback(cache.length - k + n)  # 4. keep x0, d_1..d_n of the k + 1 fed
    drafter.commit(Verdict(draft_ids.tolist(), n, token))
    return draft_ids.tolist()[:n] + [token], torch.tensor([token])


class WatchedDrafter(ModelDrafter):
    """A ModelDrafter that counts the verdicts it hears: the checker reads them after each step."""

    def reset(self):
        super().reset()
        self.verdicts = []

    def commit(self, verdict, hidden=None):
        self.verdicts.append(verdict)
        super().commit(verdict, hidden)


def models():
    """A tiny target, and a copy of it with every weight perturbed by 5% of its spread as the draft."""
    target = tiny_model(0)
    draft = copy.deepcopy(target)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for w in draft.parameters():
            w.add_(0.05 * w.std() * torch.randn(w.shape, generator=g))
    return target, draft


HINTS = {
    "no_rollback": "You keep the target's keys and values of the rejected drafts: the next step's tokens attend "
                   "to text that was never committed, and the output drifts away from the target's.",
    "off_by_one_rollback": "You keep n positions of the k + 1 the step fed, instead of n + 1: x0 was fed before "
                           "the drafts, so x0 and d_1..d_n are n + 1 positions. The target forgets a committed "
                           "token every step.",
    "drafter_not_told": "You never call drafter.commit: the draft's cache keeps its rejected drafts and the draft "
                        "never hears the next token, so it drafts from the wrong text and its drafts are "
                        "accepted less often (the output stays right: verification sees to that).",
}


def _read_step(out, i):
    try:
        committed, next_c = out
        committed = [int(t) for t in (committed.tolist() if isinstance(committed, torch.Tensor) else committed)]
        next_c = torch.as_tensor(next_c).view(-1)
    except (TypeError, ValueError):
        raise Failure(f"Step {i + 1} returned {out!r}: return (committed, next_c), a list of the tokens the step "
                      f"commits and the next token as a (1,) tensor.") from None
    if not committed or next_c.shape != (1,) or int(next_c) != committed[-1]:
        raise Failure(f"Step {i + 1} returned committed = {committed} and next_c = {next_c.tolist()}: next_c "
                      f"should be the last committed token, as a (1,) tensor.")
    return committed, next_c.long()


def _check_cache(cache, before, committed, i):
    want, got = before + len(committed), cache.length
    if got == want:
        return
    diagnosis = ("no_rollback" if got == before + K + 1 else "off_by_one_rollback" if got == want - 1 else None)
    tokens = f"{len(committed)} token" + ("" if len(committed) == 1 else "s")
    raise Failure(f"After step {i + 1}, which committed {tokens}, the target's cache holds {got} positions, but it "
                  f"should hold {want}: every committed token but the new x0.", diagnosis)


def _check_told(drafter, heard_before, committed, i):
    told = drafter.verdicts[heard_before:]
    if not told:
        raise Failure(f"Step {i + 1} never told the drafter the verdict (drafter.commit was not called).",
                      "drafter_not_told")
    if len(told) > 1:
        raise Failure(f"Step {i + 1} told the drafter the verdict {len(told)} times: once per step.")
    if told[0].committed != committed:
        raise Failure(f"Step {i + 1} committed {committed}, but it told the drafter that {told[0].committed} "
                      f"were committed.")


def run_steps(fn, target, draft, baseline):
    """Call fn in a loop until NEW_TOKENS are committed, checking each step; the tokens per step."""
    cache, drafter = target.new_cache(CAPACITY), WatchedDrafter(draft, CAPACITY)
    target(torch.tensor([PROMPT[:-1]]), cache=cache)  # the prompt but x0, its last token
    drafter.prefill(PROMPT)
    x0, g, out, per_step = torch.tensor(PROMPT[-1:]), torch.Generator().manual_seed(0), [], []
    while len(out) < len(baseline):
        i, before, heard = len(per_step), cache.length, len(drafter.verdicts)
        result = call(fn, (target, cache, drafter, x0, K, SamplingConfig(), g), f"step {i + 1}")
        committed, x0 = _read_step(result, i)
        _check_cache(cache, before, committed, i)
        _check_told(drafter, heard, committed, i)
        for j, t in enumerate(committed[:len(baseline) - len(out)]):
            if t != baseline[len(out) + j]:
                raise Failure(f"Step {i + 1} commits the token {t} as new token {len(out) + j + 1}, where the "
                              f"target's own greedy decoding gives {baseline[len(out) + j]}.")
        out += committed
        per_step.append(len(committed))
    return per_step


@torch.inference_mode()
def grade_step(fn):
    target, draft = models()
    baseline = autoregressive_generate(target, PROMPT, max_new_tokens=NEW_TOKENS).tokens
    reference = run_steps(step, target, draft, baseline)
    got = run_steps(fn, target, draft, baseline)
    if got != reference:
        diff = next(i for i, (a, b) in enumerate(zip(got, reference)) if a != b)
        raise Failure(f"Your output equals the target's, but step {diff + 1} commits {got[diff]} tokens where the "
                      f"reference step commits {reference[diff]} (tokens per step: yours {got}, the reference's "
                      f"{reference}): the draft is not drafting from the committed text.")
    return (f"Your step ran {len(got)} times with K = {K} on a tiny target and a perturbed copy of it as the draft: "
            f"the {len(baseline)} tokens equal the target's greedy decoding, the target's cache and the drafter "
            f"stayed in line, and the tokens per step ({len(baseline) / len(got):.2f} on average) are the "
            f"reference's.")


STEP = Exercise("step", step, grade_step, HINTS)
