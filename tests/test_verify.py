import torch

from specdec_lab.core.verify import verify, verify_reference


def _case(K, V, seed, zero_q_at=None, equal_at=None):
    g = torch.Generator().manual_seed(seed)
    p = torch.rand(K + 1, V, generator=g) ** 3
    p = p / p.sum(-1, keepdim=True)
    q = torch.rand(K, V, generator=g) ** 3
    q = q / q.sum(-1, keepdim=True)
    d = torch.multinomial(q, 1, generator=g).view(K)
    if zero_q_at is not None:
        q[zero_q_at, d[zero_q_at]] = 0.0
    if equal_at is not None:
        q[equal_at] = p[equal_at]
    u = torch.rand(K, generator=g)
    e = torch.empty(V).exponential_(generator=g)
    return d, p, q, u, e


def test_vectorised_verify_matches_the_reference_loop_for_the_same_uniforms():
    outcomes = set()
    for seed in range(300):
        K = 1 + seed % 8
        d, p, q, u, e = _case(K, 7, seed)
        fast, ref = verify(d, p, q, u, e), verify_reference(d, p, q, u, e)
        assert fast.tolist() == ref.tolist(), f"seed {seed}: device verify {fast} != reference {ref}"
        outcomes.add(int(fast[0]) == K)
    assert outcomes == {True, False}, "the cases must cover both a rejection and all-accepted (bonus)"


def test_draft_token_with_zero_draft_probability_is_rejected_without_nan():
    d, p, q, u, e = _case(3, 5, 1, zero_q_at=0)
    out = verify(d, p, q, u, e)
    assert int(out[0]) == 0, "q(d) = 0 must reject"
    assert verify_reference(d, p, q, u, e).tolist() == out.tolist()


def test_all_zero_residual_falls_back_to_p():
    d, p, q, u, e = _case(2, 5, 3, equal_at=0)
    q[0, d[0]] = p[0, d[0]] * 1.5  # q >= p everywhere at position 0: max(0, p - q) is all zeros
    u[0] = 0.99  # and p(d)/q(d) = 2/3 < 0.99: rejected
    out, ref = verify(d, p, q, u, e), verify_reference(d, p, q, u, e)
    assert out.tolist() == ref.tolist()
    assert int(out[0]) == 0
    assert int(out[1]) == int((p[0] / e).argmax()), "an all-zero residual must fall back to p"


def test_greedy_accepts_while_target_argmax_agrees_then_takes_the_target_argmax():
    p = torch.zeros(4, 6)
    p[0, 2] = p[1, 4] = p[2, 1] = p[3, 5] = 1.0  # target's greedy tokens: 2, 4, 1, then bonus 5
    e = torch.ones(6)
    for drafted, expect in [([2, 4, 1], [3, 5]), ([2, 4, 0], [2, 1]), ([3, 4, 1], [0, 2])]:
        d = torch.tensor(drafted)
        assert verify(d, p, None, None, e, greedy=True).tolist() == expect
        assert verify_reference(d, p, None, None, e, greedy=True).tolist() == expect


def test_residual_is_the_only_distribution_drawn_after_a_rejection():
    # p puts mass on 0 and 1; q puts all mass on 1. After rejecting d = 1, only token 0 is possible.
    p = torch.tensor([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]])
    q = torch.tensor([[0.0, 1.0, 0.0]])
    d, u = torch.tensor([1]), torch.tensor([0.9])  # 0.9 >= p/q = 0.5: reject
    for seed in range(20):
        e = torch.empty(3).exponential_(generator=torch.Generator().manual_seed(seed))
        assert verify(d, p, q, u, e).tolist() == [0, 0]
