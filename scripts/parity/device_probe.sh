#!/usr/bin/env bash
# One device start for the bf16 exactness work (docs/PARITY.md): a Release CUDA build of dzr (sm_90a, no
# OpenCV), kernel_probe.py (every op group against PyTorch on the same operands), then the DiT sub-stage probe
# (where inside the first forwards dzr's bf16 values first differ from the reference's). About 2.5 minutes on
# the H200 machine.
# Usage (GPU machine, repository root; carry [".ref"] for the sub-stage probe): OUT=dir scripts/parity/device_probe.sh
# Settings: SKIP=linear,bmm,op,conv (kernel groups to leave out), CASES=none (attention cases: all by default),
# CUDNN_LOG=1 (cuDNN's API logs of both sides, compressed into $OUT), TORCH_CUDNN=1 (dzr on PyTorch's bundled
# cuDNN and cuBLAS as well), PROBE=0 (no sub-stage probe).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/dzr-device-probe}
BUILD_DIR=${BUILD_DIR:-build-parity-device}
export PATH="$PATH:/usr/local/cuda/bin"
mkdir -p "$OUT"
gen=()
command -v ninja >/dev/null 2>&1 && gen=(-G Ninja)
cmake -S . -B "$BUILD_DIR" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DDZR_CUDA=ON -DDZR_OPENCV=OFF \
    -DCMAKE_CUDA_ARCHITECTURES=90a >"$OUT/configure.log" 2>&1 &&
    cmake --build "$BUILD_DIR" --target dzr_cli -j "$(nproc)" >"$OUT/build.log" 2>&1 || {
    grep -E "error" "$OUT/build.log" | head -20
    exit 1
}
DZR=$BUILD_DIR/bin/dzr
args=(--dzr "$DZR" --skip "${SKIP:-}")
[[ -n "${CASES:-}" ]] && args+=(--cases "$CASES")
[[ "${CUDNN_LOG:-0}" == 1 ]] && args+=(--cudnn-log)
echo "== kernel probe (system cuDNN)"
python3 scripts/parity/kernel_probe.py "${args[@]}" --out "$OUT/kernels"
if [[ "${TORCH_CUDNN:-0}" == 1 ]]; then
    TL=$(python3 -c 'import nvidia, os; print(os.path.dirname(nvidia.__path__[0]))' 2>/dev/null)/nvidia
    echo "== kernel probe (PyTorch's cuDNN and cuBLAS: $TL)"
    DZR_LD_LIBRARY_PATH="$TL/cudnn/lib:$TL/cu13/lib" python3 scripts/parity/kernel_probe.py "${args[@]}" \
        --out "$OUT/kernels-torchlib" --work /tmp/dzr-kernel-probe-2
fi
if [[ "${PROBE:-1}" == 1 ]]; then
    echo "== DiT sub-stage probe (fraction of elements that differ)"
    DZR_BIN=$DZR OUT="$OUT/substage" bash scripts/parity/substage_probe.sh |
        sed -E 's/^probe +//; s/max abs [^ ]+  max rel [^ ]+  //'
fi
find "$OUT" -name "*.log" -size +64k -exec gzip -9 {} \;
