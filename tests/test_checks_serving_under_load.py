"""Chapter 13's checks (specdec_lab/lab/checks/serving_under_load.py): a server's rows give the target's
greedy answers, and the check fails on a server whose rule keeps every drafted token; the paged-memory
check holds on the chapter's workload and fails on another."""
import pytest

import specdec_lab as sl
from specdec_lab.lab import pitfalls
from specdec_lab.lab.checks import serving_under_load as checks
from specdec_lab.lab.fragmentation import simulate_fragmentation

PROMPTS = [[1, 2, 3], [4, 5, 6, 7], [8, 9], [10, 11, 12, 13, 14]]
TOKENS = 16


def test_every_row_gets_the_targets_answer_and_a_rule_that_keeps_every_draft_fails():
    target, draft = sl.tiny_model(0), sl.tiny_model(1, n_layers=1)
    references = [sl.autoregressive_generate(target, p, max_new_tokens=TOKENS) for p in PROMPTS]

    def server(verifier="token"):
        return sl.Server(target, draft, max_batch=2, k=3, max_seq_len=64, verifier=verifier)

    checks.serves_the_targets_answers(server(), PROMPTS, references, TOKENS)
    with pytest.raises(AssertionError, match="batch-1 autoregressive output"):
        checks.serves_the_targets_answers(server(pitfalls.verify_batch_keep_every_draft), PROMPTS, references, TOKENS)


def test_paged_memory_holds_on_the_chapters_workload_and_fails_on_another_seed():
    frag = dict(num_requests=200, max_len=2048, block_size=16, memory_tokens=32768, seed=0,
                k=4, acceptance=0.7, arrival_rate=4.0)
    result = simulate_fragmentation(**frag)
    ns = {"result": result, "c": result.contiguous, "p": result.paged, "kv_token": 128 * 2**10, "FRAG": frag}
    checks.paged_memory(ns)
    other = simulate_fragmentation(**{**frag, "seed": 1})
    with pytest.raises(AssertionError):
        checks.paged_memory({**ns, "result": other, "c": other.contiguous, "p": other.paged})
