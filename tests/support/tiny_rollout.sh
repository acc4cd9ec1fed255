#!/usr/bin/env bash
# One tiny CPU rollout end to end with the given dzr, for the sanitizer build (ctest -L sanitize): the tiny
# checkpoint (checksums verified), a short synthetic episode, two calls with metrics and plots (no warm-up:
# under the sanitizers it would take minutes), then --resume (the fingerprint path) and two refusals (an
# output directory inside the inputs, an invalid episode). Usage: tiny_rollout.sh DZR SOURCE_DIR
set -euo pipefail
dzr=$1
src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cfg=$src/configs/tiny.yaml
"$dzr" ckpt make --config "$cfg" --dtype f32 --tokenizer "$src/tests/data/tokenizer/spiece.model" \
    --out "$tmp/ckpt" >/dev/null
"$dzr" ckpt validate --hash "$tmp/ckpt" --config "$cfg" >/dev/null
"$dzr" episode synth --out "$tmp/eps/ep" --frames 30 --width 64 --height 36 --frames-format npy >/dev/null
run=(rollout "$tmp/eps" --ckpt "$tmp/ckpt" --config "$cfg" --device cpu --quiet --no-warmup --set rollout.max_chunks=1)
"$dzr" "${run[@]}" --out "$tmp/out" >/dev/null
# NOTE: the sanitizer build has no OpenCV, so no PNG plots: the report draws them as SVG
for f in actions.npy actions.csv timing.json manifest.json metrics.json gt_actions.npy done.json; do
    [[ -f $tmp/out/ep/$f ]] || { echo "tiny rollout: $f missing"; exit 1; }
done
for f in summary.json report.html report/ep.html; do
    [[ -f $tmp/out/$f ]] || { echo "tiny rollout: $f missing"; exit 1; }
done
"$dzr" "${run[@]}" --out "$tmp/out" --resume >/dev/null
if "$dzr" "${run[@]}" --out "$tmp/eps" 2>/dev/null >&2; then
    echo "tiny rollout: a run writing into its episodes was not refused"
    exit 1
fi
rm "$tmp/eps/ep/wrist_image_left.npy"
if "$dzr" "${run[@]}" --out "$tmp/out2" 2>/dev/null >&2; then
    echo "tiny rollout: an episode without its wrist camera was not refused"
    exit 1
fi
echo "tiny rollout: ok"
