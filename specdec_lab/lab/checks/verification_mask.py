"""Chapter 05's checks: what a correct verification pass satisfies, and the figures the chapter quotes."""
import torch

from ...api import SpeculativeEngine
from ...core.kv_cache import KVCache
from ...core.masks import verification_mask, verification_mask_reference


def verification_pass(model, ids, drafts, draft_model, baseline_tokens):
    """A correct target's verification pass: one masked pass over [x_0, d_1..d_K] matches K+1
    single-token passes within 1e-3 in every logit (float32 rounding allows far less, a leak moves
    logits by whole units), and speculative greedy decoding with `draft_model` reproduces the target's
    greedy tokens `baseline_tokens`."""
    k = len(drafts)
    x = torch.tensor([[ids[-1]] + list(drafts)])                        # (1, K+1): x_0, d_1..d_K

    def logits(one_pass):
        cache = KVCache.for_model(model.cfg, len(ids) + k + 1)
        model(torch.tensor([ids[:-1]]), cache=cache)
        if one_pass:
            return model(x, cache=cache)[0]                                              # (K+1, V)
        return torch.cat([model(x[:, i:i + 1], cache=cache)[0] for i in range(k + 1)])  # (K+1, V)

    with torch.no_grad():
        gap = (logits(True) - logits(False)).abs().max().item()
    assert gap < 1e-3, "one masked K+1 pass must match K+1 single-token passes within 1e-3"
    res = SpeculativeEngine(model, draft_model, k=k).generate(ids, max_new_tokens=len(baseline_tokens))
    assert res.tokens == list(baseline_tokens), "speculative greedy must equal the target's greedy"


def figures(forward_kind, masked, single, diff_unmasked, random_draft_probs, accepted_shares):
    """The chapter's figures: the fused forward equal bit for bit, every position off by whole logits
    without the mask, answer 1's counts, and the leak raising the accepted share of a random draft.
    `random_draft_probs` is None for a greedy draft, else (p masked, p unmasked) at the drafted tokens."""
    assert all(torch.equal(verification_mask(L, T), verification_mask_reference(L, T))
               for L in range(10) for T in range(1, 10)), "the vectorised mask differs from the reference loop"
    assert forward_kind == "cpu-fused" and torch.equal(masked, single), "the prose: the fused forward, bit for bit"
    assert min(diff_unmasked) > 1.0, f"without the mask every position should move by whole logits: {diff_unmasked}"
    mask_6_5 = verification_mask(6, 5).reshape(5, 11)
    assert int(torch.isinf(mask_6_5).sum()) == 10 == 4 * 5 // 2, "answer 1: K(K+1)/2 hidden entries"
    assert int(torch.isfinite(mask_6_5[-1]).sum()) == 11, "answer 1: the last row sees all L + K + 1 keys"
    if random_draft_probs is not None:
        p_masked, p_unmasked = random_draft_probs
        assert float(p_masked.max()) < 1e-2, "the masked target should find random tokens unlikely"
        assert float(p_unmasked.max()) > 0.1, "without the mask, some random token should look likely"
    with_mask, without = accepted_shares
    assert without > with_mask, f"the leak should raise the accepted share ({without:.2f} against {with_mask:.2f})"
