#!/usr/bin/env python3
"""Golden outputs of DreamZero's per-view eval transform for tests/unit/test_preprocess.cpp, written to
tests/data/preprocess_golden.safetensors.

The reference (dreamzero-reference.md §1.4; groot/vla/data/transform/video.py) runs, per view:
  VideoToTensor   torch.from_numpy(frames).to(float32) / 255.0, permute(0, 3, 1, 2)   [T, C, H, W]
  VideoCrop       torchvision.transforms.v2.CenterCrop((171, 304))                     (eval mode)
  VideoResize     torchvision.transforms.v2.Resize((176, 320), BILINEAR, antialias=True)
  VideoToNumpy    (x.permute(0, 2, 3, 1) * 255).to(torch.uint8)
The official classes import albumentations, cv2 and pydantic, which the GPU machine lacks, so this
script makes the same torchvision calls on a tensor built exactly as VideoToTensor builds it (a
channels-last view, as the reference's permute gives). With --repo it checks that video.py still
makes these calls (a text check of the source).

Frames that are not 180x320 are first resized with padding by clients through
openpi_client.image_tools.resize_with_pad (PIL bilinear keeping the aspect ratio, zero padding).
openpi_client is used when importable; otherwise its 10-line logic is restated below on PIL.

Inputs are not stored: each frame comes from a 32-bit integer hash of (seed, flat index) that the
C++ test reproduces (hashed_frame() in test_preprocess.cpp). Cases and shapes are in __metadata__.
Tensors: <case>.view uint8 [176, 320, 3], and <case>.padded uint8 [180, 320, 3] for padded cases.
To keep the file small some cases store only metadata: flat frames a summary
(<case>.summary = "min,max,count_not_equal"), others a digest of the view (<case>.fnv1a64 = 64-bit
FNV-1a of its bytes, hex).

Usage (needs torch, torchvision, numpy, Pillow; no network):
    python3 scripts/parity/gen_preprocess_golden.py [--repo /path/to/dreamzero] [--out PATH]
"""
import argparse
import json
import os
import struct
import sys

import numpy as np
import torch
import torchvision.transforms.v2 as T

# name: (height, width, kind, seed, stored tensors)
CASES = {
    "rand_a": (180, 320, "hash", 1, ("view",)),
    "smooth": (180, 320, "smooth", 0, ("digest",)),
    "pad_360x640": (360, 640, "hash", 3, ("view",)),
    "pad_240x427": (240, 427, "hash", 4, ("padded",)),
    "flat_255": (180, 320, "flat", 255, ()),
    "flat_77": (180, 320, "flat", 77, ()),
}


def hashed_frame(h, w, seed):
    """uint8 [h, w, 3]: the top 8 bits of a 32-bit hash of the flat index (as in the C++ test)."""
    mask = 0xFFFFFFFF
    i = np.arange(h * w * 3, dtype=np.uint64)
    u = (i * np.uint64(2654435761) + np.uint64(seed * 40503)) & np.uint64(mask)
    u = u ^ (u >> np.uint64(13))
    u = (u * np.uint64(1274126177)) & np.uint64(mask)
    u = u ^ (u >> np.uint64(16))
    return (u >> np.uint64(24)).astype(np.uint8).reshape(h, w, 3)


def make_frame(h, w, kind, seed):
    if kind == "hash":
        return hashed_frame(h, w, seed)
    if kind == "flat":
        return np.full((h, w, 3), seed, dtype=np.uint8)
    # smooth: slow diagonal gradients per channel, so many outputs land near integer levels
    y, x = np.mgrid[0:h, 0:w]
    return np.stack([(x + 2 * y) % 256, (3 * x + y) % 256, (x * y) % 256], axis=-1).astype(np.uint8)


def resize_with_pad(image, height, width):
    try:
        from openpi_client.image_tools import resize_with_pad as official
        return official(image, height, width)
    except ImportError:
        pass
    from PIL import Image
    if image.shape[:2] == (height, width):
        return image
    pil = Image.fromarray(image)
    cur_w, cur_h = pil.size
    ratio = max(cur_w / width, cur_h / height)
    rh, rw = int(cur_h / ratio), int(cur_w / ratio)
    resized = pil.resize((rw, rh), resample=Image.BILINEAR)
    canvas = Image.new(resized.mode, (width, height), 0)
    canvas.paste(resized, (max(0, int((width - rw) / 2)), max(0, int((height - rh) / 2))))
    return np.asarray(canvas)


def fnv1a64(data):
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def eval_view(frame):
    """The four eval transforms on one [180, 320, 3] uint8 frame -> [176, 320, 3] uint8."""
    x = torch.from_numpy(frame[None].copy()).to(torch.float32) / 255.0  # VideoToTensor
    x = x.permute(0, 3, 1, 2)
    x = T.CenterCrop((171, 304))(x)
    x = T.Resize((176, 320), interpolation=T.InterpolationMode.BILINEAR, antialias=True)(x)
    return (x.permute(0, 2, 3, 1) * 255).to(torch.uint8)[0].numpy()


def check_repo(repo):
    path = os.path.join(repo, "groot", "vla", "data", "transform", "video.py")
    src = open(path).read()
    for needle in ("T.CenterCrop(size)", "T.Resize(size, interpolation=interpolation, antialias=self.antialias)",
                   "frames.to(torch.float32) / 255.0", "(frames.permute(0, 2, 3, 1) * 255).to(torch.uint8)"):
        if needle not in src:
            raise SystemExit(f"{path}: expected to find {needle!r}; the reference transforms changed")


def write_safetensors(path, tensors, metadata):
    header = {"__metadata__": metadata}
    blobs, offset = [], 0
    for name in sorted(tensors):
        b = np.ascontiguousarray(tensors[name]).tobytes()
        header[name] = {"dtype": "U8", "shape": list(tensors[name].shape), "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    default_out = os.path.normpath(os.path.join(here, "..", "..", "tests", "data", "preprocess_golden.safetensors"))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repo", help="a fetched copy of github.com/dreamzero0/dreamzero (checked, not imported)")
    ap.add_argument("--out", default=default_out)
    args = ap.parse_args()
    if args.repo:
        check_repo(args.repo)

    tensors = {}
    metadata = {"cases": ",".join(CASES), "torch": torch.__version__, "generator": "scripts/parity/gen_preprocess_golden.py"}
    for name, (h, w, kind, seed, stored) in CASES.items():
        metadata[name] = f"{h},{w},{kind},{seed}"
        frame = make_frame(h, w, kind, seed)
        padded = resize_with_pad(frame, 180, 320)
        view = eval_view(padded)
        if "padded" in stored:
            tensors[f"{name}.padded"] = padded
        if "view" in stored:
            tensors[f"{name}.view"] = view
        if "digest" in stored:
            metadata[f"{name}.fnv1a64"] = fnv1a64(np.ascontiguousarray(view).tobytes())
        if kind == "flat":
            metadata[f"{name}.summary"] = f"{int(view.min())},{int(view.max())},{int((view != seed).sum())}"
    write_safetensors(args.out, tensors, metadata)
    print(f"wrote {args.out}: {len(tensors)} tensors; flat summaries: "
          + ", ".join(f"{k}={v}" for k, v in metadata.items() if k.endswith(".summary")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
