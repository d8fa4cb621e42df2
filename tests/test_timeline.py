"""lab/timeline.py: the two lanes hold the run's measured times and token counts."""
import pytest

from specdec_lab.core.records import StepRecord
from specdec_lab.lab.timeline import timeline_figure


def step(i, k, accepted, draft_s, target_s):
    return StepRecord(step=i, k=k, drafted=list(range(k)), num_accepted=accepted, next_token=9, p_draft=[],
                      q_draft=[], uniforms=[], draft_seconds=draft_s, target_seconds=target_s, syncs=1,
                      committed=list(range(accepted + 1)))


def test_the_lanes_hold_the_steps_times_and_the_plain_forwards_over_the_same_span():
    steps = [step(0, 3, 3, 0.003, 0.040), step(1, 3, 0, 0.003, 0.038), step(2, 0, 0, 0.0, 0.030)]
    fig = timeline_figure(steps, ar_seconds=0.025)
    draft, verify, plain = fig.data
    assert list(draft.base) == pytest.approx([0.0, 43.0, 84.0]) and list(draft.x) == pytest.approx([3.0, 3.0, 0.0])
    assert list(verify.base) == pytest.approx([3.0, 46.0, 84.0]) and list(verify.x) == pytest.approx([40.0, 38.0, 30.0])
    assert list(verify.text) == ["+4", "+1", "+1"], "each verification is labelled with the tokens its step committed"
    assert len(plain.x) == 4 and set(plain.x) == {25.0}, "114 ms hold 4 whole plain forwards of 25 ms"
    notes = {a.y: a.text for a in fig.layout.annotations}
    assert notes == {"speculative": "<b>6 tokens</b>", "plain decoding": "<b>4.6 tokens</b>"}


def test_an_empty_run_or_a_zero_plain_time_is_refused_by_name():
    with pytest.raises(ValueError, match="at least one step"):
        timeline_figure([], 0.025)
    with pytest.raises(ValueError, match="ar_seconds=0"):
        timeline_figure([step(0, 1, 1, 0.001, 0.01)], 0)
