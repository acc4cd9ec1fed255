#!/usr/bin/env bash
# One device start for the kernel-level probes: a Release CUDA build of dzr (sm_90a, no OpenCV), then
# kernel_probe.py on the system cuDNN and on PyTorch's bundled cuDNN (with cuDNN's API logs), each
# log compressed into $OUT. Usage (GPU machine, repository root): OUT=dir scripts/parity/device_probe.sh
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
TL=$(python3 -c 'import nvidia, os; print(os.path.dirname(nvidia.__path__[0]))' 2>/dev/null)/nvidia
echo "== system cuDNN"
python3 scripts/parity/kernel_probe.py --dzr "$BUILD_DIR/bin/dzr" --out "$OUT/attn-system" --cudnn-log ${CASES:+--cases "$CASES"}
echo "== PyTorch's cuDNN ($TL)"
DZR_LD_LIBRARY_PATH="$TL/cudnn/lib:$TL/cu13/lib" python3 scripts/parity/kernel_probe.py --dzr "$BUILD_DIR/bin/dzr" \
    --out "$OUT/attn-torchlib" --cudnn-log --work /tmp/dzr-attention-probe-2 ${CASES:+--cases "$CASES"} | grep -v "^linear"
find "$OUT" -name "*.log" -size +64k -exec gzip -9 {} \;
