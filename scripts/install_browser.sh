#!/usr/bin/env bash
# Installs Debian's chromium for the browser test (tests/test_browser_demo.py).
# Idempotent: returns at once when /usr/bin/chromium is already there.
# Without root (or sudo without a password) or without apt-get it prints what to
# do and exits 1, so that `make setup` can go on and the browser test says why
# it cannot run.
set -u
CHROMIUM=${CHROMIUM:-/usr/bin/chromium}

if [ -x "$CHROMIUM" ]; then
    echo "install_browser: $CHROMIUM is already installed"
    exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
    echo "install_browser: $CHROMIUM is missing and apt-get is not available on this system;" >&2
    echo "  install Chromium by other means and make it available at $CHROMIUM" >&2
    exit 1
fi

if [ "$(id -u)" -eq 0 ]; then
    SUDO=""
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    SUDO="sudo -n"
else
    echo "install_browser: $CHROMIUM is missing and installing it needs root;" >&2
    echo "  run: sudo apt-get update && sudo apt-get install -y chromium" >&2
    exit 1
fi

echo "install_browser: installing Debian's chromium (apt-get)"
export DEBIAN_FRONTEND=noninteractive
if ! { $SUDO apt-get update -q && $SUDO apt-get install -y -q --no-install-recommends chromium fonts-dejavu-core; }; then
    echo "install_browser: apt-get could not install chromium (see the messages above)" >&2
    exit 1
fi

if [ ! -x "$CHROMIUM" ]; then
    echo "install_browser: apt-get finished but $CHROMIUM is still missing" >&2
    exit 1
fi
echo "install_browser: installed $("$CHROMIUM" --version 2>/dev/null || echo chromium)"
