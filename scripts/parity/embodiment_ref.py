"""The official eval transform of an embodiment, for reference_run.py: frames -> canvas, raw state -> normalized
padded state, instruction -> templated text, normalized actions -> robot actions.

Everything numerical is the official code itself, taken out of the reference checkout with `ast` and run as is
(no copy lives in this repository), so that the modules' heavy imports (pydantic, albumentations, cv2, tree,
ftfy) are not needed:
  * Normalizer                          groot/vla/data/transform/state_action.py (forward / inverse per mode)
  * VideoToTensor.to_tensor, VideoToNumpy.to_numpy   groot/vla/data/transform/video.py
  * DreamTransform._prepare_video, collate           groot/vla/model/dreamzero/transform/dreamzero_cotrain.py
  * EmbodimentTag                       groot/vla/data/schema/embodiment_tags.py
VideoCrop / VideoResize in eval are torchvision's CenterCrop((int(h * scale), int(w * scale))) and
Resize((height, width), BILINEAR, antialias=True) (video.py get_transform), called directly. The relative ->
absolute step follows GrootSimPolicy.unapply (sim_policy.py): action.<key> + the raw state.<key>, in float64.

The description (cameras, keys, modes, relative keys, view size) is read from the checkpoint's
experiment_cfg/conf.yaml with PyYAML, independently of dzr; a checkpoint without one (the legacy DROID parity
checkpoints) takes the description dzr recorded in the inputs' manifest.
"""
import __future__
import ast
import importlib.util
import json
import types
from pathlib import Path


def _official(ref, rel_path, name, namespace, cls=None):
    """Runs the definition of `name` (a top-level function or class, or a method of class `cls`) from the
    official file in `namespace` and returns it."""
    path = Path(ref) / rel_path
    tree = ast.parse(path.read_text(), filename=str(path))
    body = tree.body
    if cls is not None:
        body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls).body
    node = next((n for n in body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == name), None)
    if node is None:
        raise SystemExit(f"{path}: no definition of {cls + '.' if cls else ''}{name}")
    node.decorator_list = []  # @staticmethod of the class body; called as a plain function here
    # NOTE: compiled with postponed annotations, so that the types it names (List, AutoTokenizer) need no import.
    code = compile(ast.Module(body=[node], type_ignores=[]), str(path), "exec",
                   flags=__future__.annotations.compiler_flag, dont_inherit=True)
    exec(code, namespace)
    return namespace[name]


def _embodiment_tag_enum(ref):
    path = Path(ref) / "groot/vla/data/schema/embodiment_tags.py"
    spec = importlib.util.spec_from_file_location("dzr_parity_embodiment_tags", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.EmbodimentTag


class Description:
    """What the official transform of one embodiment does, read from conf.yaml (or the manifest)."""

    def __init__(self, tag):
        self.tag = tag
        self.cameras, self.state, self.action = [], [], []  # keys without the group prefix
        self.modes = {}  # "state.key" -> mode
        self.relative = []
        self.crop_scale = 1.0
        self.view = None  # (height, width) of VideoResize
        self.max_state_dim = None
        self.mapping = None
        self.source = ""


def _from_conf(conf_path, tag):
    import yaml

    cfg = yaml.safe_load(Path(conf_path).read_text())
    transforms = cfg.get("transforms") or cfg.get("train_dataset", {}).get("all_transforms")
    if tag not in transforms:
        raise SystemExit(f"{conf_path}: no transforms for embodiment {tag} (it has {sorted(transforms)})")
    d = Description(tag)
    d.source = str(conf_path)
    for t in transforms[tag]["transforms"]:
        cls = t["_target_"].rsplit(".", 1)[-1]
        if cls == "ConcatTransform":
            d.cameras = [k.split(".", 1)[1] for k in t["video_concat_order"]]
            d.state = [k.split(".", 1)[1] for k in t.get("state_concat_order") or []]
            d.action = [k.split(".", 1)[1] for k in t.get("action_concat_order") or []]
        elif cls == "StateActionTransform":
            for k, mode in (t.get("normalization_modes") or {}).items():
                if k in t.get("apply_to", []):
                    d.modes[k] = mode
        elif cls == "VideoCrop":
            d.crop_scale = float(t["scale"])
        elif cls == "VideoResize":
            d.view = (int(t["height"]), int(t["width"]))
        elif cls == "DreamTransform":
            d.max_state_dim = int(t["max_state_dim"])
            d.mapping = dict(t.get("embodiment_tag_mapping") or {})
    if cfg.get("relative_action") or cfg.get("relative_action_per_horizon"):
        d.relative = list(cfg.get("relative_action_keys") or [])
    d.mapping = cfg.get("embodiment_tag_to_projector_index") or d.mapping
    return d


def _from_manifest(manifest, mapping_default):
    d = Description(manifest.get("embodiment", "oxe_droid"))
    d.source = "the inputs' manifest (dzr's description: the checkpoint has no experiment_cfg/conf.yaml)"
    d.cameras = list(manifest["cameras"])
    for group, keys in (("state", manifest.get("state_keys")), ("action", manifest.get("action_keys"))):
        if keys is None:  # inputs made before embodiments: DROID's
            keys = [{"key": "joint_position", "norm": "q99", "relative": group == "action"},
                    {"key": "gripper_position", "norm": "q99", "relative": False}]
        for k in keys:
            getattr(d, group).append(k["key"])
            if k["norm"] != "none":
                d.modes[f"{group}.{k['key']}"] = k["norm"]
            if k.get("relative"):
                d.relative.append(k["key"])
    d.crop_scale = 0.95
    d.mapping = mapping_default
    return d


class Embodiment:
    def __init__(self, ref, ckpt, manifest, max_state_dim, canvas):
        import numpy as np
        import torch

        self.np, self.torch = np, torch
        ns = {"torch": torch, "np": np, "numpy": np}
        self.Normalizer = _official(ref, "groot/vla/data/transform/state_action.py", "Normalizer", ns)
        self.to_tensor = _official(ref, "groot/vla/data/transform/video.py", "to_tensor", ns, cls="VideoToTensor")
        self.to_numpy = _official(ref, "groot/vla/data/transform/video.py", "to_numpy", ns, cls="VideoToNumpy")
        self.EmbodimentTag = _embodiment_tag_enum(ref)
        from einops import rearrange

        self.rearrange = rearrange
        cot = {"np": np, "torch": torch, "ast": ast, "EmbodimentTag": self.EmbodimentTag, "rearrange": rearrange}
        cot_file = "groot/vla/model/dreamzero/transform/dreamzero_cotrain.py"
        self.prepare_video = _official(ref, cot_file, "_prepare_video", cot, cls="DreamTransform")
        self.collate = _official(ref, cot_file, "collate", cot)
        mapping_default = self._base_mapping(ref)

        tag = manifest.get("embodiment", "oxe_droid")
        conf = Path(ckpt) / "experiment_cfg" / "conf.yaml"
        self.desc = _from_conf(conf, tag) if conf.exists() else _from_manifest(manifest, mapping_default)
        self.desc.mapping = self.desc.mapping or mapping_default
        self.max_state_dim = self.desc.max_state_dim or max_state_dim
        md = json.loads((Path(ckpt) / "experiment_cfg" / "metadata.json").read_text())[tag]
        self.stats, self.dims = md["statistics"], {}
        for group in ("state", "action"):
            mods = md.get("modalities", {}).get(group, {})
            for k in getattr(self.desc, group):
                shape = mods.get(k, {}).get("shape")
                self.dims[f"{group}.{k}"] = int(shape[0]) if shape else len(self.stats[group][k]["q01"])
        # the normalizer of each key with a mode, built as StateActionTransform.set_metadata builds it
        self.normalizers = {}
        for key, mode in self.desc.modes.items():
            group, k = key.split(".", 1)
            self.normalizers[key] = self.Normalizer(mode=mode, statistics=dict(self.stats[group][k]))
        if self.desc.view is None:  # the built-in descriptions leave the view size to the model's canvas
            f = 2 if len(self.desc.cameras) > 1 else 1
            self.desc.view = (canvas[0] // f, canvas[1] // f)
        self.embodiment_id = self.desc.mapping[tag]

    @staticmethod
    def _base_mapping(ref):
        import yaml

        base = Path(ref) / "groot/vla/configs/model/dreamzero/transform/base.yaml"
        return yaml.safe_load(base.read_text())["embodiment_tag_to_projector_index"]

    def describe(self):
        d = self.desc
        return (f"embodiment {d.tag} (projector index {self.embodiment_id}) from {d.source}: cameras {d.cameras}, "
                f"state {[(k, self.dims['state.' + k]) for k in d.state]}, action "
                f"{[(k, self.dims['action.' + k]) for k in d.action]}, relative {d.relative}, modes {d.modes}, "
                f"crop {d.crop_scale}, views {d.view}")

    def canvas(self, frames):
        """frames: per camera (in concatenation order) uint8 [T, H, W, 3] -> the head's images [T, H', W', 3]."""
        import torchvision.transforms.v2 as T

        np, torch = self.np, self.torch
        views = []
        for f in frames:
            x = self.to_tensor(f, output_on_cuda=False)  # [T, C, H, W] in [0, 1]
            h, w = x.shape[-2:]
            x = T.CenterCrop((int(h * self.desc.crop_scale), int(w * self.desc.crop_scale)))(x)
            x = T.Resize(self.desc.view, interpolation=T.InterpolationMode.BILINEAR, antialias=True)(x)
            views.append(self.to_numpy(x))  # [T, h, w, C] uint8
        video = np.stack(views, axis=-4)  # ConcatTransform: [T, V, h, w, C]
        this = types.SimpleNamespace(embodiment_tag=self.EmbodimentTag(self.desc.tag))
        images = self.prepare_video(this, {"video": video}).astype(np.uint8)  # [1, T, C, H, W] (or [V, T, C, h, w])
        return self.rearrange(images, "v t c h w -> (t v) h w c")

    def state(self, raw):
        """raw: key -> float64 [dim] -> the padded, normalized state [max_state_dim] (float64)."""
        np, torch = self.np, self.torch
        parts = []
        for k in self.desc.state:
            x = torch.from_numpy(np.asarray(raw[k], dtype=np.float64).reshape(1, -1))
            n = self.normalizers.get(f"state.{k}")
            parts.append(n.forward(x) if n else x)
        s = torch.cat(parts, dim=-1).numpy()[0] if parts else np.zeros(0)
        return np.pad(s, (0, self.max_state_dim - s.shape[0]))

    def prompt_text(self, prompt):
        """The templated instruction the official collate() tokenizes (before the tokenizer's cleaning)."""
        seen = []

        def tokenizer(values, return_mask=False, add_special_tokens=True):
            seen.extend(values)
            return None, None

        self.collate([{"text": prompt, "embodiment_id": self.embodiment_id}], tokenizer, num_views=3,
                     embodiment_tag_mapping=self.desc.mapping)
        return seen[0]

    def robot_actions(self, action_pred, raw_state):
        """action_pred: float32 [horizon, action_dim] normalized -> robot actions float32 [horizon, D]."""
        np, torch = self.np, self.torch
        out, start = [], 0
        for k in self.desc.action:
            d = self.dims[f"action.{k}"]
            x = torch.from_numpy(np.ascontiguousarray(action_pred[:, start:start + d], dtype=np.float32))
            start += d
            n = self.normalizers.get(f"action.{k}")
            a = (n.inverse(x) if n else x).numpy()
            if k in self.desc.relative and k in raw_state:
                a = a + np.asarray(raw_state[k], dtype=np.float64)[None, :]
            out.append(a)
        return np.concatenate(out, axis=1).astype(np.float32)
