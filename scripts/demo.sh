#!/usr/bin/env bash
# The main job on the built-in sample: installs what is missing, builds dzr, makes the tiny random
# checkpoint (the real DreamZero key names at a few-MB geometry, with the sample umT5 tokenizer), and
# replays samples/episode_000 through the warm-up and the chunked rollout on the CPU, with the predicted
# video. Prints the summary table, the output paths and, last, the HTML report to open.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
echo "demo: building dzr into build/ (the first build takes several minutes on 2 cores, longer with CUDA;"
echo "      later builds are incremental)"
# NOTE: ninja's "[n/N]" lines become a line per 10%; errors pass through; warnings are left out.
set +o pipefail
BUILD_DIR=build scripts/build.sh 2>&1 | awk -F'[][/]' '
    /^\[[0-9]+\/[0-9]+\]/ { p = int($2 * 10 / $3); if (p != last) { printf "demo: build %d%% (%d of %d steps)\n", p * 10, $2, $3; fflush(); last = p }; next }
    /[Ee]rror|FAILED/ { print; fflush() }'
status=${PIPESTATUS[0]}
set -o pipefail
[[ $status == 0 ]] || { echo "demo: the build failed (run scripts/build.sh to see why)"; exit 1; }
DZR=build/bin/dzr
OUT=${OUT_DIR:-out/demo}
rm -rf "$OUT"
mkdir -p "$OUT"
"$DZR" ckpt make --config configs/tiny.yaml --seed 0 --dtype f32 --tokenizer tests/data/tokenizer/spiece.model \
    --out "$OUT/ckpt-tiny" >/dev/null
"$DZR" ckpt validate "$OUT/ckpt-tiny" --config configs/tiny.yaml
"$DZR" rollout samples/episode_000 --ckpt "$OUT/ckpt-tiny" --config configs/tiny.yaml --device cpu \
    --out "$OUT/rollout" --save-video
echo "demo: actions, timing, metrics, plots and videos in $OUT/rollout/episode_000/"
echo "demo: NOTE the demo checkpoint has random weights: its actions are noise and the MSE means nothing;" \
     "it shows the pipeline, the files and the timings (use a real DreamZero checkpoint for real actions)"
echo "demo: report: $OUT/rollout/report.html"
