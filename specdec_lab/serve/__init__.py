"""Serving many requests at once: the batched speculative step, its caches, and the scheduler.

kv (paged rows and their padded twin), forward (the decoder over ragged rows), verify (the batch's
verdict on the device), engine (the step), scheduler (continuous batching: Server), policy (K by load).
"""
from .engine import BatchEngine, BatchRecord, Sequence, make_sequence, run_to_completion
from .kv import PaddedBatchKV, PagedBatchKV
from .policy import GoodputPolicy, KSchedule, measure_step_costs
from .scheduler import Completion, Handle, RequestFailed, Server, StepError
from .verify import (BATCH_RULES, num_accepted, verify_batch, verify_batch_reference, verify_block_batch,
                     verify_match_batch, verify_rows)

__all__ = ["BatchEngine", "BatchRecord", "Sequence", "make_sequence", "run_to_completion", "PaddedBatchKV",
           "PagedBatchKV", "BATCH_RULES", "num_accepted", "verify_batch", "verify_batch_reference",
           "verify_block_batch", "verify_match_batch", "verify_rows", "Completion", "Handle",
           "RequestFailed", "StepError", "Server", "GoodputPolicy", "KSchedule", "measure_step_costs"]
