"""A key/value cache of fixed shapes, for compiled forwards (gpt-fast's model.py does the same).

Every forward reads the whole capacity: the new positions are written by index at
`input_pos` (no Python length reaches the graph), and the attention mask rows are
gathered from one (S, S) causal mask made here once. Slots past the committed length
hold stale keys from rejected drafts; the mask hides them. The length bookkeeping
(reserve, advance, rollback) is KVCache's.
"""
import torch
import torch.nn.functional as F

from ..core.kv_cache import KVCache


class StaticKVCache(KVCache):
    def __init__(self, n_layers, batch_size, n_kv_heads, capacity, head_dim, dtype=torch.float32, device="cpu"):
        super().__init__(n_layers, batch_size, n_kv_heads, capacity, head_dim, dtype, device)
        # (S, S): row i allows columns 0..i. A forward at positions input_pos uses rows causal[input_pos].
        self.causal = torch.ones(capacity, capacity, dtype=torch.bool, device=device).tril()
        if self.k.device.type == "cuda":
            # CUDA graphs replay fixed addresses: a graph may write these buffers in place only if they
            # are marked as living at one address for good. torch has no public name for this yet;
            # transformers' StaticCache uses the same function.
            from torch._dynamo import mark_static_address
            for t in (self.k, self.v, self.causal):
                mark_static_address(t)

    def mask_rows(self, input_pos: torch.Tensor) -> torch.Tensor:
        """The boolean mask (1, 1, T, S) for new tokens at input_pos (True = attend)."""
        return self.causal[input_pos].unsqueeze(0).unsqueeze(0)

    def attend(self, layer, q, k, v, mask, input_pos=None):
        """Write one layer's new keys/values (B, Hkv, T, D) at input_pos (T,) and attend over the
        whole capacity (B, Hkv, S, D) with `mask` (T rows over S columns)."""
        self.k[layer].index_copy_(2, input_pos, k)
        self.v[layer].index_copy_(2, input_pos, v)
        return F.scaled_dot_product_attention(q, self.k[layer], self.v[layer], attn_mask=mask, enable_gqa=True)
