#!/usr/bin/env bash
# Set up every separately built program the external test suites drive, each cached outside the
# repository and reused when present:
#   - the runtimes' own virtualenvs (MTPLX, vllm-mlx, mlx-vlm): tests/conformance
#   - llama.cpp (llama-server, llama-quantize) and its converter's virtualenv: tests/test_gguf*.py
#   - Chromium from the system packages: the verify --report page test
# Then `MTPFORGE_CI=1 python -m pytest` runs the whole suite with none of them skipped:
#
#   bash scripts/setup_external.sh && MTPFORGE_CI=1 python -m pytest
#
# On a fresh 2-core machine this takes about 15 minutes (llama.cpp's compile is most of it; the
# virtualenvs are built beside it), and several GB under ~/.cache/mtpforge.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
log=$(mktemp)
"$PY" scripts/setup_runtimes.py >"$log" 2>&1 &
runtimes=$!
bash scripts/setup_llama_cpp.sh
status=0
wait "$runtimes" || status=$?
grep -v '^WARNING: Location' "$log" || true
rm -f "$log"
if [ "$status" -ne 0 ]; then
    echo "setup_external: a runtime's virtualenv could not be built (above); its conformance tests fail under MTPFORGE_CI" >&2
fi
if ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-browser >/dev/null 2>&1; then
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    if command -v apt-get >/dev/null 2>&1; then
        $SUDO apt-get update -q
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q chromium
    else
        echo "setup_external: install Chromium with your system's package manager (the report page test needs it)" >&2
    fi
fi
exit "$status"
