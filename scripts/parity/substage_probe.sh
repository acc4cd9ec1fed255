#!/usr/bin/env bash
# One call of the parity inputs with the DiT's per-layer internals dumped on both sides (reference bf16 with
# --sub-stages, dzr CUDA bf16 on the reference's own conditioning via --inject-from), then compare.py's
# per-tensor details: where inside a block dzr's bf16 rounding first departs from the reference's.
# Usage (GPU machine, repository root, .ref carried): OUT=dir scripts/parity/substage_probe.sh
# Settings: DZR_BIN (default build-parity-device/bin/dzr), CONFIG=configs/parity.yaml, WORK=/tmp/dzr-probe
set -uo pipefail
cd "$(dirname "$0")/../.."
DZR=${DZR_BIN:-build-parity-device/bin/dzr}
CONFIG=${CONFIG:-configs/parity.yaml}
WORK=${WORK:-/tmp/dzr-probe}
OUT=${OUT:-$WORK/out}
PYTHON=${PYTHON:-python3}
# NOTE: a machine kept warm between calls still has the last probe's checkpoint and inputs
rm -rf "$WORK/ckpt" "$WORK/inputs"
mkdir -p "$WORK" "$OUT"
DUMP='^(input\.video|state|text\.(pos|neg)|clip|ys|vae\.clip|noise\.(video|action)|sample\.|velocity\.|x$|actions$)'
DUMP+='|^dit\..*\.(layer_out\.[0-9]+|head|action_velocity)$'
FORWARDS=${FORWARDS:-0}  # the forwards (n per kind and branch) whose internals are dumped, e.g. 0,3
DUMP+="|^dit\\.[a-z]+\\.(pos|neg)\\.(${FORWARDS//,/|})\\.(patch_embed|time_e0?|time_sin|action_tau|action_tokens|state_tokens"
DUMP+='|(self_attn_in|q|k|v|self_attn|x_self|cross_attn|x_cross|ffn)\.[0-9]+)$'
DUMP+='|^(umt5|clip)\.'
[[ "${VAE_DUMP:-0}" == 1 ]] && DUMP+='|^vae\.(chunk1\.)?(conv_in|block\.[0-9]+|head)$'
"$DZR" ckpt make --config "$CONFIG" --seed 1 --dtype f32 --tokenizer tests/data/tokenizer/spiece.model \
    --out "$WORK/ckpt" >/dev/null || exit 1
"$DZR" parity make-inputs --ckpt "$WORK/ckpt" --out "$WORK/inputs" --calls "${CALLS:-1}" >/dev/null || exit 1
"$PYTHON" scripts/parity/reference_run.py --ref .ref/dreamzero --ckpt "$WORK/ckpt" --inputs "$WORK/inputs" \
    --out "$WORK/ref.safetensors" --dtype bf16 --device cuda --sub-stages --sub-stage-forwards "$FORWARDS" \
    $([[ "${VAE_DUMP:-0}" == 1 ]] && echo --vae-internals) \
    >"$OUT/ref.log" 2>&1 || exit 1
"$DZR" --log-level debug parity run --ckpt "$WORK/ckpt" --inputs "$WORK/inputs" --out "$WORK/ours.safetensors" --device cuda \
    --dtype bf16 --dump "$DUMP" --inject-from "$WORK/ref.safetensors" >"$OUT/dzr.log" 2>&1 || exit 1
"$PYTHON" scripts/parity/compare.py --info-pair "probe=$WORK/ours.safetensors:$WORK/ref.safetensors:2e-2" \
    --details "$OUT/details.txt" >"$OUT/table.txt" 2>&1
grep -E "\.((prefill|denoise)\.pos\.0\.|umt5\.pos\.|clip\.)" "$OUT/details.txt"
