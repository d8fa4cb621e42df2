"""Static figures: a plotly figure shown interactively with a PNG of it stored beside, so that
the chapters read on GitHub and nbviewer, which draw no plotly. The PNG is drawn by kaleido in a
Chromium or Chrome that starts once per process. viz re-exports these."""
import base64
import os
import shutil

import kaleido
import plotly.graph_objects as go
import plotly.io as pio
from IPython.display import display

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")  # searched on PATH


def browser_path() -> str:
    """The Chromium or Chrome that draws static figures: $BROWSER_PATH when set, else the first of
    BROWSERS on PATH. Raises RuntimeError saying how to get one when there is none."""
    path = os.environ.get("BROWSER_PATH") or next(filter(None, map(shutil.which, BROWSERS)), None)
    if path is None or not os.access(path, os.X_OK):
        where = f"BROWSER_PATH={path!r} is not an executable" if path else f"none of {', '.join(BROWSERS)} is on PATH"
        raise RuntimeError(f"static figures need Chromium or Chrome, and {where}: install one "
                           "(scripts/install_browser.sh does on Debian or Ubuntu) or set BROWSER_PATH to its binary")
    return path


def png(fig, width=900, height=None, scale=1.0) -> bytes:
    """The figure as PNG bytes, `width` x `height` layout pixels (height: the figure's own, else
    450) times `scale`. The same figure gives the same bytes on the same machine."""
    for name, value in (("width", width), ("height", height), ("scale", scale)):
        if value is not None and not (isinstance(value, (int, float)) and value > 0):
            raise ValueError(f"{name} must be a positive number, got {value!r}")
    if not isinstance(fig, go.Figure):
        raise ValueError(f"fig must be a plotly go.Figure, got {type(fig).__name__}")
    height = height or fig.layout.height or 450
    # One browser per process, started on the first figure and closed at exit: a chapter's
    # figures after the first take a fraction of a second instead of a browser start each.
    kaleido.start_sync_server(path=browser_path(), mathjax=False, silence_warnings=True)
    return kaleido.calc_fig_sync(fig.to_dict(), opts=dict(format="png", width=width, height=height, scale=scale))


def figure_bundle(fig, width=900, height=None) -> dict:
    """What show() displays: plotly's JSON (JupyterLab draws it interactively), a PNG of the same
    figure (what GitHub and nbviewer draw; JupyterLab shows it until the pointer enters), and a
    one-line text naming the figure."""
    title = fig.layout.title.text or "untitled"
    return {**pio.renderers["plotly_mimetype"].to_mimebundle(fig.to_dict()),
            "image/png": base64.b64encode(png(fig, width, height)).decode("ascii"),
            "text/plain": f"<figure: {title}>"}


def show(fig, width=900, height=None) -> None:
    """Display a figure in a notebook, interactive and as a stored PNG (figure_bundle)."""
    display(figure_bundle(fig, width, height), raw=True)
