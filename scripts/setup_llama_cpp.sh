#!/usr/bin/env bash
# Build llama.cpp (llama-server, llama-quantize) from the tree vendored in the PyPI sdist of
# llama-cpp-python, and a tools virtualenv for llama.cpp's own converter (convert_hf_to_gguf.py),
# both in the cache outside the repository. Reused when present; the GGUF tests use them.
#
#   scripts/setup_llama_cpp.sh [all|build|tools]      (default: all)
#
# Safe to interrupt: the sdist is extracted into a temporary folder and renamed into place; a
# build counts as done only once its stamp file is written (an interrupted build resumes
# incrementally); the tools virtualenv is made in a temporary folder and renamed when complete.
# Without a C++ compiler it says so and exits 0: the GGUF tests then skip, naming the reason.
set -euo pipefail

VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
TORCH=${MTPFORGE_TOOLS_TORCH:-torch==2.13.0}
CACHE=${MTPFORGE_CACHE:-$HOME/.cache/mtpforge}
SRC="$CACHE/llama_cpp_python-$VERSION"
TREE="$SRC/vendor/llama.cpp"
BUILD="$TREE/build"
STAMP="$BUILD/.mtpforge-build-ok"
TOOLS="$CACHE/tools-llama-cpp"
PY=${PYTHON:-python3}
what=${1:-all}

log() { printf 'setup_llama_cpp: %s\n' "$*" >&2; }

fetch_tree() {
    [ -f "$TREE/CMakeLists.txt" ] && return 0
    mkdir -p "$CACHE"
    local tmp
    tmp=$(mktemp -d "$CACHE/.llama-sdist.XXXXXX")
    # no RETURN trap: bash keeps it set after this function returns and fires it, with $tmp
    # unbound, when the next function returns (set -u then ends the script)
    log "downloading the llama-cpp-python==$VERSION sdist"
    if ! "$PY" -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$tmp" ||
        ! tar -xzf "$tmp"/llama_cpp_python-"$VERSION".tar.gz -C "$tmp"; then
        rm -rf "$tmp"
        log "could not download or unpack the llama-cpp-python==$VERSION sdist"
        return 1
    fi
    rm -rf "$SRC"
    mv "$tmp/llama_cpp_python-$VERSION" "$SRC"
    rm -rf "$tmp"
}

cmake_tools() {
    # cmake and ninja from PyPI (into the tools venv) where the machine has none
    if command -v cmake >/dev/null && command -v ninja >/dev/null; then
        return 0
    fi
    tools_venv
    "$TOOLS/bin/python" -m pip install -q cmake ninja
    export PATH="$TOOLS/bin:$PATH"
}

# ggml's AMX kernels (compiled in by -march=native on a CPU that lists amx_tile) die with SIGILL
# where the kernel or hypervisor does not grant the AMX tile state, as on the x86 machines CI
# runs on; the AVX-512 paths they replace are fine for the tiny models the tests run
EXTRA_FLAGS=""
if [ "$(uname -m)" = "x86_64" ]; then
    EXTRA_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
fi
CONFIG="native; extra flags: ${EXTRA_FLAGS:-none}"

build() {
    if [ -f "$STAMP" ] && grep -qxF "$CONFIG" "$STAMP" && [ -x "$BUILD/bin/llama-server" ] &&
        [ -x "$BUILD/bin/llama-quantize" ]; then
        log "llama.cpp already built: $BUILD/bin"
        return 0
    fi
    if ! command -v c++ >/dev/null && ! command -v clang++ >/dev/null && ! command -v g++ >/dev/null; then
        log "no C++ compiler found: llama.cpp not built (the GGUF tests will be skipped)"
        return 0
    fi
    fetch_tree
    cmake_tools
    log "building llama-server and llama-quantize in $BUILD (12-25 min on 2 cores)"
    (
        cd "$TREE"
        cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DGGML_NATIVE=ON \
            -DCMAKE_C_FLAGS="$EXTRA_FLAGS" -DCMAKE_CXX_FLAGS="$EXTRA_FLAGS" \
            -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF >/dev/null
        cmake --build build --target llama-server llama-quantize -j"${LLAMA_BUILD_JOBS:-2}"
    )
    printf '%s\n%s\n' "$CONFIG" "$(date -u +%FT%TZ)" >"$STAMP"
    log "built: $BUILD/bin"
}

tools_venv() {
    if [ -f "$TOOLS/.mtpforge-tools-ok" ]; then
        return 0
    fi
    fetch_tree
    mkdir -p "$CACHE"
    rm -rf "$CACHE"/.tools-llama-cpp.*
    local tmp
    tmp=$(mktemp -d "$CACHE/.tools-llama-cpp.XXXXXX")
    log "making the converter's virtualenv ($TORCH CPU, transformers, the tree's gguf-py)"
    "$PY" -m venv "$tmp"
    local links=()
    # a local CPU wheel of torch where the machine has one (PyPI's Linux torch pulls in GBs of CUDA)
    [ -d "${MTPFORGE_WHEELS:-/opt/wheels}" ] && links=(--find-links "${MTPFORGE_WHEELS:-/opt/wheels}")
    "$tmp/bin/python" -m pip install -q "${links[@]}" "$TORCH" "transformers>=4.57,<6" sentencepiece \
        "protobuf>=4.21" "$TREE/gguf-py"
    touch "$tmp/.mtpforge-tools-ok"
    rm -rf "$TOOLS"
    # the venv is always run as "$TOOLS/bin/python", which finds its pyvenv.cfg after the rename
    mv "$tmp" "$TOOLS"
    log "converter virtualenv: $TOOLS"
}

case "$what" in
    all) build; tools_venv ;;
    build) build ;;
    tools) tools_venv ;;
    *) log "usage: $0 [all|build|tools]"; exit 2 ;;
esac
