#!/usr/bin/env bash
# One device command of the bf16 exactness work (docs/PARITY.md), in steps that reuse what a warm machine
# still has: `build` (Release, CUDA, no OpenCV, sm_90a, every target; skipped when the binary exists and
# FORCE_BUILD is unset), `tests` (ctest -L cuda), `parity` (run_parity.sh: reference bf16, dzr CUDA bf16, dzr
# on the reference's conditioning), `variants` (dzr CUDA bf16 again on the same inputs under each setting in
# VARIANTS, each compared with the reference bf16 dump of `parity`), `probe` (kernel_probe.py), `trace` (the
# reference's aten-op trace of its first two calls), `substage` (substage_probe.sh: the DiT's and the
# encoders' internals on both sides) and `bench` (`dzr bench rollout` at the DROID geometry: BENCH_CALLS,
# BENCH_NUMERICS="reference fast" (variants: variant_args below), BENCH_DEVICE; BENCH_FP8=1 adds fast numerics with FP8 weights and KV); `embodiments` runs the parity step on AgiBot- and YAM-shaped
# checkpoints (EMBODIMENTS="agibot yam"); `vae` times the VAE encode (dzr bench vae, fast and reference numerics); `profile` writes the op profile of DROID calls (PROFILE_CALLS,
# PROFILE_NUMERICS) and the DiT GEMMs (one branch's rows, both branches'); `wide` is the parity run at the real widths
# (configs/parity_wide.yaml, WIDE_CALLS=9: three resets) with the reference fp32 and bf16 runs and dzr CUDA bf16 in
# reference and fast numerics: the gate of fast (gate.py) and reference numerics against the reference bf16 run;
# `fp8gate` runs the FP8 gates at the same widths (gate.py --kind fp8: per call rel l2 within 3 x the reference bf16
# run's, max rel at most 0.1): dzr fast numerics with FP8 weights, FP8 KV and both on the `wide` checkpoint, then FP8
# weights on the same checkpoint with outlier input columns (OUTLIER_COLUMNS=4 of every FP8 Linear x OUTLIER_SCALE=30)
# against the reference runs on that one; after `wide` in the same call it reuses its checkpoint, inputs and reference
# dumps (run_parity.sh REUSE=1);
# `widesub` finds the first op that differs at the real widths (per-forward internals on both sides, every real-width
# GEMM shape under the cuBLASLt workspace, alignment and library settings, dzr variants; WIDESUB_CALLS, WIDE_VARIANTS);
# `ltsearch` runs scripts/bench/lt_search.cu (cuBLASLt configurations at the DiT's shapes, timed sustained);
# `load` times loading the DROID checkpoint cold and warm, old path and new (scripts/bench/load_cold_warm.sh; the
# random 46 GB checkpoint is made once into LOAD_CKPT, default .dzr-load/droid in the repository, on the machine's
# disk). The device tool returns at most 8 files, so everything each step writes goes into one archive,
# $OUT/<step>.tar.gz, and a short summary is printed last.
#
# Usage (GPU machine, repository root, .ref carried): STEPS="build tests parity" OUT=$OUT scripts/parity/device_round.sh
# Settings: CUDA_TESTS_J (parallel CUDA tests), CUDA_TESTS_R (a ctest -R filter of them), BUILD_DIR=build-parity-device WORK=/tmp/dzr-round VARIANTS="DZR_PLAIN_GEMM=lt DZR_PLAIN_GEMM=cublas"
#   PARITY_CALLS=7 (the parity step's calls; CALLS is the sub-stage probe's)
#   PROBE_ARGS (extra kernel_probe.py arguments, e.g. "--skip conv --cases clip_257_h16_d80")
#   LOAD_CKPT (the load step's checkpoint), LOAD_VARIANTS and SKIP_OLD (scripts/bench/load_cold_warm.sh's)
#   EXTRA_CMAKE_ARGS (more configure arguments of the build step, e.g. another cuDNN: -DDZR_CUDNN_INCLUDE=DIR
#   -DDZR_CUDNN_LIB=FILE, with BUILD_DIR set apart and LD_LIBRARY_PATH naming its library folder)
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/dzr-round-out}
BUILD_DIR=${BUILD_DIR:-build-parity-device}
WORK=${WORK:-/tmp/dzr-round}
STEPS=${STEPS:-build tests parity variants probe trace substage}
VARIANTS=${VARIANTS:-DZR_PLAIN_GEMM=lt DZR_PLAIN_GEMM=cublas}
export PATH="$PATH:/usr/local/cuda/bin" PYTHONUNBUFFERED=1
mkdir -p "$OUT" "$WORK"
DZR=$BUILD_DIR/bin/dzr
failed=()
t0=$SECONDS
want() { [[ " $STEPS " == *" $1 "* ]]; }
# The GPU's clocks, power and clock-limit reasons every 200 ms while a bench runs (nvidia-smi, into CSV FILE), and
# their summary over the run's second half (the timed calls): is a sustained rollout power- or clock-limited?
SMI_PID=
smi_start() {
    local fields=timestamp,clocks.sm,clocks.max.sm,clocks.mem,power.draw,power.limit,temperature.gpu
    if nvidia-smi --query-gpu=clocks_event_reasons.active --format=csv,noheader >/dev/null 2>&1; then
        fields+=,clocks_event_reasons.active
    else
        fields+=,clocks_throttle_reasons.active
    fi
    nvidia-smi --query-gpu="$fields" --format=csv,noheader,nounits -lms 200 >"$1" 2>/dev/null &
    SMI_PID=$!
}
smi_stop() {
    [[ -n "$SMI_PID" ]] && kill "$SMI_PID" 2>/dev/null && wait "$SMI_PID" 2>/dev/null
    SMI_PID=
    python3 - "$1" <<'PY' || true
import csv, statistics, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) >= 8]
busy = [r for r in rows[len(rows) // 2:] if float(r[4]) > 150]  # the timed calls' samples with the GPU at work
if busy:
    med = lambda i: statistics.median(float(r[i]) for r in busy)
    reasons = {}
    for r in busy:
        reasons[r[7].strip()] = reasons.get(r[7].strip(), 0) + 1
    print(f"nvidia-smi over {len(busy)} busy samples: SM clock median {med(1):.0f} MHz (max {busy[0][2].strip()}), "
          f"memory {med(3):.0f} MHz, power median {med(4):.0f} W of {busy[0][5].strip()} W, temperature {med(6):.0f} C, "
          f"limit reasons {sorted(reasons.items(), key=lambda kv: -kv[1])[:3]}")
PY
}
# The bench/profile variant NAME as `dzr bench rollout` arguments in VARGS (and environment settings in VENV:
# "-nobattn", one self-attention SDPA per branch: DZR_BATCHED_ATTENTION=off; "-notune", the cuBLASLt heuristic's
# first algorithm for every GEMM: DZR_GEMM_TUNE=off; "-nolanes", the pool without kv.in_place lanes (the attention
# gathers its rows): --set kv.in_place=false; "-pgraphs" (profile step: --profile-graphs, the forwards replayed and only
# their kernels and launches counted); "-noshare", layer 0's self-attention run per branch: DZR_SHARE_LAYER0=off;
# "-stream8", the streamed row kernels' earlier shape: DZR_ROW_KERNELS=stream8):
# numerics first, then "-nobatch" (the CFG
# branches one after the other: --no-batch-cfg), "-fp8" (FP8 weights and KV), "-fp8w" (FP8 weights, bf16 KV), e.g. fast,
# reference, fast-nobatch, fast-fp8, fast-fp8w.
variant_args() {
    VARGS=(--numerics "${1%%-*}")
    VENV=()
    [[ "$1" == *-nobattn* ]] && VENV+=(DZR_BATCHED_ATTENTION=off)
    [[ "$1" == *-notune* ]] && VENV+=(DZR_GEMM_TUNE=off)
    [[ "$1" == *-noshare* ]] && VENV+=(DZR_SHARE_LAYER0=off)
    [[ "$1" == *-stream8* ]] && VENV+=(DZR_ROW_KERNELS=stream8)
    [[ "$1" == *-nobatch* ]] && VARGS+=(--no-batch-cfg)
    [[ "$1" == *-nolanes* ]] && VARGS+=(--set kv.in_place=false)
    [[ "$1" == *-pgraphs* ]] && VARGS+=(--profile-graphs)  # profile step only: graphs replayed, kernels and launches
    if [[ "$1" == *-fp8w* ]]; then VARGS+=(--precision fp8)
    elif [[ "$1" == *-fp8* ]]; then VARGS+=(--precision fp8 --kv-dtype fp8); fi
    return 0
}
say() { printf '\n== %s (%d s) ==\n' "$*" $((SECONDS - t0)); }
check() { (($1 == 0)) || failed+=("$2 (exit $1)"); }
pack() { (cd "$WORK/$1" 2>/dev/null && tar -czf "$OUT/$1.tar.gz" . 2>/dev/null); }

if want build; then
    say "build"
    mkdir -p "$WORK/build"
    if [[ -x "$DZR" && -z "${FORCE_BUILD:-}" ]]; then
        echo "kept the existing $DZR"
        cmake --build "$BUILD_DIR" -j "$(nproc)" >"$WORK/build/build.log" 2>&1
    else
        gen=()
        command -v ninja >/dev/null 2>&1 && gen=(-G Ninja)
        cmake -S . -B "$BUILD_DIR" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DDZR_CUDA=ON -DDZR_OPENCV=OFF \
            -DCMAKE_CUDA_ARCHITECTURES=90a ${EXTRA_CMAKE_ARGS:-} >"$WORK/build/configure.log" 2>&1 &&
            cmake --build "$BUILD_DIR" -j "$(nproc)" >"$WORK/build/build.log" 2>&1
    fi
    check $? build
    grep -E "error" "$WORK/build/build.log" | head -20
    grep -h "dzr: CUPTI" "$WORK/build/configure.log" 2>/dev/null
    git log -1 --format='dzr commit %h %s' 2>/dev/null
fi

if want tests; then
    say "cuda tests"
    mkdir -p "$WORK/tests"
    # NOTE: CUDA_TESTS_J tests at once (one GPU holds several: each takes a few GiB)
    ctest --test-dir "$BUILD_DIR" -L cuda ${CUDA_TESTS_R:+-R "$CUDA_TESTS_R"} -j "${CUDA_TESTS_J:-1}" --output-on-failure --timeout 300 \
        >"$WORK/tests/ctest-cuda.log" 2>&1
    check $? "cuda tests"
    tail -n 12 "$WORK/tests/ctest-cuda.log"
    pack tests
fi

if want vae; then
    # The VAE encode at the DROID canvas (dzr bench vae): fast numerics (the tuned channels-last convolutions, against
    # reference numerics' time and output, and a per-op profile) and fast numerics with the tuning off
    say "vae: dzr bench vae (fast, tuned; fast, DZR_CONV_TUNE=off)"
    mkdir -p "$WORK/vae"
    "$DZR" --log-level debug bench vae --config configs/dreamzero_droid.yaml --repeats "${VAE_REPEATS:-10}" \
        --numerics fast --profile >"$WORK/vae/bench-fast.log" 2>"$WORK/vae/bench-fast.err"
    check $? "bench vae fast"
    cat "$WORK/vae/bench-fast.log"
    DZR_CONV_TUNE=off "$DZR" bench vae --config configs/dreamzero_droid.yaml --repeats "${VAE_REPEATS:-10}" \
        --numerics fast --no-compare >"$WORK/vae/bench-fast-off.log" 2>&1
    check $? "bench vae fast, tuning off"
    cat "$WORK/vae/bench-fast-off.log"
    pack vae
fi

P=$WORK/parity-work
if want parity; then
    say "parity (reference bf16, dzr CUDA bf16, dzr on the reference's conditioning)"
    mkdir -p "$WORK/parity"
    # NOTE: OUT first: in one command's assignments a later one sees the earlier ones (WORK=$P)
    OUT="$WORK/parity" DZR_BIN=$DZR WORK=$P GPU_RUNS="${GPU_RUNS:-ref-bf16-gpu dzr-cuda-gpu}" CPU_RUN=${CPU_RUN:-0} CALLS=${PARITY_CALLS:-7} \
        RUN_TIMEOUT=240 bash scripts/parity/run_parity.sh >"$WORK/parity/parity.log" 2>&1
    check $? parity
    grep -E "^(cpu-f32|cuda-bf16|dit-only|dzr-bf16|ref-bf16)|^  call|failed" "$WORK/parity/parity.log"
    pack parity
fi

if want embodiments; then
    # The same parity run on AgiBot- and YAM-shaped checkpoints (docs/PARITY.md, embodiments).
    for e in ${EMBODIMENTS:-agibot yam}; do
        say "parity, embodiment $e (reference bf16, dzr CUDA bf16)"
        mkdir -p "$WORK/parity-$e"
        OUT="$WORK/parity-$e" DZR_BIN=$DZR WORK=$WORK/parity-work-$e EMBODIMENT=$e \
            GPU_RUNS="${GPU_RUNS:-ref-bf16-gpu dzr-cuda-gpu}" CPU_RUN=${CPU_RUN:-0} CALLS=${PARITY_CALLS:-7} \
            RUN_TIMEOUT=240 bash scripts/parity/run_parity.sh >"$WORK/parity-$e/parity.log" 2>&1
        check $? "parity $e"
        grep -E "^(cpu-f32|cuda-bf16|dit-only|dzr-bf16|ref-bf16)|^  call|failed|canvas" "$WORK/parity-$e/parity.log" | head -40
        pack "parity-$e"
    done
fi

if want wide; then
    # The numerics gate of fast at the real widths (docs/PARITY.md): per call, dzr fast vs the reference fp32 run
    # within 1.1 x the reference bf16 run's own distance from it (actions max rel and rel l2). No per-layer dumps
    # (at width 5120 they would be ~12 GB per run).
    say "wide: parity at the real widths (${WIDE_CONFIG:-configs/parity_wide.yaml}, ${WIDE_CALLS:-9} calls; reference fp32 and bf16, dzr reference and fast)"
    mkdir -p "$WORK/wide"
    OUT="$WORK/wide" DZR_BIN=$DZR WORK=$WORK/wide-work CONFIG=${WIDE_CONFIG:-configs/parity_wide.yaml} CALLS=${WIDE_CALLS:-9} \
        GPU_RUNS="ref-fp32-gpu ref-bf16-gpu dzr-cuda-gpu dzr-cudafast-gpu" CPU_RUN=0 INJECT_RUN=0 DUMP_LAYERS=0 \
        RUN_TIMEOUT=${WIDE_TIMEOUT:-360} bash scripts/parity/run_parity.sh >"$WORK/wide/parity.log" 2>&1
    check $? wide
    # each step's exit status and seconds, then the pairs' verdicts and the state machine
    grep -E "^-- " "$WORK/wide/run.log"
    grep -E "^== |^(cuda-bf16|[a-z0-9-]+-vs-[a-z0-9-]+): |^  call|^failed" "$WORK/wide/parity.log"
    if grep -q "^cuda-bf16:" "$WORK/wide/table.txt" 2>/dev/null; then
        # NOTE: with CPU_RUN=0 the first pair of the table (columns 4-6) is cuda-bf16
        echo "-- actions per call: dzr reference numerics vs the reference bf16 run (cuda-bf16, gate 2e-2)"
        awk '$1 == "actions" { printf "  call %s  max abs %s  max rel %s  %s\n", $2, $4, $5, $6 }' "$WORK/wide/table.txt"
    fi
    echo "-- the gate of fast"
    cat "$WORK/wide/gate.txt" 2>/dev/null || echo "  no gate table (see parity.log)"
    echo "-- dzr reference numerics measured the same way (not gated)"
    cat "$WORK/wide/gate-reference.txt" 2>/dev/null || echo "  none"
    pack wide
fi

if want fp8gate; then
    # The FP8 gates at the real widths (docs/PARITY.md, issue #14 item 5), in two run_parity.sh calls sharing the
    # `wide` step's work directory: (1) the wide checkpoint: reference fp32 and bf16 (reused after `wide`), dzr fast
    # with FP8 weights, FP8 KV and both; (2) the outlier checkpoint: reference fp32 and bf16 on it, dzr fast with FP8
    # weights. NOTE: one after the other, so that at most two reference runs (~14 GB of host memory each at these
    # widths) and two checkpoints share the machine.
    say "fp8gate: the FP8 gates at the real widths (${WIDE_CONFIG:-configs/parity_wide.yaml}, ${WIDE_CALLS:-9} calls; outliers ${OUTLIER_COLUMNS:-4} x ${OUTLIER_SCALE:-30})"
    mkdir -p "$WORK/fp8gate"
    fp8_phase() {
        local tag=$1 runs=$2
        mkdir -p "$WORK/fp8gate/$tag"
        OUT="$WORK/fp8gate/$tag" DZR_BIN=$DZR WORK=$WORK/wide-work REUSE=1 CONFIG=${WIDE_CONFIG:-configs/parity_wide.yaml} \
            CALLS=${WIDE_CALLS:-9} GPU_RUNS="$runs" CPU_RUN=0 INJECT_RUN=0 DUMP_LAYERS=0 \
            OUTLIER_COLUMNS=${OUTLIER_COLUMNS:-4} OUTLIER_SCALE=${OUTLIER_SCALE:-30} RUN_TIMEOUT=${FP8_TIMEOUT:-360} \
            bash scripts/parity/run_parity.sh >"$WORK/fp8gate/$tag/parity.log" 2>&1
        check $? "fp8gate $tag"
        # each step's exit status and seconds (or "reused"), the failures
        grep -E "^-- " "$WORK/fp8gate/$tag/run.log" | cut -c1-160
        grep -E "^failed" "$WORK/fp8gate/$tag/parity.log" | cut -c1-200
    }
    # NOTE: FP8_PHASES (wide, outlier) and FP8_WIDE_RUNS narrow a short call down to the runs a change touches
    [[ " ${FP8_PHASES:-wide outlier} " == *" wide "* ]] &&
        fp8_phase wide "${FP8_WIDE_RUNS:-ref-fp32-gpu ref-bf16-gpu dzr-cudafp8-gpu dzr-cudafp8kv-gpu dzr-cudafp8all-gpu}"
    [[ " ${FP8_PHASES:-wide outlier} " == *" outlier "* ]] &&
        fp8_phase outlier "ref-fp32-outlier ref-bf16-outlier dzr-cudafp8-outlier"
    for f in "$WORK"/fp8gate/wide/gate-dzr-*.txt "$WORK"/fp8gate/outlier/gate-dzr-*.txt; do
        [[ -f $f ]] || continue
        # the table and the verdict, without the three lines naming the dumps
        echo "-- $(basename "$f" .txt)"
        tail -n +5 "$f" | grep -v '^$' | cut -c1-200
    done
    ls "$WORK"/fp8gate/*/gate-dzr-*.txt >/dev/null 2>&1 || echo "  no FP8 gate table (see fp8gate/*/parity.log)"
    pack fp8gate
fi

if want widesub; then
    # Which op first differs from the official bf16 run at the real widths (docs/PARITY.md, "The real widths: where
    # bit-identity breaks"), in one step of about 5 minutes on a warm machine:
    #  1. (in the background) kernel_probe.py's group `wide`: every real-width GEMM shape, torch under its default
    #     and CUBLASLT_WORKSPACE_SIZE=1024 / 32768, dzr under its default, DZR_LT_WORKSPACE=1024 (+ DZR_LT_ALIGN=torch),
    #     PyTorch's bundled cuBLAS and (bias-free) DZR_PLAIN_GEMM=cublas; the cuBLASLt API logs of the head shape;
    #  2. the reference bf16 run of configs/parity_wide.yaml over WIDESUB_CALLS calls (default 2: a reset and a
    #     commit) dumping, for the first forward of each kind and branch, the embeddings, register tokens, layer
    #     outputs, the head's LayerNorm output and its Linear's input (reference --sub-stage-set head); dzr on the
    #     reference's conditioning dumping the same: per forward the first stage that differs (first_diff.py);
    #  3. dzr again on the reference's conditioning under each setting of WIDE_VARIANTS (in parallel; a comma joins
    #     several variables, `torchlibs` puts PyTorch's bundled cuBLAS first), and once end to end (no injection):
    #     per call how many head outputs differ and the actions' max rel.
    say "widesub: the real widths, first difference per forward (${WIDESUB_CALLS:-2} calls) and GEMM probes"
    mkdir -p "$WORK/widesub"
    rm -f "$WORK"/widesub/*.rc "$WORK"/widesub/*.details.txt "$WORK"/widesub/*.table.txt
    S=$WORK/widesub-work
    mkdir -p "$S"
    TL=$(python3 -c 'import nvidia, os; print(os.path.join(nvidia.__path__[0], "cu13", "lib"))' 2>/dev/null)
    echo "PyTorch's bundled CUDA libraries (variant torchlibs): ${TL:-none found}"
    python3 scripts/parity/kernel_probe.py --dzr "$DZR" --out "$WORK/widesub/probe" --work /tmp/dzr-kernel-probe-wide \
        --cases none --skip linear,bmm,op,conv --cublaslt-log >"$WORK/widesub/probe.log" 2>&1 &
    probe_pid=$!
    wcalls=${WIDESUB_CALLS:-2}
    # NOTE: the 6.8 GB checkpoint is kept on a warm machine (same config, seed and binary: the same bytes)
    if [[ ! -f "$S/ckpt/config.json" ]]; then
        "$DZR" ckpt make --config configs/parity_wide.yaml --seed 1 --dtype f32 --tokenizer tests/data/tokenizer/spiece.model \
            --force --shard-size 1GB --out "$S/ckpt" >"$WORK/widesub/ckpt.log" 2>&1
        check $? "widesub: ckpt make"
    fi
    rm -rf "$S/inputs" "$S"/*.safetensors
    "$DZR" parity make-inputs --ckpt "$S/ckpt" --out "$S/inputs" --calls "$wcalls" >"$WORK/widesub/inputs.log" 2>&1
    check $? "widesub: inputs"
    t1=$SECONDS
    timeout 400 python3 scripts/parity/reference_run.py --ref .ref/dreamzero --ckpt "$S/ckpt" --inputs "$S/inputs" \
        --out "$S/ref.safetensors" --dtype bf16 --device cuda --no-layers --sub-stages --sub-stage-forwards 0 \
        --sub-stage-set head >"$WORK/widesub/ref.log" 2>&1
    check $? "widesub: reference bf16"
    echo "reference bf16: $((SECONDS - t1)) s"
    small='^(input\.video|state|text\.(pos|neg)|clip|ys|vae\.clip|noise\.(video|action)|sample\.|velocity\.|x$|actions$)'
    small+='|^dit\..*\.(head|action_velocity)$'
    full="$small|^dit\.[a-z]+\.(pos|neg)\.0\.(patch_embed|time_sin|time_e0?|action_tau|action_tokens|state_tokens"
    full+='|layer_out\.[0-9]+|head_norm|head_in)$|^(umt5|clip)\.'
    # tag, environment, extra arguments of one dzr run (in the background); its table and details in widesub/
    dzr_run() {
        local tag=$1 envs=$2 dump=$3
        shift 3
        local e=()
        for kv in ${envs//,/ }; do
            if [[ $kv == torchlibs ]]; then e+=("LD_LIBRARY_PATH=$TL:${LD_LIBRARY_PATH:-}"); else e+=("$kv"); fi
        done
        (
            env "${e[@]}" timeout 300 "$DZR" parity run --ckpt "$S/ckpt" --inputs "$S/inputs" --out "$S/$tag.safetensors" \
                --device cuda --dtype bf16 --check-finite --dump "$dump" "$@" >"$WORK/widesub/$tag.log" 2>&1 &&
                python3 scripts/parity/compare.py --info-pair "$tag=$S/$tag.safetensors:$S/ref.safetensors:2e-2" \
                    --details "$WORK/widesub/$tag.details.txt" >"$WORK/widesub/$tag.table.txt" 2>&1
            echo $? >"$WORK/widesub/$tag.rc"
        ) &
        wpids+=($!)
    }
    wpids=()
    if [[ -f "$S/ref.safetensors" ]]; then
        dzr_run probe "" "$full" --inject-from "$S/ref.safetensors"
        dzr_run end-to-end "" "$small"
        for v in ${WIDE_VARIANTS:-DZR_LT_WORKSPACE=1024 DZR_LT_WORKSPACE=1024,DZR_LT_ALIGN=torch DZR_PLAIN_GEMM=cublas DZR_LT_WORKSPACE=1024,DZR_PLAIN_GEMM=cublas torchlibs torchlibs,DZR_LT_WORKSPACE=1024}; do
            dzr_run "v-${v//[^A-Za-z0-9_.,-]/_}" "$v" "$small" --inject-from "$S/ref.safetensors"
        done
        wait "${wpids[@]}"
        for f in "$WORK"/widesub/*.rc; do
            [[ $(cat "$f") == 0 ]] || failed+=("widesub: $(basename "$f" .rc) (exit $(cat "$f"))")
        done
        rm -f "$S"/*.safetensors
    fi
    wait "$probe_pid"
    check $? "widesub: kernel probe"
    echo "-- GEMMs at the real widths: elements that differ from torch's default run (of the count shown)"
    grep -E "^wide " "$WORK/widesub/probe.log" | awk '{ z = 1; for (i = 5; i <= NF; i++) if ($i ~ /=/ && $i !~ /=0$/) z = 0;
        if (z) zero = zero " " $2; else print substr($0, 1, 300) } END { print "  0 under every setting:" zero }'
    grep -E "^wide:|^cublaslt|^  " "$WORK/widesub/probe.log" | cut -c1-250 | head -14
    if [[ -f "$WORK/widesub/probe.details.txt" ]]; then
        echo "-- dzr on the reference's conditioning, first forward of each kind and branch (fraction of elements that differ)"
        python3 scripts/parity/first_diff.py "$WORK/widesub/probe.details.txt" | cut -c1-420
        echo "-- end to end (dzr's own encoders): per call"
        python3 scripts/parity/first_diff.py "$WORK/widesub/end-to-end.details.txt" | grep policy | cut -c1-420
        python3 scripts/parity/first_diff.py --brief "$WORK/widesub/end-to-end.details.txt"
        echo "-- dzr on the reference's conditioning, default and each variant: per call"
        python3 scripts/parity/first_diff.py --brief "$WORK/widesub/probe.details.txt" | sed 's/^/  default /'
        for f in "$WORK"/widesub/v-*.details.txt; do
            [[ -f $f ]] || continue
            python3 scripts/parity/first_diff.py --brief "$f" | sed "s/^/  $(basename "$f" .details.txt) /"
        done
    fi
    pack widesub
fi

if want variants; then
    say "variants: $VARIANTS"
    mkdir -p "$WORK/variants"
    for v in $VARIANTS; do
        tag=${v//[^A-Za-z0-9_.-]/_}
        env "$v" "$DZR" parity run --ckpt "$P/ckpt-gpu" --inputs "$P/inputs" --out "$WORK/variants/$tag.safetensors" \
            --device cuda --dtype bf16 --check-finite >"$WORK/variants/$tag.log" 2>&1
        check $? "variant $v"
        python3 scripts/parity/compare.py --info-pair "$tag=$WORK/variants/$tag.safetensors:$P/ref-bf16-gpu.safetensors:2e-2" \
            --details "$WORK/variants/$tag.details.txt" >"$WORK/variants/$tag.table.txt" 2>&1
        echo "-- $v"
        # the worst max rel of each stage over the calls
        awk 'NF >= 6 && $2 ~ /^[0-9]+$/ { if (!($1 in m) || $5 + 0 > m[$1] + 0) m[$1] = $5 }
             END { for (k in m) printf "  %-16s %s\n", k, m[k] }' "$WORK/variants/$tag.table.txt" | sort
        grep -E "informational" "$WORK/variants/$tag.table.txt"
        rm -f "$WORK/variants/$tag.safetensors"
    done
    pack variants
fi

if want probe; then
    say "kernel probe"
    mkdir -p "$WORK/probe"
    # shellcheck disable=SC2086
    python3 scripts/parity/kernel_probe.py --dzr "$DZR" --out "$WORK/probe" --work /tmp/dzr-kernel-probe \
        ${PROBE_ARGS:-} >"$WORK/probe/probe.log" 2>&1
    check $? probe
    grep -vE " 0/[0-9]+ differ" "$WORK/probe/probe.log" | grep -E "DEFAULT|linear|rows|bmm|op |conv|failed" | cut -c1-160
    echo "(rows with 0 differing elements not shown; all in probe.tar.gz)"
    grep -E "mem-efficient" "$WORK/probe/probe.log" | cut -c1-160
    pack probe
fi

if want trace; then
    say "reference op trace (bf16, first two calls)"
    mkdir -p "$WORK/trace"
    T=$WORK/trace-work
    rm -rf "$T" && mkdir -p "$T"
    "$DZR" ckpt make --config configs/parity.yaml --seed 1 --dtype f32 --tokenizer tests/data/tokenizer/spiece.model \
        --out "$T/ckpt" >/dev/null && "$DZR" parity make-inputs --ckpt "$T/ckpt" --out "$T/inputs" --calls 2 >/dev/null &&
        python3 scripts/parity/reference_run.py --ref .ref/dreamzero --ckpt "$T/ckpt" --inputs "$T/inputs" \
            --out "$T/ref.safetensors" --dtype bf16 --device cuda --calls 2 --trace-ops "$WORK/trace/ops.txt" \
            --trace-calls 2 >"$WORK/trace/ref.log" 2>&1
    check $? trace
    grep -nE "scaled_dot_product|_attention" "$WORK/trace/ops.txt" | sort -u -t'(' -k1,1 | head -20
    pack trace
fi

if want substage; then
    say "sub-stage probe (DiT and encoder internals)"
    mkdir -p "$WORK/substage"
    DZR_BIN=$DZR OUT="$WORK/substage" WORK=$WORK/substage-work FORWARDS=${FORWARDS:-0} \
        bash scripts/parity/substage_probe.sh >"$WORK/substage/probe.log" 2>&1
    check $? substage
    awk '{for(i=1;i<=NF;i++) if($i=="differ"){print $2, $(i+1); break}}' "$WORK/substage/details.txt" |
        grep -vE " 0\.00e\+00$" | head -80
    echo "(tensors with no differing element not shown)"
    pack substage
fi

if want load; then
    say "load: the DROID checkpoint cold and warm, old path and new (scripts/bench/load_cold_warm.sh)"
    mkdir -p "$WORK/load"
    # NOTE: on the machine's disk, not under /tmp (a tmpfs holds the files in memory: no cold read to measure)
    LOAD_CKPT=${LOAD_CKPT:-$PWD/.dzr-load/droid}
    if [[ ! -f "$LOAD_CKPT/model.safetensors.index.json" ]]; then
        mkdir -p "$(dirname "$LOAD_CKPT")"
        df -h "$(dirname "$LOAD_CKPT")" | tail -n 1
        "$DZR" ckpt make --config configs/dreamzero_droid.yaml --seed 1 --out "$LOAD_CKPT" --force --threads 10 \
            >"$WORK/load/make.log" 2>&1
        check $? "load: ckpt make"
        tail -n 3 "$WORK/load/make.log"
    fi
    CKPT=$LOAD_CKPT DZR=$DZR OUT="$WORK/load" bash scripts/bench/load_cold_warm.sh >"$WORK/load/load.log" 2>&1
    check $? "load (a target not met, or a run failed)"
    grep -E "^(path|run [0-9])|^\||^target|failed|cannot|NOT" "$WORK/load/load.log" | cut -c1-220
    pack load
fi

if want bench; then
    say "bench rollout at the DROID geometry (random weights, ${BENCH_CALLS:-21} timed calls, ${BENCH_NUMERICS:-reference})"
    mkdir -p "$WORK/bench"
    for n in ${BENCH_NUMERICS:-reference}; do
        variant_args "$n"
        smi_start "$WORK/bench/smi-$n.csv"
        env "${VENV[@]}" "$DZR" bench rollout --config configs/dreamzero_droid.yaml --device "${BENCH_DEVICE:-cuda:0}" "${VARGS[@]}" \
            --calls "${BENCH_CALLS:-21}" --json "$WORK/bench/rollout-$n.json" >"$WORK/bench/rollout-$n.log" 2>&1
        check $? "bench rollout $n"
        smi_stop "$WORK/bench/smi-$n.csv"
        cat "$WORK/bench/rollout-$n.log" | tail -n 20
    done
    if [[ -n "${BENCH_FP8:-}" ]]; then
        # FP8 DiT weights (quantized at load from the random bf16 ones) and the FP8 KV pool, fast numerics
        "$DZR" bench rollout --config configs/dreamzero_droid.yaml --device "${BENCH_DEVICE:-cuda:0}" --numerics fast \
            --precision fp8 --kv-dtype fp8 --calls "${BENCH_CALLS:-21}" --json "$WORK/bench/rollout-fp8.json" \
            >"$WORK/bench/rollout-fp8.log" 2>&1
        check $? "bench rollout fp8"
        tail -n 20 "$WORK/bench/rollout-fp8.log"
    fi
    pack bench
fi

if want profile; then
    # The op profile of a DROID call (docs/PERF.md, where the time goes): every backend op timed with events, CUPTI
    # kernel counts, launches and idle gaps where built in; plus the DiT GEMMs at one branch's and both branches' rows.
    say "profile at the DROID geometry (${PROFILE_CALLS:-6} profiled calls, ${PROFILE_NUMERICS:-reference})"
    mkdir -p "$WORK/profile"
    for n in ${PROFILE_NUMERICS:-reference}; do
        variant_args "$n"
        env "${VENV[@]}" "$DZR" bench rollout --config configs/dreamzero_droid.yaml --device "${BENCH_DEVICE:-cuda:0}" "${VARGS[@]}" \
            --calls "${PROFILE_CALLS:-6}" --json "$WORK/profile/rollout-$n.json" --profile "$WORK/profile/profile-$n.json" \
            >"$WORK/profile/rollout-$n.log" 2>"$WORK/profile/profile-$n.txt"
        check $? "profile $n"
        head -n 40 "$WORK/profile/profile-$n.txt"
        grep -A14 -E "^-- denoise.denoise.(pos|both)" "$WORK/profile/profile-$n.txt"
    done
    "$DZR" bench attention --lq 1785 --lk 257 512 2665 7945 --heads 40 --head-dim 128 \
        >"$WORK/profile/attention-dit.txt" 2>&1
    check $? "bench attention"
    grep -vE "^\s*$" "$WORK/profile/attention-dit.txt" | head -n 40
    "$DZR" bench gemm --dit >"$WORK/profile/gemm-dit.txt" 2>&1
    check $? "bench gemm --dit"
    tail -n 9 "$WORK/profile/gemm-dit.txt"
    pack profile
fi

if want fp8probe; then
    # Which FP8 matmul configurations cuBLASLt offers here and their speed at the DiT's shapes (issue #14)
    say "fp8probe: cuBLASLt FP8 modes at the DiT shapes (scripts/bench/fp8_lt_probe.cu)"
    mkdir -p "$WORK/fp8probe"
    nvcc -std=c++17 -O2 -arch=sm_90a scripts/bench/fp8_lt_probe.cu -lcublasLt -o "$WORK/fp8probe/probe" \
        >"$WORK/fp8probe/build.log" 2>&1 && "$WORK/fp8probe/probe" >"$WORK/fp8probe/probe.txt" 2>&1
    check $? fp8probe
    cat "$WORK/fp8probe/probe.txt" "$WORK/fp8probe/build.log" | head -n 70
    pack fp8probe
fi

if want ltsearch; then
    # A wider cuBLASLt search at the DiT's bf16 shapes, timed sustained (scripts/bench/lt_search.cu; docs/PERF.md)
    say "ltsearch: cuBLASLt configurations at the DiT's shapes, sustained (scripts/bench/lt_search.cu)"
    mkdir -p "$WORK/ltsearch"
    smi_start "$WORK/ltsearch/smi.csv"
    nvcc -std=c++17 -O2 -arch=sm_90a scripts/bench/lt_search.cu -lcublasLt -o "$WORK/ltsearch/search" \
        >"$WORK/ltsearch/build.log" 2>&1 && "$WORK/ltsearch/search" >"$WORK/ltsearch/search.txt" 2>&1
    check $? ltsearch
    smi_stop "$WORK/ltsearch/smi.csv"
    grep -vE "^    [0-9]" "$WORK/ltsearch/search.txt" | head -n 20
    grep -A8 "sustained" "$WORK/ltsearch/search.txt" | cut -c1-170
    cat "$WORK/ltsearch/build.log" | head -n 20
    pack ltsearch
fi

if want memory; then
    # The memory plan against the measured peaks (scripts/memory_check.sh; docs/MEMORY.md), MEMORY_VARIANTS
    say "memory: plan vs measured peak (${MEMORY_VARIANTS:-prepass kvfp8 fp8all budget44 refuse44})"
    mkdir -p "$WORK/memory"
    DZR=$DZR OUT="$WORK/memory" CALLS=${MEMORY_CALLS:-5} VARIANTS="${MEMORY_VARIANTS:-prepass kvfp8 fp8all budget44 refuse44}" \
        bash scripts/memory_check.sh >"$WORK/memory/memory.log" 2>&1
    check $? memory
    grep -E "^== |measured peak|refused|s/call|median|FAIL|  [a-z0-9]+:|memory check|does not fit" "$WORK/memory/memory.log" |
        cut -c1-200 | head -n 60
    pack memory
fi

if want ranks; then
    # Issue #15 on one GPU: two MPI ranks sharing the H200 (--allow-shared-gpu) on short DROID-geometry episodes,
    # their actions against one process's, and the refusal without the flag (docs/SCALING.md)
    say "ranks: two ranks on one GPU (--allow-shared-gpu) against a single process"
    mkdir -p "$WORK/ranks"
    R=$WORK/ranks-work
    rm -rf "$R" && mkdir -p "$R"
    RCKPT=${LOAD_CKPT:-$PWD/.dzr-load/droid}
    if [[ ! -f "$RCKPT/model.safetensors.index.json" ]]; then
        mkdir -p "$(dirname "$RCKPT")"
        /usr/bin/time -f "ckpt make: %e s" "$DZR" ckpt make --config configs/dreamzero_droid.yaml --seed 1 --out "$RCKPT" \
            --force --threads 12 >"$WORK/ranks/make.log" 2>&1
        check $? "ranks: ckpt make"
        tail -n 2 "$WORK/ranks/make.log"
    fi
    for i in 0 1 2 3; do
        "$DZR" episode synth --out "$R/eps/ep_$i" --frames "${RANK_FRAMES:-40}" --seed "$i" --frames-format npy >/dev/null
    done
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    t=$SECONDS
    mpirun -np 2 --oversubscribe "$DZR" rollout "$R/eps" --ckpt "$RCKPT" --out "$R/shared" \
        --config configs/dreamzero_droid.yaml --device cuda --allow-shared-gpu --no-report --tokenizer tests/data/tokenizer/spiece.model >"$WORK/ranks/shared.log" 2>&1
    check $? "ranks: two ranks with --allow-shared-gpu"
    echo "two ranks on one GPU: $((SECONDS - t)) s"
    t=$SECONDS
    "$DZR" rollout "$R/eps" --ckpt "$RCKPT" --out "$R/single" --config configs/dreamzero_droid.yaml --device cuda --tokenizer tests/data/tokenizer/spiece.model \
        --no-report >"$WORK/ranks/single.log" 2>&1
    check $? "ranks: single process"
    echo "one process: $((SECONDS - t)) s"
    same=0
    for i in 0 1 2 3; do
        if cmp "$R/shared/ep_$i/actions.npy" "$R/single/ep_$i/actions.npy"; then same=$((same + 1)); fi
    done
    echo "actions.npy identical in $same of 4 episodes"
    ((same == 4)) || failed+=("ranks: actions differ between the two-rank and the single run")
    mpirun -np 2 --oversubscribe "$DZR" rollout "$R/eps" --ckpt "$RCKPT" --out "$R/refused" \
        --config configs/dreamzero_droid.yaml --device cuda --no-report --tokenizer tests/data/tokenizer/spiece.model >"$WORK/ranks/refused.log" 2>&1
    rc=$?
    echo "without --allow-shared-gpu: exit $rc"
    grep -hE "GPU|already used|visible" "$WORK/ranks/refused.log" | head -n 4
    ((rc != 0)) || failed+=("ranks: two ranks on one GPU were not refused without --allow-shared-gpu")
    grep -hE "rank|s/call|peak" "$WORK/ranks/shared.log" | tail -n 12
    cp "$R"/shared/summary.json "$WORK/ranks/summary-shared.json" 2>/dev/null
    cp "$R"/single/summary.json "$WORK/ranks/summary-single.json" 2>/dev/null
    pack ranks
fi

say "summary"
if ((${#failed[@]})); then printf 'failed: %s\n' "${failed[@]}"; else echo "every step passed"; fi
((${#failed[@]} == 0))
