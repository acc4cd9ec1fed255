#!/usr/bin/env python3
"""Golden values of the official FlowUniPCMultistepScheduler for tests/unit/test_sampling_golden.cpp,
written to tests/data/sched_golden.json.

Runs the official scheduler file of a fetched copy of github.com/dreamzero0/dreamzero (commit ab790c1,
groot/vla/model/dreamzero/modules/flow_unipc_multistep_scheduler.py) on the CPU in float32:
  - diffusers is replaced by stubs (the scheduler only needs ConfigMixin/register_to_config storing the
    init arguments in self.config, SchedulerMixin, SchedulerOutput, KarrasDiffusionSchedulers);
  - the hard-coded device='cuda' of __init__ is replaced by 'cpu' in the source text before exec;
  - torch.compile is made a no-op (the two update helpers are decorated with it).
The scheduler is built as the policy head builds it (num_train_timesteps=1000, shift=1, then
set_timesteps(16, shift=5.0)) and stepped as the head's loop steps it (wan_flow_matching_action_tf.py
lines 1227-1305): on steps the DiT mask skips, the last computed velocity is reused and the scheduler
still steps. The mask for NUM_DIT_STEPS=8 is read from the head's source.

Each run stores: shape, mask, model ("fixed": v_i = base_i; "affine": v_i = base_i + 0.5 * x_i, a
velocity that depends on the sample the network sees), x_init, base (16 tensors), used (the velocity
passed to step() at each step) and samples (the sample after each step), all flattened float32.

Usage (needs torch only; no network):
    python3 scripts/parity/gen_sched_golden.py /path/to/dreamzero [--out PATH]
"""
import argparse
import dataclasses
import enum
import functools
import inspect
import json
import os
import re
import subprocess
import sys
import types

import torch

SCHEDULER = os.path.join("groot", "vla", "model", "dreamzero", "modules", "flow_unipc_multistep_scheduler.py")
HEAD = os.path.join("groot", "vla", "model", "dreamzero", "action_head", "wan_flow_matching_action_tf.py")


def install_diffusers_stubs():
    configuration_utils = types.ModuleType("diffusers.configuration_utils")
    scheduling_utils = types.ModuleType("diffusers.schedulers.scheduling_utils")

    class ConfigMixin:
        def register_to_config(self, **kwargs):
            for k, v in kwargs.items():
                setattr(self.config, k, v)

    def register_to_config(init):
        @functools.wraps(init)
        def wrapper(self, *args, **kwargs):
            bound = inspect.signature(init).bind(self, *args, **kwargs)
            bound.apply_defaults()
            config = dict(bound.arguments)
            config.pop("self")
            self.config = types.SimpleNamespace(**config)
            init(self, *args, **kwargs)

        return wrapper

    class SchedulerMixin:
        pass

    @dataclasses.dataclass
    class SchedulerOutput:
        prev_sample: torch.Tensor

    class KarrasDiffusionSchedulers(enum.Enum):
        Stub = 1

    configuration_utils.ConfigMixin = ConfigMixin
    configuration_utils.register_to_config = register_to_config
    scheduling_utils.SchedulerMixin = SchedulerMixin
    scheduling_utils.SchedulerOutput = SchedulerOutput
    scheduling_utils.KarrasDiffusionSchedulers = KarrasDiffusionSchedulers
    sys.modules["diffusers"] = types.ModuleType("diffusers")
    sys.modules["diffusers.configuration_utils"] = configuration_utils
    sys.modules["diffusers.schedulers"] = types.ModuleType("diffusers.schedulers")
    sys.modules["diffusers.schedulers.scheduling_utils"] = scheduling_utils


def load_scheduler_class(repo):
    path = os.path.join(repo, SCHEDULER)
    src = open(path).read()
    if "device='cuda'" not in src:
        raise SystemExit(f"{path}: the hard-coded device='cuda' was not found; check the patch")
    src = src.replace("device='cuda'", "device='cpu'")

    def no_compile(fn=None, **kwargs):
        return fn if fn is not None else (lambda f: f)

    torch.compile = no_compile
    install_diffusers_stubs()
    module = types.ModuleType("official_flow_unipc")
    module.__file__ = path
    exec(compile(src, path, "exec"), module.__dict__)
    return module.FlowUniPCMultistepScheduler


def dit8_mask(repo):
    path = os.path.join(repo, HEAD)
    src = open(path).read()
    m = re.search(r"elif num_dit_steps == 8:\s*\n\s*self\.dit_step_mask = (\[[^\]]*\])", src)
    if not m:
        raise SystemExit(f"{path}: could not find the NUM_DIT_STEPS=8 mask")
    return [v.strip() == "True" for v in m.group(1).strip("[]").split(",")]


def run(sched_cls, shape, mask, model, seed):
    sched = sched_cls(num_train_timesteps=1000, shift=1, use_dynamic_shifting=False)
    sched.set_timesteps(16, device="cpu", shift=5.0)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g, dtype=torch.float32)
    base = [torch.randn(shape, generator=g, dtype=torch.float32) for _ in range(16)]
    out = {"shape": list(shape), "mask": mask, "model": model, "x_init": x.flatten().tolist(),
           "base": [b.flatten().tolist() for b in base], "used": [], "samples": []}
    held = None
    for i, t in enumerate(sched.timesteps):
        if mask[i]:
            held = base[i] if model == "fixed" else base[i] + 0.5 * x
        assert held is not None, "step 0 must run"
        x = sched.step(model_output=held, timestep=t, sample=x, step_index=i, return_dict=False)[0]
        out["used"].append(held.flatten().tolist())
        out["samples"].append(x.flatten().tolist())
    return sched, out


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    default_out = os.path.normpath(os.path.join(here, "..", "..", "tests", "data", "sched_golden.json"))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("repo", help="a fetched copy of the official dreamzero repository")
    ap.add_argument("--out", default=default_out)
    ap.add_argument("--commit", help="the repository commit to record when REPO is not a git checkout")
    args = ap.parse_args()

    sched_cls = load_scheduler_class(args.repo)
    masks = {"all": [True] * 16, "dit8": dit8_mask(args.repo)}
    shapes = {"video": (1, 3, 2, 4), "action": (1, 6, 4)}
    runs = []
    seed = 1140
    sched = None
    for shape_name, shape in shapes.items():
        for mask_name, mask in masks.items():
            for model in ("fixed", "affine"):
                sched, r = run(sched_cls, shape, mask, model, seed)
                r["name"] = f"{shape_name}_{mask_name}_{model}"
                runs.append(r)
                seed += 1
    try:
        commit = subprocess.run(["git", "-C", args.repo, "rev-parse", "HEAD"], capture_output=True, text=True,
                                check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = args.commit or "unknown"
    golden = {
        "generator": "scripts/parity/gen_sched_golden.py",
        "torch": torch.__version__,
        "repo_commit": commit,
        "sigmas": sched.sigmas.tolist(),
        "timesteps": sched.timesteps.tolist(),
        "dit8_mask": masks["dit8"],
        "runs": runs,
    }
    tmp = args.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(golden, f, separators=(",", ":"))
    os.replace(tmp, args.out)
    print(f"wrote {args.out}: {len(runs)} runs, timesteps {golden['timesteps']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
