"""Where the reference rounds: a trace of the aten ops one policy call runs, with their dtypes.

Used by `reference_run.py --trace-ops FILE`. A TorchDispatchMode sees every aten op after autocast has
inserted its casts, so the trace shows exactly which intermediate results the reference keeps in bf16
and which in fp32 (the rounding points dzr's bf16 path must mirror to agree with it bit for bit).

Each op is attributed to the innermost module running it; the layer index of repeated blocks is normalized
(`blocks.7` -> `blocks.N`) and only the first invocation of each normalized path is kept, so the file lists one op
sequence per distinct module (e.g. one DiT block, one umT5 layer, one VAE residual block).
"""
import re
from collections import OrderedDict

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_SHORT = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16", torch.float64: "f64",
          torch.int64: "i64", torch.int32: "i32", torch.bool: "bool", torch.uint8: "u8",
          torch.complex64: "c64", torch.complex128: "c128"}
_SKIP = {"aten.detach.default", "aten.view.default", "aten._unsafe_view.default", "aten.t.default",
         "aten.transpose.int", "aten.permute.default", "aten.expand.default", "aten.unsqueeze.default",
         "aten.squeeze.dim", "aten.slice.Tensor", "aten.select.int", "aten.split.Tensor",
         "aten.split_with_sizes.default", "aten.unbind.int", "aten.alias.default", "aten.as_strided.default",
         "aten.chunk.default", "aten.reshape.default", "aten.squeeze.dims", "aten.empty.memory_format",
         "aten.lift_fresh.default", "aten._local_scalar_dense.default", "aten.is_same_size.default"}


def _desc(x):
    if isinstance(x, torch.Tensor):
        return f"{_SHORT.get(x.dtype, str(x.dtype))}{list(x.shape)}"
    if isinstance(x, (list, tuple)):
        inner = [_desc(v) for v in x if isinstance(v, torch.Tensor)]
        return "[" + ",".join(inner) + "]" if inner else None
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return f"{x:g}" if isinstance(x, float) else str(x)
    return None


class OpTracer(TorchDispatchMode):
    def __init__(self, root, max_ops_per_module=400):
        super().__init__()
        self.stack = ["head"]
        self.first = OrderedDict()  # normalized module path -> list of op lines (first invocation)
        self.done = set()  # normalized paths whose first invocation finished
        self.max_ops = max_ops_per_module
        self.handles = []
        self.prefix = ""
        for name, mod in root.named_modules():
            if not name:
                continue
            norm = re.sub(r"(blocks|transformer)\.\d+(?=\.|$)", r"\1.N", name)
            self.handles.append(mod.register_forward_pre_hook(self._enter(norm)))
            self.handles.append(mod.register_forward_hook(self._leave(norm)))

    def _enter(self, norm):
        def hook(_mod, _args):
            self.stack.append(norm)
        return hook

    def _leave(self, norm):
        def hook(_mod, _args, _out):
            if self.stack and self.stack[-1] == norm:
                self.stack.pop()
            self.done.add(norm)
        return hook

    def new_call(self, k):
        """Trace each module's first invocation again, under a `c<k>` prefix."""
        self.prefix = f"c{k} "
        self.done = set()

    def remove_hooks(self):
        for h in self.handles:
            h.remove()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = str(func)
        if name in _SKIP:
            return out
        where = self.stack[-1]
        if where in self.done and where != "head":
            return out
        ops = self.first.setdefault(self.prefix + where, [])
        if len(ops) < (self.max_ops * 10 if where == "head" else self.max_ops):
            ins = [d for d in (_desc(a) for a in args) if d is not None]
            for k, v in kwargs.items():
                d = _desc(v)
                if d is not None or k in ("dtype",):
                    ins.append(f"{k}={d if d is not None else v}")
            outs = _desc(out)
            ops.append(f"{name.replace('aten.', '')}({', '.join(ins)}) -> {outs}")
        return out

    def write(self, path, header=""):
        with open(path, "w") as f:
            if header:
                f.write(header.rstrip() + "\n")
            for where, ops in self.first.items():
                f.write(f"\n## {where}\n")
                for line in ops:
                    f.write(f"  {line}\n")
