"""What the demo panel leaves in a saved notebook: its output bundle and its snapshot read without a kernel."""
import specdec_lab as sl
from specdec_lab.lab.widgets import FATES, DemoPanel

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def test_the_panel_s_output_holds_the_widgets_view_and_a_note_with_the_legend_for_readers_without_a_kernel():
    target = sl.tiny_model(0)
    bundle = DemoPanel(target, target).display_bundle()
    assert bundle[WIDGET_VIEW]["model_id"], "a running kernel must still draw the live widgets"
    assert "VBox" not in bundle["text/plain"] and "run this notebook" in bundle["text/plain"]
    assert all(f'class="sdl-tok sdl-{fate}"' in bundle["text/html"] for fate in FATES), "the legend, every fate"


def test_the_snapshot_is_the_cards_and_the_strip_as_they_stand():
    target = sl.tiny_model(0)
    panel = DemoPanel(target, target)
    panel.strip.value += '<span class="sdl-tok sdl-accepted">x</span>'
    html = panel.snapshot_html()
    assert html.startswith(panel.figures.value) and html.endswith(panel.strip.value)
    assert 'class="sdl-figures"' in html and "sdl-accepted" in html
