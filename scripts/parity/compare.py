#!/usr/bin/env python3
"""Compares dzr's parity dumps (`dzr parity run`) with the reference's (reference_run.py) and prints one table.

Each --pair LABEL=OURS.safetensors:REF.safetensors:TOL adds three columns (max abs, max rel, ok) to the table;
rows are stages per call. Stage groups (a row aggregates the tensors of one group in one call, e.g. every
evaluated step of velocity.cond, or every layer output of every denoising forward):

  input.video state text.pos text.neg clip ys vae.clip noise.video noise.action
  dit.prefill dit.commit dit.denoise   (layer outputs, head tokens, action decoder output of each forward)
  velocity.cond velocity.uncond velocity.action sample.video sample.action x actions actions_robot

Errors, for dzr's tensor a against the reference's b (same shape):
  max abs = max_i |a_i - b_i|
  max rel = max_i |a_i - b_i| / max(|b_i|, rms(b))      (rms(b) = sqrt(mean(b^2)); a floor that keeps near-zero
                                                          elements from dominating; 0/0 counts as 0)
A row is "ok" when max rel <= TOL. --details also gives each tensor's rel l2 = ||a - b||_2 / ||b||_2 and the fraction of its elements that differ at all. The gate of a pair is the `actions` rows (normalized action_pred of every
call): the pair passes when all of them are ok. Tensors present in only one file are listed, not compared,
except where dzr computes a stage once that the reference repeats (text embeddings after call 0) or traces
less (samples of skipped steps).

Usage:
  python3 scripts/parity/compare.py --pair "cpu-f32=ours_cpu.safetensors:ref_fp32.safetensors:1e-4" \
      --pair "cuda-bf16=ours_cuda.safetensors:ref_bf16.safetensors:2e-2" \
      [--info-pair LABEL=A:B:TOL] [--out table.txt] [--md table.md] [--details details.txt]
Exit status: 0 when every --pair's gate passes, 1 otherwise (--info-pair columns are reported only).
"""
import argparse
import json
import re
import sys

import numpy as np
from safetensors import safe_open

GROUPS = ["input.video", "state", "umt5.internal", "text.pos", "text.neg", "clip.internal", "clip", "vae.internal", "ys",
          "vae.clip",
          "noise.video", "noise.action",
          "dit.prefill", "dit.commit", "dit.denoise", "velocity.cond", "velocity.uncond", "velocity.action",
          "sample.video", "sample.action", "x", "actions", "actions_robot"]
GATE = "actions"


def group_of(stage):
    if stage in GROUPS:  # before the prefixes below: "vae.clip" is a stage, not a VAE internal
        return stage
    m = re.match(r"dit\.(prefill|commit|denoise)\.", stage)
    if m:
        return f"dit.{m.group(1)}"
    m = re.match(r"(velocity\.(cond|uncond|action)|sample\.(video|action))\.\d+$", stage)
    if m:
        return m.group(1)
    if stage.startswith("umt5."):  # the encoders' internals (sub-stage dumps)
        return "umt5.internal"
    if stage.startswith("clip."):
        return "clip.internal"
    if re.match(r"vae\.(chunk1\.)?(conv_in|block\.\d+|head)$", stage):
        return "vae.internal"
    return None


def load(path):
    out, meta = {}, {}
    with safe_open(path, framework="np") as f:
        meta = json.loads((f.metadata() or {}).get("parity", "{}"))
        for k in f.keys():
            out[k] = f.get_tensor(k).astype(np.float64)
    return out, meta


def errors(a, b):
    d = np.abs(a - b)
    rms = float(np.sqrt(np.mean(b * b))) if b.size else 0.0
    den = np.maximum(np.abs(b), rms)
    rel = np.where(den > 0, d / np.where(den > 0, den, 1.0), np.where(d > 0, np.inf, 0.0))
    return float(d.max(initial=0.0)), float(rel.max(initial=0.0))


def rel_l2(a, b):
    """||a - b||_2 / ||b||_2 (details only: a norm-wise companion of the worst-element max rel)."""
    nb = float(np.linalg.norm(b))
    d = float(np.linalg.norm(a - b))
    return d / nb if nb > 0 else (0.0 if d == 0 else float("inf"))


def compare_pair(ours, ref):
    rows = {}  # (group, call) -> [max abs, max rel, count, worst stage]
    only_ours, only_ref, shape_mismatch, per_tensor = [], [], [], []
    for name in sorted(set(ours) | set(ref)):
        call, _, stage = name.partition(".")
        g = group_of(stage)
        if g is None:
            continue
        if name not in ref:
            only_ours.append(name)
            continue
        if name not in ours:
            # NOTE: dzr encodes the text once per prompt and traces the samples of evaluated steps only.
            if not (stage.startswith(("text.", "umt5.")) and call != "c0") and not stage.startswith("sample."):
                only_ref.append(name)
            continue
        a, b = ours[name], ref[name]
        if a.shape != b.shape:
            shape_mismatch.append(f"{name}: dzr {list(a.shape)} vs reference {list(b.shape)}")
            continue
        ea, er = errors(a, b)
        per_tensor.append((name, a.shape, ea, er, rel_l2(a, b), float(np.count_nonzero(a != b)) / max(a.size, 1)))
        r = rows.setdefault((g, int(call[1:])), [0.0, 0.0, 0, ""])
        if er >= r[1]:
            r[3] = stage
        r[0], r[1], r[2] = max(r[0], ea), max(r[1], er), r[2] + 1
    return rows, only_ours, only_ref, shape_mismatch, per_tensor


def state_machine(ours_meta, ref_meta):
    """Per call: reset, start frame and KV length of the denoising forwards, on both sides."""
    lines = []
    calls = ours_meta.get("calls", [])
    fw = ref_meta.get("forwards", [])
    if not fw or not calls or "start_frame" not in calls[0]:
        return lines  # not a dzr-vs-reference pair
    for k, c in enumerate(calls):
        den = [f for f in fw if f["call"] == k and f["kind"] == "denoise"]
        kinds = sorted({f["kind"] for f in fw if f["call"] == k and f["kind"] != "denoise"})
        ref_start = den[0]["start_frame"] if den else None
        ref_kv = den[0]["kv_in"] if den else None
        ok = ref_start == c["start_frame"] and ref_kv == c["kv_tokens"] and (("prefill" in kinds) == c["reset"])
        lines.append(f"call {k}: dzr reset={c['reset']} start={c['start_frame']} kv={c['kv_tokens']} | reference "
                     f"{'+'.join(kinds)} start={ref_start} kv={ref_kv} denoise forwards={len(den)} "
                     f"{'ok' if ok else 'MISMATCH'}")
    return lines


def fmt(x):
    return "-" if x is None else ("inf" if x == float("inf") else f"{x:.2e}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--pair", action="append", default=[], help="LABEL=OURS:REF:TOL (gated)")
    p.add_argument("--info-pair", action="append", default=[], help="LABEL=A:B:TOL (reported, not gated)")
    p.add_argument("--out", help="also write the table (and notes) to this file")
    p.add_argument("--md", help="also write the table as Markdown to this file")
    p.add_argument("--details", help="write every compared tensor's errors to this file")
    args = p.parse_args()
    if not args.pair and not args.info_pair:
        p.error("give at least one --pair")

    pairs = []
    details = []
    for spec, gated in [(s, True) for s in args.pair] + [(s, False) for s in args.info_pair]:
        label, _, rest = spec.partition("=")
        ours_path, ref_path, tol = rest.rsplit(":", 2)
        ours, ours_meta = load(ours_path)
        ref, ref_meta = load(ref_path)
        rows, only_ours, only_ref, bad, per_tensor = compare_pair(ours, ref)
        details += [f"{label}  {name}  {list(shape)}  max abs {fmt(ea)}  max rel {fmt(er)}  rel l2 {fmt(el)}  "
                    f"differ {nd:.2e}" for name, shape, ea, er, el, nd in per_tensor]
        pairs.append(dict(label=label, tol=float(tol), gated=gated, rows=rows, only_ours=only_ours, only_ref=only_ref,
                          bad=bad, sm=state_machine(ours_meta, ref_meta), ours_meta=ours_meta, ref_meta=ref_meta))

    keys = sorted({k for pr in pairs for k in pr["rows"]}, key=lambda k: (GROUPS.index(k[0]), k[1]))
    header = ["stage", "call", "n"]
    for pr in pairs:
        header += [f"{pr['label']} max abs", f"{pr['label']} max rel", f"ok (rel <= {pr['tol']:g})"]
    table = []
    for g, c in keys:
        row = [g, str(c)]
        n = max((pr["rows"].get((g, c), [0, 0, 0])[2] for pr in pairs), default=0)
        row.append(str(n))
        for pr in pairs:
            r = pr["rows"].get((g, c))
            if r is None:
                row += ["-", "-", "-"]
            else:
                ok = r[1] <= pr["tol"]
                row += [fmt(r[0]), fmt(r[1]), ("PASS" if ok else "FAIL") if g == GATE else ("yes" if ok else "no")]
        table.append(row)

    notes = []
    verdict = True
    for pr in pairs:
        gate = [pr["rows"][k] for k in pr["rows"] if k[0] == GATE]
        passed = bool(gate) and all(r[1] <= pr["tol"] for r in gate) and not pr["bad"]
        if pr["gated"]:
            verdict = verdict and passed
        worst = max((r[1] for r in gate), default=None)
        status = ("PASS" if passed else "FAIL") if pr["gated"] else "(informational)"
        notes.append(f"{pr['label']}: {status} - actions max rel {fmt(worst)} over {len(gate)} calls "
                     f"(target {pr['tol']:g})")
        for line in pr["sm"]:
            notes.append(f"  {line}")
        for what, names in (("only in dzr's dump", pr["only_ours"]), ("only in the reference's dump", pr["only_ref"]),
                            ("shape mismatch", pr["bad"])):
            if names:
                shown = ", ".join(names[:8]) + (f", ... ({len(names)} in all)" if len(names) > 8 else "")
                notes.append(f"  {what}: {shown}")

    md = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    md += ["| " + " | ".join(r) + " |" for r in table]
    widths = [max([len(header[i])] + [len(r[i]) for r in table]) for i in range(len(header))]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in table]
    text = "\n".join(lines + [""] + notes) + "\n"
    sys.stdout.write(text)
    for path, body in ((args.out, text), (args.md, "\n".join(md + [""] + notes) + "\n"),
                       (args.details, "\n".join(details) + "\n")):
        if path:
            with open(path, "w") as f:
                f.write(body)
    return 0 if verdict else 1


if __name__ == "__main__":
    sys.exit(main())
