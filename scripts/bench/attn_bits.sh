#!/usr/bin/env bash
# dzr's own attention kernels against another revision's, byte for byte on fixed inputs (scripts/bench/attn_bits.cu):
# a refactor of kernels/attention.cu or kernels/attention_memeff.cu must not move a bit.
# Usage (GPU machine, repository root): OLD=DIR scripts/bench/attn_bits.sh, where DIR/kernels/ holds the other
# revision's attention.cu and attention_memeff.cu (git show REV:kernels/attention.cu > DIR/kernels/attention.cu ...).
set -euo pipefail
cd "$(dirname "$0")/../.."
OLD=${OLD:?OLD=DIR with DIR/kernels/attention.cu and attention_memeff.cu of the other revision}
W=${WORK:-/tmp/dzr-attn-bits}
mkdir -p "$W"
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
build() {  # NAME DIR: the harness linked with DIR's two kernel sources
    local f
    for f in attention attention_memeff; do
        "$NVCC" -std=c++20 -O3 -arch=sm_90a -I. -Ilib -c "$2/kernels/$f.cu" -o "$W/$1-$f.o"
    done
    "$NVCC" -std=c++20 -O3 -arch=sm_90a -I. -Ilib scripts/bench/attn_bits.cu "$W/$1-attention.o" \
        "$W/$1-attention_memeff.o" -o "$W/$1"
}
build new "$PWD"
build old "$(cd "$OLD" && pwd)"
"$W/new" "$W/new.bin"
"$W/old" "$W/old.bin"
if cmp -s "$W/new.bin" "$W/old.bin"; then
    echo "attention kernels: $(stat -c %s "$W/new.bin") output bytes identical to $OLD's"
else
    echo "attention kernels: outputs DIFFER from $OLD's"; cmp "$W/new.bin" "$W/old.bin" | head -n 3; exit 1
fi
