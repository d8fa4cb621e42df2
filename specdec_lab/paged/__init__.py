"""Paged KV blocks (vLLM's design, arXiv 2309.06180): a block allocator and a paged cache."""
from .allocator import BlockAllocator, PoolExhaustedError, blocks_for
from .cache import PagedKVCache, PagedSequenceCache

__all__ = ["BlockAllocator", "PoolExhaustedError", "blocks_for", "PagedKVCache", "PagedSequenceCache"]
