"""The live demo in a real browser: JupyterLab, headless Chromium, the notebook run, K changed, Run pressed.

Starts JupyterLab on a free loopback port with a random token, opens
notebooks/15_live_demo.ipynb in Debian's chromium (driven by the playwright
package through `executable_path`), runs all cells, moves the K slider with the
keyboard, presses Run and checks in the page that the token strip, the chart
and the figures show the new run. Screenshots go to test-artifacts/ (set
UPDATE_DOCS_SCREENSHOT=1 to also refresh docs/demo.png). The server is always
stopped. JupyterLab's user settings live in a temporary folder with autosave
off, so the notebook in the repository is never rewritten.
"""
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from playwright.sync_api import sync_playwright

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "notebooks" / "15_live_demo.ipynb"
ARTIFACTS = REPO / "test-artifacts"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SETTINGS = {  # JupyterLab user settings: no autosave of the repo's notebook, no news or update pop-ups
    "@jupyterlab/docmanager-extension/plugin.jupyterlab-settings": {"autosave": False},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings":
        {"fetchNews": "false", "checkForUpdates": False, "doNotDisturbMode": True},
}
FIGURES = ".sdl-figures"
STRIP_TOKENS = ".sdl-strip-widget .sdl-tok"


def _ensure_chromium():
    if CHROMIUM.exists():
        return
    script = REPO / "scripts" / "install_browser.sh"
    proc = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=900)
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing and {script.relative_to(REPO)} could not install it "
                    f"(exit {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}", pytrace=False)


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _jupyter():
    exe = Path(sys.executable).parent / "jupyter"
    return str(exe if exe.exists() else REPO / ".venv" / "bin" / "jupyter")


def _start_lab(tmp, port, token, log):
    settings = tmp / "settings"
    for name, value in SETTINGS.items():
        (settings / name).parent.mkdir(parents=True, exist_ok=True)
        (settings / name).write_text(json.dumps(value))
    cmd = [_jupyter(), "lab", "--no-browser", f"--port={port}", "--ServerApp.port_retries=0",
           f"--ServerApp.token={token}", "--ServerApp.ip=127.0.0.1", f"--ServerApp.root_dir={REPO / 'notebooks'}",
           f"--LabApp.user_settings_dir={settings}", f"--LabApp.workspaces_dir={tmp / 'workspaces'}"]
    if os.geteuid() == 0:
        cmd.append("--allow-root")
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(tmp / "runtime"))
    return subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env)


def _wait_for_server(proc, port, token, log_path, timeout=90):
    url = f"http://127.0.0.1:{port}/api/status?token={token}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"JupyterLab exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}", pytrace=False)
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    pytest.fail(f"JupyterLab did not answer on port {port} in {timeout} s:\n{log_path.read_text()[-3000:]}",
                pytrace=False)


def _stop(proc):
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=15)


def _remove_checkpoint(checkpoint):
    checkpoint.unlink(missing_ok=True)
    try:
        checkpoint.parent.rmdir()  # only when empty: other notebooks' checkpoints stay
    except OSError:
        pass


def _figures(page):
    """The state of the figure cards: data attributes and each card's value."""
    return page.evaluate("""sel => {
        const el = document.querySelector(sel);
        if (!el) return null;
        const values = {};
        el.querySelectorAll('[data-figure]').forEach(
            c => values[c.dataset.figure] = c.querySelector('.sdl-value').textContent);
        return {run: el.dataset.run, state: el.dataset.state, k: el.dataset.k, values};
    }""", FIGURES)


def _kernel_idle_on_server(port, token, timeout=90):
    """Wait until the server has the notebook's kernel running and idle."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/sessions?token={token}", timeout=5) as r:
            sessions = json.load(r)
        if any(s["path"].endswith(NOTEBOOK.name) and s["kernel"]["execution_state"] == "idle" for s in sessions):
            return
        time.sleep(0.5)
    pytest.fail(f"the notebook's kernel was not idle within {timeout} s", pytrace=False)


QUEUED = "() => [...document.querySelectorAll('.jp-InputPrompt')].some(e => e.textContent.includes('[*]'))"
ACCEPT = ".jp-Dialog .jp-Dialog-button.jp-mod-accept"


def _run_all_cells(page, attempts=4):
    """Run > Run All Cells until cells are queued ([*]). A click made while the front end is still
    connecting to the kernel runs nothing, or asks for a kernel (the dialog is accepted)."""
    for _ in range(attempts):
        page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=90_000)
        page.click(".lm-MenuBar-itemLabel:text-is('Run')")
        page.click(".lm-Menu-item:has(.lm-Menu-itemLabel:text-is('Run All Cells'))")
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if page.evaluate(QUEUED):
                return
            if page.locator(ACCEPT).count():
                page.click(ACCEPT)
            page.wait_for_timeout(200)
    pytest.fail("JupyterLab queued no cell after Run All Cells", pytrace=False)


def _drive_demo(page, url, port, token):
    page.goto(url)
    page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=90_000)
    _kernel_idle_on_server(port, token)
    _run_all_cells(page)
    # The chapter runs the panel from Python (a first run, then repeats): wait until a run is done
    # and the kernel idle. Loading the pair takes a while on a CPU.
    page.wait_for_selector(f"{FIGURES}[data-state='done']", timeout=240_000)
    # the rest of the chapter (its side-by-side runs and the finale's eight systems) takes minutes more
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=480_000)
    before = _figures(page)
    want = str(int(before["run"]) + 1)  # the run the button press makes

    handle = page.locator(".sdl-k .noUi-handle")
    handle.scroll_into_view_if_needed()
    handle.focus()
    k = int(before["k"]) + 1
    page.keyboard.press("ArrowRight")  # K -> K + 1
    readout = page.locator(".sdl-k .widget-readout")
    page.wait_for_function(f"el => el.textContent.trim() === '{k}'", arg=readout.element_handle(), timeout=10_000)

    page.click(".sdl-run button, button.sdl-run")
    seen = set()  # strip lengths seen while running: the streaming, sampled
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        figs = _figures(page)
        seen.add(page.locator(STRIP_TOKENS).count())
        if figs and figs["run"] == want and figs["state"] == "done":
            break
        page.wait_for_timeout(100)
    after = _figures(page)
    return before, after, seen


def test_live_demo_runs_in_jupyterlab_and_shows_the_run(tmp_path):
    _ensure_chromium()
    ARTIFACTS.mkdir(exist_ok=True)
    port, token = _free_port(), secrets.token_hex(16)
    log_path = ARTIFACTS / "jupyterlab.log"
    original = NOTEBOOK.read_bytes()
    checkpoint = NOTEBOOK.parent / ".ipynb_checkpoints" / f"{NOTEBOOK.stem}-checkpoint.ipynb"
    had_checkpoint = checkpoint.exists()  # the server makes one when the notebook opens
    with open(log_path, "w") as log:
        proc = _start_lab(tmp_path, port, token, log)
        try:
            _wait_for_server(proc, port, token, log_path)
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
                try:
                    page = browser.new_page(viewport={"width": 1400, "height": 1600})
                    try:
                        before, after, seen = _drive_demo(
                            page, f"http://127.0.0.1:{port}/lab/tree/{NOTEBOOK.name}?token={token}", port, token)
                        _check_page(page, before, after)
                        panel = page.locator(".sdl-panel")
                        panel.screenshot(path=str(ARTIFACTS / "demo.png"))
                        print(f"strip sizes seen while running: {sorted(seen)}")
                    finally:
                        page.screenshot(path=str(ARTIFACTS / "demo-page.png"))
                finally:
                    browser.close()
        finally:
            _stop(proc)
            if NOTEBOOK.read_bytes() != original:  # nothing should save it; guard the repository anyway
                NOTEBOOK.write_bytes(original)
            if not had_checkpoint:
                _remove_checkpoint(checkpoint)
    if os.environ.get("UPDATE_DOCS_SCREENSHOT") == "1":
        shutil.copyfile(ARTIFACTS / "demo.png", REPO / "docs" / "demo.png")


def _check_page(page, before, after):
    assert int(after["run"]) == int(before["run"]) + 1 and after["state"] == "done", \
        f"the run pressed in the page did not finish: {before} -> {after}"
    assert int(after["k"]) == int(before["k"]) + 1, "the K slider moved in the browser must reach the kernel"
    assert after["values"] != before["values"] or after["run"] != before["run"], "the figures must update"
    assert after["values"]["tokens_per_second"] != "-" and after["values"]["new_tokens"] not in ("-", "0")
    assert after["values"]["baseline_tokens_per_second"] != "-" and after["values"]["speedup"] != "-", \
        "a press of Run shows tokens/s for both engines, speculative and autoregressive"
    assert page.locator(".sdl-strip-widget .sdl-accepted").count() >= 1, "at least one accepted draft token"
    assert page.locator(STRIP_TOKENS).count() >= 2
    hover = page.locator(".sdl-strip-widget .sdl-accepted").first.get_attribute("title")
    assert hover.startswith("step ") and "p(d) = " in hover and "q(d) = " in hover, hover
    accepted_bars = page.locator(".sdl-chart .barlayer .trace").first.locator(".point")
    assert accepted_bars.count() == int(after["values"]["steps"]), "the chart draws one accepted bar per step"
    assert page.locator(".jp-OutputArea-output .sdl-error").count() == 0
