#!/usr/bin/env bash
# The whole parity run against the official implementation, in one command on the GPU machine
# (docs/PARITY.md): build dzr (CUDA, no OpenCV), make the parity checkpoints (f32) and the inputs, run
# the reference head in fp32 and bf16, run dzr on the CPU (f32) and on CUDA (bf16), compare, and put
# the table, the logs and the per-tensor details into $OUT. Later steps run even when an earlier one
# failed where they can; the exit status is non-zero if any step failed or a gate did not pass.
#
# Two checkpoints of the same seed:
#   gpu  configs/parity.yaml as is (the real VAE, base_dim 96): reference bf16 vs dzr CUDA bf16, and
#        the reference fp32 run for scale
#   cpu  the same with the VAE narrowed (model.vae.base_dim=$CPU_VAE_BASE, default 8): reference fp32 vs
#        dzr CPU f32. NOTE: dzr's CPU backend cannot encode 124 TFLOP of real-width VAE (two 33-frame
#        and five 9-frame clips) inside one device command; every other network keeps the parity geometry.
#
# Usage (repository root; the official code at .ref/dreamzero travels with the tree via carry):
#   OUT=/some/dir scripts/parity/run_parity.sh
#   EMBODIMENT=agibot OUT=/some/dir scripts/parity/run_parity.sh    (or yam, oxe_droid)
# EMBODIMENT makes both checkpoints with `dzr ckpt make --embodiment $EMBODIMENT` (experiment_cfg/conf.yaml and
# metadata.json of that embodiment) and the inputs with its cameras, state keys and prompt template; the reference
# then builds the canvases, the normalized state and the robot actions with the official eval transform of the
# embodiment (embodiment_ref.py). Unset: the DROID checkpoints of before (metadata.json only, no conf.yaml).
# The numerics gate of `fast` (docs/PARITY.md): GPU_RUNS with dzr-cudafast-gpu (dzr CUDA bf16, paged KV, --numerics
# fast), ref-bf16-gpu and ref-fp32-gpu runs scripts/parity/gate.py: per call, fast's actions no further from the fp32
# reference than the bf16 reference is (max rel and rel l2, slack GATE_SLACK=1.1); its table goes to $OUT/gate.txt.
# At the real widths: CONFIG=configs/parity_wide.yaml CALLS=9 DUMP_LAYERS=0 (device_round.sh step `wide`).
# The FP8 gates (docs/PARITY.md, issue #14): dzr-cudafp8-<ckpt> (fast numerics, --precision fp8, bf16 KV),
# dzr-cudafp8kv-<ckpt> (fast numerics, bf16 weights, --kv-dtype fp8) and dzr-cudafp8all-<ckpt> (both), each gated by
# gate.py --kind fp8 against ref-bf16-<ckpt> and ref-fp32-<ckpt> (per call rel l2 within 3 x the reference bf16 run's,
# max rel at most 0.1); tables in $OUT/gate-<run>.txt. The checkpoint `outlier` (runs named *-outlier) is ckpt-gpu's
# with OUTLIER_COLUMNS input columns of every FP8 Linear weight times OUTLIER_SCALE (`dzr ckpt make --outlier-columns`).
# REUSE=1 keeps $WORK's checkpoints, inputs and successful reference dumps from an earlier run of the same settings
# ($WORK/stamp.txt: config, seed, calls, embodiment, the CPU VAE width, DUMP_LAYERS, REF_DEVICE, the outliers) instead
# of making them again; dzr runs always run again (device_round.sh step `fp8gate` after `wide`).
# Settings: CONFIG=configs/parity.yaml SEED=1 CALLS=7 CPU_VAE_BASE=8 REF=.ref/dreamzero WORK=/tmp/dzr-parity
#   BUILD_DIR=build-parity-device JOBS=$(nproc) DZR_CUDA_ARCHS=90a DZR_BIN=(use this dzr, skip the build)
#   GPU_RUNS="ref-fp32-cpu ref-bf16-gpu ref-fp32-gpu dzr-cuda-gpu dzr-cudadense-gpu" (in parallel with
#   dzr-cpu-cpu) CPU_RUN=1 CPU_TIMEOUT=200 RUN_TIMEOUT=240
#   INJECT_RUN=1 (after the others: dzr-cudainject-gpu, dzr CUDA bf16 on ref-bf16-gpu's encoder outputs)
#   DUMP_LAYERS=1 (0: no per-layer DiT outputs in any dump; at the real widths they would be ~12 GB per run)
#   GATE_SLACK=1.1 OUTLIER_COLUMNS=4 OUTLIER_SCALE=30 REUSE=0
#   PYTHON=python3 REF_DEVICE=cuda (cpu: try the plumbing on a machine without a GPU, fp32 runs only)
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-build-parity-device/out}
WORK=${WORK:-/tmp/dzr-parity}
BUILD_DIR=${BUILD_DIR:-build-parity-device}
CONFIG=${CONFIG:-configs/parity.yaml}
SEED=${SEED:-1}
CALLS=${CALLS:-7}
CPU_VAE_BASE=${CPU_VAE_BASE:-8}
REF=${REF:-.ref/dreamzero}
JOBS=${JOBS:-$(nproc)}
PYTHON=${PYTHON:-python3}
EMBODIMENT=${EMBODIMENT:-}
emb=()
[[ -n "$EMBODIMENT" ]] && emb=(--embodiment "$EMBODIMENT")
GPU_RUNS=${GPU_RUNS:-ref-fp32-cpu ref-bf16-gpu ref-fp32-gpu dzr-cuda-gpu dzr-cudadense-gpu}
CPU_RUN=${CPU_RUN:-1}
INJECT_RUN=${INJECT_RUN:-1}
CPU_TIMEOUT=${CPU_TIMEOUT:-200}
RUN_TIMEOUT=${RUN_TIMEOUT:-240}
REF_DEVICE=${REF_DEVICE:-cuda}
DUMP_LAYERS=${DUMP_LAYERS:-1}
GATE_SLACK=${GATE_SLACK:-1.1}
OUTLIER_COLUMNS=${OUTLIER_COLUMNS:-4}
OUTLIER_SCALE=${OUTLIER_SCALE:-30}
REUSE=${REUSE:-0}
TOKENIZER=tests/data/tokenizer/spiece.model
export PATH="$PATH:/usr/local/cuda/bin" PYTHONUNBUFFERED=1
mkdir -p "$OUT" "$WORK"
LOG="$OUT/run.log"
: >"$LOG"
failed=()
t_start=$SECONDS

say() { printf '\n== %s (%d s) ==\n' "$*" $((SECONDS - t_start)) | tee -a "$LOG"; }
# run NAME CMD...: CMD's output goes to $WORK/NAME.log, its tail to $LOG; failures are recorded.
run() {
    local name=$1
    shift
    local t0=$SECONDS
    "$@" >"$WORK/$name.log" 2>&1
    local rc=$?
    { printf -- '-- %s: exit %d, %d s\n' "$name" "$rc" $((SECONDS - t0)); tail -n 25 "$WORK/$name.log"; } >>"$LOG"
    ((rc == 0)) || failed+=("$name (exit $rc)")
    return $rc
}

say "versions ($(date -u +%Y-%m-%dT%H:%MZ))"
{
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 || true
    nvcc --version 2>/dev/null | tail -1
    "$PYTHON" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)' 2>&1
    echo "cpus: $(nproc)"
    git log -1 --format='dzr commit %h %s' 2>/dev/null || true
    if [[ -e "$REF/.git" ]]; then git -C "$REF" log -1 --format='reference commit %h'; else echo "reference: $REF"; fi
    sha256sum "$REF/groot/vla/model/dreamzero/action_head/wan_flow_matching_action_tf.py" 2>&1 | cut -c1-16
} | tee -a "$LOG"

DZR=${DZR_BIN:-$BUILD_DIR/bin/dzr}
if [[ -z "${DZR_BIN:-}" ]]; then
    say "build dzr (CUDA, no OpenCV, -j$JOBS)"
    gen=()
    command -v ninja >/dev/null 2>&1 && gen=(-G Ninja)
    run configure cmake -S . -B "$BUILD_DIR" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DDZR_CUDA=ON -DDZR_OPENCV=OFF \
        -DCMAKE_CUDA_ARCHITECTURES="${DZR_CUDA_ARCHS:-90a}"
    run build cmake --build "$BUILD_DIR" --target dzr_cli -j "$JOBS"
    if [[ ! -x "$DZR" ]]; then
        say "the CUDA build failed: building dzr without CUDA (the reference and CPU runs still go)"
        run configure-cpu cmake -S . -B "$BUILD_DIR-cpu" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DDZR_CUDA=OFF \
            -DDZR_OPENCV=OFF
        run build-cpu cmake --build "$BUILD_DIR-cpu" --target dzr_cli -j "$JOBS"
        DZR=$BUILD_DIR-cpu/bin/dzr
        INJECT_RUN=0
        GPU_RUNS=$(tr ' ' '\n' <<<"$GPU_RUNS" | grep -v '^dzr-cuda' | tr '\n' ' ')
    fi
fi

runs="$GPU_RUNS"
((CPU_RUN)) && runs="$runs dzr-cpu-cpu"
say "parity checkpoints ($CONFIG, seed $SEED, f32; cpu: vae.base_dim=$CPU_VAE_BASE; embodiment ${EMBODIMENT:-oxe_droid}) and inputs"
stamp="config=$CONFIG seed=$SEED calls=$CALLS embodiment=${EMBODIMENT:-} cpu_vae_base=$CPU_VAE_BASE"
stamp+=" dump_layers=$DUMP_LAYERS ref_device=$REF_DEVICE outliers=$OUTLIER_COLUMNS:$OUTLIER_SCALE"
reuse=0
if ((REUSE)) && [[ "$(cat "$WORK/stamp.txt" 2>/dev/null)" == "$stamp" ]]; then
    reuse=1
    echo "REUSE=1: keeping what $WORK holds of an earlier run of the same settings" | tee -a "$LOG"
else
    rm -rf "$WORK/ckpt-gpu" "$WORK/ckpt-cpu" "$WORK/ckpt-outlier" "$WORK/inputs" "$WORK/stamp.txt"
    rm -f "$WORK"/*.rc "$WORK"/*.safetensors
fi
# make NAME ARGS...: the checkpoint $WORK/ckpt-NAME of the seed (kept when reusing one that exists: `ckpt make` renames
# a finished directory into place, so one that exists is whole).
# NOTE: --force: the real-width configuration is 6.8 GB as f32; shards of 1 GB are written in parallel (the tensor
# bytes do not depend on the sharding).
make_ckpt() {
    local name=$1
    shift
    ((reuse)) && [[ -f "$WORK/ckpt-$name/config.json" ]] && return 0
    rm -rf "$WORK/ckpt-$name"
    run "ckpt-$name" "$DZR" ckpt make --config "$CONFIG" --seed "$SEED" --dtype f32 --tokenizer "$TOKENIZER" \
        "${emb[@]}" --force --shard-size 1GB --out "$WORK/ckpt-$name" "$@"
}
make_ckpt gpu
# the narrowed-VAE checkpoint and the outlier one only when a run uses them
[[ " $runs " == *"-cpu "* ]] && make_ckpt cpu --set "model.vae.base_dim=$CPU_VAE_BASE"
[[ " $runs " == *"-outlier "* ]] &&
    make_ckpt outlier --outlier-columns "$OUTLIER_COLUMNS" --outlier-scale "$OUTLIER_SCALE"
if ! ((reuse)) || [[ ! -f "$WORK/inputs/manifest.json" ]]; then
    rm -rf "$WORK/inputs"
    run inputs "$DZR" parity make-inputs --ckpt "$WORK/ckpt-gpu" --out "$WORK/inputs" --calls "$CALLS" "${emb[@]}"
fi
((${#failed[@]})) || echo "$stamp" >"$WORK/stamp.txt"

# Every run in parallel: the GPU ones are small next to an H200, and dzr's CPU run uses the cores.
# NAME = ref-<fp32|bf16>-<ckpt> | dzr-cuda-<ckpt> (paged KV) | dzr-cudadense-<ckpt> | dzr-cudafast-<ckpt> (paged KV,
# --numerics fast) | dzr-cudafp8-<ckpt> | dzr-cudafp8kv-<ckpt> | dzr-cudafp8all-<ckpt> (paged KV, --numerics fast;
# FP8 weights, FP8 KV, both) | dzr-cpu-<ckpt> | dzr-cudainject-<ckpt> (paged KV, on the encoder outputs of
# ref-bf16-<ckpt>'s dump; launched after it). <ckpt>: gpu, cpu or outlier.
# Each leaves $WORK/NAME.rc.
# Without DUMP_LAYERS, dzr dumps what the reference dumps with --no-layers (its default stages less layer_out).
ref_dump=()
dzr_dump=()
if ((!DUMP_LAYERS)); then
    ref_dump=(--no-layers)
    dzr_dump=(--dump '^(input\.video|state|text\.(pos|neg)|clip|ys|vae\.clip|noise\.(video|action)|sample\.|velocity\.|x$|actions$)|^dit\..*\.(head|action_velocity)$')
fi
launch() {
    local r=$1 ck=${1##*-} limit=$RUN_TIMEOUT cmd=()
    case $r in
    ref-*)
        local dt=${r#ref-}
        cmd=("$PYTHON" scripts/parity/reference_run.py --ref "$REF" --ckpt "$WORK/ckpt-$ck" --inputs "$WORK/inputs"
            --out "$WORK/$r.safetensors" --dtype "${dt%-*}" --device "$REF_DEVICE" "${ref_dump[@]}") ;;
    dzr-cuda-* | dzr-cudadense-* | dzr-cudafast-* | dzr-cudainject-* | dzr-cudafp8-* | dzr-cudafp8kv-* | dzr-cudafp8all-*)
        local kv=paged numerics=reference precision=bf16 kv_dtype=bf16
        [[ $r == dzr-cudadense-* ]] && kv=dense
        [[ $r == dzr-cudafast-* || $r == dzr-cudafp8* ]] && numerics=fast
        [[ $r == dzr-cudafp8-* || $r == dzr-cudafp8all-* ]] && precision=fp8
        [[ $r == dzr-cudafp8kv-* || $r == dzr-cudafp8all-* ]] && kv_dtype=fp8
        cmd=("$DZR" parity run --ckpt "$WORK/ckpt-$ck" --inputs "$WORK/inputs" --out "$WORK/$r.safetensors"
            --device cuda --dtype bf16 --kv "$kv" --numerics "$numerics" --precision "$precision" --kv-dtype "$kv_dtype"
            --check-finite "${dzr_dump[@]}")
        # dzr-cudainject: text, CLIP, ys and the commit latents replaced by the bf16 reference's, so that
        # only the DiT and the sampler differ.
        [[ $r == dzr-cudainject-* ]] && cmd+=(--inject-from "$WORK/ref-bf16-$ck.safetensors") ;;
    dzr-cpu-*)
        limit=$CPU_TIMEOUT
        cmd=("$DZR" parity run --ckpt "$WORK/ckpt-$ck" --inputs "$WORK/inputs" --out "$WORK/$r.safetensors"
            --device cpu --dtype f32 "${dzr_dump[@]}") ;;
    esac
    (
        failed=()
        run "$r" timeout "$limit" "${cmd[@]}"
        echo $? >"$WORK/$r.rc"
    ) &
}
say "runs (in parallel): $runs"
for r in $runs; do
    if ((reuse)) && [[ $r == ref-* && -f "$WORK/$r.safetensors" && "$(cat "$WORK/$r.rc" 2>/dev/null)" == 0 ]]; then
        echo "-- $r: reused $WORK/$r.safetensors" | tee -a "$LOG"
        continue
    fi
    rm -f "$WORK/$r.safetensors" "$WORK/$r.rc"
    launch "$r"
done
wait
for r in $runs; do
    rc=$(cat "$WORK/$r.rc" 2>/dev/null || echo "none")
    [[ "$rc" == 0 ]] || failed+=("$r (exit $rc)")
done
# dzr on the reference's conditioning needs ref-bf16-gpu's dump, so it starts only now.
rm -f "$WORK/dzr-cudainject-gpu.safetensors" "$WORK/dzr-cudainject-gpu.rc"
if ((INJECT_RUN)) && [[ " $runs " == *" ref-bf16-gpu "* && $(cat "$WORK/ref-bf16-gpu.rc" 2>/dev/null) == 0 ]]; then
    say "run: dzr-cudainject-gpu (on ref-bf16-gpu's text, CLIP, ys and VAE outputs)"
    launch dzr-cudainject-gpu
    wait
    rc=$(cat "$WORK/dzr-cudainject-gpu.rc" 2>/dev/null || echo "none")
    [[ "$rc" == 0 ]] || failed+=("dzr-cudainject-gpu (exit $rc)")
fi

say "compare"
have() { [[ -f "$WORK/$1.safetensors" && -f "$WORK/$2.safetensors" ]]; }
pair() { echo "$1=$WORK/$2.safetensors:$WORK/$3.safetensors:$4"; }
args=()
have dzr-cpu-cpu ref-fp32-cpu && args+=(--pair "$(pair cpu-f32 dzr-cpu-cpu ref-fp32-cpu 1e-4)")
cuda=dzr-cuda-gpu
have dzr-cuda-gpu ref-bf16-gpu || cuda=dzr-cudadense-gpu  # the dense-KV run stands in when the paged one failed
have $cuda ref-bf16-gpu && args+=(--pair "$(pair cuda-bf16 $cuda ref-bf16-gpu 2e-2)")
# For scale (reported, not gated): dzr's and the reference's own bf16 error against the fp32 reference.
have $cuda ref-fp32-gpu && args+=(--info-pair "$(pair dzr-bf16-vs-ref-f32 $cuda ref-fp32-gpu 2e-2)")
have ref-bf16-gpu ref-fp32-gpu && args+=(--info-pair "$(pair ref-bf16-vs-ref-f32 ref-bf16-gpu ref-fp32-gpu 2e-2)")
have dzr-cudadense-gpu dzr-cuda-gpu && args+=(--info-pair "$(pair cuda-paged-vs-dense dzr-cuda-gpu dzr-cudadense-gpu 2e-2)")
# fast numerics against the fp32 and bf16 references and against dzr's reference numerics.
have dzr-cudafast-gpu ref-fp32-gpu && args+=(--info-pair "$(pair fast-vs-ref-f32 dzr-cudafast-gpu ref-fp32-gpu 2e-2)")
have dzr-cudafast-gpu ref-bf16-gpu && args+=(--info-pair "$(pair fast-vs-ref-bf16 dzr-cudafast-gpu ref-bf16-gpu 2e-2)")
have dzr-cudafast-gpu dzr-cuda-gpu && args+=(--info-pair "$(pair fast-vs-reference-numerics dzr-cudafast-gpu dzr-cuda-gpu 2e-2)")
# FP8 runs against the fp32 reference of their checkpoint (gated below by gate.py --kind fp8, actions only).
for r in $runs; do
    [[ $r == dzr-cudafp8* ]] || continue
    have "$r" "ref-fp32-${r##*-}" && args+=(--info-pair "$(pair "${r#dzr-cuda}-vs-ref-f32" "$r" "ref-fp32-${r##*-}" 2e-2)")
done
# DiT + sampler alone: the encoder stages read 0 there by construction.
have dzr-cudainject-gpu ref-bf16-gpu && args+=(--info-pair "$(pair dit-only-bf16 dzr-cudainject-gpu ref-bf16-gpu 2e-2)")
if ((${#args[@]})); then
    run compare "$PYTHON" scripts/parity/compare.py "${args[@]}" --out "$OUT/table.txt" --md "$OUT/table.md" \
        --details "$OUT/details.txt"
else
    failed+=("compare (no pair of dumps to compare)")
fi
rm -f "$OUT/gate.txt" "$OUT/gate-reference.txt" "$OUT"/gate-dzr-*.txt
if [[ " $runs " == *" dzr-cudafast-gpu "* ]]; then
    # The numerics gate of fast: per call, fast vs ref fp32 within GATE_SLACK x ref bf16 vs ref fp32 (actions).
    if have dzr-cudafast-gpu ref-fp32-gpu && have ref-bf16-gpu ref-fp32-gpu; then
        say "gate of fast numerics (slack $GATE_SLACK)"
        run gate "$PYTHON" scripts/parity/gate.py --candidate "$WORK/dzr-cudafast-gpu.safetensors" \
            --baseline "$WORK/ref-bf16-gpu.safetensors" --reference "$WORK/ref-fp32-gpu.safetensors" \
            --slack "$GATE_SLACK" --calls "$CALLS" --out "$OUT/gate.txt"
    else
        failed+=("gate (needs the dumps of dzr-cudafast-gpu, ref-bf16-gpu and ref-fp32-gpu)")
    fi
fi
# The FP8 gates: per call, the FP8 run vs ref fp32 rel l2 within 3 x ref bf16 vs ref fp32, max rel at most 0.1 (actions),
# each against the reference runs of its own checkpoint.
for r in $runs; do
    [[ $r == dzr-cudafp8* ]] || continue
    ck=${r##*-}
    label=${r#dzr-cuda}
    label=${label%-gpu}
    if have "$r" "ref-fp32-$ck" && have "ref-bf16-$ck" "ref-fp32-$ck"; then
        say "FP8 gate of $r"
        run "gate-$r" "$PYTHON" scripts/parity/gate.py --kind fp8 --label "$label" --candidate "$WORK/$r.safetensors" \
            --baseline "$WORK/ref-bf16-$ck.safetensors" --reference "$WORK/ref-fp32-$ck.safetensors" --calls "$CALLS" \
            --out "$OUT/gate-$r.txt"
    else
        failed+=("gate-$r (needs the dumps of $r, ref-bf16-$ck and ref-fp32-$ck)")
    fi
done
# For scale (not gated): dzr's reference numerics measured the same way.
if have dzr-cuda-gpu ref-fp32-gpu && have ref-bf16-gpu ref-fp32-gpu; then
    "$PYTHON" scripts/parity/gate.py --candidate "$WORK/dzr-cuda-gpu.safetensors" --label reference-numerics \
        --baseline "$WORK/ref-bf16-gpu.safetensors" --reference "$WORK/ref-fp32-gpu.safetensors" \
        --slack "$GATE_SLACK" --calls "$CALLS" --out "$OUT/gate-reference.txt" >/dev/null 2>&1
fi
(cd "$WORK" && tar -czf "$OUT/logs.tar.gz" ./*.log inputs/manifest.json ckpt-gpu/config.json ckpt-gpu/experiment_cfg \
    2>/dev/null)

say "summary"
if ((${#failed[@]})); then
    printf 'failed: %s\n' "${failed[@]}" | tee -a "$LOG"
else
    echo "every step passed" | tee -a "$LOG"
fi
[[ -f "$OUT/table.txt" ]] && cat "$OUT/table.txt"
[[ -f "$OUT/gate.txt" ]] && { echo; cat "$OUT/gate.txt"; }
for f in "$OUT"/gate-dzr-*.txt; do [[ -f "$f" ]] && { echo; cat "$f"; }; done
[[ -f "$OUT/gate-reference.txt" ]] && { echo; echo "(not gated)"; cat "$OUT/gate-reference.txt"; }
((${#failed[@]} == 0))
