"""Exercises "verify" and "block_verify": write a verification rule, checked by the law of its output.

Both take the learner's fn(p, q, drafted, generator) -> (n, token):

    p          (K+1, V) float   the target's distributions p_1..p_{K+1} (rows of probabilities)
    q          (K, V) float     the draft's distributions q_1..q_K that the drafts were drawn from
    drafted    (K,) int64       the drafted tokens d_1..d_K
    generator  torch.Generator  the only source of randomness to use (torch.rand(..., generator=generator))

and return n, the number of drafts accepted, and the next token: the correction after a rejection,
or the bonus drawn from p_{K+1} when all K are accepted.

A sampled rule cannot be checked token for token against a reference: two correct rules use their
random numbers differently. The checker (laws.py) draws the drafts from q itself, runs the rule many
times, and checks the law of what comes out: (a) the emitted tokens must be distributed exactly as
the target's own, and (b) the pair (n, next token) for each drafted block must follow the rule the
exercise asks for. The known mistakes have exact laws as well, and the one the counts fit is named.

Only what changes the law can be seen. Forgetting to normalise the residual changes nothing when the
draw is torch.multinomial or the exponential race (core.verify.draw): both take unnormalised weights.
It shows with inverse-CDF sampling, where the missing mass lands on the last token; that form is the
"residual_unnormalised" mistake.
"""
from fractions import Fraction

import torch

from ...core.sampling import exponential_noise
from ...verification import verify_block_reference
from .. import lossless, pitfalls
from .laws import grade_rule, toy_step
from .report import Exercise

SAMPLES = 20000  # steps per check: enough to see a 0.03 gap in a token's frequency at p-value 1e-4

# K = 2 drafts over V = 4 tokens. The draft over-proposes tokens 0 and 1 where the target prefers 2 and 3,
# and proposes token 2 at the second position, which the target never emits there.
TOKEN_STEP = toy_step(p_rows=[(1, 2, 3, 4), (5, 1, 0, 4), (2, 2, 5, 1)], q_rows=[(4, 3, 2, 1), (3, 2, 3, 2)])
# K = 3 drafts over V = 3 tokens, found by a search for rows on which the block rule, the token rule and the
# block's two pitfalls give verdict laws far apart (an expected chi-square of 900 between any two at 20000 steps).
BLOCK_STEP = toy_step(p_rows=[(1, 3, 1), (2, 6, 6), (8, 4, 4), (6, 8, 5)],
                      q_rows=[(9, 3, 8), (7, 1, 2), (1, 2, 6)])


def verify(p, q, drafted, generator):
    """Token-by-token verification (arXiv 2211.17192, Algorithm 1): keep d_i while a uniform u_i is
    below min(1, p_i(d_i) / q_i(d_i)); at the first rejection draw the next token from the residual
    norm(max(0, p_i - q_i)); when all K pass, draw the bonus token from p_{K+1}."""
    K = drafted.shape[0]
    for i in range(K):
        d = int(drafted[i])
        u = float(torch.rand(1, generator=generator))
        if q[i, d] > 0 and u < min(1.0, float(p[i, d] / q[i, d])):
            continue
        residual = torch.clamp(p[i] - q[i], min=0.0)  # (V,)
        if residual.sum() <= 0:  # p_i = q_i: nothing is left to correct, and p_i itself is right
            residual = p[i]
        return i, int(torch.multinomial(residual, 1, generator=generator))  # multinomial normalises
    return K, int(torch.multinomial(p[K], 1, generator=generator))


def rule_as_exercise(rule):
    """A rule with core.verify.verify's signature (draft_ids, p, q, u, e) as fn(p, q, drafted,
    generator): u and e drawn from the generator."""
    def fn(p, q, drafted, generator):
        u = torch.rand(drafted.shape[0], generator=generator)
        e = exponential_noise(p.shape[-1], generator)
        n, token = rule(drafted, p, q, u, e).tolist()
        return n, token
    fn.__doc__ = f"{rule.__name__} as fn(p, q, drafted, generator) -> (n, token)."
    return fn


def block_verify(p, q, drafted, generator):
    """Block verification (arXiv 2403.10444, Algorithm 2): the library's readable loop,
    verification.verify_block_reference, with its uniforms u (K,) and its Exponential(1) noise e (V,)
    for the one final draw taken from the generator."""
    u = torch.rand(drafted.shape[0], generator=generator)
    e = exponential_noise(p.shape[-1], generator)
    n, token = verify_block_reference(drafted, p, q, u, e).tolist()
    return n, token


# ---- The mistakes, as exact laws in lossless.py's form: rule(p_rows, q_rows, drafts) -> [(n, dist, prob)] ----

def _ratio(p, q, x):
    return min(p[x] / q[x], Fraction(1)) if q[x] else Fraction(0)


def _residual(p, q):
    return lossless.fraction_norm([max(pv - qv, 0) for pv, qv in zip(p, q)]) or p


def _one_hot(row):
    best = max(range(len(row)), key=lambda x: row[x])
    return [Fraction(int(x == best)) for x in range(len(row))]


def _unnormalised(p, q):
    """Inverse-CDF sampling from the residual without dividing by its mass: u lands past the cumulated
    weights with probability 1 - mass, and the index is clamped to the last token."""
    r = [max(pv - qv, 0) for pv, qv in zip(p, q)]
    return r[:-1] + [r[-1] + 1 - sum(r)] if sum(r) else p


def token_rule_with(accept=_ratio, residual=_residual, bonus=lambda p_rows, q_rows, K: p_rows[K],
                    late=False, tested=lambda K: K):
    """lossless.exact_token_rule with one piece replaced: accept(p_i, q_i, d_i) the chance to keep d_i,
    residual(p_i, q_i) the next token's law at a rejection, bonus(p_rows, q_rows, K) its law when all
    pass; late: n counts the rejected draft; tested(K): how many drafts the loop looks at."""
    def rule(p_rows, q_rows, drafts):
        K, out, alive = tested(len(drafts)), [], Fraction(1)
        for i in range(K):
            a = accept(p_rows[i], q_rows[i], drafts[i])
            out.append((i + int(late), residual(p_rows[i], q_rows[i]), alive * (1 - a)))
            alive *= a
        return out + [(K, bonus(p_rows, q_rows, K), alive)]
    return rule


def block_rule_with_bonus(bonus):
    """lossless.exact_block_rule with the next token's law after a fully accepted block replaced."""
    def rule(p_rows, q_rows, drafts):
        out = lossless.exact_block_rule(p_rows, q_rows, drafts)
        tau, _, prob = out[-1]  # tau = K: every draft kept
        return out[:-1] + [(tau, bonus(p_rows, q_rows, len(drafts)), prob)]
    return rule


GREEDY = token_rule_with(accept=lambda p, q, x: Fraction(int(_one_hot(p)[x] == 1)), residual=lambda p, q: _one_hot(p),
                         bonus=lambda p_rows, q_rows, K: _one_hot(p_rows[K]))
COMMON = [  # mistakes either rule can make
    ("accept_all", token_rule_with(accept=lambda p, q, x: Fraction(1))),
    ("argmax_not_sample", GREEDY),
]
TOKEN_MISTAKES = COMMON + [
    ("resample_from_p", token_rule_with(residual=lambda p, q: p)),
    ("ratio_inverted", token_rule_with(accept=lambda p, q, x: min(q[x] / p[x], Fraction(1)) if p[x] else Fraction(1))),
    ("residual_unnormalised", token_rule_with(residual=_unnormalised)),
    ("no_bonus", token_rule_with(bonus=lambda p_rows, q_rows, K: p_rows[K - 1])),
    ("bonus_from_q", token_rule_with(bonus=lambda p_rows, q_rows, K: q_rows[K - 1])),
    ("off_by_one", token_rule_with(late=True)),
    ("off_by_one", token_rule_with(tested=lambda K: K - 1)),
]
BLOCK_MISTAKES = COMMON + [
    ("token_rule", lossless.exact_token_rule),
    ("block_ratio_test", pitfalls.exact_block_ratio_test),
    ("block_unscaled_residual", pitfalls.exact_block_unscaled_residual),
    ("no_bonus", block_rule_with_bonus(lambda p_rows, q_rows, K: p_rows[K - 1])),
    ("bonus_from_q", block_rule_with_bonus(lambda p_rows, q_rows, K: q_rows[K - 1])),
]

HINTS = {
    "accept_all": "You keep every draft whatever the target thinks of it, so the output is the draft's "
                  "distribution, not the target's: tokens the target never emits come out.",
    "argmax_not_sample": "You compare each draft with the target's most likely token and take argmaxes: that "
                         "is the greedy rule. At a temperature above 0 the target samples, so every token but "
                         "the most likely one disappears from the output.",
    "resample_from_p": "At a rejection you draw the next token from p instead of the residual "
                       "norm(max(0, p - q)). Tokens the draft over-proposes come out too often: they were "
                       "already paid for by the acceptance test, and p pays for them a second time.",
    "ratio_inverted": "Your acceptance test is min(1, q/p) instead of min(1, p/q): you keep the tokens the "
                      "draft over-proposes and reject the ones the target prefers.",
    "residual_unnormalised": "You draw from the residual max(0, p - q) by inverse CDF without dividing it by "
                             "its sum: the weights add up to less than 1, and the missing mass lands on the "
                             "last token of the vocabulary.",
    "no_bonus": "When all K drafts are accepted you draw the next token from p_K (the row of the last draft) "
                "instead of p_{K+1}, the row after it: the bonus token comes from the wrong position.",
    "bonus_from_q": "When all K drafts are accepted you draw the next token from the draft's q instead of the "
                    "target's p_{K+1}: the bonus token follows the draft's distribution.",
    "off_by_one": "Your count of accepted drafts is off by one: either the rejected draft is counted (and "
                  "emitted) as accepted, or the loop stops one draft early and never looks at the last one.",
    "token_rule": "You wrote the token-by-token rule. It is lossless too, but block verification judges the "
                  "block as a whole and keeps a later draft even after an earlier test failed, so it "
                  "accepts more drafts per step.",
    "block_ratio_test": "Inside the block you test each draft with the token rule's min(1, p/q) instead of the "
                        "block's threshold h_i, while still keeping the largest i that passes: a later pass "
                        "overrides an earlier failure without the residual mass h_i accounts for.",
    "block_unscaled_residual": "You draw the next token from max(p - q, 0) instead of max(P_tau p - q, 0): "
                               "without the block's weight P_tau the correction does not make up for what "
                               "the block kept.",
}


def grade_verify(fn):
    return grade_rule(fn, TOKEN_STEP, lossless.exact_token_rule, "token-by-token rule", TOKEN_MISTAKES, SAMPLES)


def grade_block_verify(fn):
    return grade_rule(fn, BLOCK_STEP, lossless.exact_block_rule, "block verification rule", BLOCK_MISTAKES,
                      SAMPLES)


VERIFY = Exercise("verify", verify, grade_verify, HINTS)
BLOCK_VERIFY = Exercise("block_verify", block_verify, grade_block_verify, HINTS)
