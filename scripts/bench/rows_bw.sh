#!/usr/bin/env bash
# Builds and runs scripts/bench/rows_bw.cu on a GPU machine: the streamed row kernels of this tree against the copy,
# roofline and launch-shape variants, and (with OLD_REV, or with out/old/ already made elsewhere, where the machine has
# no git history) bit for bit against another revision's kernels/dit_rows.cu. Writes its table to stdout.
#   OLD_REV=cb920a8 bash scripts/bench/rows_bw.sh      # makes out/old/ from git, then builds and runs
#   bash scripts/bench/rows_bw.sh                      # uses out/old/ if present (carry it to the device machine)
set -euo pipefail
cd "$(dirname "$0")/../.."
ARCH=${ARCH:-sm_90a}
BIN=${BIN:-/tmp/rows_bw}
if [[ -n "${OLD_REV:-}" ]]; then
    mkdir -p out/old
    git show "$OLD_REV:kernels/dit_rows.cu" >out/old/dit_rows_old.cu
    cat >out/old/old_rows.cu <<'CU'
// Another revision's streamed row kernels (kernels/dit_rows.cu), compiled with -Ddzr=dzr_old so that they sit beside
// the working tree's in scripts/bench/rows_bw.cu's bit comparison.
#include "dit_rows_old.cu"
extern "C" cudaError_t old_ada_layer_norm(const void* a, cudaStream_t s) {
    return dzr_old::kernels::rows::ada_layer_norm(*static_cast<const dzr_old::kernels::rows::NormArgs*>(a), s);
}
extern "C" cudaError_t old_rms_norm_rope(const void* a, cudaStream_t s) {
    return dzr_old::kernels::rows::rms_norm_rope(*static_cast<const dzr_old::kernels::rows::RopeArgs*>(a), s);
}
CU
fi
old=()
if [[ -f out/old/old_rows.cu ]]; then
    nvcc -std=c++20 -O3 -arch="$ARCH" -I. -Ilib -Ddzr=dzr_old -c out/old/old_rows.cu -o "$BIN.old.o"
    old=(-DROWS_BW_OLD "$BIN.old.o")
fi
nvcc -std=c++20 -O3 -arch="$ARCH" -I. -Ilib scripts/bench/rows_bw.cu kernels/dit_rows.cu "${old[@]}" -ldl -o "$BIN"
"$BIN"
