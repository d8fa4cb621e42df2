#!/usr/bin/env bash
# The prepared GPU check: one run, one JSON and one log (specdec_lab/bench/gpu_check.py says what
# it measures). It downloads nothing and installs nothing from the network, and needs only torch
# (2.11 or newer), transformers, safetensors and tokenizers, which a GPU machine's image has.
#
#   bash scripts/gpu_check.sh            # on a CUDA machine: the full check, about 7 minutes on an H200
#   bash scripts/gpu_check.sh --smoke    # tiny shapes on the CPU in a few minutes (the test suite runs it)
#
# The default pair's real weights: the draft ships in the repository; the target's 98 MB .gguf
# comes with the check as .gpu/gguf.part-* (DEVELOPERS.md says how), with the wheel of `gguf` in
# .gpu/wheels/ for the one-time conversion. Outputs go to $OUT (default gpu_check_out/).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu_check_out}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

if [[ "${1:-}" == "--smoke" ]]; then
    exec "$PY" -m specdec_lab.bench.gpu_check --smoke --out "$OUT/gpu_check.json" --log "$OUT/gpu_check.log" \
        --budget "${BUDGET:-600}"
fi

export SPECDEC_LAB_CACHE=${SPECDEC_LAB_CACHE:-$PWD/.gpu/cache}
mkdir -p "$SPECDEC_LAB_CACHE"
gguf="$SPECDEC_LAB_CACHE/SmolLM2-135M-Instruct.Q4_1.gguf"
if [[ ! -f "$gguf" ]] && compgen -G ".gpu/gguf.part-*" > /dev/null; then
    cat .gpu/gguf.part-* > "$gguf"  # the library checks its sha256 before using it
fi
if compgen -G ".gpu/wheels/*.whl" > /dev/null; then
    "$PY" -m pip install -q --no-deps --no-index .gpu/wheels/*.whl
fi
nvidia-smi --query-gpu=name,memory.total,clocks.max.memory --format=csv | tee "$OUT/nvidia_smi.txt" || true
# perf_hints logs why a graph could not be captured (for example a mutated input), if it ever is.
TORCH_LOGS=${TORCH_LOGS:-perf_hints} "$PY" -m specdec_lab.bench.gpu_check --out "$OUT/gpu_check.json" \
    --log "$OUT/gpu_check.log" --budget "${BUDGET:-390}" 2> "$OUT/stderr.log" || status=$?
if "$PY" -c "import pytest" 2> /dev/null; then  # the GPU tests, where pytest is installed (or carried)
    "$PY" -m pytest -q -p no:cacheprovider tests/test_gpu.py tests/test_static.py > "$OUT/tests.log" 2>&1 || true
    tail -n 5 "$OUT/tests.log"
fi
exit "${status:-0}"
