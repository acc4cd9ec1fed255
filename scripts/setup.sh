#!/usr/bin/env bash
# Installs what dzr needs on Debian 12 (or Ubuntu), skipping packages already present.
# Usage: scripts/setup.sh [--no-opencv] [--browser] [--fuzz]
#   --browser  also a headless Chromium for the report's browser test (scripts/test.sh asks for it)
#   --fuzz     also clang and its runtime libraries (libFuzzer, sanitizers) for the sanitizer and fuzz job of
#              scripts/test.sh
set -euo pipefail
opencv=1
browser=0
fuzz=0
for arg in "$@"; do
    case "$arg" in
        --no-opencv) opencv=0 ;;
        --browser) browser=1 ;;
        --fuzz) fuzz=1 ;;
        *) echo "setup: unknown option $arg (--no-opencv, --browser, --fuzz)" >&2; exit 2 ;;
    esac
done

pkgs=(build-essential cmake ninja-build pkg-config python3
      libcli11-dev libyaml-cpp-dev libspdlog-dev libfmt-dev doctest-dev nlohmann-json3-dev
      libsentencepiece-dev libopenblas-dev libpng-dev libssl-dev
      libavformat-dev libavcodec-dev libswscale-dev libavutil-dev python3-venv libboost-dev libmsgpack-cxx-dev)
if ((fuzz)); then
    pkgs+=(clang libclang-rt-dev)
fi
if ((opencv)); then
    # The slim OpenCV -dev packages (core, imgproc, imgcodecs, videoio with its FFmpeg backend), not the
    # 673 MB libopencv-dev meta-package.
    pkgs+=(libopencv-core-dev libopencv-imgproc-dev libopencv-imgcodecs-dev libopencv-videoio-dev)
fi
# mpirun for the sharded-rollout test (dzr itself does not link MPI).
pkgs+=(openmpi-bin)

missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    echo "setup: installing ${missing[*]}"
    SUDO=""
    [[ $(id -u) -ne 0 ]] && SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# LeRobot datasets: Debian 12 packages no Apache Arrow C++, so dzr builds against the pyarrow wheel's libraries and
# headers; PyAV and numpy write the dataset test fixtures. Into a virtual environment of dzr's own unless python3
# has them already (scripts/lib/python.sh picks the one to use).
source "$(dirname "$0")/lib/python.sh"
if ! "$DZR_PYTHON" -c 'import pyarrow, av, numpy' >/dev/null 2>&1; then
    echo "setup: installing pyarrow, av and numpy into $DZR_PYDEPS"
    python3 -m venv "$DZR_PYDEPS"
    "$DZR_PYDEPS/bin/pip" install -q --disable-pip-version-check 'pyarrow>=19' 'av>=14' numpy
fi

# dzr serve's test talks to the server through the official client stack (openpi-client pins numpy < 2, so it gets
# a virtual environment of its own, apart from the pyarrow that dzr builds against).
DZR_SERVEDEPS=${DZR_SERVEDEPS:-$HOME/.cache/dzr/servedeps}
if ! "$DZR_SERVEDEPS/bin/python" -c 'import openpi_client, websockets, msgpack, numpy' >/dev/null 2>&1; then
    echo "setup: installing openpi-client, websockets and msgpack into $DZR_SERVEDEPS (dzr serve's test)"
    python3 -m venv "$DZR_SERVEDEPS"
    "$DZR_SERVEDEPS/bin/pip" install -q --disable-pip-version-check openpi-client websockets msgpack numpy
fi

# NOTE: Debian's chromium-headless-shell (no GTK, ~64 MB) is enough for the test; where the package
# does not exist (Ubuntu ships Chromium as a snap) the browser test reports "skipped".
if ((browser)) && ! command -v chromium-headless-shell >/dev/null 2>&1 && ! command -v chromium >/dev/null 2>&1; then
    SUDO=""
    [[ $(id -u) -ne 0 ]] && SUDO="sudo"
    if apt-cache show chromium-headless-shell >/dev/null 2>&1 || { $SUDO apt-get update -qq && apt-cache show chromium-headless-shell >/dev/null 2>&1; }; then
        echo "setup: installing chromium-headless-shell (the report's browser test)"
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends chromium-headless-shell >/dev/null
    else
        echo "setup: note: no chromium-headless-shell package here; the browser test will be skipped"
    fi
fi

if ! command -v nvcc >/dev/null 2>&1 && [[ -x /usr/local/cuda/bin/nvcc ]]; then
    echo "setup: note: add /usr/local/cuda/bin to PATH to build the CUDA backend"
fi
