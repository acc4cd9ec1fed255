#!/usr/bin/env bash
# Configures and builds dzr into BUILD_DIR (default build/). Extra arguments go to cmake; TARGETS (space
# separated) limits what is built.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
export PATH="$PATH:/usr/local/cuda/bin"
source scripts/lib/python.sh
gen=()
command -v ninja >/dev/null 2>&1 && gen=(-G Ninja)
if [[ ! -f "$BUILD_DIR/CMakeCache.txt" ]]; then
    cmake -S . -B "$BUILD_DIR" "${gen[@]}" "-DDZR_PYTHON=$DZR_PYTHON" "$@"
else
    cmake -S . -B "$BUILD_DIR" "$@" >/dev/null
fi
targets=()
for t in ${TARGETS:-}; do targets+=(--target "$t"); done
cmake --build "$BUILD_DIR" -j "${JOBS:-$(nproc)}" "${targets[@]}"
