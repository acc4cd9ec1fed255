#!/usr/bin/env bash
# Cold and warm checkpoint loading on one machine (issue #15 item 5, docs/PERF.md "Loading a checkpoint"):
#   1. the disk's own speed: `cat` of every shard to /dev/null after dropping the page cache (then once more from
#      the page cache, and 8 cats at once after another drop, for reference);
#   2. `dzr bench load` for the old path (one upload per weight from the memory mapping) and the new one (parallel
#      reads into pinned staging, weights/bulk_load.h) and each LOAD_VARIANTS setting: the caches are dropped, the
#      process loads twice (run 1 cold, from the disk; run 2 warm, from the page cache).
# Dropping the caches needs root (`echo 3 > /proc/sys/vm/drop_caches`); without it the cold runs are not cold and
# the script says so and measures the warm ones only. A checkpoint on tmpfs is refused: it lives in memory.
#
# Usage: CKPT=DIR [DZR=build/bin/dzr] [DEVICE=cuda:0] [OUT=/tmp/dzr-load] scripts/bench/load_cold_warm.sh
#   LOAD_VARIANTS: new-path settings separated by '|' (default "--direct|--threads 16|--staging-mb 16"; empty: none)
#   SKIP_OLD=1: leave out the old path (33 s cold for the DROID checkpoint)
#   NO_DROP=1: never drop the caches (a shared machine; only the warm numbers then mean anything)
# Writes OUT/results.tsv (what, cold_s, warm_s, gb), OUT/results.md (the table for docs/PERF.md), one log and one
# JSON per dzr run, OUT/machine.txt (disk, file system, memory, GPU); prints the table and the two targets' verdicts
# (new path cold within 10% of cat; warm at most 8 s).
set -uo pipefail
cd "$(dirname "$0")/../.."
CKPT=${CKPT:?set CKPT to a checkpoint directory (dzr ckpt make --config configs/dreamzero_droid.yaml ...)}
DZR=${DZR:-build/bin/dzr}
DEVICE=${DEVICE:-cuda:0}
OUT=${OUT:-/tmp/dzr-load}
LOAD_VARIANTS=${LOAD_VARIANTS---direct|--threads 16|--staging-mb 16}
mkdir -p "$OUT"
[[ -x "$DZR" ]] || { echo "load_cold_warm: no dzr binary at $DZR (set DZR)" >&2; exit 2; }
shopt -s nullglob
shards=("$CKPT"/*.safetensors)
((${#shards[@]})) || { echo "load_cold_warm: no *.safetensors in $CKPT" >&2; exit 2; }
bytes=$(stat -c %s "${shards[@]}" | awk '{s += $1} END {print s}')
fstype=$(stat -f -c %T "$CKPT")
if [[ "$fstype" == tmpfs || "$fstype" == ramfs ]]; then
    echo "load_cold_warm: $CKPT is on $fstype (memory): a cold load cannot be measured there; put it on a disk" >&2
    exit 2
fi

{
    echo "date: $(date -u +%FT%TZ)"
    echo "checkpoint: $CKPT (${#shards[@]} shards, $bytes bytes), file system $fstype"
    findmnt -T "$CKPT" 2>/dev/null
    df -h "$CKPT"
    lsblk -o NAME,TYPE,SIZE,ROTA,MODEL,SCHED,RA,MIN-IO,OPT-IO 2>/dev/null
    for q in /sys/block/*/queue/read_ahead_kb; do echo "$q: $(cat "$q")"; done
    echo "cpus: $(nproc)"
    free -g
    nvidia-smi --query-gpu=name,pcie.link.gen.current,pcie.link.width.current,driver_version --format=csv 2>/dev/null
    git log -1 --format='dzr commit %h %s' 2>/dev/null
} >"$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"

can_drop=0
if [[ -z "${NO_DROP:-}" ]] && sync && echo 3 2>/dev/null >/proc/sys/vm/drop_caches; then can_drop=1; fi
drop() { ((can_drop)) && sync && echo 3 >/proc/sys/vm/drop_caches; }
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.3f", b - a}'; }
gbs() { awk -v n="$1" -v s="$2" 'BEGIN {printf "%.2f", s > 0 ? n / s / 1e9 : 0}'; }
((can_drop)) || echo "load_cold_warm: the caches are not dropped (NO_DROP, or /proc/sys/vm/drop_caches is not writable): cold runs are NOT measured"

printf 'what\tcold_s\twarm_s\tgb\n' >"$OUT/results.tsv"
cat_cold=""
if ((can_drop)); then
    drop
    t0=$(now); cat "${shards[@]}" >/dev/null; t1=$(now)
    cat_cold=$(secs "$t0" "$t1")
fi
t0=$(now); cat "${shards[@]}" >/dev/null; t1=$(now)
cat_warm=$(secs "$t0" "$t1")
printf 'cat\t%s\t%s\t%s\n' "${cat_cold:--}" "$cat_warm" "$(awk -v n="$bytes" 'BEGIN {printf "%.3f", n / 1e9}')" \
    >>"$OUT/results.tsv"
if ((can_drop)); then
    drop
    t0=$(now); printf '%s\0' "${shards[@]}" | xargs -0 -n 1 -P 8 cat >/dev/null; t1=$(now)
    printf 'cat x8 (one per shard, 8 at once)\t%s\t-\t%s\n' "$(secs "$t0" "$t1")" \
        "$(awk -v n="$bytes" 'BEGIN {printf "%.3f", n / 1e9}')" >>"$OUT/results.tsv"
fi

# One dzr process: drop, then two loads (cold, warm). $1: a label, the rest: bench load arguments.
bench() {
    local label=$1 tag
    shift
    tag=$(printf '%s' "$label" | tr -c 'A-Za-z0-9_.-' '_')
    drop
    "$DZR" bench load --checkpoint "$CKPT" --device "$DEVICE" --repeat 2 --json "$OUT/$tag.json" "$@" \
        >"$OUT/$tag.log" 2>&1
    local rc=$?
    cat "$OUT/$tag.log"
    if ((rc != 0)); then
        echo "load_cold_warm: '$label' failed (exit $rc)"
        printf '%s\tfailed\tfailed\t-\n' "$label" >>"$OUT/results.tsv"
        return
    fi
    local cold warm gb
    cold=$(awk '/^result / && / run=1 / {for (i = 1; i <= NF; i++) if ($i ~ /^seconds=/) print substr($i, 9)}' "$OUT/$tag.log")
    warm=$(awk '/^result / && / run=2 / {for (i = 1; i <= NF; i++) if ($i ~ /^seconds=/) print substr($i, 9)}' "$OUT/$tag.log")
    gb=$(awk '/^result / && / run=1 / {for (i = 1; i <= NF; i++) if ($i ~ /^gb=/) print substr($i, 4)}' "$OUT/$tag.log")
    ((can_drop)) || cold="-"
    printf '%s\t%s\t%s\t%s\n' "$label" "$cold" "$warm" "$gb" >>"$OUT/results.tsv"
}

[[ -n "${SKIP_OLD:-}" ]] || bench "dzr old path" --path old
bench "dzr new path (defaults)" --path new
IFS='|' read -r -a variants <<<"$LOAD_VARIANTS"
for v in "${variants[@]}"; do
    [[ -n "${v// /}" ]] || continue
    # shellcheck disable=SC2086
    bench "dzr new path $v" --path new $v
done

{
    echo "| load | cold s | cold GB/s | warm s | warm GB/s | cold vs cat |"
    echo "| --- | --- | --- | --- | --- | --- |"
    tail -n +2 "$OUT/results.tsv" | while IFS=$'\t' read -r what cold warm gb; do
        cg="-" wg="-" rel="-"
        [[ "$cold" =~ ^[0-9.]+$ ]] && cg=$(awk -v g="$gb" -v s="$cold" 'BEGIN {printf "%.2f", g / s}')
        [[ "$warm" =~ ^[0-9.]+$ ]] && wg=$(awk -v g="$gb" -v s="$warm" 'BEGIN {printf "%.2f", g / s}')
        [[ "$cold" =~ ^[0-9.]+$ && "$cat_cold" =~ ^[0-9.]+$ ]] &&
            rel=$(awk -v c="$cold" -v k="$cat_cold" 'BEGIN {printf "%+.0f%%", (c / k - 1) * 100}')
        echo "| $what | $cold | $cg | $warm | $wg | $rel |"
    done
} >"$OUT/results.md"
echo
cat "$OUT/results.md"

new_cold=$(awk -F'\t' '$1 == "dzr new path (defaults)" {print $2}' "$OUT/results.tsv")
new_warm=$(awk -F'\t' '$1 == "dzr new path (defaults)" {print $3}' "$OUT/results.tsv")
status=0
if [[ "$new_cold" =~ ^[0-9.]+$ && "$cat_cold" =~ ^[0-9.]+$ ]]; then
    if awk -v c="$new_cold" -v k="$cat_cold" 'BEGIN {exit !(c <= 1.1 * k)}'; then
        echo "target cold: met ($new_cold s against cat's $cat_cold s; at most 10% more allowed)"
    else
        echo "target cold: NOT met ($new_cold s against cat's $cat_cold s; at most 10% more allowed)"
        status=1
    fi
else
    echo "target cold: not measured"
fi
if [[ "$new_warm" =~ ^[0-9.]+$ ]]; then
    if awk -v w="$new_warm" 'BEGIN {exit !(w <= 8)}'; then
        echo "target warm: met ($new_warm s; at most 8 s)"
    else
        echo "target warm: NOT met ($new_warm s; at most 8 s)"
        status=1
    fi
else
    echo "target warm: not measured"
    status=1
fi
exit $status
