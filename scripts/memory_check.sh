#!/usr/bin/env bash
# The memory plan against the measured peak on a GPU (docs/MEMORY.md): for each variant, `dzr plan` on the device
# (its convolutions' scratch included), then `dzr bench rollout` at the DROID geometry (random weights made on the
# host, the warm-up, then CALLS timed calls), whose JSON holds the measured `peak_gpu_memory_bytes` next to the
# `planned_peak_gpu_memory_bytes`. Fails when a measured peak exceeds its plan, or when a budget the plan exceeds
# does not refuse the run before the load; and that the text pre-pass changes no action on the GPU (a tiny
# checkpoint it makes). Nothing here needs a real checkpoint.
#
# Usage: scripts/memory_check.sh            (after scripts/device-test.sh, or any CUDA build)
#   DZR=build-device/bin/dzr  CONFIG=configs/dreamzero_droid.yaml  CALLS=9  DEVICE=cuda:0
#   OUT=dir (the JSON and logs; default build-device/logs/memory)  VARIANTS="resident prepass kvfp8 fp8all budget44 stream44 refuse44 identical"
#   ROLLOUT_OUT=dir: also check every episode's timing.json of a finished `dzr rollout --out dir` (VARIANTS= to
#   check only that)
set -uo pipefail
cd "$(dirname "$0")/.."
DZR=${DZR:-build-device/bin/dzr}
CONFIG=${CONFIG:-configs/dreamzero_droid.yaml}
CALLS=${CALLS:-9}
DEVICE=${DEVICE:-cuda:0}
OUT=${OUT:-build-device/logs/memory}
VARIANTS=${VARIANTS-"resident prepass refuse44 identical"}
mkdir -p "$OUT"
failed=()

# bench NAME ARGS...: the plan on the device, then the bench; compares the two.
bench() {
    local name=$1
    shift
    local plan_args=(--no-text-prepass)
    [[ " $* " == *" --text-prepass "* ]] && plan_args=()
    # the plan of the same precision and KV dtype as the bench
    local a prev=""
    for a in "$@"; do
        [[ $prev == --precision || $prev == --kv-dtype || $prev == --set ]] && plan_args+=("$prev" "$a")
        prev=$a
    done
    printf '\n== %s ==\n' "$name"
    "$DZR" plan --config "$CONFIG" --device "$DEVICE" "${plan_args[@]}" | tee "$OUT/$name.plan.txt"
    "$DZR" plan --config "$CONFIG" --device "$DEVICE" "${plan_args[@]}" --json >"$OUT/$name.plan.json"
    if ! "$DZR" bench rollout --config "$CONFIG" --device "$DEVICE" --calls "$CALLS" --json "$OUT/$name.json" "$@" \
        2>&1 | tee "$OUT/$name.log"; then
        failed+=("$name: the bench failed")
        return
    fi
    python3 - "$OUT/$name.json" "$name" <<'EOF' || failed+=("$name: measured peak above the plan (or none measured)")
import json, sys
j = json.load(open(sys.argv[1]))
measured, planned = j["peak_gpu_memory_bytes"], j["planned_peak_gpu_memory_bytes"]
if not isinstance(measured, int) or not isinstance(planned, int):
    sys.exit(f"{sys.argv[2]}: measured {measured}, planned {planned}: a GPU run records both")
gib = 1 << 30
print(f"{sys.argv[2]}: measured peak {measured:,} B ({measured / gib:.2f} GiB), "
      f"plan {planned:,} B ({planned / gib:.2f} GiB), plan - measured {(planned - measured) / gib:+.2f} GiB")
phases = {p["key"]: p["bytes"] for p in j.get("memory_plan", {}).get("phases", []) if "key" in p and "bytes" in p}
for key, label in (("gpu_memory_after_load_bytes", "after the load"), ("gpu_memory_after_warmup_bytes", "after the warm-up")):
    if isinstance(j.get(key), int):
        print(f"  in use {label}: {j[key] / gib:.2f} GiB; planned phases: "
              + ", ".join(f"{k} {v / gib:.2f} GiB" for k, v in phases.items()))
sys.exit(0 if measured <= planned else 1)
EOF
}

# refuse NAME ARGS...: a budget below the plan must stop the bench before its weights are made (exit 1, the parts
# named, seconds not minutes).
refuse() {
    local name=$1
    shift
    printf '\n== %s ==\n' "$name"
    local t0=$SECONDS
    "$DZR" bench rollout --config "$CONFIG" --device "$DEVICE" --calls 1 "$@" >"$OUT/$name.log" 2>&1
    local rc=$?
    cat "$OUT/$name.log"
    if ((rc == 0)) || ! grep -q "does not fit" "$OUT/$name.log"; then
        failed+=("$name: expected a refusal naming the parts (exit $rc)")
    else
        echo "$name: refused before the load in $((SECONDS - t0)) s"
    fi
}

# identical: the text pre-pass must not change an action on the GPU either: a tiny checkpoint, two synthetic
# episodes with different prompts, `dzr rollout` with and without the pre-pass, actions.npy compared byte for byte.
identical() {
    printf '\n== identical (text pre-pass on %s) ==\n' "$DEVICE"
    local d="$OUT/identical"
    rm -rf "$d" && mkdir -p "$d"
    "$DZR" ckpt make --config configs/tiny.yaml --seed 1 --out "$d/ckpt" --tokenizer tests/data/tokenizer/spiece.model \
        >"$d/make.log" 2>&1 || { failed+=("identical: ckpt make"); return; }
    for seed in 0 1; do
        "$DZR" episode synth --out "$d/episodes/ep$seed" --seed "$seed" --frames 100 --frames-format npy >/dev/null ||
            { failed+=("identical: episode synth"); return; }
    done
    for mode in prepass resident; do
        local extra=()
        [[ $mode == resident ]] && extra=(--no-text-prepass)
        "$DZR" rollout "$d/episodes" --ckpt "$d/ckpt" --config configs/tiny.yaml --device "$DEVICE" --quiet \
            --no-report --out "$d/$mode" "${extra[@]}" >"$d/$mode.log" 2>&1 || { failed+=("identical: rollout $mode"); return; }
    done
    for ep in ep0 ep1; do
        if cmp "$d/prepass/$ep/actions.npy" "$d/resident/$ep/actions.npy"; then
            echo "identical: $ep actions.npy bit-identical with and without the pre-pass"
        else
            failed+=("identical: $ep actions differ with the text pre-pass")
        fi
    done
    ROLLOUT_OUT=${ROLLOUT_OUT:-$d/prepass}
}

for v in $VARIANTS; do
    case $v in
    resident) bench resident ;;               # umT5 resident (today's default before the pre-pass)
    # the text pre-pass (issue #14: <= 47 GiB, a 48 GB card: without kv.in_place's lanes, whose room for the current
    # rows is 4 GiB at DROID; prepass-lanes: with them, as kv.in_place auto gives on a GPU that holds them)
    prepass) bench prepass --text-prepass --set kv.in_place=false ;;
    prepass-lanes) bench prepass-lanes --text-prepass ;;
    # bf16 weights + FP8 KV <= 42 GiB (a 48 GB card); FP8 weights + FP8 KV <= 26 GiB (a 32 GB card); with the FP8 KV
    # cache a 44 GiB budget fits and completes; bf16 weights and KV fit 44 GiB only with streamed DiT layers
    # (stream44: offload_layers auto), without them (refuse44) the run is refused
    kvfp8) bench kvfp8 --text-prepass --kv-dtype fp8 ;;
    fp8all) bench fp8all --text-prepass --precision fp8 --kv-dtype fp8 --numerics fast ;;
    budget44) bench budget44 --text-prepass --kv-dtype fp8 --gpu-memory-budget 44GiB ;;
    stream44) bench stream44 --text-prepass --gpu-memory-budget 44GiB ;;
    refuse44) refuse refuse44 --text-prepass --gpu-memory-budget 44GiB --set offload_layers=0 ;;
    identical) identical ;;
    *) failed+=("unknown variant $v") ;;
    esac
done

# A rollout's own record: each episode's timing.json has the measured and the planned peak side by side.
if [[ -n "${ROLLOUT_OUT:-}" ]]; then
    printf '\n== rollout %s ==\n' "$ROLLOUT_OUT"
    python3 - "$ROLLOUT_OUT" <<'EOF' || failed+=("rollout $ROLLOUT_OUT: a measured peak above its plan, or none recorded")
import json, pathlib, sys
bad = 0
files = sorted(pathlib.Path(sys.argv[1]).glob("*/timing.json"))
for f in files:
    t = json.loads(f.read_text())
    m, p = t.get("peak_gpu_memory_bytes"), t.get("planned_peak_gpu_memory_bytes")
    ok = isinstance(m, int) and isinstance(p, int) and m <= p
    bad += not ok
    print(f"{f.parent.name}: measured {m}, planned {p}: {'ok' if ok else 'FAIL'}")
sys.exit(1 if bad or not files else 0)
EOF
fi

# The offline plan (no GPU) beside the device's: the difference is the convolution library's own scratch.
if [[ -s "$OUT/prepass.plan.json" || -s "$OUT/resident.plan.json" ]]; then
    "$DZR" plan --config "$CONFIG" --json >"$OUT/offline.plan.json"
    python3 - "$OUT/offline.plan.json" "$OUT"/resident.plan.json "$OUT"/prepass.plan.json <<'EOF' || true
import json, sys
def ws(p):
    try:
        return next(x["bytes"] for x in json.load(open(p))["parts"] if x["key"] == "workspace")
    except Exception:
        return None
off = ws(sys.argv[1])
for p in sys.argv[2:]:
    if ws(p) is not None:
        print(f"workspace: offline {off / (1 << 30):.3f} GiB, on {p.split('/')[-1]} {ws(p) / (1 << 30):.3f} GiB")
        break
EOF
fi

if ((${#failed[@]})); then
    printf '\nFAILED:\n'
    printf '  %s\n' "${failed[@]}"
    exit 1
fi
echo "memory check: every measured peak is within its plan"
