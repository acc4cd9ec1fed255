#!/usr/bin/env bash
# Everything a device session usually wants from one machine start (each start costs a minute of the
# session's device budget): one Release CUDA build (no OpenCV, sm_90a), the CUDA tests, the host-side
# prepare benchmark, a CUDA rollout at the DROID canvas with the tiny networks (host-side timing, peak GPU
# memory, --save-video), the parity run against the official code (with the DiT-only injected run) and the
# DiT sub-stage probe. About 6 minutes on the H200 machine. Every step runs even when an earlier one
# failed; the exit status is non-zero if any did. Files go to $OUT (the run tool's folder).
#
# Usage (repository root; carry [".ref"] for the parity steps): OUT=/dir scripts/device-all.sh
# Settings: STEPS="tests bench rollout parity probe" BUILD_DIR=build-parity-device JOBS=$(nproc)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-build-parity-device/out}
BUILD_DIR=${BUILD_DIR:-build-parity-device}
JOBS=${JOBS:-$(nproc)}
STEPS=${STEPS:-tests bench rollout parity probe}
export PATH="$PATH:/usr/local/cuda/bin"
mkdir -p "$OUT"
failed=()
t_start=$SECONDS
say() { printf '\n== %s (%d s) ==\n' "$*" $((SECONDS - t_start)); }
want() { [[ " $STEPS " == *" $1 "* ]]; }
check() { (($1 == 0)) || failed+=("$2 (exit $1)"); }

say "build"
gen=()
command -v ninja >/dev/null 2>&1 && gen=(-G Ninja)
cmake -S . -B "$BUILD_DIR" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DDZR_CUDA=ON -DDZR_OPENCV=OFF \
    -DCMAKE_CUDA_ARCHITECTURES="${DZR_CUDA_ARCHS:-90a}" >"$OUT/configure.log" 2>&1
check $? configure
targets=(dzr_cli)
want tests && targets=(all)
cmake --build "$BUILD_DIR" --target "${targets[@]}" -j "$JOBS" >"$OUT/build.log" 2>&1
check $? build
grep -E "error:" "$OUT/build.log" | head -20
DZR=$BUILD_DIR/bin/dzr

if want tests; then
    say "cuda tests"
    ctest --test-dir "$BUILD_DIR" -L cuda --output-on-failure --timeout 300 >"$OUT/ctest-cuda.log" 2>&1
    check $? "cuda tests"
    tail -n 4 "$OUT/ctest-cuda.log"
fi

if want bench; then
    say "dzr bench prepare (DROID canvas)"
    "$DZR" bench prepare --config configs/dreamzero_droid.yaml --iters 100 2>&1 | tee "$OUT/bench-prepare.log"
    check "${PIPESTATUS[0]}" "bench prepare"
fi

if want rollout; then
    say "CUDA rollout at the DROID canvas, tiny networks"
    W=/tmp/dzr-device-rollout
    rm -rf "$W" && mkdir -p "$W"
    geo=(--set model.canvas_height=352 --set model.canvas_width=640 --set model.dit.frame_seqlen=880)
    "$DZR" ckpt make --config configs/tiny.yaml --seed 3 --tokenizer tests/data/tokenizer/spiece.model "${geo[@]}" \
        --out "$W/ckpt" >/dev/null &&
        "$DZR" episode synth --frames 200 --seed 0 --frames-format npy --out "$W/episode" >/dev/null &&
        "$DZR" rollout "$W/episode" --ckpt "$W/ckpt" --config configs/tiny.yaml "${geo[@]}" --device cuda \
            --save-video --out "$W/out" >"$OUT/rollout.log" 2>&1
    check $? rollout
    tail -n 16 "$OUT/rollout.log"
    cp "$W/out/episode/timing.json" "$OUT/rollout-timing.json" 2>/dev/null
fi

if want parity; then
    say "parity against the official code"
    DZR_BIN=$DZR GPU_RUNS="${GPU_RUNS:-ref-bf16-gpu ref-fp32-gpu dzr-cuda-gpu ref-fp32-cpu}" RUN_TIMEOUT=220 \
        CPU_TIMEOUT=220 OUT="$OUT/parity" bash scripts/parity/run_parity.sh >"$OUT/parity.log" 2>&1
    check $? parity
    grep -E "^(cpu-f32|cuda-bf16|dzr-bf16|ref-bf16|dit-only)" "$OUT/parity.log"
fi

if want probe; then
    say "DiT sub-stage probe"
    DZR_BIN=$DZR OUT="$OUT/probe" bash scripts/parity/substage_probe.sh | grep -E "prefill\.pos\.0\." 
    check "${PIPESTATUS[0]}" probe
fi

say "summary"
if ((${#failed[@]})); then
    printf 'failed: %s\n' "${failed[@]}"
    exit 1
fi
echo "every step passed"
