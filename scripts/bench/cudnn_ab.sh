#!/usr/bin/env bash
# The DROID bench rollout built against two cuDNN releases in one device call: the system's (the GPU machine's
# cuDNN 9.14) and the one PyTorch's environment carries (cuDNN 9.19 in its nvidia-cudnn wheel), same tree, same
# machine, the benches back to back. Usage (GPU machine, repository root): OUT=$OUT scripts/bench/cudnn_ab.sh
# Settings: AB_NUMERICS (default "fast"), BENCH_CALLS (21), CUDNN_DIR (default: python3's nvidia.cudnn package).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/dzr-ab-out}
mkdir -p "$OUT"
CUDNN_DIR=${CUDNN_DIR:-$(python3 -c 'import nvidia.cudnn as c; print(list(c.__path__)[0])' 2>/dev/null)}
round() {  # round NAME [env...]: build into build-NAME, then bench, the round's files under $OUT/NAME/
    local name=$1
    shift
    mkdir -p "$OUT/$name"
    for step in build bench; do
        env "$@" BUILD_DIR="build-$name" WORK="/tmp/dzr-ab-$name" STEPS="$step" BENCH_NUMERICS="${AB_NUMERICS:-fast}" \
            BENCH_CALLS="${BENCH_CALLS:-21}" OUT="$OUT/$name" bash scripts/parity/device_round.sh >"$OUT/$name/$step.log" 2>&1
        echo "== $name $step: exit $?"
    done
    grep -h -o "cuBLASLt + cuDNN [0-9]*" "/tmp/dzr-ab-$name/bench/"rollout-*.log 2>/dev/null | head -n 1
    tail -n 24 "$OUT/$name/bench.log"
}
round system
if [[ -n "$CUDNN_DIR" && -f "$CUDNN_DIR/include/cudnn.h" && -e "$CUDNN_DIR/lib/libcudnn.so.9" ]]; then
    grep -m3 -E "define CUDNN_(MAJOR|MINOR|PATCHLEVEL)" "$CUDNN_DIR/include/cudnn_version.h"
    round wheel EXTRA_CMAKE_ARGS="-DDZR_CUDNN_INCLUDE=$CUDNN_DIR/include -DDZR_CUDNN_LIB=$CUDNN_DIR/lib/libcudnn.so.9" \
        LD_LIBRARY_PATH="$CUDNN_DIR/lib:${LD_LIBRARY_PATH:-}"
else
    echo "no cuDNN wheel found (CUDNN_DIR='$CUDNN_DIR')"
fi
