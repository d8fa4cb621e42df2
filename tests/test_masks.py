import torch

from specdec_lab.core.masks import verification_mask, verification_mask_reference


def test_vectorised_mask_equals_reference_loop_for_many_shapes():
    for L in range(0, 12):
        for T in range(1, 10):
            fast, ref = verification_mask(L, T), verification_mask_reference(L, T)
            assert fast.shape == (1, 1, T, L + T)
            assert torch.equal(fast, ref), f"mask differs from the reference at L={L}, T={T}"


def test_each_new_token_sees_the_cache_and_itself_but_not_later_drafts():
    m = verification_mask(5, 4)[0, 0]
    for i in range(4):
        assert (m[i, :5 + i + 1] == 0).all(), "a new token must see the whole cache and itself"
        assert torch.isinf(m[i, 5 + i + 1:]).all(), "a draft token leaked into an earlier position"


def test_mask_broadcasts_to_the_batch():
    assert verification_mask(3, 2, batch_size=4).shape == (4, 1, 2, 5)
