#!/usr/bin/env python3
"""scripts/parity/first_diff.py on a synthetic compare.py --details file: each forward's stages come out in the
order the DiT computes them (not the file's alphabetical order) with the first differing one named, the policy's
stages per call, and the brief per-call summary counts the differing heads. Standard library only.
Usage: python3 tests/parity/test_first_diff.py
"""
import subprocess
import sys
import tempfile
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "parity" / "first_diff.py"


def line(name, max_rel, differ):
    return f"probe  {name}  [4, 8]  max abs 1.00e-02  max rel {max_rel:.2e}  rel l2 1.00e-03  differ {differ:.2e}"


# alphabetical, as compare.py writes them; in the forward's order the head is the first stage that differs
DETAILS = [
    line("c0.actions", 3.1e-2, 0.5),
    line("c0.dit.denoise.pos.0.action_tokens", 0, 0),
    line("c0.dit.denoise.pos.0.head", 2e-3, 1.2e-3),
    line("c0.dit.denoise.pos.0.head_in", 0, 0),
    line("c0.dit.denoise.pos.0.head_norm", 0, 0),
    line("c0.dit.denoise.pos.0.layer_out.0", 0, 0),
    line("c0.dit.denoise.pos.0.layer_out.1", 0, 0),
    line("c0.dit.denoise.pos.0.patch_embed", 0, 0),
    line("c0.dit.denoise.pos.0.time_e0", 0, 0),
    line("c0.dit.denoise.pos.1.head", 1e-3, 2e-3),
    line("c0.dit.prefill.pos.0.head", 0, 0),
    line("c0.dit.prefill.pos.0.head_in", 0, 0),
    line("c0.dit.prefill.pos.0.layer_out.0", 0, 0),
    line("c0.dit.prefill.pos.0.patch_embed", 0, 0),
    line("c0.text.pos", 0, 0),
    line("c0.velocity.cond.0", 1e-3, 1e-4),
    line("c0.velocity.cond.6", 5e-3, 3e-1),
    line("c1.actions", 0, 0),
    line("c1.dit.denoise.pos.0.head", 0, 0),
]


def run(*args):
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "details.txt"
        path.write_text("\n".join(DETAILS) + "\n")
        r = subprocess.run([sys.executable, str(SCRIPT), str(path), *args], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()


def main():
    out = run()
    den = [ln for ln in out if "denoise.pos.0:" in ln]
    assert len(den) == 1, out
    assert "first differing: head |" in den[0], den[0]
    order = ["patch_embed", "time_e0", "action_tokens", "layer_out.0", "layer_out.1", "head_norm", "head_in", "head"]
    body = den[0].split("|", 1)[1] + " "
    pos = [body.index(f" {s} ") for s in order]
    assert pos == sorted(pos), den[0]
    pre = [ln for ln in out if "prefill.pos.0:" in ln]
    assert len(pre) == 1 and "first differing: none" in pre[0], out
    # a forward with its outputs only (denoise.pos.1) has no line of its own
    assert not any("denoise.pos.1:" in ln for ln in out), out
    pol = [ln for ln in out if ln.strip().startswith("c0 policy")]
    assert len(pol) == 1 and "velocity.cond 3.0e-01" in pol[0] and "actions max rel 3.10e-02" in pol[0], pol

    brief = run("--brief")
    assert len(brief) == 2, brief
    assert "head differs in 2/3 forwards (worst 2.0e-03" in brief[0], brief[0]
    assert "head differs in 0/1" in brief[1] and "actions max rel 0.0" in brief[1], brief[1]
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
