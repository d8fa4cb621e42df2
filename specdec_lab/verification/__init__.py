"""Lossless verification rules beside core/verify.py's token-by-token rule, each as a pair of
twins with verify's signature: (draft_ids (K,), p (K+1, V), q (K, V) or None, u (K,), e (V,),
greedy=False) -> (2,) int64 [num_accepted, next_token].

  "token"  accept d_i while u_i < min(1, p_i(d_i) / q_i(d_i))   (arXiv 2211.17192, Algorithm 1)
  "block"  the block judged as a whole                          (arXiv 2403.10444, Algorithm 2)
  "match"  keep d_i while it equals the target's own draw       (exact match; q is not read)

RULES maps each name to its (vectorised, reference) pair.
"""
from ..core.verify import verify, verify_reference
from .block import block_weights, verify_block, verify_block_reference
from .match import target_tokens, verify_match, verify_match_reference

RULES = {
    "token": (verify, verify_reference),
    "block": (verify_block, verify_block_reference),
    "match": (verify_match, verify_match_reference),
}

__all__ = ["RULES", "block_weights", "target_tokens", "verify_block", "verify_block_reference", "verify_match",
           "verify_match_reference"]
