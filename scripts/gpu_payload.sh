#!/usr/bin/env bash
# Prepare .gpu/ (ignored by git) for scripts/gpu_check.sh on a machine that cannot download:
#   .gpu/gguf.part-aa, -ab   the default target's 98 MB .gguf in two parts of at most 50 MB
#   .gpu/wheels/             wheels of gguf (the one-time conversion) and of pytest (the GPU tests)
# DEVELOPERS.md says how the parts travel. Needs the target fetched (`make setup`) and PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
gguf=$("$PY" -c "from specdec_lab.io.assets import ensure_gguf; print(ensure_gguf())")
rm -rf .gpu && mkdir -p .gpu/wheels
split -b 50M "$gguf" .gpu/gguf.part-
"$PY" -m pip download -q --no-deps -d .gpu/wheels gguf==0.19.0 pytest==9.2.0 pluggy iniconfig pygments
ls -la .gpu .gpu/wheels
