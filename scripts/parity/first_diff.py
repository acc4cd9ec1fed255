#!/usr/bin/env python3
"""Where a dzr dump first departs from the reference's, from compare.py's --details file (one line per tensor:
LABEL  NAME  [shape]  max abs A  max rel R  rel l2 L  differ F, F the fraction of elements that differ at all).

  first_diff.py DETAILS            per DiT forward with internals (c<k>.dit.<kind>.<branch>.<n>.*), its stages in
                                   the order the forward computes them with the fraction that differs, and the
                                   first stage that differs; then per call the policy's stages (conditioning,
                                   velocities, actions)
  first_diff.py DETAILS --brief    per call one line: how many DiT forwards' head tokens and action-decoder outputs
                                   differ at all, and the actions' max rel

Made for the device step `widesub` (scripts/parity/device_round.sh), whose output comes back as the last 12,000
characters only: one short line per forward or call. Needs only the standard library.
"""
import argparse
import re
import sys

# a forward's stages in the order CausalDit computes them (the layer index sorts inside its stage)
FORWARD_ORDER = ["patch_embed", "time_sin", "time_e", "time_e0", "action_tau", "action_tokens", "state_tokens",
                 "self_attn_in", "q", "k", "v", "self_attn", "x_self", "cross_attn", "x_cross", "ffn", "layer_out",
                 "head_norm", "head_in", "head", "action_velocity"]
POLICY_ORDER = ["input.video", "state", "text.pos", "text.neg", "clip", "ys", "vae.clip", "velocity.cond",
                "velocity.uncond", "velocity.action", "x", "actions", "actions_robot"]
LINE = re.compile(r"^(\S+)\s+(c(\d+)\.(\S+))\s+\[[^\]]*\]\s+max abs (\S+)\s+max rel (\S+)\s+rel l2 (\S+)\s+differ (\S+)")
FORWARD = re.compile(r"^dit\.([a-z]+)\.(pos|neg)\.(\d+)\.([a-z_0]+?)(?:\.(\d+))?$")


def parse(path):
    rows = []
    with open(path) as f:
        for line in f:
            m = LINE.match(line.strip())
            if m:
                rows.append(dict(call=int(m.group(3)), stage=m.group(4), max_rel=float(m.group(6)),
                                 differ=float(m.group(8))))
    return rows


def frac(x):
    return "0" if x == 0 else f"{x:.1e}"


def forwards(rows):
    """{(call, kind, branch, n): [(order key, name, differ)]} of the forwards that carry more than their outputs."""
    out = {}
    for r in rows:
        m = FORWARD.match(r["stage"])
        if not m:
            continue
        kind, branch, n, name, layer = m.groups()
        if name not in FORWARD_ORDER:
            continue
        key = (FORWARD_ORDER.index(name), int(layer) if layer else -1)
        label = f"{name}.{layer}" if layer else name
        out.setdefault((r["call"], kind, branch, int(n)), []).append((key, label, r["differ"]))
    return {k: sorted(v) for k, v in out.items() if len(v) > 2}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("details")
    p.add_argument("--brief", action="store_true")
    args = p.parse_args()
    rows = parse(args.details)
    if not rows:
        print(f"{args.details}: no compared tensors")
        return 1
    calls = sorted({r["call"] for r in rows})
    if args.brief:
        for c in calls:
            heads = [r for r in rows if r["call"] == c and r["stage"].endswith(".head")]
            vel = [r for r in rows if r["call"] == c and r["stage"].endswith(".action_velocity")]
            act = [r for r in rows if r["call"] == c and r["stage"] == "actions"]
            worst = max((r["differ"] for r in heads), default=0.0)
            print(f"  c{c}: head differs in {sum(r['differ'] > 0 for r in heads)}/{len(heads)} forwards (worst "
                  f"{frac(worst)} of elements), action decoder {sum(r['differ'] > 0 for r in vel)}/{len(vel)}, "
                  f"actions max rel {act[0]['max_rel'] if act else '-'}")
        return 0
    for (c, kind, branch, n), stages in sorted(forwards(rows).items()):
        first = next((label for _, label, d in stages if d > 0), None)
        body = " ".join(f"{label} {frac(d)}" for _, label, d in stages)
        print(f"  c{c} {kind}.{branch}.{n}: first differing: {first or 'none'} | {body}")
    for c in calls:
        pol = {r["stage"]: r for r in rows if r["call"] == c and r["stage"] in POLICY_ORDER}
        pol.update({s: r for s, r in ((re.sub(r"\.\d+$", "", r["stage"]), r) for r in rows if r["call"] == c)
                    if s in ("velocity.cond", "velocity.uncond", "velocity.action") and
                    (s not in pol or r["differ"] > pol[s]["differ"])})
        body = " ".join(f"{s} {frac(pol[s]['differ'])}" for s in POLICY_ORDER if s in pol)
        act = pol.get("actions")
        print(f"  c{c} policy (fraction differing; velocities: the worst step): {body}"
              + (f" | actions max rel {act['max_rel']:.2e}" if act else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
