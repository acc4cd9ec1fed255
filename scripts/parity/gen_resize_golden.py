#!/usr/bin/env python3
"""Golden outputs of the embodiments' crop + anti-aliased resize for tests/unit/test_preprocess.cpp, written to
tests/data/resize_golden.safetensors.

AgiBot's and YAM's eval transform (embodiment_ref.py canvas()) runs, per view, on 480x640 frames:
  VideoToTensor   frames.to(float32) / 255.0, permute(0, 3, 1, 2)                      [T, C, H, W]
  VideoCrop       torchvision.transforms.v2.CenterCrop((int(H * scale), int(W * scale)))   (456x608 at 0.95)
  VideoResize     torchvision.transforms.v2.Resize((h, w), BILINEAR, antialias=True)     (the model's view size)
  VideoToNumpy    (x.permute(0, 2, 3, 1) * 255).to(torch.uint8)
Down-scaling 456 rows to 176 takes 5 and 6 taps per output, to 88 rows 8 to 11: these cases pin how PyTorch's CPU
kernel rounds its accumulation there (docs/PARITY.md, Embodiments). DROID's 180x320 geometry is in
gen_preprocess_golden.py. The rounding depends on the CPU kernel PyTorch dispatches to: generate on an AVX2 or
AVX512 CPU (the capability is recorded in the metadata; the script refuses a build without FMA).

Inputs are not stored: each frame is made from the 32-bit hash of gen_preprocess_golden.py (hashed_frame), or,
for kind "blocks", that hash on a grid B times smaller, each value repeated over a B x B block (flat regions make
outputs land near whole levels, where the accumulation's rounding shows after truncation). The C++ test makes
the same frames. Cases are listed in __metadata__ ("cases"; per case "H,W,kind,seed,B,scale,h,w"). Tensors:
<case>.view uint8 [h, w, 3]; cases without one store <case>.fnv1a64 (64-bit FNV-1a of the view, hex).

Usage (needs torch, torchvision, numpy; no network):
    python3 scripts/parity/gen_resize_golden.py [--out PATH]
"""
import argparse
import os
import sys

import numpy as np
import torch
import torchvision.transforms.v2 as T

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_preprocess_golden import fnv1a64, hashed_frame, make_frame, write_safetensors  # noqa: E402

# name: (H, W, kind, seed, block, crop scale, view h, view w, store the view)
CASES = {
    "blocks16_176x320": (480, 640, "blocks", 1, 16, 0.95, 176, 320, True),
    "hash_176x320": (480, 640, "hash", 1, 1, 0.95, 176, 320, False),
    "smooth_88x160": (480, 640, "smooth", 0, 1, 0.95, 88, 160, True),
    "blocks32_60x80": (480, 640, "blocks", 2, 32, 1.0, 60, 80, False),
}


def frame_of(h, w, kind, seed, block):
    if kind == "blocks":
        small = hashed_frame((h + block - 1) // block, (w + block - 1) // block, seed)
        return np.ascontiguousarray(small.repeat(block, axis=0).repeat(block, axis=1)[:h, :w])
    return make_frame(h, w, kind, seed)


def eval_view(frame, scale, view):
    """embodiment_ref.py canvas() for one camera and one frame: [H, W, 3] uint8 -> [h, w, 3] uint8."""
    x = torch.from_numpy(frame[None].copy()).to(torch.float32) / 255.0  # VideoToTensor
    x = x.permute(0, 3, 1, 2)
    h, w = x.shape[-2:]
    x = T.CenterCrop((int(h * scale), int(w * scale)))(x)
    x = T.Resize(view, interpolation=T.InterpolationMode.BILINEAR, antialias=True)(x)
    return (x.permute(0, 2, 3, 1) * 255).to(torch.uint8)[0].numpy()


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    default_out = os.path.normpath(os.path.join(here, "..", "..", "tests", "data", "resize_golden.safetensors"))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=default_out)
    args = ap.parse_args()
    capability = torch.backends.cpu.get_cpu_capability()
    if capability.upper() not in ("AVX2", "AVX512"):
        raise SystemExit(f"torch dispatches to the {capability} CPU kernels here; the parity runs use AVX2/AVX512")

    tensors = {}
    metadata = {"cases": ",".join(CASES), "torch": torch.__version__, "cpu_capability": capability,
                "generator": "scripts/parity/gen_resize_golden.py"}
    for name, (h, w, kind, seed, block, scale, vh, vw, store) in CASES.items():
        metadata[name] = f"{h},{w},{kind},{seed},{block},{scale},{vh},{vw}"
        view = eval_view(frame_of(h, w, kind, seed, block), scale, (vh, vw))
        if store:
            tensors[f"{name}.view"] = view
        else:
            metadata[f"{name}.fnv1a64"] = fnv1a64(np.ascontiguousarray(view).tobytes())
    write_safetensors(args.out, tensors, metadata)
    print(f"wrote {args.out}: {len(tensors)} views, torch {torch.__version__} ({capability})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
