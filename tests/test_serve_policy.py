"""serve.policy: K by batch size (a schedule) and by goodput (measured costs, running alpha)."""
import random

import pytest

import specdec_lab as sl
from specdec_lab.core.records import StepRecord
from specdec_lab.serve import BatchRecord, Server
from specdec_lab.serve.engine import BatchEngine
from specdec_lab.serve.policy import GoodputPolicy, KSchedule, expected_tokens, measure_step_costs


def test_the_schedule_follows_vllms_ranges_and_is_off_outside_them():
    s = KSchedule([(1, 2, 4), (3, 8, 2), (12, 16, 1)])
    assert [s.k_for(b) for b in (1, 2, 3, 8, 9, 11, 12, 16, 17)] == [4, 4, 2, 2, 0, 0, 1, 1, 0]


@pytest.mark.parametrize("ranges,name", [([(1, 4, 2), (4, 8, 1)], "overlap"), ([(0, 4, 2)], "start_bs"),
                                         ([(3, 2, 2)], "end_bs"), ([(1, 2, 17)], "k"), ([(1, 2)], "triples")])
def test_bad_schedules_are_refused(ranges, name):
    with pytest.raises(ValueError, match=name):
        KSchedule(ranges)


def test_expected_tokens_per_row_and_step():
    assert expected_tokens(0.5, 0) == 1.0
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)
    assert expected_tokens(1.0, 3) == 4.0


def _costs(fn, sizes=(1, 2, 4, 8, 16), ks=range(5)):
    return {(b, k): fn(b, k) for b in sizes for k in ks}


def test_goodput_drafts_where_verification_is_free_and_stops_where_it_is_paid_in_full():
    # Bandwidth-bound up to 8 tokens per forward, compute-bound beyond: cost = max(1, tokens / 8).
    policy = GoodputPolicy(_costs(lambda b, k: max(1.0, b * (k + 1) / 8)), k_max=4, alpha=0.8)
    assert policy.k_for(1) == 4, "one row: verification is free, draft the most"
    assert policy.k_for(16) == 0, "sixteen rows: every extra token costs its full price"
    ks = [policy.k_for(b) for b in (1, 2, 4, 8, 16)]
    assert ks == sorted(ks, reverse=True), f"K must not grow with the batch: {ks}"
    for b in (1, 2, 4, 8, 16):  # never below plain batched decoding by its own model
        assert policy.goodput(b, policy.k_for(b)) >= policy.goodput(b, 0)


def test_goodput_interpolates_between_measured_batch_sizes():
    policy = GoodputPolicy(_costs(lambda b, k: b * (k + 1.0), sizes=(2, 8)), k_max=4)
    assert policy.cost(5, 0) == pytest.approx(5.0) and policy.cost(16, 1) == pytest.approx(32.0)
    assert policy.cost(1, 2) == pytest.approx(6.0)


def _record(ks, ns, seconds=1.0):
    rows = [StepRecord(0, k, [0] * k, n, 0, [], [], [], 0.0, 0.0, 1) for k, n in zip(ks, ns)]
    return BatchRecord(rows, 0.0, seconds, 1, max(ks))


def test_alpha_is_estimated_from_the_verdicts():
    policy = GoodputPolicy(_costs(lambda b, k: 1.0), k_max=4, alpha=0.2, decay=1.0)
    rnd = random.Random(0)
    for _ in range(2000):
        ns = []
        for _ in range(4):
            n = 0
            while n < 4 and rnd.random() < 0.7:
                n += 1
            ns.append(n)
        policy.observe(_record([4] * 4, ns))
    assert policy.alpha == pytest.approx(0.7, abs=0.02)


def test_bad_policies_are_refused():
    with pytest.raises(ValueError, match=r"missing \(batch_size, k\): \[\(1, 0\)"):
        GoodputPolicy({(1, 2): 1.0})
    with pytest.raises(ValueError, match="alpha"):
        GoodputPolicy(_costs(lambda b, k: 1.0), alpha=1.0)
    with pytest.raises(ValueError, match="k_max"):
        GoodputPolicy(_costs(lambda b, k: 1.0), k_max=20)


def test_a_cost_table_without_every_k_and_bad_weights_are_refused():
    """Before: an unmeasured K cost what the largest measured smaller K cost, so it looked cheaper
    than it is and won; prior_weight=0 divided by zero; any decay was taken."""
    holes = {(b, k): 1.0 + k for b in (1, 2) for k in (0, 1, 2, 4)}  # k = 3 never measured
    with pytest.raises(ValueError, match=r"missing \(batch_size, k\): \[\(1, 3\), \(2, 3\)\]"):
        GoodputPolicy(holes, k_max=4)
    assert GoodputPolicy(holes, k_max=2).k_for(1) in (0, 1, 2), "a k_max the table covers is taken"
    for kw, word in (({"prior_weight": 0}, "prior_weight"), ({"prior_weight": -1.0}, "prior_weight"),
                     ({"decay": 0.0}, "decay"), ({"decay": 1.5}, "decay"), ({"alpha": "0.5"}, "alpha")):
        with pytest.raises(ValueError, match=word):
            GoodputPolicy(_costs(lambda b, k: 1.0), **kw)


def test_the_server_drafts_the_schedules_k_for_each_batch_size():
    target, draft = sl.tiny_model(0), sl.tiny_model(1, n_layers=1)
    schedule = KSchedule([(1, 1, 4), (2, 3, 2)])
    seen = []
    server = Server(target, draft, max_batch=4, block_size=4, max_seq_len=128, k=schedule,
                    on_batch=lambda s, rec: seen.append((rec.batch_size, rec.k_max)))
    hs = [server.submit([1 + i, 2, 3], max_new_tokens=30 - 5 * i) for i in range(4)]
    server.run_until_idle()
    assert {b for b, _ in seen} == {1, 2, 3, 4}
    for b, k in seen:  # the budget may clamp K in a row's last steps, never raise it
        assert k <= schedule.k_for(b)
    assert all(k == 0 for b, k in seen if b == 4) and any(k == 4 for b, k in seen if b == 1)
    for i, h in enumerate(hs):
        assert h.result().tokens == sl.autoregressive_generate(target, [1 + i, 2, 3], max_new_tokens=30 - 5 * i).tokens


def test_measured_step_costs_cover_the_grid_and_drive_the_server():
    target, draft = sl.tiny_model(0), sl.tiny_model(1, n_layers=1)
    costs = measure_step_costs(BatchEngine(target, draft, num_blocks=64, block_size=4, max_seq_len=128),
                               [1, 2], [0, 1, 2], context=8, reps=1)
    assert set(costs) == {(b, k) for b in (1, 2) for k in (0, 1, 2)} and all(s > 0 for s in costs.values())
    policy = GoodputPolicy(costs, k_max=2)
    server = Server(target, draft, max_batch=2, block_size=4, max_seq_len=128, k=policy)
    h = server.submit([4, 5, 6], max_new_tokens=12)
    assert h.result().tokens == sl.autoregressive_generate(target, [4, 5, 6], max_new_tokens=12).tokens
    assert server.k_history and all(k in (0, 1, 2) for _, k in server.k_history), "the policy's K each step"


def test_a_noisy_cost_that_says_more_tokens_are_cheaper_is_not_believed():
    costs = _costs(lambda b, k: 1.0 + 0.5 * k)
    costs[(8, 3)] = 0.5  # a lucky measurement
    policy = GoodputPolicy(costs, k_max=4, alpha=0.4)
    assert policy.cost(8, 3) == pytest.approx(2.0) and policy.cost(8, 4) == pytest.approx(3.0)


def test_serves_default_policy_is_goodput_measured_on_the_servers_own_engine():
    """`serve` with no --k: the goodput policy, its step costs measured on the server's own paged pool at
    1, 2, 4 and max_batch rows for K = 0..4, every block given back before the first request."""
    from specdec_lab.bench.serve import ServeBenchConfig
    from specdec_lab.cli import build_parser
    from specdec_lab.service.cli import cost_batch_sizes, k_policy
    assert build_parser().parse_args(["serve"]).k == "goodput"
    assert cost_batch_sizes(8) == (1, 2, 4, 8) and cost_batch_sizes(1) == (1,) and cost_batch_sizes(64) == (1, 2, 4, 8, 16)
    target, draft = sl.tiny_model(0), sl.tiny_model(1, n_layers=1)
    server = Server(target, draft, max_batch=8, block_size=4, max_seq_len=160, k=0)
    said = []
    policy = k_policy("goodput", server, ServeBenchConfig(), said.append)
    assert isinstance(policy, GoodputPolicy) and policy.k_max == 4
    assert set(policy.costs) == {(b, k) for b in (1, 2, 4, 8) for k in range(5)}
    assert server.engine.target_kv.free_blocks == server.engine.target_kv.num_blocks, "the measurement's rows left"
    assert "measuring step costs" in said[0] and "measured in" in said[1]
    server.k = policy
    h = server.submit([4, 5, 6], max_new_tokens=12)
    assert h.result().tokens == sl.autoregressive_generate(target, [4, 5, 6], max_new_tokens=12).tokens
