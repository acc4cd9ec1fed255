#!/usr/bin/env bash
# Installs what is missing, builds dzr and runs the whole test suite:
#   1. the normal build (CUDA compiled when nvcc exists): every test; GPU tests report "skipped"
#      on machines without a GPU;
#   2. an ASan/UBSan build of the CPU engine: the parser tests (label `parser`).
# First, the module layering check (docs/DESIGN.md: includes go one way only).
# The browser test (label `browser`: the HTML report in headless Chromium) leaves its screenshots in
# build/test-artifacts/browser/.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --browser

echo "== module layering =="
python3 scripts/ci/check_layering.py
echo "layering: ok"

echo "== build (release) =="
BUILD_DIR=build scripts/build.sh
echo "== tests =="
(cd build && ctest --output-on-failure -j "$(nproc)")

echo "== parser tests under ASan/UBSan =="
# Only what the parser tests need (test_checkpoint also runs the dzr binary).
TARGETS="dzr_cli unit_test_safetensors unit_test_checkpoint unit_test_config unit_test_npy unit_test_episode unit_test_embodiment" \
    BUILD_DIR=build-asan scripts/build.sh -DDZR_SANITIZE=ON -DDZR_CUDA=OFF -DDZR_OPENCV=OFF \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --output-on-failure -L parser -j "$(nproc)")
