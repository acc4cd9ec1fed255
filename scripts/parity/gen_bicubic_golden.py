#!/usr/bin/env python3
"""Golden outputs of torch.nn.functional.interpolate(mode='bicubic', align_corners=False) for
tests/unit/test_bicubic.cpp, written to tests/data/bicubic_golden.safetensors.

The CLIP preprocessing of DreamZero (dreamzero-reference.md §2.2) resizes the [-1, 1] reference canvas
frame [3, 352, 640] to 224x224 with exactly this call (then x*0.5+0.5 and the CLIP mean/std).

Inputs are not stored: every case is generated from an integer hash that the C++ test reproduces
bit for bit (values k / 2^(bits-1) - 1, exact in f32 and bf16). The case list and the generator
parameters go into the file's __metadata__, so the C++ test reads the cases from the file.

Tensors per case X:
  X.resized             f32, torch on the CPU in f32 (the reference semantics)
  X.resized_cuda_bf16   bf16, torch on CUDA with a bf16 input (only when CUDA is available; what the
                        reference runs, for later CUDA-backend parity)
About 1 MB in all.

Usage (needs only torch; no network):  python3 scripts/parity/gen_bicubic_golden.py [--out PATH]
"""
import argparse
import json
import os
import struct
import sys

import torch
import torch.nn.functional as F

# name: (channels, in_h, in_w, out_h, out_w, seed, bits)
CASES = {
    "a": (3, 352, 640, 224, 224, 1, 8),   # the real canvas -> CLIP input (downscale, uint8-like levels)
    "b": (2, 37, 53, 100, 75, 2, 16),     # up in both axes, odd sizes
    "c": (1, 5, 7, 12, 3, 3, 16),         # tiny: every output touches the clamped border
}


def hashed_image(c, h, w, seed, bits):
    """Values (v - 2^(bits-1)) / 2^(bits-1) with v the top `bits` bits of a 32-bit integer hash of
    the flat index (the same arithmetic as hashed_image() in tests/unit/test_bicubic.cpp)."""
    mask = 0xFFFFFFFF
    i = torch.arange(c * h * w, dtype=torch.int64)
    u = (i * 2654435761 + seed * 40503) & mask
    u = u ^ (u >> 13)
    u = (u * 1274126177) & mask
    u = u ^ (u >> 16)
    v = u >> (32 - bits)
    half = 1 << (bits - 1)
    return ((v - half).to(torch.float32) * (1.0 / half)).reshape(c, h, w)


def resize(x, out_h, out_w):
    return F.interpolate(x.unsqueeze(0), size=(out_h, out_w), mode="bicubic", align_corners=False)[0]


def tensor_bytes(t):
    t = t.contiguous().cpu()
    return bytes(t.flatten().view(torch.uint8).tolist())


def write_safetensors(path, tensors, metadata):
    codes = {torch.float32: "F32", torch.bfloat16: "BF16"}
    header = {"__metadata__": metadata}
    blobs = []
    offset = 0
    for name in sorted(tensors):
        t = tensors[name]
        b = tensor_bytes(t)
        header[name] = {"dtype": codes[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(b)]}
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
    default_out = os.path.normpath(os.path.join(here, "..", "..", "tests", "data", "bicubic_golden.safetensors"))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=default_out)
    ap.add_argument("--no-cuda", action="store_true", help="skip the CUDA tensors even if a GPU is present")
    args = ap.parse_args()

    use_cuda = torch.cuda.is_available() and not args.no_cuda
    tensors = {}
    metadata = {"cases": ",".join(CASES), "torch": str(torch.__version__), "generator": "scripts/parity/gen_bicubic_golden.py"}
    for name, (c, h, w, oh, ow, seed, bits) in CASES.items():
        metadata[name] = ",".join(str(v) for v in (c, h, w, oh, ow, seed, bits))
        x = hashed_image(c, h, w, seed, bits)
        with torch.no_grad():
            tensors[f"{name}.resized"] = resize(x, oh, ow)
            if use_cuda:
                xc = x.cuda()
                tensors[f"{name}.resized_cuda_bf16"] = resize(xc.to(torch.bfloat16), oh, ow).cpu()
    write_safetensors(args.out, tensors, metadata)
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    print(f"wrote {args.out}: {len(tensors)} tensors, {total} bytes of data, cuda={use_cuda}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
