#!/usr/bin/env python3
"""Checks dzr's one-way module layering over the `#include "..."` lines (docs/DESIGN.md, Modules).

lib/ modules sit on levels; a file may include its own module and modules of lower levels only:

    0 core
    1 backend, io           (io: files, images, video; only core below it)
    2 config, dataset       (config: plain configuration structs and their parsers; dataset: LeRobot datasets
                            through Arrow and FFmpeg, reached by apps only)
    3 weights, kv, sampling
    4 model
    5 policy
    6 rollout
    7 serve                 (dzr serve: the policy server on the rollout's engine and frame schedule)
    8 apps/                 (not in lib/: the CLI and its subcommand modules)

kernels/ (the CUDA kernels) may be included only by lib/backend/cuda/ and kernels/ itself, and the backend's
implementation folders (lib/backend/cpu/, lib/backend/cuda/) only from within lib/backend/ (and the tests).
Prints every violation as `file:line: includes "x" (module a, level i) from module b (level j)` and exits 1;
prints nothing and exits 0 when the tree is clean.
Usage: scripts/ci/check_layering.py [REPO_ROOT]
"""
import os
import re
import sys

LEVELS = {"core": 0, "backend": 1, "io": 1, "config": 2, "dataset": 2, "weights": 3, "kv": 3, "sampling": 3,
          "model": 4, "policy": 5, "rollout": 6, "serve": 7}
APPS_LEVEL = 8
INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')
SOURCES = (".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh")


def module_of(path):
    """(module, level) of a repository-relative source path, or None outside lib/, apps/ and kernels/."""
    parts = path.split("/")
    if parts[0] == "lib" and len(parts) > 2:
        return parts[1], LEVELS.get(parts[1])
    if parts[0] == "apps":
        return "apps", APPS_LEVEL
    if parts[0] == "kernels":
        return "kernels", None
    return None


def target_of(include):
    """(module, level) an include names: "backend/x.h" -> backend, "kernels/x.cuh" -> kernels."""
    head = include.split("/")[0]
    if head in LEVELS:
        return head, LEVELS[head]
    if head == "kernels":
        return "kernels", None
    if head == "apps":
        return "apps", APPS_LEVEL
    return None


def violations(root):
    out = []
    for top in ("lib", "apps", "kernels"):
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for name in sorted(files):
                if not name.endswith(SOURCES):
                    continue
                full = os.path.join(dirpath, name)
                rel = os.path.relpath(full, root).replace(os.sep, "/")
                src = module_of(rel)
                if src is None:
                    continue
                src_mod, src_level = src
                if src_mod not in ("apps", "kernels") and src_level is None:
                    out.append(f"{rel}: module lib/{src_mod} has no level in scripts/ci/check_layering.py")
                    continue
                with open(full, errors="replace") as f:
                    for lineno, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if not m:
                            continue
                        inc = m.group(1)
                        tgt = target_of(inc)
                        if tgt is None:
                            continue
                        tgt_mod, tgt_level = tgt
                        where = f"{rel}:{lineno}: includes \"{inc}\""
                        if tgt_mod == "kernels":
                            if src_mod != "kernels" and not rel.startswith("lib/backend/cuda/"):
                                out.append(f"{where}: kernels/ is reached only through lib/backend/cuda/")
                            continue
                        if src_mod == "kernels":
                            if tgt_mod != "core":
                                out.append(f"{where}: kernels/ may include only core/ and kernels/")
                            continue
                        if re.match(r"backend/(cpu|cuda)/", inc) and not rel.startswith("lib/backend/"):
                            out.append(f"{where}: a backend's implementation is private to lib/backend/")
                            continue
                        if tgt_mod == src_mod:
                            continue
                        if tgt_level >= src_level:
                            out.append(f"{where} (module {tgt_mod}, level {tgt_level}) from module {src_mod} "
                                       f"(level {src_level}): includes go to lower levels only")
    return out


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    bad = violations(os.path.abspath(root))
    for line in bad:
        print(line)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
