"""lab/eagle_figure.py: the diagram taps the layers it is given, and refuses layers it cannot draw."""
import pytest

from specdec_lab.drafters.eagle3 import default_hidden_layers
from specdec_lab.lab.eagle_figure import TAP, eagle3_flow_figure


def test_the_diagram_taps_the_three_layers_the_draft_reads():
    layers = default_hidden_layers(30)
    fig = eagle3_flow_figure(30, layers)
    texts = [a.text for a in fig.layout.annotations]
    assert {"layers 0 to 1", "layers 2 to 14", "layers 15 to 26", "layers 27 to 29"} <= set(texts)
    assert "taps after layers<br>1, 14 and 26" in texts
    taps = [a for a in fig.layout.annotations if a.showarrow and a.arrowcolor == TAP]
    assert len(taps) == 3 and {a.x for a in taps} == {5.2}, "three taps, each into fc"


def test_layers_out_of_order_or_past_the_last_are_refused_by_name():
    for layers in ((14, 1, 26), (1, 14, 29), (1, 1, 26)):
        with pytest.raises(ValueError, match="hidden_layers"):
            eagle3_flow_figure(30, layers)
