#!/usr/bin/env bash
# The prepared GPU check: one command, one JSON and one log (specdec_lab/bench/gpu_check.py says what
# it measures and in which order). It downloads nothing and installs nothing: it runs from the
# tracked tree with the machine's own torch (2.11 or newer), safetensors and pytest, and reads real
# weights only from what the tree carries (the shipped draft) or what the machine already holds.
#
#   bash scripts/gpu_check.sh            # on a CUDA machine: about 8 minutes at most on an H200
#   bash scripts/gpu_check.sh --smoke    # tiny stand-ins on the CPU, the same code (the test suite runs it)
#
# Outputs go to $CHECK_OUT, else $OUT, else gpu_check_out/. LIMIT (default 540) seconds bound the whole
# command, BUDGET (default LIMIT - 40) the measurements: a step that would start later is recorded as
# skipped, and a run killed by the limit keeps every step written before it.
set -uo pipefail
cd "$(dirname "$0")/.."
DEST=${CHECK_OUT:-${OUT:-gpu_check_out}}
PY=${PYTHON:-python3}
LIMIT=${LIMIT:-540}
mkdir -p "$DEST"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
mode=()
[[ "${1:-}" == "--smoke" ]] && mode=(--smoke)
if [[ ${#mode[@]} -eq 0 ]]; then
    nvidia-smi --query-gpu=name,memory.total,clocks.max.memory --format=csv > "$DEST/nvidia_smi.txt" 2>&1 || true
fi
# perf_hints logs why a CUDA graph could not be captured, if one ever is not.
TORCH_LOGS=${TORCH_LOGS:-perf_hints} timeout -k 10 "$LIMIT" "$PY" -m specdec_lab.bench.gpu_check "${mode[@]}" \
    --out "$DEST/gpu_check.json" --log "$DEST/gpu_check.log" --budget "${BUDGET:-$((LIMIT - 40))}" \
    2> "$DEST/stderr.log"
status=$?
[[ $status -eq 124 || $status -eq 137 ]] && echo "stopped by the ${LIMIT} s limit; $DEST/gpu_check.json keeps every finished step"
tail -n 3 "$DEST/gpu_check.log"
exit $status
