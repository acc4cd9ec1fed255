#!/usr/bin/env bash
# Regenerates the CI golden fixture tests/data/golden/policy_golden.safetensors from the official
# reference (docs/PARITY.md): a checkpoint at tests/data/golden/policy_golden.yaml (seed 7, f32), the
# parity inputs (7 calls), the reference head in fp32 (reference_run.py), then make_golden.py. With
# CHECK=1 (default) it also runs dzr's CPU policy on the same inputs and prints the comparison table.
#
# Usage (repository root, dzr built): scripts/parity/make_golden.sh
# Settings: DZR=build/bin/dzr REF=.ref/dreamzero DEVICE=cpu|cuda (the reference's device; fp32 either way)
#   WORK=/tmp/dzr-golden PYTHON=python3 CALLS=7 CHECK=1 OUT=tests/data/golden/policy_golden.safetensors
set -euo pipefail
cd "$(dirname "$0")/../.."
DZR=${DZR:-build/bin/dzr}
REF=${REF:-.ref/dreamzero}
DEVICE=${DEVICE:-cpu}
WORK=${WORK:-/tmp/dzr-golden}
PYTHON=${PYTHON:-python3}
CALLS=${CALLS:-7}
CHECK=${CHECK:-1}
OUT=${OUT:-tests/data/golden/policy_golden.safetensors}
CONFIG=tests/data/golden/policy_golden.yaml
SEED=7
export PYTHONUNBUFFERED=1

rm -rf "$WORK/ckpt" "$WORK/inputs"
mkdir -p "$WORK"
"$DZR" ckpt make --config "$CONFIG" --seed "$SEED" --dtype f32 --tokenizer tests/data/tokenizer/spiece.model \
    --out "$WORK/ckpt"
"$DZR" parity make-inputs --ckpt "$WORK/ckpt" --out "$WORK/inputs" --calls "$CALLS"
"$PYTHON" scripts/parity/reference_run.py --ref "$REF" --ckpt "$WORK/ckpt" --inputs "$WORK/inputs" \
    --out "$WORK/ref-fp32.safetensors" --dtype fp32 --device "$DEVICE" --no-layers
"$PYTHON" scripts/parity/make_golden.py --ref "$WORK/ref-fp32.safetensors" --inputs "$WORK/inputs" --seed "$SEED" \
    --config "$CONFIG" --out "$OUT"
if ((CHECK)); then
    "$DZR" parity run --ckpt "$WORK/ckpt" --inputs "$WORK/inputs" --out "$WORK/dzr-cpu.safetensors" --device cpu
    "$PYTHON" scripts/parity/compare.py --pair "cpu-f32=$WORK/dzr-cpu.safetensors:$WORK/ref-fp32.safetensors:1e-4"
fi
