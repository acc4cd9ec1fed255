#!/usr/bin/env bash
# The VAE encode's speed on one GPU (issue #13), in one device call: builds dzr (Release, CUDA, sm_90a, no OpenCV)
# and the CUDA tests of fast numerics' convolutions and VAE norm, runs them, then `dzr bench vae` at the DROID
# geometry in reference numerics, fast numerics (the tuner's choices, the difference to reference numerics and the
# convolution plan table) and fast numerics with every convolution forced channels-last (DZR_CONV_TUNE=channels-last)
# and with the tuning off (DZR_CONV_TUNE=off: the fast VAE norm only). Logs go to $OUT.
#
# Usage (GPU machine, repository root): OUT=$OUT scripts/bench/vae_device.sh
# Settings: BUILD_DIR=build-vae-device REPEATS=10 CONFIG=configs/dreamzero_droid.yaml
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/dzr-vae-out}
BUILD_DIR=${BUILD_DIR:-build-vae-device}
REPEATS=${REPEATS:-10}
CONFIG=${CONFIG:-configs/dreamzero_droid.yaml}
export PATH="$PATH:/usr/local/cuda/bin"
mkdir -p "$OUT"
gen=()
command -v ninja >/dev/null 2>&1 && gen=(-G Ninja)
targets=(dzr_cli cuda_test_vae_fast_conv cuda_test_vae_norm cuda_test_backend_ops)
if ! cmake -S . -B "$BUILD_DIR" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DDZR_CUDA=ON -DDZR_OPENCV=OFF \
        -DCMAKE_CUDA_ARCHITECTURES=90a >"$OUT/build.log" 2>&1 ||
    ! cmake --build "$BUILD_DIR" -j "$(nproc)" $(printf -- '--target %s ' "${targets[@]}") >>"$OUT/build.log" 2>&1; then
    echo "build failed:"; tail -n 30 "$OUT/build.log"; exit 1
fi
for t in cuda_test_vae_fast_conv cuda_test_vae_norm cuda_test_backend_ops; do
    "$BUILD_DIR/tests/$t" >"$OUT/$t.log" 2>&1
    echo "$t: rc $?  $(grep -E '^\[doctest\] (test cases|assertions)' "$OUT/$t.log" | tr '\n' ' ')"
done
DZR=$BUILD_DIR/bin/dzr
bench() {  # name, VAR=value, dzr bench vae arguments...
    local name=$1 setting=$2
    shift 2
    env "$setting" "$DZR" --log-level debug bench vae --config "$CONFIG" --repeats "$REPEATS" "$@" \
        >"$OUT/bench-$name.log" 2>"$OUT/bench-$name.err"
    echo "== bench $name ($setting, rc $?)"
    cat "$OUT/bench-$name.log"
}
bench reference DZR_CONV_TUNE=auto --numerics reference
bench fast DZR_CONV_TUNE=auto
bench fast-channels-last DZR_CONV_TUNE=channels-last --no-compare
bench fast-tune-off DZR_CONV_TUNE=off --no-compare
