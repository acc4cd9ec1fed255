#!/usr/bin/env bash
# Regenerates samples/: one synthetic DROID-like episode (three 320x180 views at 15 fps as H.264 .mp4,
# joint/gripper state, ground-truth actions, a prompt), made by `dzr episode synth`.
#
# The .mp4 files need a dzr built with OpenCV. A machine without video support (the GPU machine)
# regenerates the same source frames as .npy instead:
#   dzr episode synth --out /tmp/episode_000 --frames 100 --seed 0 --frames-format npy
# (the .mp4 here is the lossy encoding of exactly those frames).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
FRAMES=${FRAMES:-100}
SEED=${SEED:-0}
MAX_BYTES=$((3 * 1024 * 1024))

if [[ ! -x "$BUILD_DIR/bin/dzr" || "${REBUILD:-0}" == 1 ]]; then
    gen=()
    command -v ninja >/dev/null 2>&1 && gen=(-G Ninja)
    [[ -f "$BUILD_DIR/CMakeCache.txt" ]] || cmake -S . -B "$BUILD_DIR" "${gen[@]}"
    cmake --build "$BUILD_DIR" --target dzr_cli -j "${JOBS:-2}"
fi
DZR="$BUILD_DIR/bin/dzr"
"$DZR" info | grep -q "video decoding: OpenCV" || {
    echo "make_samples: $DZR has no video support; build with OpenCV (-DDZR_OPENCV=ON)" >&2
    exit 1
}

out=samples/episode_000
tmp=$(mktemp -d samples/.episode_000.tmp-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
"$DZR" episode synth --out "$tmp" --frames "$FRAMES" --seed "$SEED" --frames-format mp4
"$DZR" episode inspect "$tmp" >/dev/null
rm -rf "$out"
chmod 755 "$tmp"  # mktemp -d makes it private
mv "$tmp" "$out"
trap - EXIT

bytes=$(du -sb samples | cut -f1)
du -ab samples | sort -k2
if (( bytes > MAX_BYTES )); then
    echo "make_samples: samples/ is $bytes bytes, over the $MAX_BYTES budget" >&2
    exit 1
fi
echo "make_samples: samples/ is $bytes bytes"
