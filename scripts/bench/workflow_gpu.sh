#!/usr/bin/env bash
# The users' workflow paths on the GPU at DROID's geometry, in steps that reuse what a warm machine still has:
#   deps    unpack .gpu-deps (scripts/bench/gpu_deps.sh: FFmpeg, msgpack-cxx, the serve client's wheels)
#   build   Release CUDA build of dzr (sm_90a, no OpenCV) with the dataset reader and the server, BUILD_DIR
#   ckpt    a random DROID checkpoint (46 GB) in CKPT, made once
#   lerobot the same episodes rolled out from .npy (dzr episode convert of the dataset), from the LeRobot dataset
#           (h264 v2.0, then AV1 v3.0), and from .npy again: s/call and wall time per call, actions compared
#   serve   dzr serve --record, one session on the official client's schedule through loopback, then the recording
#           replayed offline: served latency (request to reply) against the offline call time, actions compared
#   oldnew  OLD (the source in .gpu-deps/old-src.tar.xz) against this tree: dzr bench rollout in fast numerics,
#           alternated, and a reference-numerics rollout of one episode by both, actions compared
#   tests   the CUDA tests (ctest -L cuda) of BUILD_DIR
#   offload DiT layers streamed from host memory (offload_layers): the CUDA tests of the streaming, then
#           dzr bench rollout in fast numerics with the defaults, without the in-place lanes, and without them with
#           the 5 streamed layers a 44 GiB budget chooses (alternated, twice)
#   offref  reference-numerics rollouts of one episode with the defaults and with --gpu-memory-budget 44GiB (its
#           choices printed, the measured peak), actions compared
# Everything goes to $OUT/workflow.tar.gz; a summary is printed last.
#
# Usage (GPU machine, repository root, .gpu-deps carried): STEPS="deps build ckpt lerobot" OUT=$OUT scripts/bench/workflow_gpu.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/dzr-workflow-out}
STEPS=${STEPS:-deps build ckpt lerobot serve oldnew}
BUILD_DIR=${BUILD_DIR:-build-workflow}
OLD_BUILD=${OLD_BUILD:-/tmp/dzr-old/build}
CKPT=${CKPT:-/tmp/dzr-droid-ckpt}
DEPS=${DEPS:-/tmp/dzr-gpudeps}
W=${WORK:-/tmp/dzr-workflow}
CALLS=${CALLS:-11}
JOBS=${JOBS:-$(nproc)}
export PATH="$PATH:/usr/local/cuda/bin" PYTHONUNBUFFERED=1
export PKG_CONFIG_LIBDIR="$DEPS/ffmpeg/lib/pkgconfig" CMAKE_PREFIX_PATH="$DEPS/msgpack"
export LD_LIBRARY_PATH="$DEPS/ffmpeg/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" PYTHONPATH="$DEPS/py"
mkdir -p "$OUT" "$W/logs"
DZR=$PWD/$BUILD_DIR/bin/dzr
TOK=tests/data/tokenizer/spiece.model
CONFIG=${CONFIG:-configs/dreamzero_droid.yaml}
COMMON=(--config "$CONFIG" --device "${DEVICE:-cuda}" --tokenizer "$TOK")
failed=()
summary=$W/logs/summary.txt
want() { [[ " $STEPS " == *" $1 "* ]]; }
say() { echo "== $1 ($((SECONDS)) s)" | tee -a "$summary"; }
note() { echo "$*" | tee -a "$summary"; }
check() { (($1 == 0)) || { failed+=("$2 (exit $1)"); note "FAILED: $2 (exit $1)"; }; }
finish() {
    say "summary"
    if ((${#failed[@]})); then printf 'failed: %s\n' "${failed[@]}" | tee -a "$summary"; else note "every step passed"; fi
    tar -C "$W" -czf "$OUT/workflow.tar.gz" logs 2>/dev/null
    cp "$summary" "$OUT/summary.txt"
}
trap finish EXIT
nvidia-smi --query-gpu=name,memory.total,power.limit --format=csv,noheader 2>/dev/null | tee -a "$summary"

# The rollout's mean and median call time, and its wall time per call less the load and the warm-up, from the run's
# timing.json files and the wall time the caller measured.
stats() {
    python3 - "$@" <<'PY'
import glob, json, statistics, sys
out, wall = sys.argv[1], float(sys.argv[2])
calls, load, warm = [], 0.0, 0.0
for f in sorted(glob.glob(f"{out}/*/timing.json")):
    t = json.load(open(f))
    calls += [c["total_ms"] for c in t["calls"] if c.get("timed", True)]
    load = max(load, t.get("checkpoint_load_ms") or 0)
    warm = max(warm, (t.get("warmup") or {}).get("total_ms") or 0)
print(f"{out.rsplit('/', 1)[-1]}: {len(calls)} calls, mean {statistics.mean(calls):.1f} ms, median "
      f"{statistics.median(calls):.1f} ms; wall {wall:.1f} s, less load {load / 1e3:.1f} s and warm-up {warm / 1e3:.1f} s: "
      f"{(wall * 1e3 - load - warm) / len(calls):.1f} ms per call")
PY
}

if want deps; then
    say "deps"
    if [[ ! -d "$DEPS/ffmpeg" ]]; then
        mkdir -p "$DEPS" && tar -C "$DEPS" -xJf .gpu-deps/prefix.tar.xz
        python3 -m pip install -q --no-deps --no-index --target "$DEPS/py" .gpu-deps/wheels/*.whl 2>&1 | tail -n 2
        chmod +x "$DEPS"/py/pkgconf/.bin/pkgconf 2>/dev/null
    fi
    ls "$DEPS/ffmpeg/lib" | wc -l | xargs echo "ffmpeg libraries:" | tee -a "$summary"
fi
PKGCONF=$(command -v pkg-config || echo "$DEPS/py/pkgconf/.bin/pkgconf")

if want build; then
    say "build ($BUILD_DIR)"
    t=$SECONDS
    cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDZR_OPENCV=OFF -DCMAKE_CUDA_ARCHITECTURES=90a \
        -DDZR_DATASETS=ON -DDZR_SERVE=ON -DDZR_PYTHON=python3 "-DPKG_CONFIG_EXECUTABLE=$PKGCONF" \
        >"$W/logs/configure.log" 2>&1
    check $? "configure"
    grep -E "^-- dzr" "$W/logs/configure.log" | tee -a "$summary"
    cmake --build "$BUILD_DIR" -j "$JOBS" --target dzr_cli >"$W/logs/build.log" 2>&1
    check $? "build dzr"
    note "build: $((SECONDS - t)) s"
    grep -E "error|warning" "$W/logs/build.log" | head -n 20
fi

if want ckpt; then
    say "ckpt ($CKPT)"
    if [[ ! -f "$CKPT/model.safetensors.index.json" ]]; then
        df -h /tmp | tail -n 1
        t=$SECONDS
        "$DZR" ckpt make --config configs/dreamzero_droid.yaml --seed 1 --out "$CKPT" --force --threads 14 \
            --tokenizer "$TOK" >"$W/logs/ckpt.log" 2>&1
        check $? "ckpt make"
        note "ckpt make: $((SECONDS - t)) s"
    fi
fi

rollout() {  # NAME INPUT [args]: one rollout into $W/NAME, timed
    local name=$1 input=$2
    shift 2
    rm -rf "${W:?}/$name"
    local t0=$EPOCHREALTIME
    "$DZR" rollout "$input" --ckpt "$CKPT" "${COMMON[@]}" --out "$W/$name" --no-report "$@" >"$W/logs/$name.log" 2>&1
    check $? "rollout $name"
    stats "$W/$name" "$(python3 -c "print($EPOCHREALTIME - $t0)")" | tee -a "$summary"
}
same_actions() {  # A B: every episode's actions.npy of run A equals run B's
    local n=0 same=0
    for f in "$W/$1"/*/actions.npy; do
        n=$((n + 1))
        cmp -s "$f" "$W/$2/$(basename "$(dirname "$f")")/actions.npy" && same=$((same + 1))
    done
    note "actions.npy of $1 and $2: $same of $n identical"
    ((n > 0 && same == n)) || failed+=("actions differ: $1 against $2")
}

if want lerobot; then
    say "lerobot: .npy, LeRobot h264 v2.0, LeRobot AV1 v3.0, .npy again"
    rm -rf "$W/npy-eps"
    "$DZR" episode convert .gpu-deps/droid_v20 --out "$W/npy-eps" >"$W/logs/convert.log" 2>&1
    check $? "episode convert"
    "$DZR" bench prepare --dataset .gpu-deps/droid_v20 --repeats 3 >"$W/logs/prepare-v20.log" 2>&1
    "$DZR" bench prepare --dataset .gpu-deps/droid_v30 --repeats 3 >"$W/logs/prepare-v30.log" 2>&1
    grep -hiE "frames/s|fps|per call" "$W"/logs/prepare-v*.log | head -n 6 | tee -a "$summary"
    rollout npy1 "$W/npy-eps"
    rollout lr_v20 .gpu-deps/droid_v20
    rollout lr_v30 .gpu-deps/droid_v30
    rollout npy2 "$W/npy-eps"
    same_actions lr_v20 npy1
    same_actions npy2 npy1
fi

if want serve; then
    say "serve: one session through loopback, then its recording replayed"
    ep=$(ls -d "$W"/npy-eps/*/ | head -n 1)
    ${SERVE_PYTHON:-python3} scripts/bench/serve_latency.py --dzr "$DZR" --ckpt "$CKPT" --episode "$ep" --work "$W/serve" \
        -- "${COMMON[@]}" 2>&1 | tee "$W/logs/serve.log" | tail -n 25 | tee -a "$summary"
    check "${PIPESTATUS[0]}" "serve latency"
fi

if want oldnew; then
    say "oldnew: $(cat .gpu-deps/old-commit 2>/dev/null) against this tree"
    if [[ ! -x "$OLD_BUILD/bin/dzr" ]]; then
        t=$SECONDS
        rm -rf /tmp/dzr-old/src && mkdir -p /tmp/dzr-old/src && tar -C /tmp/dzr-old/src -xJf .gpu-deps/old-src.tar.xz
        cmake -S /tmp/dzr-old/src -B "$OLD_BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDZR_OPENCV=OFF \
            -DCMAKE_CUDA_ARCHITECTURES=90a >"$W/logs/old-configure.log" 2>&1 &&
            cmake --build "$OLD_BUILD" -j "$JOBS" --target dzr_cli >"$W/logs/old-build.log" 2>&1
        check $? "old build"
        note "old build: $((SECONDS - t)) s"
    fi
    for round in 1 2; do
        for which in old new; do
            bin=$DZR
            [[ $which == old ]] && bin=$OLD_BUILD/bin/dzr
            "$bin" bench rollout --numerics fast --calls "$CALLS" --threads 14 --json "$W/logs/bench-$which-$round.json" \
                >"$W/logs/bench-$which-$round.log" 2>&1
            check $? "bench $which $round"
            note "$which round $round: $(grep -hE "^\| *total|total  |during the timed" "$W/logs/bench-$which-$round.log" | head -n 3 | tr -s ' ' | tr '\n' ' ')"
        done
    done
    rm -rf "$W/ref-eps" && "$DZR" episode synth --out "$W/ref-eps/ep_0" --frames 48 --seed 3 --frames-format npy >/dev/null
    for which in old new; do
        bin=$DZR
        [[ $which == old ]] && bin=$OLD_BUILD/bin/dzr
        rm -rf "$W/ref-$which"
        "$bin" rollout "$W/ref-eps" --ckpt "$CKPT" "${COMMON[@]}" --numerics reference --out "$W/ref-$which" --no-report \
            >"$W/logs/ref-$which.log" 2>&1
        check $? "reference rollout $which"
    done
    same_actions ref-new ref-old
fi

if want offload; then
    say "offload: streamed DiT layers (offload_layers)"
    cmake --build "$BUILD_DIR" -j "$JOBS" --target cuda_test_layer_stream cuda_test_graphs >"$W/logs/build-offload.log" 2>&1
    check $? "build the streaming tests"
    (cd "$BUILD_DIR" && ctest -R "cuda/test_layer_stream|cuda/test_graphs" --output-on-failure) >"$W/logs/ctest-offload.log" 2>&1
    check $? "ctest streaming"
    tail -n 4 "$W/logs/ctest-offload.log" | tee -a "$summary"
    for round in $(seq "${ROUNDS:-2}"); do
        for variant in lanes nolanes stream5; do
            args=()
            [[ $variant != lanes ]] && args+=(--set kv.in_place=false)
            [[ $variant == stream5 ]] && args+=(--set offload_layers=5)
            "$DZR" bench rollout --numerics fast --calls "$CALLS" --threads 14 "${args[@]}" \
                --json "$W/logs/bench-$variant-$round.json" >"$W/logs/bench-$variant-$round.log" 2>&1
            check $? "bench $variant $round"
            note "$variant round $round: $(grep -hE "^total|peak device memory|J/call|energy" "$W/logs/bench-$variant-$round.log" | head -n 4 | tr -s ' ' | tr '\n' ' ')"
        done
    done
fi

if want offref; then
    say "offref: reference numerics, resident against a 44 GiB budget"
    rm -rf "$W/ref-eps" && "$DZR" episode synth --out "$W/ref-eps/ep_0" --frames 72 --seed 3 --frames-format npy >/dev/null
    rollout ref-resident "$W/ref-eps" --numerics reference
    rollout ref-44 "$W/ref-eps" --numerics reference --gpu-memory-budget 44GiB
    grep -hE "memory plan|streamed from host|peak" "$W/logs/ref-44.log" | head -n 6 | tee -a "$summary"
    grep -hE "peak" "$W/logs/ref-resident.log" | head -n 2 | tee -a "$summary"
    same_actions ref-44 ref-resident
fi

if want tests; then
    say "tests: ctest -L cuda"
    cmake --build "$BUILD_DIR" -j "$JOBS" >"$W/logs/build-all.log" 2>&1
    check $? "build all"
    (cd "$BUILD_DIR" && ctest -L cuda -j 4 --output-on-failure) >"$W/logs/ctest-cuda.log" 2>&1
    check $? "ctest -L cuda"
    tail -n 5 "$W/logs/ctest-cuda.log" | tee -a "$summary"
fi
((${#failed[@]} == 0))
