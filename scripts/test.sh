#!/usr/bin/env bash
# Installs what is missing, builds dzr and runs the whole test suite:
#   1. the normal build (CUDA compiled when nvcc exists): every test; GPU tests report "skipped"
#      on machines without a GPU;
#   2. a clang ASan/UBSan build of the CPU engine: the parser tests (label `parser`), one tiny rollout end to
#      end (label `sanitize`) and every libFuzzer target for a few seconds (label `fuzz`; docs/RELIABILITY.md
#      says how to run them longer).
# First, the module layering check (docs/DESIGN.md: includes go one way only).
# The browser test (label `browser`: the HTML report in headless Chromium) leaves its screenshots in
# build/test-artifacts/browser/.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --browser --fuzz

echo "== module layering =="
python3 scripts/ci/check_layering.py
echo "layering: ok"

echo "== build (release) =="
# NOTE: without a GPU the CUDA tests report "skipped" and the CUDA code is only compiled, so it is compiled for the
# one architecture dzr is tuned for (sm_90a: H100/H200) instead of a release build's three (80, 89, 90a): nvcc takes
# a third of the time (kernels/dit_fused.cu: 24 s against 79 s on the 2-core CI machine). The kernels have no
# per-architecture code (no __CUDA_ARCH__ branches): the other two compile the same source.
cuda_args=()
if { command -v nvcc >/dev/null 2>&1 || [[ -x /usr/local/cuda/bin/nvcc ]]; } && ! nvidia-smi -L >/dev/null 2>&1; then
    cuda_args=(-DCMAKE_CUDA_ARCHITECTURES=90a)
fi
BUILD_DIR=build scripts/build.sh "${cuda_args[@]}"
if ((${#cuda_args[@]})); then
    echo "note: build/ holds CUDA kernels for sm_90a (H100/H200) only; for another GPU rebuild it there:"
    echo "      cmake -S . -B build -DCMAKE_CUDA_ARCHITECTURES='90a;80;89' && scripts/build.sh (dzr names a GPU it cannot run on)"
fi
echo "== tests =="
# NOTE: one OpenBLAS thread per test: ctest runs nproc tests at once, and OpenBLAS's threads spin (sched_yield)
# when they outnumber the cores. Two tiny CPU rollouts side by side on the 2-core machine: 1.36 s per call with 2
# threads each, 0.86 s with 1 (alone, 1 or 2 threads: 0.88 s; 2026-12-03).
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
(cd build && ctest --output-on-failure -j "$(nproc)")

echo "== parsers, a tiny rollout and the fuzz targets under ASan/UBSan (clang) =="
# Only what those tests need (test_checkpoint and test_rollout_validation also run the dzr binary; none runs its
# `dzr parity` subcommands, so DZR_DIAGNOSTICS=OFF leaves them out).
# NOTE: clang, because libFuzzer is clang's; CMAKE_*_COMPILER only take effect when the directory is new.
# NOTE: -O1 -g1 (line tables: the sanitizers' reports still name file and line): on the 2-core CI machine this
# build and its tests took 511 + 66 s against 560 + 58 s at RelWithDebInfo's -O2 -g (2026-12-03).
fuzzers=""
for f in safetensors_header npy_header episode_yaml config_json metadata_json run_config run_files; do fuzzers+=" fuzz_$f"; done
TARGETS="dzr_cli unit_test_safetensors unit_test_checkpoint unit_test_config unit_test_npy unit_test_episode \
         unit_test_embodiment unit_test_rollout_validation dataset_test_ffmpeg_video serve_test_units$fuzzers" \
    BUILD_DIR=build-sanitize scripts/build.sh -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
    -DDZR_SANITIZE=ON -DDZR_FUZZ=ON -DDZR_CUDA=OFF -DDZR_OPENCV=OFF -DDZR_DIAGNOSTICS=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG"
(cd build-sanitize && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --output-on-failure -L "parser|sanitize|fuzz" -j "$(nproc)")
