#!/usr/bin/env bash
# Regenerates samples/ with `dzr episode synth`: a synthetic DROID-like episode (samples/episode_000: three
# 320x180 views at 15 fps as H.264 .mp4, joint/gripper state, ground-truth actions, a prompt) and one episode per
# other built-in embodiment (samples/agibot/episode_000, samples/yam/episode_000: 48 frames of 640x480 at 30 fps,
# every state key of the embodiment, its actions), which CI rolls out on tiny checkpoints of those embodiments.
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

# make OUT ARGS...: writes the episode into a temporary directory, checks it, then moves it into place.
make() {
    local out=$1
    shift
    mkdir -p "$(dirname "$out")"
    local tmp
    tmp=$(mktemp -d "$(dirname "$out")/.episode.tmp-XXXXXX")
    trap 'rm -rf "$tmp"' EXIT
    "$DZR" episode synth --out "$tmp" --frames-format mp4 "$@"
    "$DZR" episode inspect "$tmp" "${inspect_args[@]}" >/dev/null
    rm -rf "$out"
    chmod 755 "$tmp"  # mktemp -d makes it private
    mv "$tmp" "$out"
    trap - EXIT
}
inspect_args=()
make samples/episode_000 --frames "$FRAMES" --seed "$SEED"
inspect_args=(--embodiment agibot)
make samples/agibot/episode_000 --embodiment agibot --frames 48 --seed 0
inspect_args=(--embodiment yam)
make samples/yam/episode_000 --embodiment yam --frames 48 --seed 1 --width 640 --height 480

# A LeRobot v2.0 dataset in DreamZero-DROID-Data's layout (parquet + H.264), written by pyarrow and PyAV, not by dzr.
source scripts/lib/python.sh
rm -rf samples/lerobot_droid
"$DZR_PYTHON" tests/dataset/make_lerobot_fixture.py droid_v20 samples/lerobot_droid --episodes 2 --frames 72,57 --seed 0 \
    --quiet
"$DZR" episode inspect samples/lerobot_droid >/dev/null

bytes=$(du -sb samples | cut -f1)
du -ab samples | sort -k2
if (( bytes > MAX_BYTES )); then
    echo "make_samples: samples/ is $bytes bytes, over the $MAX_BYTES budget" >&2
    exit 1
fi
echo "make_samples: samples/ is $bytes bytes"
