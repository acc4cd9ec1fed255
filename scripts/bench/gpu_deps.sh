#!/usr/bin/env bash
# Packs what the GPU machine lacks for the dataset and serve paths into .gpu-deps/ (git-ignored; the device tool
# carries it): FFmpeg's shared libraries from the PyAV wheel (the wheel bundles everything they link) with Debian
# trixie's headers of the same FFmpeg release and pkg-config files, msgpack-cxx's headers, the serve client's wheels
# (openpi-client, websockets, msgpack), LeRobot fixtures at DROID's geometry, and optionally an older commit's
# source (OLD_COMMIT) for a same-machine before/after timing. Runs on the development machine (network needed).
#
# Usage: [OLD_COMMIT=f065984] [FRAMES=240] scripts/bench/gpu_deps.sh       then carry .gpu-deps (scripts/bench/workflow_gpu.sh)
set -euo pipefail
cd "$(dirname "$0")/../.."
DEST=$PWD/.gpu-deps
PYAV=${PYAV:-14.2.0}   # bundles FFmpeg 7.1 (libavcodec 61)
DEB_FFMPEG=${DEB_FFMPEG:-7.1.5-0+deb13u1}
FRAMES=${FRAMES:-240}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
rm -rf "$DEST" && mkdir -p "$DEST"
source scripts/lib/python.sh

pip download -q --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_17_x86_64 \
    "av==$PYAV" -d "$work/wheel"
(cd "$work" && unzip -q wheel/*.whl 'av.libs/*')
for p in libavcodec-dev libavformat-dev libavutil-dev libswscale-dev; do
    curl -fsS -o "$work/$p.deb" "http://deb.debian.org/debian/pool/main/f/ffmpeg/${p}_${DEB_FFMPEG}_amd64.deb"
    dpkg-deb -x "$work/$p.deb" "$work/deb"
done
prefix=$work/prefix
mkdir -p "$prefix/ffmpeg/include" "$prefix/ffmpeg/lib/pkgconfig"
cp -r "$work"/deb/usr/include/x86_64-linux-gnu/* "$prefix/ffmpeg/include/"
# The four libraries and every library of the wheel they need, transitively; unversioned names and .pc files so
# that CMake's pkg-config lookup finds them (the wheel names them libavcodec-<hash>.so.61...).
python3 - "$work/av.libs" "$prefix/ffmpeg/lib" <<'PY'
import os, re, shutil, subprocess, sys
src, dst = sys.argv[1:]
need = {f: re.findall(r"Shared library: \[(.*?)\]", subprocess.run(["readelf", "-d", f"{src}/{f}"],
        capture_output=True, text=True).stdout) for f in os.listdir(src)}
roots = [f for f in need if re.match(r"lib(avcodec|avformat|avutil|swscale)-", f)]
seen, todo = set(), list(roots)
while todo:
    f = todo.pop()
    if f not in seen:
        seen.add(f)
        todo += [n for n in need[f] if n in need]
for f in seen:
    shutil.copy(f"{src}/{f}", dst)
requires = {"avformat": "libavcodec libavutil", "avcodec": "libavutil", "swscale": "libavutil", "avutil": ""}
for f in roots:
    name, ver = re.match(r"lib(\w+)-[0-9a-f]+\.so\.([\d.]+)", f).groups()
    os.symlink(f, f"{dst}/lib{name}.so")
    open(f"{dst}/pkgconfig/lib{name}.pc", "w").write(
        "prefix=${pcfiledir}/../..\nlibdir=${prefix}/lib\nincludedir=${prefix}/include\n"
        f"Name: lib{name}\nDescription: FFmpeg lib{name} from the PyAV wheel\nVersion: {ver}\n"
        f"Requires.private: {requires[name]}\nLibs: -L${{libdir}} -l{name}\nCflags: -I${{includedir}}\n")
PY
mkdir -p "$prefix/msgpack/include" "$prefix/msgpack/lib/x86_64-linux-gnu/cmake"
cp -r /usr/include/msgpack /usr/include/msgpack.hpp "$prefix/msgpack/include/"
cp -r /usr/lib/x86_64-linux-gnu/cmake/msgpackc-cxx "$prefix/msgpack/lib/x86_64-linux-gnu/cmake/"
tar -C "$prefix" -cJf "$DEST/prefix.tar.xz" .

pip download -q --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_17_x86_64 \
    --platform manylinux_2_28_x86_64 --platform any openpi-client websockets msgpack pkgconf -d "$DEST/wheels"

"$DZR_PYTHON" tests/dataset/make_lerobot_fixture.py droid_v20 "$DEST/droid_v20" --episodes 2 --frames "$FRAMES" --quiet
"$DZR_PYTHON" tests/dataset/make_lerobot_fixture.py droid_v30 "$DEST/droid_v30" --episodes 2 --frames "$FRAMES" --quiet
if [[ -n "${OLD_COMMIT:-}" ]]; then
    git archive --format=tar "$OLD_COMMIT" | xz -1 >"$DEST/old-src.tar.xz"
    git rev-parse "$OLD_COMMIT" >"$DEST/old-commit"
fi
du -sh "$DEST"/*
