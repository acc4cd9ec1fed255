#!/usr/bin/env bash
# The project's own regression check (docs/CI.md): the sample episode rolled out on the tiny random checkpoint on
# the CPU, compared with the committed baseline in tests/data/baseline/sample/ by `dzr rollout --baseline`, then
# by `dzr compare` with a JUnit report that must parse; and a second rollout on two threads that must give the same
# bits. `--refresh` writes a new baseline instead.
# Usage: scripts/ci/sample_baseline.sh DZR [SOURCE_DIR] [--refresh]
set -euo pipefail
dzr=$1
src=${2:-$(cd "$(dirname "$0")/../.." && pwd)}
refresh=0
[[ ${3:-} == --refresh ]] && refresh=1
baseline=$src/tests/data/baseline/sample
if ! "$dzr" info 2>/dev/null | grep "video decoding: OpenCV" >/dev/null; then
    echo "sample baseline: skipped (this dzr cannot decode the sample's .mp4 cameras: built without OpenCV)"
    exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cfg=$src/configs/tiny.yaml
"$dzr" ckpt make --config "$cfg" --seed 0 --dtype f32 --tokenizer "$src/tests/data/tokenizer/spiece.model" \
    --out "$tmp/ckpt" >/dev/null
# NOTE: one OpenBLAS thread: the CPU's GEMMs then round the same way on every run (docs/CI.md)
export OPENBLAS_NUM_THREADS=1
run=(--log-level warn rollout "$src/samples/episode_000" --ckpt "$tmp/ckpt" --config "$cfg" --device cpu --quiet --no-plots --no-report)
# NOTE: the tolerance covers another CPU's OpenBLAS kernel table (other rounding); a change to the engine's
# arithmetic moves the actions by far more
tol=(--atol 1e-5 --metric-tol 1e-6)
if ((refresh)); then
    "$dzr" "${run[@]}" --out "$tmp/out" >/dev/null
    rm -rf "$baseline"
    mkdir -p "$baseline/episode_000"
    for f in actions.npy metrics.json done.json; do cp "$tmp/out/episode_000/$f" "$baseline/episode_000/"; done
    echo "sample baseline: refreshed $baseline"
    exit 0
fi
"$dzr" "${run[@]}" --out "$tmp/out" --baseline "$baseline" "${tol[@]}" >"$tmp/rollout.txt" ||
    { cat "$tmp/rollout.txt"; echo "sample baseline: the sample's actions drifted from $baseline"; exit 1; }
"$dzr" compare "$baseline" "$tmp/out" "${tol[@]}" --junit "$tmp/junit.xml" >/dev/null
# The thread count must not change a bit (mpirun -np N shares the cores): two OpenBLAS threads, compared exactly.
OPENBLAS_NUM_THREADS=2 "$dzr" "${run[@]}" --out "$tmp/out2" --baseline "$tmp/out" >"$tmp/threads.txt" ||
    { cat "$tmp/threads.txt"; echo "sample baseline: 2 threads gave other actions than 1"; exit 1; }
python3 - "$tmp/junit.xml" <<'PY'
import sys, xml.etree.ElementTree as ET
suite = ET.parse(sys.argv[1]).getroot()[0]
names = [c.get("name") for c in suite.findall("testcase")]
assert names == ["settings", "episode_000"], names
assert suite.get("failures") == "0" and suite.get("errors") == "0", ET.tostring(suite)
PY
echo "sample baseline: ok"
