#!/usr/bin/env bash
# LeRobot datasets end to end through the dzr binary, on fixtures written by pyarrow and PyAV
# (tests/dataset/make_lerobot_fixture.py), not by dzr:
#   1. `dzr episode inspect` lists the v2.0 (h264), v2.1 (AgiBot AV1; YAM) and v3.0 (AV1, episodes packed per file)
#      datasets;
#   2. `dzr episode convert` of each DROID dataset gives the frames PyAV decodes at the parquet's timestamps
#      (pixel for pixel), and the state, actions and prompt of the parquet;
#   3. a rollout of dataset episodes gives byte-identical actions.npy to the same episodes as .npy directories;
#   4. broken datasets fail before any weight loads, with one message naming the episode and the file, and leave
#      no output directory.
# Usage: tests/dataset/test_lerobot.sh DZR SOURCE_DIR   (exit 77: skipped)
set -euo pipefail
dzr=$1
src=$2
source "$src/scripts/lib/python.sh"
py=$DZR_PYTHON
if [[ $("$dzr" info 2>/dev/null) != *"LeRobot datasets: Arrow"* ]]; then
    echo "lerobot: skipped (this dzr reads no datasets: built without Arrow and FFmpeg)"
    exit 77
fi
if ! "$py" -c 'import pyarrow, av, numpy' 2>/dev/null; then
    echo "lerobot: skipped ($py lacks pyarrow, av or numpy; scripts/setup.sh installs them)"
    exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OPENBLAS_NUM_THREADS=1
fixture="$py $src/tests/dataset/make_lerobot_fixture.py"
$fixture droid_v20 "$tmp/v20" --npy-dirs "$tmp/v20_npy" >/dev/null
$fixture droid_v30 "$tmp/v30" --npy-dirs "$tmp/v30_npy" >/dev/null
$fixture agibot_v21 "$tmp/agibot" >/dev/null
$fixture yam_v21 "$tmp/yam" >/dev/null
fail() { echo "lerobot: FAILED: $*"; exit 1; }

echo "== inspect =="
"$dzr" --log-level warn episode inspect "$tmp/v20" >"$tmp/inspect_v20.txt" || { cat "$tmp/inspect_v20.txt"; fail "inspect v2.0"; }
grep -q "episode_000002" "$tmp/inspect_v20.txt" || fail "inspect v2.0 lists no episode_000002"
"$dzr" --log-level warn episode inspect "$tmp/v30" --episodes 1 >"$tmp/inspect_v30.txt" || { cat "$tmp/inspect_v30.txt"; fail "inspect v3.0"; }
"$dzr" --log-level warn episode inspect "$tmp/agibot" --embodiment agibot >"$tmp/inspect_agibot.txt" ||
    { cat "$tmp/inspect_agibot.txt"; fail "inspect AgiBot v2.1 (AV1)"; }
"$dzr" --log-level warn episode inspect "$tmp/yam" --embodiment yam >"$tmp/inspect_yam.txt" ||
    { cat "$tmp/inspect_yam.txt"; fail "inspect YAM v2.1 (prompt from the string column annotation.task)"; }
grep -q "Fold the towel" "$tmp/inspect_yam.txt" || fail "YAM: the prompt is not annotation.task's"

echo "== frames, state and actions against PyAV and the parquet =="
for v in v20 v30; do
    "$dzr" --log-level warn episode convert "$tmp/$v" --out "$tmp/${v}_conv" >/dev/null || fail "convert $v"
    "$py" - "$tmp/${v}_npy" "$tmp/${v}_conv" <<'PY' || fail "convert $v differs from PyAV / the parquet"
import pathlib, sys
import numpy as np
want, got = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
eps = sorted(p.name for p in want.iterdir())
assert eps == sorted(p.name for p in got.iterdir()), (eps, sorted(p.name for p in got.iterdir()))
for ep in eps:
    for f in sorted((want / ep).glob("*.npy")):
        a, b = np.load(f), np.load(got / ep / f.name)
        assert a.shape == b.shape, (ep, f.name, a.shape, b.shape)
        if a.dtype == np.uint8:
            diff = np.abs(a.astype(int) - b.astype(int))
            assert diff.max() == 0, f"{ep}/{f.name}: {np.count_nonzero(diff)} values differ, max {diff.max()}"
        else:
            assert np.array_equal(a.astype(np.float64), b), f"{ep}/{f.name}: values differ"
    p_want = [l for l in (want / ep / "episode.yaml").read_text().splitlines() if l.startswith("prompt:")]
    p_got = [l for l in (got / ep / "episode.yaml").read_text().splitlines() if l.startswith("prompt:")]
    assert p_want == p_got, (ep, p_want, p_got)
print(f"{len(eps)} episodes equal")
PY
done

echo "== rollouts: dataset against .npy directories =="
# configs/tiny.yaml shrunk further (a 64x128 canvas, 9-frame clips: tests/support/micro_geometry.h): the frames still
# reach the model through the dataset reader or the .npy files, and a call takes ~0.15 s instead of ~1.2 s
# (DZR_LONG_TESTS=1: the tiny geometry, docs/CI.md); no warm-up (~1 s a run; it changes no action)
cfg=$src/configs/tiny.yaml
geometry=(--set model.canvas_height=64 --set model.canvas_width=128 --set model.dit.frame_seqlen=32
          --set model.num_frames=9)
[[ ${DZR_LONG_TESTS:-0} == 0 ]] || geometry=()
"$dzr" ckpt make --config "$cfg" "${geometry[@]}" --seed 0 --dtype f32 \
    --tokenizer "$src/tests/data/tokenizer/spiece.model" --out "$tmp/ckpt" >/dev/null
run=(--log-level warn rollout --ckpt "$tmp/ckpt" --config "$cfg" "${geometry[@]}" --device cpu --quiet --no-plots
     --no-report --no-warmup)
"$dzr" "${run[@]}" "$tmp/v20" --episodes 0,2 --out "$tmp/out_v20" >/dev/null || fail "rollout v2.0"
"$dzr" "${run[@]}" "$tmp/v20_npy/episode_000000" "$tmp/v20_npy/episode_000002" --out "$tmp/out_v20_npy" >/dev/null ||
    fail "rollout of the v2.0 episodes as .npy"
"$dzr" "${run[@]}" "$tmp/v30" --episodes 1 --out "$tmp/out_v30" >/dev/null || fail "rollout v3.0"
"$dzr" "${run[@]}" "$tmp/v30_npy/episode_000001" --out "$tmp/out_v30_npy" >/dev/null || fail "rollout v3.0 as .npy"
for pair in "out_v20/episode_000000 out_v20_npy/episode_000000" "out_v20/episode_000002 out_v20_npy/episode_000002" \
            "out_v30/episode_000001 out_v30_npy/episode_000001"; do
    set -- $pair
    cmp "$tmp/$1/actions.npy" "$tmp/$2/actions.npy" || fail "$1/actions.npy differs from $2/actions.npy"
    echo "$1: actions.npy byte-identical"
done
[[ $(ls "$tmp/out_v20") == *episode_000000* && ! -e "$tmp/out_v20/episode_000001" ]] || fail "--episodes 0,2 ran others"

echo "== broken datasets =="
# expect_error NAME PATTERN [rollout args...]: a dry-run rollout of a broken copy fails naming PATTERN, writes nothing.
expect_error() {
    local name=$1 pattern=$2
    shift 2
    local out="$tmp/out_bad_$name"
    if "$dzr" "${run[@]}" "$tmp/bad_$name" --out "$out" "$@" >"$tmp/bad_$name.txt" 2>&1; then
        fail "$name: accepted"
    fi
    grep -q -- "$pattern" "$tmp/bad_$name.txt" || { cat "$tmp/bad_$name.txt"; fail "$name: no message naming $pattern"; }
    [[ ! -e "$out" ]] || fail "$name: wrote $out"
    echo "$name: refused: $(grep -m1 -- "$pattern" "$tmp/bad_$name.txt" | cut -c1-300)"
}
broken() { rm -rf "$tmp/bad_$1"; cp -r "$tmp/v20" "$tmp/bad_$1"; }
v20_video=videos/chunk-000/observation.images.wrist_image_left/episode_000001.mp4
broken no_info_version; sed -i 's/"v2.0"/"v9.9"/' "$tmp/bad_no_info_version/meta/info.json"
expect_error no_info_version "codebase_version v9.9"
broken no_episodes; rm "$tmp/bad_no_episodes/meta/episodes.jsonl"
expect_error no_episodes "episodes.jsonl"
broken bad_template; sed -i 's/{episode_index:06d}.parquet/{episode_idx:06d}.parquet/' "$tmp/bad_bad_template/meta/info.json"
expect_error bad_template "unknown field {episode_idx:06d}"
broken missing_video; rm "$tmp/bad_missing_video/$v20_video"
expect_error missing_video "episode_000001.mp4"
broken short_video; "$py" - "$tmp/v20/$v20_video" "$tmp/bad_short_video/$v20_video" <<'PY'
import sys, av
# the same stream, cut to its first 10 frames
with av.open(sys.argv[1]) as src, av.open(sys.argv[2], "w") as dst:
    s = src.streams.video[0]
    o = dst.add_stream_from_template(s)
    for i, pkt in enumerate(src.demux(s)):
        if pkt.dts is None or i >= 10:
            continue
        pkt.stream = o
        dst.mux(pkt)
PY
expect_error short_video "episode_000001.mp4"
broken corrupt_video; head -c 3000 "$tmp/v20/$v20_video" >"$tmp/bad_corrupt_video/$v20_video"
expect_error corrupt_video "episode_000001.mp4"
broken corrupt_parquet; printf 'PAR1 not really' >"$tmp/bad_corrupt_parquet/data/chunk-000/episode_000001.parquet"
expect_error corrupt_parquet "episode_000001.parquet"
broken timestamps; "$py" - "$tmp/bad_timestamps/data/chunk-000/episode_000001.parquet" <<'PY'
import sys, pyarrow as pa, pyarrow.parquet as pq
t = pq.read_table(sys.argv[1])
ts = t.column("timestamp").to_pylist()
ts = [x + (0.02 if i == 5 else 0.0) for i, x in enumerate(ts)]
t = t.set_column(t.schema.get_field_index("timestamp"), "timestamp", pa.array(ts, type=t.schema.field("timestamp").type))
pq.write_table(t, sys.argv[1])
PY
expect_error timestamps "episode_000001"
broken no_modality; rm "$tmp/bad_no_modality/meta/modality.json"
expect_error no_modality "modality.json"
broken missing_key; "$py" - "$tmp/bad_missing_key/meta/modality.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
del m["state"]["joint_position"]
json.dump(m, open(sys.argv[1], "w"), indent=2)
PY
expect_error missing_key "state.joint_position"
broken no_episode; expect_error no_episode "has no episode 7" --episodes 0,7
broken split; expect_error split 'no split "val" (it has: train)' --split val
broken no_prompt; "$py" - "$tmp/bad_no_prompt" <<'PY'
import json, pathlib, sys, pyarrow as pa, pyarrow.parquet as pq
root = pathlib.Path(sys.argv[1])
f = root / "data/chunk-000/episode_000001.parquet"
t = pq.read_table(f)
for name in t.column_names:
    if name.startswith("annotation.language"):
        t = t.set_column(t.schema.get_field_index(name), name, pa.array([0] * t.num_rows, type=t.schema.field(name).type))
pq.write_table(t, f)
eps = [json.loads(l) for l in (root / "meta/episodes.jsonl").read_text().splitlines() if l.strip()]
for e in eps:
    if e["episode_index"] == 1:
        e["tasks"] = []
(root / "meta/episodes.jsonl").write_text("".join(json.dumps(e) + "\n" for e in eps))
PY
expect_error no_prompt "episode_000001 has no language instruction"
"$dzr" "${run[@]}" "$tmp/bad_no_prompt" --out "$tmp/out_skip" --skip-invalid --dry-run >"$tmp/skip.txt" 2>&1 ||
    { cat "$tmp/skip.txt"; fail "--skip-invalid did not run the dataset's other episodes"; }
echo "no_prompt with --skip-invalid: the other episodes run"
# --split takes info.json's range (the converter writes "train": "0:100")
"$dzr" "${run[@]}" "$tmp/v20" --split train --episodes 1 --out "$tmp/out_split" --dry-run >"$tmp/split.txt" 2>&1 ||
    { cat "$tmp/split.txt"; fail "--split train --episodes 1"; }
# The dataset is never written to.
[[ -z $(find "$tmp/v20" "$tmp/v30" -newer "$tmp/inspect_v20.txt" -print -quit) ]] || fail "something was written into a dataset"
echo "lerobot: ok"
