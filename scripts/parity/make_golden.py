#!/usr/bin/env python3
"""Writes the CI golden fixture (tests/data/golden/policy_golden.safetensors) from a reference fp32 dump.

Input: a dump of scripts/parity/reference_run.py (--dtype fp32) made on a parity input directory of
`dzr parity make-inputs`, at the geometry of tests/data/golden/policy_golden.yaml. The fixture keeps, per call,
what tests/model/test_golden_policy.cpp compares with dzr's CPU policy, strided where a tensor is large:

  c<k>.state [1, 64]                 c<k>.actions [24, 32]            c<k>.actions_robot [24, 8]
  c<k>.velocity.action.0 [24, 32]    c<k>.velocity.cond.0 / .uncond.0 / c<k>.x   [16, 2, h, w] strided
  c0.text.pos / c0.text.neg [512, dim]
  reset calls:  c<k>.clip rows 0..31 of [257, 1280];  c<k>.ys [20, 9, h, w] strided
  other calls:  c<k>.vae.clip [16, 3, h, w] strided
  noise.video (strided) and noise.action; text_ids, text_negative_ids (int64 [512])
"Strided" keeps every --stride-th latent row and column (default 2).

Metadata "golden" (JSON): for each tensor its source stage and per-dimension [start, stop, step]; the prompt;
the checkpoint seed and config; per call the frame count, frame indices, the raw state (exact float64 repr),
the FNV-1a 64 digest of the three camera arrays (order exterior_image_1_left, exterior_image_2_left,
wrist_image_left), whether the reference reset and the start frame of its denoised block; the reference run's
provenance.

Usage: python3 scripts/parity/make_golden.py --ref REF.safetensors --inputs INPUTS --seed 7 \
           --config tests/data/golden/policy_golden.yaml --out tests/data/golden/policy_golden.safetensors
"""
import argparse
import json
from pathlib import Path

import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

CAMERAS = ["exterior_image_1_left", "exterior_image_2_left", "wrist_image_left"]


def fnv1a64(chunks):
    h = 0xcbf29ce484222325
    for data in chunks:
        for b in data:
            h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ref", required=True)
    p.add_argument("--inputs", required=True)
    p.add_argument("--seed", type=int, required=True, help="the checkpoint's `dzr ckpt make --seed`")
    p.add_argument("--config", required=True, help="the checkpoint's config (repository-relative)")
    p.add_argument("--out", required=True)
    p.add_argument("--stride", type=int, default=2, help="row/column stride of the latents kept")
    args = p.parse_args()

    inputs = Path(args.inputs)
    manifest = json.loads((inputs / "manifest.json").read_text())
    with safe_open(args.ref, framework="np") as f:
        ref = {k: f.get_tensor(k) for k in f.keys()}
        ref_meta = json.loads(f.metadata()["parity"])
    if ref_meta["dtype"] != "fp32":
        raise SystemExit(f"{args.ref}: a {ref_meta['dtype']} dump; goldens come from the fp32 reference")

    tensors, slices = {}, {}

    def keep(name, source, sl=None):
        a = ref[source]
        if sl is None:
            sl = [[0, n, 1] for n in a.shape]
        tensors[name] = np.ascontiguousarray(a[tuple(slice(*s) for s in sl)], dtype=np.float32)
        slices[name] = {"source": source, "slices": sl}

    def strided(source):
        a = ref[source]
        return [[0, n, 1] for n in a.shape[:-2]] + [[0, a.shape[-2], args.stride], [0, a.shape[-1], args.stride]]

    calls = []
    for k, c in enumerate(manifest["calls"]):
        if f"c{k}.actions" not in ref:
            break
        d = inputs / f"call_{k}"
        cams = [np.load(d / f"{cam}.npy") for cam in CAMERAS]
        reset = f"c{k}.ys" in ref
        info = next(ci for ci in ref_meta["calls"] if ci["call"] == k)
        calls.append(dict(frames=c["frames"], frame_indices=c["frame_indices"],
                          joint_position=[float(v) for v in np.load(d / "joint_position.npy")],
                          gripper_position=[float(v) for v in np.load(d / "gripper_position.npy")],
                          frames_fnv1a64=fnv1a64([np.ascontiguousarray(a).tobytes() for a in cams]),
                          reset=reset, denoise_start_frame=info["start_frame_after"] - 2))
        for s in ("state", "actions", "actions_robot", "velocity.action.0"):
            keep(f"c{k}.{s}", f"c{k}.{s}")
        for s in ("velocity.cond.0", "velocity.uncond.0", "x"):
            keep(f"c{k}.{s}", f"c{k}.{s}", strided(f"c{k}.{s}"))
        if reset:
            keep(f"c{k}.clip", f"c{k}.clip", [[0, 32, 1], [0, ref[f"c{k}.clip"].shape[1], 1]])
            keep(f"c{k}.ys", f"c{k}.ys", strided(f"c{k}.ys"))
        else:
            keep(f"c{k}.vae.clip", f"c{k}.vae.clip", strided(f"c{k}.vae.clip"))
    for s in ("text.pos", "text.neg"):
        keep(f"c0.{s}", f"c0.{s}")
    keep("noise.video", "c0.noise.video", strided("c0.noise.video"))
    keep("noise.action", "c0.noise.action")
    for name in ("text_ids", "text_negative_ids"):
        tensors[name] = np.load(inputs / f"{name}.npy").astype(np.int64)

    meta = dict(format="dzr-golden/1", config=args.config, seed=args.seed, prompt=manifest["prompt"],
                text_tokens=manifest["text_tokens"], negative_tokens=manifest["negative_tokens"],
                canvas=manifest["canvas"], cameras=CAMERAS, calls=calls, tensors=slices,
                reference=dict(producer=ref_meta["producer"], dtype=ref_meta["dtype"], device=ref_meta["device"],
                               torch=ref_meta["torch"], patches=ref_meta["patches"]))
    save_file(tensors, args.out, metadata={"golden": json.dumps(meta)})
    size = Path(args.out).stat().st_size
    print(f"wrote {args.out}: {len(tensors)} tensors, {len(calls)} calls, {size / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
