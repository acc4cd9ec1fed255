#!/usr/bin/env bash
# The one script the GPU machine runs: tool versions, a Release CUDA build (no OpenCV), the cuda and
# unit tests, then `dzr bench gemm`, `dzr bench ops`, `dzr bench attention` and `dzr bench kv`. Every
# step runs even when an earlier one failed; the exit status is non-zero if any did. Logs go to
# $BUILD_DIR/logs and, when OUT is set, to $OUT (device-test.log, ctest-cuda-full.log, logs.tar.gz).
#
# Usage: scripts/device-test.sh [extra cmake args]
#   BUILD_DIR=build-device  JOBS=16  TEST_TIMEOUT=300 (seconds per test)
#   DZR_CUDA_ARCHS=90a (one arch: faster builds; default: the project's 90a;80;89)
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build-device}
JOBS=${JOBS:-16}
LOGS="$BUILD_DIR/logs"
mkdir -p "$LOGS"
export PATH="$PATH:/usr/local/cuda/bin"
failed=()

step() { printf '\n== %s ==\n' "$*"; }
# run NAME CMD...: runs CMD with its output in $LOGS/NAME.log (and on stdout); records a failure.
run() {
    local name=$1
    shift
    "$@" 2>&1 | tee "$LOGS/$name.log"
    local rc=${PIPESTATUS[0]}
    ((rc == 0)) || failed+=("$name (exit $rc)")
    return 0
}

main() {
    step "versions ($(date -u +%Y-%m-%dT%H:%MZ))"
    nvidia-smi || failed+=("nvidia-smi")
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv || true
    nvcc --version | tail -2
    cmake --version | head -1
    g++ --version | head -1
    echo "cpus: $(nproc)"

    step configure
    local gen=() archs=() keep_going=(-k)
    if command -v ninja >/dev/null 2>&1; then
        gen=(-G Ninja)
        keep_going=(-k 0)
    fi
    [[ -n "${DZR_CUDA_ARCHS:-}" ]] && archs=(-DCMAKE_CUDA_ARCHITECTURES="$DZR_CUDA_ARCHS")
    run configure cmake -S . -B "$BUILD_DIR" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DDZR_OPENCV=OFF -DDZR_CUDA=ON \
        "${archs[@]}" "$@"

    step "build (-j$JOBS)"
    # NOTE: keep going past a broken target so every test that does build still runs.
    local t0=$SECONDS
    run build cmake --build "$BUILD_DIR" -j "$JOBS" -- "${keep_going[@]}"
    echo "build took $((SECONDS - t0)) s"

    step "cuda tests"
    run ctest-cuda ctest --test-dir "$BUILD_DIR" -L cuda --output-on-failure --timeout "${TEST_TIMEOUT:-300}"
    cp "$BUILD_DIR/Testing/Temporary/LastTest.log" "$LOGS/ctest-cuda-full.log" 2>/dev/null || true
    [[ -n "${OUT:-}" ]] && cp "$LOGS/ctest-cuda-full.log" "$OUT/" 2>/dev/null

    # NOTE: benchmarks before the unit tests, so a slow unit test cannot cost the numbers.
    step benchmarks
    local dzr="$BUILD_DIR/bin/dzr"
    run bench-gemm "$dzr" bench gemm
    run bench-gemm-dit "$dzr" bench gemm --dit
    run bench-ops "$dzr" bench ops
    run bench-attention "$dzr" bench attention
    run bench-kv "$dzr" bench kv

    step "unit tests"
    run ctest-unit ctest --test-dir "$BUILD_DIR" -L unit --output-on-failure --timeout "${TEST_TIMEOUT:-300}" -j "$JOBS"

    step summary
    grep -h -E '^(100% tests passed|[0-9]+% tests passed|The following tests FAILED)' "$LOGS"/ctest-*.log || true
    grep -h -A1 -E '^shape ' "$LOGS/bench-gemm.log" | tail -1 || true
    if ((${#failed[@]})); then
        echo "FAILED steps: ${failed[*]}"
    else
        echo "all steps passed"
    fi
}

# NOTE: the log is written to $OUT as it grows, so a run stopped from outside still leaves it there.
main "$@" 2>&1 | tee "$LOGS/device-test.log" ${OUT:+"$OUT/device-test.log"}
status=0
grep -q '^FAILED steps:' "$LOGS/device-test.log" && status=1
if [[ -n "${OUT:-}" ]]; then
    tar -czf "$OUT/logs.tar.gz" -C "$BUILD_DIR" logs 2>/dev/null
fi
exit $status
