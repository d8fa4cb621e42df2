"""scripts/draft_ceiling.py: the replay of drafting policies along a known greedy answer."""
import importlib.util
from pathlib import Path

import pytest

PATH = Path(__file__).resolve().parents[1] / "scripts" / "draft_ceiling.py"
spec = importlib.util.spec_from_file_location("draft_ceiling", PATH)
dc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(dc)


def make_run(answer, first, second=None, conf=1.0, prompt=(900, 901, 902)):
    """A run whose draft's first choice at each position is first[i] (second choice second[i])."""
    second = second or [-2] * len(answer)
    choices = [[f, s, -3, -4] for f, s in zip(first, second)]
    ranks = [c.index(t) if t in c else dc.MISS for c, t in zip(choices, answer)]
    return dict(prompt=list(prompt), answer=list(answer), choices=choices, conf=[conf] * len(answer), ranks=ranks)


def flat(T):
    return 1.0


def test_a_draft_that_is_always_right_commits_k_plus_one_tokens_a_step():
    answer = list(range(10, 24))  # 14 tokens: two steps of 6 accepted + 1 from the target
    run = make_run(answer, answer)
    assert dc.replay([run], lambda r, j: dc.draft_chain(r, j, k=6, stop_below=None), 0.0, flat) == 7.0
    # Priced: two verifications of 7 tokens and 12 draft forwards.
    assert dc.replay([run], lambda r, j: dc.draft_chain(r, j, k=6, stop_below=None), 0.1,
                     lambda T: 1.0 + 0.1 * (T - 1)) == pytest.approx(14 / (2 * 1.6 + 12 * 0.1))


def test_a_draft_that_is_always_wrong_pays_its_whole_chain_for_one_token():
    answer = list(range(10, 20))
    run = make_run(answer, [5] * len(answer))
    speed = dc.replay([run], lambda r, j: dc.draft_chain(r, j, k=3, stop_below=None), 0.05,
                      lambda T: 1.0 + 0.1 * (T - 1))
    # Ten steps of one token; the last two draft only as far as the answer goes (2, then 1 token).
    assert speed == pytest.approx(10 / (8 * (1.3 + 3 * 0.05) + (1.2 + 2 * 0.05) + (1.1 + 0.05)))
    # The early stop drafts one token and stops: an unsure draft costs one forward and one row.
    unsure = make_run(answer, [5] * len(answer), conf=0.1)
    assert dc.replay([unsure], lambda r, j: dc.draft_chain(r, j, k=3), 0.05,
                     lambda T: 1.0 + 0.1 * (T - 1)) == pytest.approx(1 / (1.1 + 0.05))


def test_a_second_choice_leaf_is_accepted_where_the_first_is_wrong():
    answer = [10, 11, 12, 13]
    run = make_run(answer, [99, 99, 99, 99], second=answer)
    paths, forwards = dc.draft_chain(run, 0, k=3, stop_below=None, alternatives=1)
    assert paths == [[10], [99, -1, -1]] and forwards == 3
    # Each step: the second choice is accepted, then the target's token: 2 tokens a step.
    assert dc.replay([run], lambda r, j: dc.draft_chain(r, j, k=3, stop_below=None, alternatives=1), 0.0, flat) == 2.0


def test_lookup_copies_what_followed_the_last_tokens_and_the_draft_is_not_run():
    prompt = [1, 2, 3, 4, 5, 1, 2]  # the context ends in "1 2", which was followed by 3 4 5
    run = make_run([3, 4, 5, 9], [0, 0, 0, 0], prompt=prompt)
    assert dc.lookup_then_draft(run, 0, k=3) == ([[3, 4, 5]], 0)
    paths, forwards = dc.lookup_then_draft(run, 0, k=3, stop_below=None, together=True)
    assert paths == [[0, -1, -1], [3, 4, 5]] and forwards == 3


def test_a_better_draft_keeps_every_hit_and_gains_the_asked_share():
    answers = [list(range(10, 30)), list(range(40, 60))]
    firsts = [[t if i % 4 == 0 else 7 for i, t in enumerate(a)] for a in answers]  # right at 1 in 4
    runs = [make_run(a, f, conf=0.9) for a, f in zip(answers, firsts)]
    for run in runs:
        run["conf"] = [0.9 if r == 0 else 0.1 for r in run["ranks"]]
    better = dc.improved(runs, 0.6, seed=1)
    hits = [r == 0 for run in better for r in run["ranks"]]
    assert sum(hits) == 24  # 0.6 of 40 positions
    for old, new in zip(runs, better):
        assert all(n == 0 for o, n in zip(old["ranks"], new["ranks"]) if o == 0)  # every old hit stays
        for j, rank in enumerate(new["ranks"]):  # ranks, choices and confidences agree
            assert (new["choices"][j][0] == new["answer"][j]) == (rank == 0)
            assert new["conf"][j] == (0.9 if rank == 0 else 0.1)
        assert old["ranks"].count(0) == 5 and old["choices"][1][0] == 7  # the input is left as it was
    assert dc.improved(runs, 0.1) == runs  # asking for less than it has changes nothing
    # More agreement is never slower along the same answers.
    speeds = [dc.replay(dc.improved(runs, a), lambda r, j: dc.draft_chain(r, j, k=4), 0.05, flat)
              for a in (0.25, 0.5, 0.75, 1.0)]
    assert speeds == sorted(speeds) and speeds[-1] == pytest.approx(5 / (1 + 4 * 0.05))


def test_verify_costs_reads_the_measured_k_and_draws_lines_between_and_past_them():
    v = dc.verify_costs({"verify_cost": {"2": 1.1, "4": 1.2, "6": 1.5}})  # K -> v, so T = 3, 5, 7
    assert v(1) == 1.0 and v(3) == 1.1 and v(5) == 1.2 and v(7) == 1.5
    assert v(2) == pytest.approx(1.05) and v(4) == pytest.approx(1.15) and v(6) == pytest.approx(1.35)
    assert v(9) == pytest.approx(1.8)  # the last segment's slope, 0.15 a token, continued
    table = dc.agreement_table([make_run(list(range(10, 30)), [7] * 20)], 0.05, v, agreements=(0.5, 1.0),
                               multiples=(1, 4))
    assert set(table) == {1, 4} and all(len(x) == 2 for x in table.values())
    assert table[1][1] > table[1][0] and table[1][0] > table[4][0]
