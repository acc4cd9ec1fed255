#!/usr/bin/env bash
# Installs what dzr needs on Debian 12 (or Ubuntu), skipping packages already present.
# Usage: scripts/setup.sh [--no-opencv] [--fuzz]
#   --fuzz: also clang and its runtime libraries (libFuzzer, sanitizers) for the sanitizer and fuzz job of
#           scripts/test.sh
set -euo pipefail

opencv=1
for arg in "$@"; do
    case $arg in
        --no-opencv) opencv=0 ;;
        --fuzz) fuzz=1 ;;
        *) echo "setup: unknown option $arg (expected --no-opencv or --fuzz)" >&2; exit 2 ;;
    esac
done

pkgs=(build-essential cmake ninja-build pkg-config python3
      libcli11-dev libyaml-cpp-dev libspdlog-dev libfmt-dev doctest-dev nlohmann-json3-dev
      libsentencepiece-dev libopenblas-dev libssl-dev)
if [[ ${fuzz:-0} == 1 ]]; then
    pkgs+=(clang libclang-rt-dev)
fi
if [[ $opencv == 1 ]]; then
    # The slim OpenCV -dev packages (core, imgproc, imgcodecs, videoio with its FFmpeg backend), not the
    # 673 MB libopencv-dev meta-package.
    pkgs+=(libopencv-core-dev libopencv-imgproc-dev libopencv-imgcodecs-dev libopencv-videoio-dev)
fi

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

if ! command -v nvcc >/dev/null 2>&1 && [[ -x /usr/local/cuda/bin/nvcc ]]; then
    echo "setup: note: add /usr/local/cuda/bin to PATH to build the CUDA backend"
fi
