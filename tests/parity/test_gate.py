#!/usr/bin/env python3
"""scripts/parity/gate.py on synthetic dumps: the gate of `fast` passes when the candidate is no further from the
fp32 dump than the bf16 baseline is (within the slack), and fails on a call beyond it in either measure (max rel or
rel l2), on a missing call, a shape mismatch or a non-finite value; an unreadable dump exits 2. The FP8 gate
(--kind fp8: rel l2 within 3 x the baseline's, max rel at most 0.1) passes and fails on each of its two bounds, and
its explicit flags give the same verdicts as the preset.

Needs numpy and safetensors (the parity harness's own dependencies); without them it reports skipped (exit 77).
Usage: python3 tests/parity/test_gate.py [--keep DIR]
"""
import os
import subprocess
import sys
import tempfile
from pathlib import Path

try:
    import numpy as np
    from safetensors.numpy import save_file
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)

GATE = Path(__file__).resolve().parents[2] / "scripts" / "parity" / "gate.py"
CALLS = 9
SHAPE = (24, 32)
rng = np.random.default_rng(13)
REF = {k: rng.standard_normal(SHAPE) for k in range(CALLS)}
# the baseline's (the reference bf16 run's) error per call: a spread error and one larger element
BASE_ERR = {}
for k in range(CALLS):
    e = 1e-2 * rng.standard_normal(SHAPE)
    e[k % SHAPE[0], 3] += 5e-2
    BASE_ERR[k] = e


def dump(path, tensors, meta=None):
    save_file({name: np.ascontiguousarray(t, dtype=np.float32) for name, t in tensors.items()}, str(path),
              metadata={"parity": meta or "{}"})
    return path


def stage(per_call, name="actions"):
    return {f"c{k}.{name}": v for k, v in per_call.items()}


def run_gate(work, cand, calls_arg=CALLS, base=None, ref=None, extra_args=()):
    """Writes the three dumps (candidate {call: tensor}, the baseline, the fp32 reference) and runs the gate."""
    ref = REF if ref is None else ref
    base = {k: REF[k] + BASE_ERR[k] for k in REF} if base is None else base
    # an unrelated stage in every dump, which the gate must ignore
    extra = {f"c{k}.x": np.full((2, 3), float(k)) for k in range(2)}
    c = dump(work / "cand.safetensors", {**stage(cand), **extra}, '{"producer": "dzr parity run", "numerics": "fast"}')
    b = dump(work / "base.safetensors", {**stage(base), **extra}, '{"dtype": "bf16"}')
    r = dump(work / "ref.safetensors", {**stage(ref), **{k: v + 1 for k, v in extra.items()}}, '{"dtype": "fp32"}')
    cmd = [sys.executable, str(GATE), "--candidate", str(c), "--baseline", str(b), "--reference", str(r),
           "--calls", str(calls_arg), "--out", str(work / "gate.txt"), *extra_args]
    p = subprocess.run(cmd, capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


def scaled(factor, calls=None):
    """The candidate at `factor` times the baseline's error (both measures scale with it) in `calls` (default all),
    half the baseline's error elsewhere."""
    calls = range(CALLS) if calls is None else calls
    return {k: REF[k] + (factor if k in calls else 0.5) * BASE_ERR[k] for k in range(CALLS)}


def spread(l2_factor, calls=None):
    """The candidate with, in `calls` (default all), an error of the same size at every element: l2_factor x the
    baseline's rel l2 in rel l2, and every element's max rel (against the rms floor) at most that rel l2; elsewhere
    half the baseline's error."""
    calls = range(CALLS) if calls is None else calls
    out = {}
    for k in range(CALLS):
        r, b = REF[k], BASE_ERR[k]
        if k not in calls:
            out[k] = r + 0.5 * b
            continue
        rms = np.sqrt(np.mean(r * r))
        c = l2_factor * np.linalg.norm(b) / np.linalg.norm(r)  # the candidate's rel l2
        out[k] = r + c * rms * np.sign(rng.standard_normal(SHAPE))
    return out


def spike(k, max_rel, cand=None):
    """`cand` (default half the baseline's error everywhere) with call k exact but one element at max rel `max_rel`."""
    cand = scaled(0.5) if cand is None else cand
    r = REF[k]
    rms = np.sqrt(np.mean(r * r))
    e = np.zeros(SHAPE)
    e[5, 7] = max_rel * max(abs(r[5, 7]), rms)
    cand[k] = r + e
    return cand


def row(out, call):
    for line in out.splitlines():
        if line.split()[:1] == [str(call)]:
            return line
    raise AssertionError(f"no row for call {call} in:\n{out}")


failures = []
checks = 0


def check(name, cond, out):
    global checks
    checks += 1
    print(f"{'ok  ' if cond else 'FAIL'} {name}")
    if not cond:
        failures.append(name)
        print(out)


def main():
    keep = sys.argv[2] if len(sys.argv) > 2 and sys.argv[1] == "--keep" else None
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(keep or tmp)
        work.mkdir(parents=True, exist_ok=True)

        rc, out = run_gate(work, scaled(0.5))
        check("closer than the baseline in every call: PASS", rc == 0 and "fast gate: PASS" in out, out)
        check("the table has a row per call", all(row(out, k).rstrip().endswith("PASS") for k in range(CALLS)), out)
        check("the table is written to --out", (work / "gate.txt").read_text() == out, out)

        rc, out = run_gate(work, {k: REF[k].copy() for k in range(CALLS)})
        check("identical to the fp32 dump: PASS", rc == 0, out)

        rc, out = run_gate(work, scaled(1.09))
        check("1.09 x the baseline's error in every call (slack 1.1): PASS", rc == 0 and "1.090" in out, out)

        rc, out = run_gate(work, scaled(1.12, calls=[6]))
        check("1.12 x the baseline's error in one call: FAIL", rc == 1 and "fast gate: FAIL" in out, out)
        check("  only that call fails", row(out, 6).rstrip().endswith("FAIL") and
              all(row(out, k).rstrip().endswith("PASS") for k in range(CALLS) if k != 6), out)

        # max rel within, rel l2 beyond: every element off by 0.9 x the baseline's worst relative error (against the
        # rms floor, so no element's max rel exceeds 0.9 x the baseline's), which spreads far more error than it has
        r, b = REF[2], BASE_ERR[2]
        rms = np.sqrt(np.mean(r * r))
        b_rel = np.max(np.abs(b) / np.maximum(np.abs(r), rms))
        e = 0.9 * b_rel * rms * np.sign(rng.standard_normal(SHAPE))
        assert np.linalg.norm(e) > 1.2 * np.linalg.norm(b), "test setup: the spread error must exceed the bound"
        cand = scaled(0.5)
        cand[2] = r + e
        rc, out = run_gate(work, cand)
        check("rel l2 beyond the bound, max rel within: FAIL", rc == 1 and row(out, 2).rstrip().endswith("FAIL"), out)

        # rel l2 within, max rel beyond: one element at twice the baseline's worst relative error, the rest exact
        r, b = REF[4], BASE_ERR[4]
        rms = np.sqrt(np.mean(r * r))
        b_rel = np.max(np.abs(b) / np.maximum(np.abs(r), rms))
        e = np.zeros(SHAPE)
        e[10, 10] = 2.0 * b_rel * max(abs(r[10, 10]), rms)
        assert np.linalg.norm(e) < 0.9 * np.linalg.norm(b), "test setup: the one element must stay within rel l2"
        cand = scaled(0.5)
        cand[4] = r + e
        rc, out = run_gate(work, cand)
        check("max rel beyond the bound, rel l2 within: FAIL", rc == 1 and row(out, 4).rstrip().endswith("FAIL"), out)

        cand = scaled(0.5)
        del cand[8]
        rc, out = run_gate(work, cand)
        check("a call missing from the candidate: FAIL", rc == 1 and "lacks" in out and "[8]" in out, out)

        rc, out = run_gate(work, scaled(0.5), calls_arg=CALLS + 1)
        check("fewer calls than --calls asks for: FAIL", rc == 1 and "expected 0..9" in out, out)

        cand = scaled(0.5)
        cand[3] = cand[3].copy()
        cand[3][0, 0] = np.nan
        rc, out = run_gate(work, cand)
        check("a NaN in the candidate: FAIL", rc == 1 and "non-finite" in out, out)

        cand = scaled(0.5)
        cand[1] = cand[1][:, :16]
        rc, out = run_gate(work, cand)
        check("a shape mismatch: FAIL", rc == 1 and "shape" in out, out)

        # the baseline exact in a call: the candidate must be exact there too
        base = {k: REF[k] + BASE_ERR[k] for k in range(CALLS)}
        base[0] = REF[0].copy()
        rc, out = run_gate(work, scaled(0.5), base=base)
        check("the baseline exact in a call and the candidate not: FAIL", rc == 1 and row(out, 0).rstrip().endswith("FAIL"), out)

        # ---- the FP8 gate: rel l2 within 3 x the baseline's, max rel at most 0.1 (absolute) ----
        fp8 = ("--kind", "fp8")
        rc, out = run_gate(work, spread(2.9), extra_args=fp8)
        check("fp8: rel l2 at 2.9 x the baseline's in every call, max rel below 0.1: PASS",
              rc == 0 and "fp8 gate: PASS" in out and "2.900" in out, out)
        check("fp8: the table names the absolute bound", "max rel / 0.1" in out and "max rel at most 0.1" in out, out)
        rc, out = run_gate(work, spread(2.9), extra_args=("--kind", "fast"))
        check("  the same candidate fails the gate of fast", rc == 1 and "fast gate: FAIL" in out, out)

        rc, out = run_gate(work, spread(3.1, calls=[5]), extra_args=fp8)
        check("fp8: rel l2 at 3.1 x the baseline's in one call: FAIL", rc == 1 and "fp8 gate: FAIL" in out, out)
        check("  only that call fails", row(out, 5).rstrip().endswith("FAIL") and
              all(row(out, k).rstrip().endswith("PASS") for k in range(CALLS) if k != 5), out)

        rc, out = run_gate(work, spike(7, 0.09), extra_args=fp8)
        check("fp8: one element at max rel 0.09, rel l2 within: PASS", rc == 0 and "0.900" in row(out, 7), out)
        rc, out = run_gate(work, spike(7, 0.11), extra_args=fp8)
        check("fp8: one element at max rel 0.11, rel l2 within: FAIL", rc == 1 and row(out, 7).rstrip().endswith("FAIL")
              and all(row(out, k).rstrip().endswith("PASS") for k in range(CALLS) if k != 7), out)
        # max rel far above the baseline's (the gate of fast would fail it) but below 0.1: the bound is absolute
        cand = spike(3, 0.095)
        r, b = REF[3], BASE_ERR[3]
        b_rel = np.max(np.abs(b) / np.maximum(np.abs(r), np.sqrt(np.mean(r * r))))
        assert b_rel < 0.095 / 1.1, "test setup: the spike must exceed fast's bound"
        rc, out = run_gate(work, cand, extra_args=fp8)
        check("fp8: max rel above the baseline's but below 0.1: PASS", rc == 0, out)

        explicit = ("--rel-l2-slack", "3", "--max-rel-abs", "0.1")
        for name, cand, want in (("2.9 x rel l2", spread(2.9), 0), ("3.1 x rel l2", spread(3.1, calls=[5]), 1),
                                 ("max rel 0.11", spike(7, 0.11), 1)):
            rc1, out1 = run_gate(work, cand, extra_args=fp8)
            rc2, out2 = run_gate(work, cand, extra_args=explicit)
            check(f"--rel-l2-slack 3 --max-rel-abs 0.1 decides as --kind fp8 ({name})", rc1 == rc2 == want,
                  out1 + out2)

        rc, out = run_gate(work, spread(2.9), extra_args=("--kind", "fp8", "--slack", "3"))
        check("fp8 with --slack (a second bound on max rel): exit 2", rc == 2 and "absolute bound" in out, out)
        rc, out = run_gate(work, spread(2.9), extra_args=("--kind", "fp8", "--rel-l2-slack", "2.5"))
        check("fp8 with --rel-l2-slack 2.5: a 2.9 x candidate FAILs", rc == 1 and "within 2.5 x" in out, out)

        (work / "broken.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
        p = subprocess.run([sys.executable, str(GATE), "--candidate", str(work / "broken.safetensors"), "--baseline",
                            str(work / "base.safetensors"), "--reference", str(work / "ref.safetensors")],
                           capture_output=True, text=True)
        check("an unreadable dump: exit 2 naming the file", p.returncode == 2 and "broken.safetensors" in p.stderr,
              p.stdout + p.stderr)

    print(f"gate: {checks - len(failures)} passed, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
