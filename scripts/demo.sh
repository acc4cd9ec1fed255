#!/usr/bin/env bash
# The main job on the built-in sample: installs what is missing, builds the dzr binary (the `dzr_cli` target only,
# into build-demo/; the tests build into build/), makes the tiny random checkpoint (the real DreamZero key names at a
# few-MB geometry, with the sample umT5 tokenizer), and replays samples/episode_000 through the warm-up and the
# chunked rollout on the CPU, with the predicted video, then the LeRobot sample dataset samples/lerobot_droid. Prints the summary table, the output paths and, last, the
# HTML report to open.
# Usage: scripts/demo.sh [extra cmake arguments, e.g. -DDZR_CUDA=OFF]
# Settings: DEMO_BUILD_DIR=build-demo  OUT_DIR=out/demo  JOBS=$(nproc)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
BUILD_DIR=${DEMO_BUILD_DIR:-build-demo}
mkdir -p "$BUILD_DIR"
log=$BUILD_DIR/demo-build.log
echo "demo: building the dzr binary into $BUILD_DIR/ (the first build takes several minutes on 2 cores, longer with"
echo "      CUDA; later builds are incremental). Every line of the build is shown; ninja's [n/N] counts the steps."
# NOTE: the build's output passes through unfiltered (configure lines, ninja's [n/N] steps, every warning and error)
# and goes to $log as well; the warnings are counted and listed again at the end.
set +o pipefail
# NOTE: the demo runs on the CPU; without a GPU here the CUDA backend would only cost build time
cuda_args=()
if ! nvidia-smi -L >/dev/null 2>&1 && [[ ! -f $BUILD_DIR/CMakeCache.txt ]]; then
    echo "demo: no GPU here: building without the CUDA backend (-DDZR_CUDA=OFF)"
    cuda_args=(-DDZR_CUDA=OFF)
fi
TARGETS=dzr_cli BUILD_DIR=$BUILD_DIR scripts/build.sh "${cuda_args[@]}" "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -o pipefail
# gcc/clang/ld "file:1:2: warning: ...", nvcc "file.cu(12): warning #177-D: ...", ptxas, CMake.
warning_re='(^|: )warning( #[0-9A-Za-z-]+)?: |^ptxas warning|^CMake Warning'
warnings=$(grep -cE "$warning_re" "$log" || true)
if ((warnings > 0)); then
    distinct=$(grep -E "$warning_re" "$log" | sort -u)
    echo "demo: the build printed $warnings warning(s), $(wc -l <<<"$distinct") distinct" \
         "(a header's warning repeats for each file that includes it):"
    sed 's/^/demo:   /' <<<"$distinct"
fi
[[ $status == 0 ]] || { echo "demo: the build failed (its errors are above; the whole output is in $log)"; exit 1; }
echo "demo: built $BUILD_DIR/bin/dzr ($warnings warning(s); the build's output is in $log)"
DZR=$BUILD_DIR/bin/dzr
OUT=${OUT_DIR:-out/demo}
rm -rf "$OUT"
mkdir -p "$OUT"
"$DZR" ckpt make --config configs/tiny.yaml --seed 0 --dtype f32 --tokenizer tests/data/tokenizer/spiece.model \
    --out "$OUT/ckpt-tiny" >/dev/null
"$DZR" ckpt validate "$OUT/ckpt-tiny" --config configs/tiny.yaml
"$DZR" rollout samples/episode_000 --ckpt "$OUT/ckpt-tiny" --config configs/tiny.yaml --device cpu \
    --out "$OUT/rollout" --save-video
echo "demo: actions, timing, metrics, plots and videos in $OUT/rollout/episode_000/"
# The LeRobot sample (DreamZero-DROID-Data's v2.0 layout), read where it lies, in builds with Arrow and FFmpeg.
if [[ $("$DZR" info) == *"LeRobot datasets: Arrow"* ]]; then
    "$DZR" rollout samples/lerobot_droid --ckpt "$OUT/ckpt-tiny" --config configs/tiny.yaml --device cpu \
        --out "$OUT/rollout_lerobot" --no-report
    echo "demo: the LeRobot sample's episodes in $OUT/rollout_lerobot/ (episode_000000, episode_000001)"
else
    echo "demo: this build reads no LeRobot datasets (no Arrow or FFmpeg found); samples/lerobot_droid skipped"
fi
echo "demo: NOTE the demo checkpoint has random weights: its actions are noise and the MSE means nothing;" \
     "it shows the pipeline, the files and the timings (use a real DreamZero checkpoint for real actions)"
echo "demo: report: $OUT/rollout/report.html"
