#!/usr/bin/env bash
# The main job on the built-in sample: installs what is missing, builds dzr, makes the tiny random
# checkpoint (real DreamZero key names at a few-MB geometry) and inspects and validates it.
# When `dzr rollout` lands this becomes: roll out samples/ on the CPU and print the summary.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
BUILD_DIR=build scripts/build.sh >/dev/null
DZR=build/bin/dzr
OUT=${OUT_DIR:-out/demo}
rm -rf "$OUT/ckpt-tiny"
mkdir -p "$OUT"
"$DZR" ckpt make --config configs/tiny.yaml --seed 0 --out "$OUT/ckpt-tiny"
"$DZR" ckpt inspect "$OUT/ckpt-tiny"
"$DZR" ckpt validate "$OUT/ckpt-tiny" --config configs/tiny.yaml
echo "demo: tiny checkpoint at $OUT/ckpt-tiny"
