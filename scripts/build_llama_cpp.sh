#!/usr/bin/env bash
# Build llama.cpp's llama-server, the peer the benchmark runs beside the lab's engine
# (specdec_lab/bench/peer.py) and the loader the export tests hold the GGUF draft to.
#
# The source is llama.cpp as vendored in the llama-cpp-python sdist on PyPI (pinned and
# sha256-checked), extracted into $SPECDEC_LAB_CACHE/llama.cpp (default ~/.cache/specdec_lab),
# outside the repository. Only llama-server is built: Release, CPU only, static, no web UI, no
# HTTPS, at most 2 parallel jobs. A stamp file makes a second run a no-op.
#
# Built for this processor (-march=native) but without Intel AMX: on machines whose CPU has AMX
# tiles but whose kernel or sandbox does not grant them to the process, ggml's AMX matmul
# (ggml_backend_amx_mul_mat) segfaults on the first forward. The AVX-512/AVX2 kernels run instead.
#
#   bash scripts/build_llama_cpp.sh [PYTHON]      # PYTHON runs pip download (default .venv/bin/python)
#
# LLAMA_ARCH=x86-64-v3 (any gcc -march value) builds a second llama-server for that processor level
# instead, into $SPECDEC_LAB_CACHE/llama.cpp-x86-64-v3: scripts/peer_noise.py compares two builds'
# arithmetic on one machine (docs/peer_noise.json). The default, native, is the one the lab runs.
set -euo pipefail

VERSION=0.3.36  # llama-cpp-python; its vendor/llama.cpp is the llama.cpp built here
SDIST_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
PY=${1:-.venv/bin/python}
CACHE=${SPECDEC_LAB_CACHE:-$HOME/.cache/specdec_lab}
ARCH=${LLAMA_ARCH:-native}
ROOT=$CACHE/llama.cpp
ARCH_FLAGS=()
if [[ $ARCH != native ]]; then
    ROOT=$CACHE/llama.cpp-$ARCH
    ARCH_FLAGS=(-DGGML_NATIVE=OFF)
fi
BIN=$ROOT/bin/llama-server
STAMP=$ROOT/BUILT-llama-cpp-python-$VERSION-no-amx  # the flavour in the name: an older build is rebuilt
NO_AMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
if [[ $ARCH != native ]]; then NO_AMX="-march=$ARCH $NO_AMX"; fi
JOBS=${JOBS:-2}

fail() {
    echo "build_llama_cpp.sh: FAILED: $*" >&2
    echo "build_llama_cpp.sh: llama-server is needed by tests/test_export.py, tests/test_peer.py and chapter 14;" >&2
    echo "build_llama_cpp.sh: it needs PyPI, cmake and a C++17 compiler (see the log above)." >&2
    exit 1
}
trap 'fail "a command exited with an error (line $LINENO)"' ERR

# llama.cpp's own converter (convert_hf_to_gguf.py, its conversion/ package and gguf-py), kept beside
# the binary: io/export.py runs it to turn the EAGLE-3 checkpoint into the GGUF llama-server reads.
CONVERT=$ROOT/convert
keep_converter() {
    [[ -f $CONVERT/convert_hf_to_gguf.py ]] && return 0
    local tmp=$ROOT/convert.partial
    rm -rf "$tmp" && mkdir -p "$tmp"
    tar -xzf "$1" -C "$tmp" --strip-components=3 "llama_cpp_python-$VERSION/vendor/llama.cpp/convert_hf_to_gguf.py" \
        "llama_cpp_python-$VERSION/vendor/llama.cpp/conversion" "llama_cpp_python-$VERSION/vendor/llama.cpp/gguf-py"
    mv "$tmp" "$CONVERT"
}

if [[ -f $STAMP && -x $BIN ]]; then
    [[ -f $ROOT/llama_cpp_python-$VERSION.tar.gz ]] && keep_converter "$ROOT/llama_cpp_python-$VERSION.tar.gz"
    echo "llama-server (llama.cpp from llama-cpp-python $VERSION) is built: $BIN"
    exit 0
fi
command -v cmake >/dev/null || fail "cmake is not installed (apt-get install cmake)"
command -v c++ >/dev/null || fail "no C++ compiler (apt-get install g++)"
[[ -x $PY ]] || PY=$(command -v python3) || fail "no Python to run pip download with"

mkdir -p "$ROOT"
SDIST=$ROOT/llama_cpp_python-$VERSION.tar.gz
if [[ ! -f $SDIST ]] || ! echo "$SDIST_SHA256  $SDIST" | sha256sum -c --quiet - 2>/dev/null; then
    echo "downloading the llama-cpp-python $VERSION source from PyPI (77 MB) ..."
    rm -f "$SDIST"
    "$PY" -m pip download --quiet --disable-pip-version-check --no-binary :all: --no-deps \
        -d "$ROOT" "llama-cpp-python==$VERSION"
    echo "$SDIST_SHA256  $SDIST" | sha256sum -c --quiet - || fail "$SDIST: sha256 mismatch"
fi

keep_converter "$SDIST"

SRC=$ROOT/src
rm -rf "$SRC" "$ROOT/build"
mkdir -p "$SRC"
echo "extracting vendor/llama.cpp ..."
tar -xzf "$SDIST" -C "$SRC" --strip-components=3 "llama_cpp_python-$VERSION/vendor/llama.cpp"

echo "building llama-server with $JOBS jobs (about 10 minutes on 2 free cores; more on a busy machine) ..."
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
cmake -S "$SRC" -B "$ROOT/build" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
    -DGGML_CUDA=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF "${ARCH_FLAGS[@]}" \
    -DCMAKE_C_FLAGS="$NO_AMX" -DCMAKE_CXX_FLAGS="$NO_AMX" > "$ROOT/cmake.log" 2>&1 \
    || { tail -30 "$ROOT/cmake.log" >&2; fail "cmake could not configure llama.cpp ($ROOT/cmake.log)"; }
start=$SECONDS
cmake --build "$ROOT/build" --target llama-server -j "$JOBS" > "$ROOT/build.log" 2>&1 \
    || { tail -30 "$ROOT/build.log" >&2; fail "compiling llama-server failed ($ROOT/build.log)"; }
mkdir -p "$ROOT/bin"
cp "$ROOT/build/bin/llama-server" "$BIN"
"$BIN" --version > /dev/null 2>&1 || fail "$BIN does not run"
rm -rf "$ROOT/build" "$SRC"  # the binary is static: nothing else is needed
echo "$VERSION built in $((SECONDS - start)) s" > "$STAMP"
echo "llama-server built in $((SECONDS - start)) s: $BIN"
