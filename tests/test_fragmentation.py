"""lab/fragmentation.py: each engine step is priced by the roofline, so a step that serves more
requests costs more, and the designs compare in modelled seconds as well as in steps."""
import math

import pytest

from specdec_lab.analysis import roofline as rf
from specdec_lab.lab.fragmentation import StepCost, simulate_fragmentation


@pytest.fixture(scope="module")
def result():
    return simulate_fragmentation(num_requests=80, memory_tokens=16384, seed=3)


def test_a_step_costs_more_when_it_serves_more_requests():
    cost = StepCost()
    one = cost.seconds(5, 600)  # one request verifying K+1 = 5 tokens over 600 cached positions
    sixty = cost.seconds(60 * 5, 60 * 600)
    hw = rf.HARDWARE["H200"]
    assert one == pytest.approx(rf.bytes_per_token(rf.LLAMA_3_8B, 600) / hw.bandwidth), "batch 1 is one read"
    assert sixty > 1.4 * one, "sixty caches and sixty requests' tokens are not free"


def test_modelled_time_is_the_sum_of_the_steps_and_both_designs_generate_the_same_tokens(result):
    for trace in (result.contiguous, result.paged):
        assert len(trace.step_seconds) == trace.steps
        assert trace.seconds == pytest.approx(math.fsum(trace.step_seconds))
        assert trace.tokens_per_second == pytest.approx(trace.tokens / trace.seconds)
    assert result.contiguous.tokens == result.paged.tokens > 0


def test_the_design_with_more_requests_per_step_pays_more_per_step(result):
    c, p = result.contiguous, result.paged
    assert p.mean_concurrent > c.mean_concurrent
    assert p.seconds / p.steps > c.seconds / c.steps, "more requests per step: each step reads and computes more"
    steps_ratio, time_ratio = c.steps / p.steps, c.seconds / p.seconds
    assert time_ratio < steps_ratio, "counting steps flatters the design that packs more into each"


def test_the_price_follows_the_device():
    slow = simulate_fragmentation(num_requests=40, cost=StepCost(hardware="A100 40GB"))
    fast = simulate_fragmentation(num_requests=40, cost=StepCost(hardware="H200"))
    assert slow.summary()["paged"]["steps"] == fast.summary()["paged"]["steps"], "the schedule is the same"
    assert slow.paged.seconds > fast.paged.seconds
    with pytest.raises(ValueError, match="cost"):
        simulate_fragmentation(num_requests=4, cost=StepCost(hardware="TPU"))
