"""Exercise "acceptance_rate" (chapter 09): the chance that the token rule accepts a draft, per position.

At position t the draft proposes x ~ q_t and the token-by-token rule keeps it with probability
min(1, p_t(x) / q_t(x)) (arXiv 2211.17192, Algorithm 1). Over the draft's choice of x, that is

    beta_t = sum_x q_t(x) min(1, p_t(x) / q_t(x)) = sum_x min(p_t(x), q_t(x)) = 1 - TV(p_t, q_t)

(Lemma 3.3); alpha, the acceptance rate of the speedup formula, is its mean over the positions
decoding visits. It is what a draft's training aims to raise: train/distill.py lowers the forward
KL(p || q) instead, which Pinsker's inequality ties to it (beta >= 1 - sqrt(KL / 2)), and
train/acceptance.py's measure_alpha and verification/expect.py's rates read beta itself, with the
same sum as the reference below.
"""
import torch

from .report import Exercise, Failure, grade_cases


def acceptance_rate(p, q):
    """p, q (T, V): the target's and the draft's probabilities, each row summing to 1.
    Returns (T,): beta_t = sum_v min(p_t(v), q_t(v)), the chance a draft drawn from q_t is accepted."""
    return torch.minimum(p, q).sum(-1)  # (T,)


def _q_ratio_unguarded(p, q):
    """E_{x~q}[min(1, p/q)] written as it reads: 0/0 is nan on tokens neither model gives mass."""
    return (q * torch.clamp(p / q, max=1.0)).sum(-1)


RATE_MISTAKES = [
    ("two_draws_agree", lambda p, q: (p * q).sum(-1)),
    ("greedy_agreement", lambda p, q: (p.argmax(-1) == q.argmax(-1)).to(p.dtype)),
    ("forgot_one_minus", lambda p, q: 0.5 * (p - q).abs().sum(-1)),
    ("max_not_min", lambda p, q: torch.maximum(p, q).sum(-1)),
    ("mean_not_sum", lambda p, q: torch.minimum(p, q).mean(-1)),
    ("nan_where_q_is_zero", _q_ratio_unguarded),
]

RATE_HINTS = {
    "two_draws_agree": "You computed sum p * q, the chance that a token drawn from q and another drawn from p "
                       "are the same token. The rule does not wait for a second draw to agree: it keeps a draft x "
                       "with probability min(1, p(x) / q(x)), so token x contributes min(p(x), q(x)), which is "
                       "never less than p(x) * q(x).",
    "greedy_agreement": "You checked whether the two models' top tokens agree. That is the acceptance rate at "
                        "temperature 0, where p and q are one-hot (the chapter's held-out greedy agreement). Here "
                        "both sample, and a draft that is not the top token is still accepted with probability "
                        "min(1, p / q): sum min(p, q) over the vocabulary.",
    "forgot_one_minus": "You computed (1/2) sum |p - q|, the total variation distance TV(p, q): the chance that "
                        "the draft is rejected. The acceptance rate is 1 - TV(p, q).",
    "max_not_min": "You summed max(p, q), which is 1 + TV(p, q) and not a probability (it reaches 2 when p and q "
                   "share no token). Token x is drafted with probability q(x) and kept with probability "
                   "min(1, p(x) / q(x)), so it contributes min(p(x), q(x)).",
    "mean_not_sum": "You averaged min(p, q) over the vocabulary, which divides the answer by V. The acceptance "
                    "rate adds up the chance of every token the draft may propose: sum over the vocabulary.",
    "nan_where_q_is_zero": "Your q * min(1, p / q) divides by zero on tokens the draft gives probability 0, and "
                           "where p is 0 as well, 0 / 0 is nan. The draft never proposes those tokens, so they "
                           "add nothing: write the term as min(p, q), equal to q * min(1, p / q) wherever q > 0.",
}


def _rates_cases():
    """[(p, q)] and {id(p): what the case is}: one hand-sized row, p = q, disjoint supports, a greedy
    (one-hot) draft, random rows (float32) and a draft close to its target (float64); T from 1 to 5."""
    g = torch.Generator().manual_seed(9)
    rows = lambda T, V: torch.randn(T, V, generator=g).softmax(-1)  # noqa: E731
    same = rows(3, 6)
    logits = torch.randn(2, 8, generator=g)
    token = torch.arange(8)  # p lives on tokens 0-2, q on 3-5; tokens 6 and 7 get 0 from both
    drafted = torch.tensor([4, 0, 2])
    close = 3 * torch.randn(5, 50, generator=g, dtype=torch.float64)  # a draft whose logits are the target's, noised
    labelled = [
        (torch.tensor([[0.5, 0.3, 0.2]], dtype=torch.float64), torch.tensor([[0.2, 0.3, 0.5]], dtype=torch.float64),
         "one position, p = (0.5, 0.3, 0.2) and q = (0.2, 0.3, 0.5)"),
        (same, same.clone(), "3 positions where q equals p (the draft is the target)"),
        (logits.masked_fill(token >= 3, float("-inf")).softmax(-1),
         logits.masked_fill((token < 3) | (token >= 6), float("-inf")).softmax(-1),
         "2 positions where p and q share no token (p on tokens 0-2, q on tokens 3-5)"),
        (rows(3, 5), torch.nn.functional.one_hot(drafted, 5).float(),
         f"3 positions of a greedy draft (q one-hot on tokens {drafted.tolist()})"),
        (rows(4, 8), rows(4, 8), "4 positions of random rows over 8 tokens, float32"),
        (close.softmax(-1), (close + torch.randn(5, 50, generator=g, dtype=torch.float64)).softmax(-1),
         "5 positions of a draft close to the target over 50 tokens, float64"),
    ]
    return [(p, q) for p, q, _ in labelled], {id(p): label for p, _, label in labelled}


def _read_rates(out, case, label):
    T, V = case[0].shape
    if not isinstance(out, torch.Tensor):
        raise Failure(f"For {label}, your function returned a {type(out).__name__}: it should return a torch "
                      f"tensor of shape ({T},), one acceptance rate per position.")
    if tuple(out.shape) != (T,):
        why = ("a single number means the sum ran over the positions as well" if out.dim() == 0 else
               "one number per token means the sum ran over the positions" if tuple(out.shape) == (V,) else
               "drop the kept dimension" if tuple(out.shape) == (T, 1) else "")
        raise Failure(f"For {label} (p and q of shape ({T}, {V})), your function returned a tensor of shape "
                      f"{tuple(out.shape)}: it should return shape ({T},), one acceptance rate per position, "
                      f"summed over the vocabulary (the last dimension, dim=-1)" + (f"; {why}." if why else "."))
    return out.double()


def _same_rates(a, b):
    a, b = torch.as_tensor(a).double(), torch.as_tensor(b).double()
    return a.shape == b.shape and torch.allclose(a, b, rtol=1e-5, atol=1e-5, equal_nan=True)


def _numbers(x):
    return "(" + ", ".join(f"{v:.3f}" for v in x.tolist()) + ")"


def _explain(label, got, want):
    if len(want) == 1:
        return f"For {label}, the acceptance rate is {float(want[0]):.3f}, but you returned {float(got[0]):.3f}."
    t = next(i for i in range(len(want)) if not _same_rates(got[i:i + 1], want[i:i + 1]))
    return (f"For {label}, the acceptance rates are {_numbers(want)}, but yours are {_numbers(got)}: at position "
            f"{t} the right value is {float(want[t]):.3f} and you returned {float(got[t]):.3f}.")


def grade_acceptance_rate(fn):
    cases, labels = _rates_cases()
    label = lambda case: labels[id(case[0])]  # noqa: E731
    grade_cases(fn, cases, acceptance_rate, RATE_MISTAKES, describe=label,
                read=lambda out, case: _read_rates(out, case, label(case)),
                explain=lambda case, got, want: _explain(label(case), got, want), same=_same_rates)
    return (f"Your acceptance rates equal sum min(p, q) on {len(cases)} cases of 1 to 5 positions: a draft equal "
            f"to the target (1), a draft sharing no token with it (0), a greedy draft (p at the drafted token), "
            f"random rows in float32, and a draft close to its target in float64.")


ACCEPTANCE_RATE = Exercise("acceptance_rate", acceptance_rate, grade_acceptance_rate, RATE_HINTS)
