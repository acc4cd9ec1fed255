#!/usr/bin/env bash
# The main job on the built-in sample: installs what is missing, builds dzr, makes the tiny random
# checkpoint (the real DreamZero key names at a few-MB geometry, with the sample umT5 tokenizer), and
# replays samples/episode_000 through the warm-up and the chunked rollout on the CPU, with the predicted
# video. Prints the summary table, the output paths and, last, the HTML report to open.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
BUILD_DIR=build scripts/build.sh >/dev/null
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
echo "demo: report: $OUT/rollout/report.html"
