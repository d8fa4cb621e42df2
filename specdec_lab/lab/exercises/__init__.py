"""Graded exercises: write a piece of speculative decoding, and hear which classic mistake it makes.

    from specdec_lab.lab import exercises
    exercises.names()                      # the exercises
    exercises.check("verify", my_verify)   # a Report: passed, message, diagnosis (a green or red box)
    exercises.solution("verify")           # the reference implementation
    exercises.check("verify", exercises.yours("verify", my_verify))   # in a chapter: see yours()

Each check runs the learner's function on the library's real pieces and compares it with the
reference. Where it fails, `diagnosis` names the known mistake whose behaviour it matches (the
mistakes are the ones lab/pitfalls.py and docs/design.md list: each has a candidate function that
makes it, and the one that reproduces the learner's answers is named), and the report's hint says
what that mistake does. Checks are seeded, so the same function always gets the same report.

  decode_ceiling   fn(n_params, bytes_per_param, context, kv_bytes_per_position, bandwidth) -> float:
                   batch-1 decoding's tokens/s ceiling when every token streams the weights and the cache
  verify           fn(p, q, drafted, generator) -> (n, token)   token-by-token rule, checked by its law
  verify_greedy    fn(target_logits, drafted) -> (n, token)      the greedy rule
  rollback         fn(target_len, draft_len, k, n) -> (new_target_len, new_draft_len, draft_pending)
  verify_mask      fn(prefix_len, k) -> (k + 1, prefix_len + k + 1) bool
  tree_mask        fn(parents) -> (N, N) bool
  expected_tokens  fn(alpha, k) -> float
  speedup          fn(alpha, k, c, v) -> float
  block_verify     fn(p, q, drafted, generator) -> (n, token)   block verification, checked by its law
  step             fn(target, cache, drafter, c, k, sampling, generator) -> (committed, next_c)
  lookup           fn(context, n, k) -> list: prompt lookup's drafts
  acceptance_rate  fn(p, q) -> (T,): the chance a draft from q is accepted against p, per position
  eagle_pairs      fn(tokens, states) -> (entry_tokens, entry_states, regress_to): a feature draft's entries
  best_k           fn(alpha, c, v) -> int: the K the cost model says is fastest
  blocks_to_take   fn(length, new_tokens, refs, block_size) -> int: blocks a paged sequence takes to write
  grammar_rows     fn(logits, drafted, allowed) -> (K+1, V): a grammar's mask on each verification row
  step_fates       fn(drafted, num_accepted, next_token) -> [(fate, token)]: what the demo's strip shows for a step

The modules: sampled.py (verify, block_verify, on laws.py's harness), positions.py (verify_greedy,
rollback), masks.py, cost.py, step.py, rows.py (lookup, grammar_rows), ceiling.py, training.py,
features.py, choosing.py, blocks.py and fates.py; report.py holds the report and the case-by-case grader.
"""
import os

import torch

from .blocks import BLOCKS_TO_TAKE
from .ceiling import DECODE_CEILING
from .choosing import BEST_K
from .cost import EXPECTED_TOKENS, SPEEDUP
from .fates import STEP_FATES
from .features import EAGLE_PAIRS
from .masks import TREE_MASK, VERIFY_MASK
from .positions import ROLLBACK, VERIFY_GREEDY
from .rows import GRAMMAR_ROWS, LOOKUP
from .report import Failure, NotWritten, Report
from .sampled import BLOCK_VERIFY, VERIFY
from .step import STEP
from .training import ACCEPTANCE_RATE

EXERCISES = {e.name: e for e in (DECODE_CEILING, VERIFY, VERIFY_GREEDY, ROLLBACK, VERIFY_MASK, TREE_MASK, EXPECTED_TOKENS,
                                 SPEEDUP, BLOCK_VERIFY, STEP, LOOKUP, ACCEPTANCE_RATE, EAGLE_PAIRS, BEST_K,
                                 BLOCKS_TO_TAKE, GRAMMAR_ROWS, STEP_FATES)}


def names() -> list:
    """The exercises, in the order the chapters meet them."""
    return list(EXERCISES)


def _exercise(name):
    if name not in EXERCISES:
        raise ValueError(f"no exercise named {name!r}; the exercises are {', '.join(map(repr, EXERCISES))}")
    return EXERCISES[name]


def solution(name):
    """The reference implementation of exercise `name`, a function with the learner's signature."""
    return _exercise(name).solution


IMPLEMENTATION = "SPECDEC_LAB_EXERCISES"  # "reference": the chapters' exercise cells grade the reference


def yours(name, fn):
    """What a chapter's exercise cell grades: your `fn`, or the reference where the environment says
    SPECDEC_LAB_EXERCISES=reference (`make test` sets it, so that the stored chapters show the check
    passing; a learner's kernel does not, so the cell grades what the learner wrote)."""
    choice = os.environ.get(IMPLEMENTATION, "yours")
    if choice not in ("yours", "reference"):
        raise ValueError(f"{IMPLEMENTATION} must be yours or reference, got {choice!r}")
    return solution(name) if choice == "reference" else fn


def check(name, fn) -> Report:
    """Run the learner's `fn` through exercise `name`'s checks; a Report says how it went.
    The global torch random state is saved and restored, and seeded inside, so a function that
    draws without the generator it is given still gets the same report every time."""
    exercise = _exercise(name)
    if not callable(fn):
        raise ValueError(f"check({name!r}, fn) needs a function as fn, got {type(fn).__name__}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        try:
            return Report(name, True, exercise.grade(fn), reference=fn is exercise.solution)
        except NotWritten:
            return Report(name, False, f"You have not written {name} yet: your function raises "
                                       f"NotImplementedError. Replace that line with your code and check again.")
        except Failure as failure:
            return Report(name, False, failure.message, failure.diagnosis,
                          exercise.mistakes.get(failure.diagnosis, ""))


__all__ = ["EXERCISES", "Report", "check", "names", "solution", "yours"]
