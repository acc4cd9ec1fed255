#!/usr/bin/env python3
"""Small deterministic test videos for the FFmpeg decoder (lib/dataset/ffmpeg_video.*) and PyAV's decode of them.

Usage: make_test_videos.py OUT_DIR

For each video <name>.mp4 it writes <name>.frames.npy (uint8 [N, H, W, 3]: every frame as PyAV's
frame.to_ndarray(format="rgb24") gives it, which is what LeRobot's pyav backend sees) and <name>.pts.npy
(float64 [N]: each frame's pts in seconds). The content is moving colour gradients plus noise, so chroma
and motion both matter; a key frame every 10 frames, so a decoder that seeks is exercised. audio_only.mp4 has
no video stream at all.
Needs PyAV (with libx264 and libsvtav1, as its wheels ship) and numpy; runs in a few seconds.
"""
import os
import sys
from fractions import Fraction
from pathlib import Path

import av
import numpy as np

FRAMES = 36
GOP = 10

# name, codec, width, height, fps, B-frames, extras
VIDEOS = [
    # moov at the front (as LeRobot's files): a file cut short still opens, and its stream ends early.
    ("h264_faststart_64x48_15fps", "libx264", 64, 48, 15, 0, {"faststart": True}),
    ("h264_bframes_320x180_30fps", "libx264", 320, 180, 30, 3, {}),
    # NOTE: tagged BT.709: to_ndarray picks the matrix from the frame's colour tags, so must we.
    ("h264_bt709_320x180_15fps", "libx264", 320, 180, 15, 2, {"colorspace": "ITU709"}),
    ("h264_fullrange_64x48_15fps", "libx264", 64, 48, 15, 0, {"range": "JPEG"}),
    # A width that is no multiple of 8 (the SIMD converter's block).
    ("h264_100x60_15fps", "libx264", 100, 60, 15, 0, {}),
    ("av1_64x48_15fps", "libsvtav1", 64, 48, 15, 0, {}),
    ("av1_320x180_30fps", "libsvtav1", 320, 180, 30, 0, {}),
]


def synth_frame(t: int, width: int, height: int, rng: np.random.Generator) -> np.ndarray:
    """uint8 RGB [H, W, 3]: diagonal gradients moving at different speeds per channel, a moving square, noise."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    r = 128 + 100 * np.sin((x + 3 * t) / 9.0)
    g = 128 + 100 * np.sin((y - 2 * t) / 7.0 + x / 23.0)
    b = (x * 255.0 / width + y * 255.0 / height + 11 * t) % 256
    img = np.stack([r, g, b], axis=-1)
    s = max(4, min(width, height) // 4)
    x0, y0 = (4 * t) % (width - s), (3 * t) % (height - s)
    img[y0:y0 + s, x0:x0 + s] = [230, 40, 60]
    img += rng.normal(0, 12, img.shape)
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


def encode(path: Path, codec: str, width: int, height: int, fps: int, bframes: int, extra: dict) -> None:
    rng = np.random.default_rng(1234 + width + fps)
    options = {"movflags": "+faststart"} if extra.get("faststart") else {}
    with av.open(str(path), "w", options=options) as out:
        stream = out.add_stream(codec, rate=Fraction(fps))
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        cc = stream.codec_context
        cc.gop_size = GOP
        if codec == "libx264":
            cc.max_b_frames = bframes
            # Fixed GOP, one thread: the same bytes on every run.
            stream.options = {"x264-params": f"keyint={GOP}:min-keyint={GOP}:scenecut=0:bframes={bframes}",
                              "crf": "23", "threads": "1"}
        else:
            stream.options = {"preset": "10", "crf": "35"}
        colorspace, color_range = extra.get("colorspace"), extra.get("range")
        if colorspace == "ITU709":
            cc.colorspace = cc.color_primaries = cc.color_trc = 1  # AVCOL_*_BT709
            cc.color_range = 1                                      # AVCOL_RANGE_MPEG
        if color_range == "JPEG":
            cc.color_range = 2                                      # AVCOL_RANGE_JPEG
        for t in range(FRAMES):
            frame = av.VideoFrame.from_ndarray(synth_frame(t, width, height, rng), format="rgb24")
            if colorspace or color_range:
                # Convert as the stream is tagged (the encoder's own conversion would use BT.601, limited range).
                frame = frame.reformat(format="yuv420p", dst_colorspace=colorspace, dst_color_range=color_range)
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)


def encode_audio_only(path: Path) -> None:
    """An mp4 with one AAC stream and no video: a decoder must say there is no video stream."""
    with av.open(str(path), "w") as out:
        stream = out.add_stream("aac", rate=16000)
        t = np.arange(1024 * 8, dtype=np.float32) / 16000
        tone = (0.2 * np.sin(2 * np.pi * 440 * t)).astype(np.float32).reshape(1, -1)
        frame = av.AudioFrame.from_ndarray(tone, format="flt", layout="mono")
        frame.sample_rate = 16000
        for packet in stream.encode(frame):
            out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)


def decode(path: Path) -> tuple[np.ndarray, np.ndarray]:
    frames, pts = [], []
    with av.open(str(path)) as container:
        for frame in container.decode(video=0):
            frames.append(frame.to_ndarray(format="rgb24"))
            pts.append(float(frame.pts * frame.time_base))
    return np.stack(frames), np.asarray(pts, dtype=np.float64)


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    os.environ.setdefault("SVT_LOG", "1")  # SVT-AV1's banner and warnings: errors only
    out_dir = Path(sys.argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, codec, width, height, fps, bframes, extra in VIDEOS:
        path = out_dir / f"{name}.mp4"
        encode(path, codec, width, height, fps, bframes, extra)
        frames, pts = decode(path)
        if len(frames) != FRAMES:
            print(f"{path}: decoded {len(frames)} frames, encoded {FRAMES}", file=sys.stderr)
            return 1
        np.save(out_dir / f"{name}.frames.npy", frames)
        np.save(out_dir / f"{name}.pts.npy", pts)
        print(f"{path}: {codec} {width}x{height} {fps} fps, {len(frames)} frames, pts {pts[0]:.4f}..{pts[-1]:.4f}")
    encode_audio_only(out_dir / "audio_only.mp4")
    return 0


if __name__ == "__main__":
    sys.exit(main())
