#!/usr/bin/env python3
"""The numerics gates of dzr against the reference's fp32 run (docs/PARITY.md): per call, a candidate run must stay
within a bound set by the reference's own bf16 run. Two kinds:

  fast  (the gate of `fast` numerics)  max rel(a, r) <= 1.1 * max rel(b, r)  and  rel l2(a, r) <= 1.1 * rel l2(b, r)
  fp8   (the FP8 gates, issue #14)     max rel(a, r) <= 0.1                   and  rel l2(a, r) <= 3 * rel l2(b, r)

For every call k of the fp32 dump, with a = c<k>.<stage> (default stage `actions`, the normalized action_pred
[24, 32]) of the candidate (dzr CUDA bf16 with --numerics fast, or with FP8 weights and/or an FP8 KV cache), b = the
same tensor of the baseline (the reference's bf16 run) and r = the reference's fp32 run (the same errors as
compare.py):
  max rel = max_i |x_i - r_i| / max(|r_i|, rms(r))         rel l2 = ||x - r||_2 / ||r||_2
SLACK 1.1 of `fast`: at most 10% further than the reference's own bf16 error. The bounds can also be set one by one
(--max-rel-slack, --rel-l2-slack, --max-rel-abs; --slack sets both slacks). The gate passes when every call of the
fp32 dump (and, with --calls N, exactly calls 0..N-1) passes. A call missing from a dump, a shape mismatch or a
non-finite value fails it; where the baseline's error is 0 the candidate's must be 0 too (for a relative bound).

Usage:
  python3 scripts/parity/gate.py --candidate dzr-cudafast-gpu.safetensors --baseline ref-bf16-gpu.safetensors \
      --reference ref-fp32-gpu.safetensors [--kind fast|fp8] [--slack 1.1] [--stage actions] [--calls 9] [--out gate.txt]
Exit status: 0 when the gate passes, 1 when it fails, 2 when a dump cannot be read (or the arguments are wrong).
"""
import argparse
import json
import math
import re
import sys
from pathlib import Path

import numpy as np
from safetensors import safe_open

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import errors, fmt, rel_l2  # noqa: E402  (the same error measures as the parity table)


def load_stage(path, stage):
    """{call: f64 array} of the tensors c<k>.<stage> of a dump, and the dump's `parity` metadata."""
    pat = re.compile(r"c(\d+)\." + re.escape(stage) + "$")
    out = {}
    try:
        with safe_open(str(path), framework="np") as f:
            meta = json.loads((f.metadata() or {}).get("parity", "{}"))
            for k in f.keys():
                m = pat.match(k)
                if m:
                    out[int(m.group(1))] = f.get_tensor(k).astype(np.float64)
    except Exception as e:  # noqa: BLE001  (safetensors raises several kinds; each is a bad dump)
        print(f"gate: cannot read {path}: {e}", file=sys.stderr)
        sys.exit(2)
    return out, meta


def describe(label, path, meta):
    keys = ("producer", "backend", "dtype", "numerics", "kv", "precision", "kv_dtype")
    what = ", ".join(f"{k} {meta[k]}" for k in keys if k in meta)
    if not what:  # the reference's dumps record their own fields
        what = ", ".join(f"{k} {meta[k]}" for k in ("dtype", "device") if k in meta)
    return f"{label}: {path}" + (f" ({what})" if what else "")


def ratio(a, b):
    if b > 0:
        return a / b
    return 0.0 if a == 0 else math.inf


# The bounds of each kind: the slack of each measure against the baseline's, or an absolute bound on max rel.
KINDS = {
    "fast": {"max_rel_slack": 1.1, "rel_l2_slack": 1.1, "max_rel_abs": None},
    "fp8": {"max_rel_slack": None, "rel_l2_slack": 3.0, "max_rel_abs": 0.1},
}


def bounds(p, args):
    """(max rel slack or None, rel l2 slack, max rel absolute bound or None) of the kind, with the flags applied."""
    b = dict(KINDS[args.kind])
    if args.slack is not None:
        if not args.slack >= 1.0:
            p.error(f"--slack must be at least 1, got {args.slack}")
        b["max_rel_slack"] = b["rel_l2_slack"] = args.slack
    for key in ("max_rel_slack", "rel_l2_slack"):
        v = getattr(args, key)
        if v is not None:
            if not v >= 1.0:
                p.error(f"--{key.replace('_', '-')} must be at least 1, got {v}")
            b[key] = v
    if args.max_rel_abs is not None:
        if not args.max_rel_abs > 0:
            p.error(f"--max-rel-abs must be positive, got {args.max_rel_abs}")
        b["max_rel_abs"] = args.max_rel_abs
    if b["max_rel_abs"] is not None:
        # NOTE: one bound on max rel, never two: an absolute one (fp8's, --max-rel-abs) or a slack (fast's)
        if args.slack is not None or args.max_rel_slack is not None:
            p.error("max rel has an absolute bound here (--kind fp8 or --max-rel-abs): give --rel-l2-slack for rel l2, "
                    "not --slack or --max-rel-slack")
        b["max_rel_slack"] = None
    return b["max_rel_slack"], b["rel_l2_slack"], b["max_rel_abs"]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--candidate", required=True, help="dump of the run under test (dzr --numerics fast, FP8, ...)")
    p.add_argument("--baseline", required=True, help="dump whose error sets the bound (the reference's bf16 run)")
    p.add_argument("--reference", required=True, help="dump both are measured against (the reference's fp32 run)")
    p.add_argument("--kind", choices=sorted(KINDS), default="fast",
                   help="fast: both measures within 1.1 x the baseline's; fp8: rel l2 within 3 x, max rel <= 0.1")
    p.add_argument("--slack", type=float, help="candidate error <= SLACK * baseline error, both measures (fast: 1.1)")
    p.add_argument("--max-rel-slack", type=float, help="max rel <= SLACK * the baseline's")
    p.add_argument("--rel-l2-slack", type=float, help="rel l2 <= SLACK * the baseline's (fp8: 3)")
    p.add_argument("--max-rel-abs", type=float, help="max rel <= this, whatever the baseline's (fp8: 0.1)")
    p.add_argument("--stage", default="actions", help="the stage compared per call (c<k>.STAGE)")
    p.add_argument("--calls", type=int, default=0, help="require exactly calls 0..N-1 (0: whatever the fp32 dump has)")
    p.add_argument("--label", help="the candidate's name in the table (default: the kind)")
    p.add_argument("--baseline-label", default="ref-bf16")
    p.add_argument("--out", help="also write the table to this file")
    args = p.parse_args()
    rel_slack, l2_slack, rel_abs = bounds(p, args)
    label = args.label or args.kind

    cand, cand_meta = load_stage(args.candidate, args.stage)
    base, base_meta = load_stage(args.baseline, args.stage)
    ref, ref_meta = load_stage(args.reference, args.stage)

    problems = []
    calls = sorted(ref)
    if not calls:
        problems.append(f"the fp32 dump {args.reference} has no tensor c<k>.{args.stage}")
    if args.calls > 0 and calls != list(range(args.calls)):
        problems.append(f"the fp32 dump holds calls {calls} of {args.stage}, expected 0..{args.calls - 1}")
    for name, dump, path in ((label, cand, args.candidate), (args.baseline_label, base, args.baseline)):
        missing = [k for k in calls if k not in dump]
        if missing:
            problems.append(f"{name} ({path}) lacks c<k>.{args.stage} of calls {missing}")

    # the max rel column: the ratio to the baseline's, or to the absolute bound
    rel_key = "max rel" if rel_abs is None else f"max rel / {rel_abs:g}"
    head = ["call", f"{args.baseline_label} max rel", f"{args.baseline_label} rel l2", f"{label} max rel",
            f"{label} rel l2", "ratio max rel" if rel_abs is None else rel_key, "ratio rel l2", "verdict"]
    rows, ratios = [], {rel_key: [], "rel l2": []}  # (ratio, call)
    for k in calls:
        if k not in cand or k not in base:
            rows.append([str(k)] + ["-"] * 6 + ["FAIL (missing)"])
            continue
        r = ref[k]
        bad = [n for n, x in ((label, cand[k]), (args.baseline_label, base[k])) if x.shape != r.shape]
        if bad:
            problems.append(f"call {k}: {', '.join(bad)} {args.stage} shape differs from the fp32 dump's "
                            f"{list(r.shape)}")
            rows.append([str(k)] + ["-"] * 6 + ["FAIL (shape)"])
            continue
        nonfinite = [n for n, x in ((label, cand[k]), (args.baseline_label, base[k]), ("ref-fp32", r))
                     if not np.all(np.isfinite(x))]
        b_rel, b_l2 = errors(base[k], r)[1], rel_l2(base[k], r)
        c_rel, c_l2 = errors(cand[k], r)[1], rel_l2(cand[k], r)
        q_rel = ratio(c_rel, b_rel) if rel_abs is None else c_rel / rel_abs
        q_l2 = ratio(c_l2, b_l2)
        rel_ok = c_rel <= rel_slack * b_rel if rel_abs is None else c_rel <= rel_abs
        ok = not nonfinite and rel_ok and c_l2 <= l2_slack * b_l2
        if nonfinite:
            problems.append(f"call {k}: non-finite {args.stage} in {', '.join(nonfinite)}")
        ratios[rel_key].append((q_rel, k))
        ratios["rel l2"].append((q_l2, k))
        rows.append([str(k), fmt(b_rel), fmt(b_l2), fmt(c_rel), fmt(c_l2), f"{q_rel:.3f}", f"{q_l2:.3f}",
                     "PASS" if ok else ("FAIL (non-finite)" if nonfinite else "FAIL")])

    passed = bool(calls) and not problems and all(row[-1] == "PASS" for row in rows)
    widths = [max([len(head[i])] + [len(row[i]) for row in rows]) for i in range(len(head))]
    lines = [describe(label, args.candidate, cand_meta), describe(args.baseline_label, args.baseline, base_meta),
             describe("ref-fp32", args.reference, ref_meta), ""]
    lines.append("  ".join(h.ljust(w) for h, w in zip(head, widths)).rstrip())
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    lines.append("")
    lines += [f"problem: {m}" for m in problems]
    worst_txt = ", ".join(f"{key} {q:.3f} (call {k})" for key, (q, k) in
                          ((key, max(v, key=lambda t: t[0])) for key, v in ratios.items() if v))
    if rel_abs is None and rel_slack == l2_slack:
        rule = f"within {rel_slack:g} x {args.baseline_label} vs ref-fp32 (max rel and rel l2)"
    elif rel_abs is None:
        rule = (f"max rel within {rel_slack:g} x and rel l2 within {l2_slack:g} x {args.baseline_label} vs "
                f"ref-fp32")
    else:
        rule = f"rel l2 within {l2_slack:g} x {args.baseline_label} vs ref-fp32, max rel at most {rel_abs:g}"
    lines.append(f"{label} gate: {'PASS' if passed else 'FAIL'} - {args.stage} of {len(calls)} calls, "
                 f"{label} vs ref-fp32 {rule}; worst ratio {worst_txt or '-'}")
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
