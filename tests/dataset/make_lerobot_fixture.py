#!/usr/bin/env python3
"""Small, format-faithful LeRobot datasets for dzr's dataset reader, written with the real writers (pyarrow for
parquet, PyAV for mp4) in the layouts the real producers write.

Usage: make_lerobot_fixture.py KIND OUT_DIR [--episodes N] [--frames F1,F2,...] [--seed S] [--npy-dirs DIR]
                               [--size WxH] [--codec h264|av1] [--chunks-size N] [--episodes-per-file N]
                               [--video-episodes-per-file N] [--vector-type fixed|list|large_list]
                               [--timestamp-dtype float32|float64] [--index-column | --no-index-column]
                               [--agibot-modality config|converter] [--check] [--quiet]

KIND (robot_version):
  droid_v20   DreamZero-DROID-Data: what DreamZero's scripts/data/convert_droid.py writes (LeRobot v2.0 layout,
              polars parquet with zstd, H.264 320x180 15 fps, tasks.jsonl with "not provided" = 0, modality.json).
  agibot_v21  What DreamZero's scripts/data/convert_agibot.py writes through LeRobot v2.1 (episodes_stats.jsonl,
              AV1 at 30 fps, float32 state[20]/action[22], its quirks: "tasks": [] in episodes.jsonl, empty
              episode stats, total_tasks 0, features with both "video_info" and "info").
  droid_v30   The same DROID content recorded by LeRobot v3.0 (v0.4.0 LeRobotDataset.save_episode): many episodes
              per data/video file, meta/episodes/chunk-000/file-000.parquet, meta/tasks.parquet, stats.json.
  yam_v21     YAM as scripts/open_loop_yam.py reads it (v2.x layout; one 46-wide state/action vector, task as the
              string column annotation.task), written by the LeRobot v2.1 recorder.
  yam_v30, agibot_v30, droid_v21
              The same robots with the LeRobot v3.0 / v2.1 recorder (generic; no known producer to match).

--npy-dirs DIR additionally writes each episode as a dzr episode directory DIR/episode_{index:06d}/ (docs/FORMATS.md,
"Episode input"): <camera>.npy uint8 [T,H,W,3] decoded back from the written mp4 with PyAV (row t takes the frame
whose pts is nearest to the row's parquet timestamp, shifted by the episode's from_timestamp in v3.0; a tie takes the
earlier frame), the embodiment's state arrays as float64, actions.npy, and episode.yaml (prompt, fps).
--check reads everything back (pyarrow, PyAV) and verifies the invariants; it exits 1 on a mismatch.

Everything is deterministic for a given --seed (the AV1 bitstream may differ between SVT-AV1 builds). Needs
numpy, pyarrow and PyAV (whose wheels ship libx264 and libsvtav1). Sources of each layout fact are cited inline.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("SVT_LOG", "1")  # SVT-AV1 prints its configuration to stderr unless told otherwise

import av  # noqa: E402
import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

# ------------------------------------------------------------------------------------------------------------------
# Constants of the real writers
# ------------------------------------------------------------------------------------------------------------------

# LeRobot v2.0/v2.1 (lerobot/common/datasets/utils.py)
V2_DATA_PATH = "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet"
V2_VIDEO_PATH = "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4"
# LeRobot v3.0 (src/lerobot/datasets/utils.py)
CHUNK_FILE_PATTERN = "chunk-{chunk_index:03d}/file-{file_index:03d}"
V3_DATA_PATH = "data/" + CHUNK_FILE_PATTERN + ".parquet"
V3_VIDEO_PATH = "videos/{video_key}/" + CHUNK_FILE_PATTERN + ".mp4"
V3_EPISODES_PATH = "meta/episodes/" + CHUNK_FILE_PATTERN + ".parquet"
V3_TASKS_PATH = "meta/tasks.parquet"
DEFAULT_CHUNK_SIZE = 1000
V3_DATA_FILES_SIZE_IN_MB = 100
V3_VIDEO_FILES_SIZE_IN_MB = 500  # v0.4.0 (later versions: 200)
# DEFAULT_FEATURES of LeRobot v2.0 .. v3.0: merged into every dataset's features as {**features, **DEFAULT_FEATURES}
DEFAULT_FEATURES = {
    "timestamp": {"dtype": "float32", "shape": [1], "names": None},
    "frame_index": {"dtype": "int64", "shape": [1], "names": None},
    "episode_index": {"dtype": "int64", "shape": [1], "names": None},
    "index": {"dtype": "int64", "shape": [1], "names": None},
    "task_index": {"dtype": "int64", "shape": [1], "names": None},
}
DEFAULT_QUANTILES = [0.01, 0.10, 0.50, 0.90, 0.99]  # v3.0 compute_stats.py

KINDS = ["droid_v20", "droid_v21", "droid_v30", "agibot_v21", "agibot_v30", "yam_v21", "yam_v30"]


# ------------------------------------------------------------------------------------------------------------------
# Robots: features, modality.json, episode content
# ------------------------------------------------------------------------------------------------------------------

class Episode:
    """One episode's content: per-frame arrays, language, and how to draw its camera frames."""

    def __init__(self, index: int, length: int):
        self.index = index
        self.length = length
        self.state: np.ndarray | None = None
        self.action: np.ndarray | None = None
        self.columns: dict[str, np.ndarray] = {}  # robot-specific extra parquet columns, in writer order
        self.frame_task = ""  # the task string a LeRobot recorder gets per frame
        self.episode_tasks: list[str] = []  # DROID v2.0: the episode's instructions (episodes.jsonl "tasks")
        self.prompt = ""  # what a dzr episode.yaml gets
        self.success = True


def _smooth(rng: np.random.Generator, dim: int, center, amp, fmin=0.05, fmax=0.35):
    """A deterministic smooth function of time (seconds) -> [len(t), dim], full float64 precision."""
    center = np.broadcast_to(np.asarray(center, dtype=np.float64), (dim,)).copy()
    amp = np.broadcast_to(np.asarray(amp, dtype=np.float64), (dim,)) * rng.uniform(0.4, 1.0, dim)
    freq = rng.uniform(fmin, fmax, dim)
    phase = rng.uniform(0.0, 2 * np.pi, dim)
    freq2 = rng.uniform(fmax, 3 * fmax, dim)
    amp2 = amp * rng.uniform(0.05, 0.2, dim)

    def f(t):
        t = np.asarray(t, dtype=np.float64)[:, None]
        return center + amp * np.sin(2 * np.pi * freq * t + phase) + amp2 * np.sin(2 * np.pi * freq2 * t + 0.5 * phase)

    def df(t):
        t = np.asarray(t, dtype=np.float64)[:, None]
        return (amp * 2 * np.pi * freq * np.cos(2 * np.pi * freq * t + phase)
                + amp2 * 2 * np.pi * freq2 * np.cos(2 * np.pi * freq2 * t + 0.5 * phase))

    return f, df


def _gripper(rng: np.random.Generator, dim: int):
    """Smooth values in [0, 1] (0 open .. 1 closed) and their derivative."""
    freq = rng.uniform(0.15, 0.4, dim)
    phase = rng.uniform(0.0, 2 * np.pi, dim)

    def f(t):
        t = np.asarray(t, dtype=np.float64)[:, None]
        return 0.5 - 0.5 * np.cos(2 * np.pi * freq * t + phase)

    def df(t):
        t = np.asarray(t, dtype=np.float64)[:, None]
        return 0.5 * 2 * np.pi * freq * np.sin(2 * np.pi * freq * t + phase)

    return f, df


class Robot:
    name = ""
    fps = 15
    default_size = (320, 180)
    robot_type = ""
    cameras: list[str] = []

    def video_key(self, cam: str) -> str:
        return f"observation.images.{cam}"

    def features(self, width: int, height: int) -> dict:
        raise NotImplementedError

    def modality(self, args) -> dict:
        raise NotImplementedError

    def make_episodes(self, lengths: list[int], seed: int) -> tuple[list[Episode], list[str]]:
        """The episodes and the task table (task_index -> text) in the producer's order."""
        raise NotImplementedError

    def npy_arrays(self, state: np.ndarray, action: np.ndarray) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """dzr's per-frame files (docs/FORMATS.md, "Episode input") from the parquet rows: state arrays, actions."""
        raise NotImplementedError


class Droid(Robot):
    """DreamZero-DROID-Data (scripts/data/convert_droid.py of github.com/dreamzero0/dreamzero)."""
    name = "droid"
    fps = 15  # convert_droid.py --fps default 15
    default_size = (320, 180)  # DROID RLDS images are 180x320x3
    robot_type = "droid"
    # Image keys in the order TFDS lists the observation features (alphabetical).
    cameras = ["exterior_image_1_left", "exterior_image_2_left", "wrist_image_left"]
    state_keys = [("cartesian_position", 6), ("gripper_position", 1), ("joint_position", 7)]
    action_keys = [("cartesian_position", 6), ("cartesian_velocity", 6), ("gripper_position", 1),
                   ("gripper_velocity", 1), ("joint_position", 7), ("joint_velocity", 7)]
    lang_keys = ["language_instruction", "language_instruction_2", "language_instruction_3"]
    # (instruction, instruction_2, instruction_3) per episode; "" = missing. Episode 1 has no first instruction,
    # so its language_instruction (and task_index) is "not provided" and _2 holds the real one.
    LANGUAGE = [
        ("Put the marker in the cup", "Place the black marker inside the white mug", ""),
        ("", "Pick up the red block and put it in the bowl", ""),
        ("Open the top drawer", "Pull the drawer of the desk open", "open drawer"),
        ("Wipe the table with the towel", "", ""),
        ("Close the laptop lid", "Fold the laptop shut", "close laptop"),
    ]

    @staticmethod
    def _slices(keys):
        out, start = {}, 0
        for k, d in keys:
            out[k] = (start, start + d)
            start += d
        return out, start

    def features(self, width, height):
        # convert_droid.py, info["features"]: video features first, then state, action, scalars, annotations.
        s, ns = self._slices(self.state_keys)
        a, na = self._slices(self.action_keys)
        feats = {
            self.video_key(k): {
                "dtype": "video",
                "shape": [height, width, 3],
                "names": ["height", "width", "channel"],
                "video_info": {"video.fps": self.fps, "video.codec": "h264", "video.pix_fmt": "yuv420p",
                               "video.is_depth_map": False, "has_audio": False},
            } for k in self.cameras
        }
        feats["observation.state"] = {"dtype": "float64", "shape": [ns], "names": [k for k, _ in self.state_keys]}
        feats["action"] = {"dtype": "float64", "shape": [na], "names": [k for k, _ in self.action_keys]}
        feats.update({
            "timestamp": {"dtype": "float64", "shape": [1]},
            "task_index": {"dtype": "int64", "shape": [1]},
            "episode_index": {"dtype": "int64", "shape": [1]},
            "index": {"dtype": "int64", "shape": [1]},
            "next.reward": {"dtype": "float64", "shape": [1]},
            "next.done": {"dtype": "bool", "shape": [1]},
            "is_terminal": {"dtype": "bool", "shape": [1]},
            "is_first": {"dtype": "bool", "shape": [1]},
            "discount": {"dtype": "float64", "shape": [1]},
        })
        feats.update({f"annotation.language.{k}": {"dtype": "int64", "shape": [1]} for k in self.lang_keys})
        return feats

    def modality(self, args):
        # convert_droid.py concat_state_or_action(compute_concat_info=True): {"start", "end"} (+ "dtype" when not
        # float64); video: original_key; annotation: "language.<lang_key>": {}.
        s, _ = self._slices(self.state_keys)
        a, _ = self._slices(self.action_keys)
        return {
            "state": {k: {"start": v[0], "end": v[1]} for k, v in s.items()},
            "action": {k: {"start": v[0], "end": v[1]} for k, v in a.items()},
            "video": {k: {"original_key": self.video_key(k)} for k in self.cameras},
            "annotation": {f"language.{k}": {} for k in self.lang_keys},
        }

    def make_episodes(self, lengths, seed):
        # Task table as convert_droid.py builds it: "not provided" = 0, then every new instruction (len > 1) in
        # episode order, lang keys in order.
        tasks = {"not provided": 0}
        episodes = []
        for i, T in enumerate(lengths):
            lang = self.LANGUAGE[i % len(self.LANGUAGE)]
            if i >= len(self.LANGUAGE):  # keep every episode's instructions new (the converter drops repeats)
                lang = tuple(f"{x} (take {i // len(self.LANGUAGE) + 1})" if x else "" for x in lang)
            for text in lang:
                if text and len(text) > 1 and text not in tasks:
                    tasks[text] = len(tasks)
            ep = Episode(i, T)
            rng = np.random.default_rng([seed, 1, i])
            t = np.arange(T, dtype=np.float64) / self.fps
            tn = (np.arange(T, dtype=np.float64) + 1) / self.fps  # the action at t targets the next frame
            cart, dcart = _smooth(rng, 6, [0.45, 0.0, 0.35, np.pi - 0.2, 0.0, 0.1], [0.08, 0.15, 0.1, 0.15, 0.15, 0.4])
            grip, dgrip = _gripper(rng, 1)
            joint, djoint = _smooth(rng, 7, [0.0, -0.6, 0.0, -2.3, 0.0, 1.7, 0.8], [0.6, 0.4, 0.5, 0.4, 0.6, 0.4, 0.8])
            ep.state = np.concatenate([cart(t), grip(t), joint(t)], axis=1)
            ep.action = np.concatenate([cart(tn), dcart(tn), grip(tn), dgrip(tn), joint(tn), djoint(tn)], axis=1)
            ann = {k: np.full(T, tasks[text] if text and len(text) > 1 else tasks["not provided"], dtype=np.int64)
                   for k, text in zip(self.lang_keys, lang)}
            ep.episode_tasks = [text for text in lang if text and len(text) > 1]
            last = np.zeros(T, dtype=bool)
            last[-1] = True
            first = np.zeros(T, dtype=bool)
            first[0] = True
            reward = np.zeros(T, dtype=np.float32)  # RLDS: 1 on the final step of a successful demo
            reward[-1] = 1.0
            ep.columns = {
                "next.reward": reward,
                "next.done": last.copy(),
                "is_terminal": last.copy(),
                "is_first": first,
                "discount": np.ones(T, dtype=np.float32),
                **{f"annotation.language.{k}": v for k, v in ann.items()},
            }
            # convert_droid.py: task_index = annotation.language.language_instruction (0 = "not provided")
            ep.frame_task = next(k for k, v in tasks.items() if v == int(ann[self.lang_keys[0]][0]))
            ep.prompt = next(text for text in lang if text and len(text) > 1)  # first provided instruction
            ep.success = bool(np.any(reward != 0))
            episodes.append(ep)
        return episodes, list(tasks)

    def npy_arrays(self, state, action):
        s, _ = self._slices(self.state_keys)
        a, _ = self._slices(self.action_keys)
        # DreamZero oxe_droid: state.joint_position, state.gripper_position; action.joint_position then
        # action.gripper_position (base_48_wan_fine_aug_relative.yaml, modality_config_oxe_droid).
        arrays = {"joint_position": state[:, slice(*s["joint_position"])],
                  "gripper_position": state[:, slice(*s["gripper_position"])]}
        actions = np.concatenate([action[:, slice(*a["joint_position"])], action[:, slice(*a["gripper_position"])]],
                                 axis=1)
        return arrays, actions


class Agibot(Robot):
    """DreamZero-AgiBot (scripts/data/convert_agibot.py, groot/vla/configs/data/dreamzero/*agibot*)."""
    name = "agibot"
    fps = 30  # convert_agibot.py: AgiBotDataset.create(fps=30)
    default_size = (64, 48)  # the real videos are 640x480 (convert_agibot.py FEATURES)
    robot_type = "a2d"
    cameras = ["top_head", "hand_left", "hand_right"]
    # State (20): joint(14) + effector(2) + head(2) + waist(2); action (22): the same + robot velocity(2).
    # Key names of the training config (modality_config_agibot); convert_agibot.py's own modality.json splits
    # waist_position into waist_pitch (18:19) and waist_lift (19:20) (--agibot-modality converter).
    state_keys = [("left_arm_joint_position", 7), ("right_arm_joint_position", 7), ("left_effector_position", 1),
                  ("right_effector_position", 1), ("head_position", 2), ("waist_position", 2)]
    action_keys = state_keys + [("robot_velocity", 2)]
    MAIN_TASK = "Pick up the bottle and place it in the basket"
    SUBTASKS = ["Grasp the bottle with the right hand", "Lift the bottle", "Place the bottle in the basket",
                "Retract the right arm", "Grasp the bottle with the left hand"]
    DEFAULT_ACTION_TEXT = "N/A"  # convert_agibot.py default_action_text for unlabelled frames

    def features(self, width, height):
        # convert_agibot.py FEATURES (shape there is the real 480x640; here the fixture's size).
        vid = lambda: {"dtype": "video", "shape": [height, width, 3], "names": ["height", "width", "channel"],
                       "video_info": {"video.fps": float(self.fps), "video.codec": "av1", "video.pix_fmt": "yuv420p",
                                      "video.is_depth_map": False, "has_audio": False}}
        feats = {self.video_key(k): vid() for k in self.cameras}
        feats.update({
            "observation.state": {"dtype": "float32", "shape": [20]},
            "action": {"dtype": "float32", "shape": [22]},
            "annotation.language.action_text": {"dtype": "int64", "shape": [1], "names": None},
            "annotation.agibot.tasks": {"dtype": "int64", "shape": [1], "names": None},
            "episode_index": {"dtype": "int64", "shape": [1], "names": None},
            "frame_index": {"dtype": "int64", "shape": [1], "names": None},
            "index": {"dtype": "int64", "shape": [1], "names": None},
            "task_index": {"dtype": "int64", "shape": [1], "names": None},
        })
        return feats

    def modality(self, args):
        def entry(orig, start, end):
            return {"original_key": orig, "start": start, "end": end, "rotation_type": None, "absolute": True,
                    "dtype": "float64", "range": None}  # "float64" as the converter writes it (the data is float32)

        def keys(group, orig):
            out, start = {}, 0
            for k, d in group:
                if k == "waist_position" and args.agibot_modality == "converter":
                    out["waist_pitch"] = entry(orig, start, start + 1)
                    out["waist_lift"] = entry(orig, start + 1, start + 2)
                else:
                    out[k] = entry(orig, start, start + d)
                start += d
            return out

        return {
            "state": keys(self.state_keys, "observation.state"),
            "action": keys(self.action_keys, "action"),
            "video": {k: {"original_key": self.video_key(k)} for k in self.cameras},
            "annotation": {
                "language.action_text": {"original_key": "task_index"},
                "agibot.sub_task": {"original_key": "annotation.agibot.sub_task"},
                "frame_type": {"original_key": "annotation.frame_type"},
            },
        }

    def make_episodes(self, lengths, seed):
        episodes, texts = [], set()
        for i, T in enumerate(lengths):
            ep = Episode(i, T)
            rng = np.random.default_rng([seed, 2, i])
            t = np.arange(T, dtype=np.float64) / self.fps
            tn = (np.arange(T, dtype=np.float64) + 1) / self.fps
            arms, _ = _smooth(rng, 14, [0.0, -0.8, 0.3, 1.2, 0.0, 0.4, 0.0] * 2, 0.5)
            eff, _ = _gripper(rng, 2)
            head, _ = _smooth(rng, 2, [0.0, 0.3], [0.3, 0.15])
            waist, _ = _smooth(rng, 2, [0.5, 0.25], [0.1, 0.05])  # pitch (rad), lift (m)
            vel, _ = _smooth(rng, 2, [0.0, 0.0], [0.2, 0.1])
            st = lambda tt: np.concatenate([arms(tt), eff(tt), head(tt), waist(tt)], axis=1)
            ep.state = st(t).astype(np.float32)
            ep.action = np.concatenate([st(tn), vel(tn)], axis=1).astype(np.float32)
            # Per-frame sub-task text: a few labelled segments, unlabelled frames "N/A".
            cuts = np.sort(rng.choice(np.arange(2, T - 2), size=3, replace=False))
            seg = [self.SUBTASKS[(i + k) % len(self.SUBTASKS)] for k in range(2)]
            per_frame = [self.DEFAULT_ACTION_TEXT] * T
            for k, (a, b) in enumerate([(cuts[0], cuts[1]), (cuts[1], cuts[2])]):
                per_frame[a:b] = [seg[k]] * (b - a)
            texts.update(per_frame)
            ep.columns = {"_action_text": per_frame}
            ep.frame_task = self.MAIN_TASK
            ep.prompt = self.MAIN_TASK  # modality.json: language.action_text reads task_index
            episodes.append(ep)
        # convert_agibot.py create_tasks_jsonl: the main task first, then the sorted unique action texts.
        tasks = [self.MAIN_TASK] + sorted(texts - {self.MAIN_TASK})
        index = {t: i for i, t in enumerate(tasks)}
        for ep in episodes:
            per_frame = ep.columns.pop("_action_text")
            ep.columns = {
                "annotation.language.action_text": np.array([index[x] for x in per_frame], dtype=np.int64),
                "annotation.agibot.tasks": np.full(ep.length, index[self.MAIN_TASK], dtype=np.int64),
            }
        return episodes, tasks

    def npy_arrays(self, state, action):
        arrays, start = {}, 0
        for k, d in self.state_keys:
            arrays[k] = state[:, start:start + d].astype(np.float64)
            start += d
        # docs/FORMATS.md: actions [T, 22] = the six state keys then robot_velocity (the parquet's own order).
        return arrays, action.astype(np.float64)


class Yam(Robot):
    """YAM (scripts/open_loop_yam.py: STATE_SLICES/ACTION_SLICES of one wide vector, annotation.task strings)."""
    name = "yam"
    fps = 30  # yam_relative.yaml / docs/FORMATS.md
    default_size = (64, 48)
    robot_type = "yam"
    cameras = ["top_camera-images-rgb", "left_camera-images-rgb", "right_camera-images-rgb"]
    WIDTH = 46  # open_loop_yam.py slices end at 46; what 0:32 holds is unknown (filled with "extra" here)
    slices = {"extra": (0, 32), "left_gripper_pos": (32, 33), "right_gripper_pos": (33, 34),
              "left_joint_pos": (34, 40), "right_joint_pos": (40, 46)}
    TASKS = ["Fold the towel in half", "Stack the blue cup on the red cup", "Put the sponge in the sink"]

    def features(self, width, height):
        feats = {self.video_key(k): {"dtype": "video", "shape": [height, width, 3],
                                     "names": ["height", "width", "channels"]} for k in self.cameras}
        names = [f"{k}_{i}" if b - a > 1 else k for k, (a, b) in self.slices.items() for i in range(b - a)]
        feats["observation.state"] = {"dtype": "float32", "shape": [self.WIDTH], "names": names}
        feats["action"] = {"dtype": "float32", "shape": [self.WIDTH], "names": names}
        feats["annotation.task"] = {"dtype": "string", "shape": [1], "names": None}
        return feats

    def modality(self, args):
        sl = {k: {"start": a, "end": b} for k, (a, b) in self.slices.items() if k != "extra"}
        return {"state": sl, "action": json.loads(json.dumps(sl)),
                "video": {k: {"original_key": self.video_key(k)} for k in self.cameras},
                "annotation": {"task": {"original_key": "annotation.task"}}}

    def make_episodes(self, lengths, seed):
        episodes, tasks = [], []
        for i, T in enumerate(lengths):
            ep = Episode(i, T)
            rng = np.random.default_rng([seed, 3, i])
            t = np.arange(T, dtype=np.float64) / self.fps
            tn = (np.arange(T, dtype=np.float64) + 1) / self.fps
            extra, _ = _smooth(rng, 32, 0.0, 0.3)
            grip, _ = _gripper(rng, 2)
            joints, _ = _smooth(rng, 12, [0.0, 0.9, 0.7, 0.0, 0.2, 0.0] * 2, 0.4)
            vec = lambda tt: np.concatenate([extra(tt), grip(tt), joints(tt)], axis=1)
            ep.state = vec(t).astype(np.float32)
            ep.action = vec(tn).astype(np.float32)
            task = self.TASKS[i % len(self.TASKS)]
            if task not in tasks:
                tasks.append(task)
            ep.columns = {"annotation.task": np.array([task] * T, dtype=object)}
            ep.frame_task = ep.prompt = task
            episodes.append(ep)
        return episodes, tasks

    def npy_arrays(self, state, action):
        get = lambda x, k: x[:, slice(*self.slices[k])].astype(np.float64)
        order = ["left_joint_pos", "left_gripper_pos", "right_joint_pos", "right_gripper_pos"]
        arrays = {k: get(state, k) for k in order}
        return arrays, np.concatenate([get(action, k) for k in order], axis=1)


ROBOTS = {"droid": Droid(), "agibot": Agibot(), "yam": Yam()}


# ------------------------------------------------------------------------------------------------------------------
# Camera frames
# ------------------------------------------------------------------------------------------------------------------

def synth_frames(robot: Robot, cam_index: int, ep: Episode, width: int, height: int, seed: int) -> np.ndarray:
    """uint8 RGB [T, H, W, 3]: per-camera/episode gradients, a moving square and disc, a fixed noise texture and
    mild per-frame noise; every frame differs, so a wrong frame, a colour-matrix or a chroma error shows."""
    rng = np.random.default_rng([seed, 100 + cam_index, ep.index, len(robot.name)])
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    texture = rng.normal(0.0, 2.0, (height, width, 3)).astype(np.float32)
    ph = 0.9 * ep.index + 1.7 * cam_index
    sx, sy = width / 320.0, height / 180.0
    out = np.empty((ep.length, height, width, 3), dtype=np.uint8)
    s = max(4, min(width, height) // 4)
    rad = max(3, min(width, height) // 6)
    for t in range(ep.length):
        r = 128 + 90 * np.sin((x / sx + 3 * t) / (27.0 + 6 * cam_index) + ph)
        g = 128 + 90 * np.sin((y / sy - 2 * t) / 21.0 + x / (69.0 * sx) + ph)
        b = (x * 255.0 / width + y * 255.0 / height + 11 * t + 40 * cam_index + 25 * ep.index) % 256
        img = np.stack([r, g, b], axis=-1) + texture
        x0, y0 = (4 * t + 13 * cam_index) % (width - s), (3 * t + 7 * ep.index) % (height - s)
        img[y0:y0 + s, x0:x0 + s] = [230 - 30 * cam_index, 40 + 50 * ep.index % 200, 60]
        cx, cy = (width - 1) * (0.5 + 0.35 * np.sin(0.21 * t + ph)), (height - 1) * (0.5 + 0.3 * np.cos(0.17 * t))
        img[(x - cx) ** 2 + (y - cy) ** 2 < rad * rad] = [20, 200, 230 - 40 * cam_index]
        img += rng.normal(0.0, 1.5, img.shape).astype(np.float32)
        out[t] = np.clip(np.rint(img), 0, 255).astype(np.uint8)
    return out


# ------------------------------------------------------------------------------------------------------------------
# Video writers (PyAV)
# ------------------------------------------------------------------------------------------------------------------

def encode_dreamzero_h264(frames: np.ndarray, path: Path, fps: int) -> None:
    """convert_droid.py encode_video: codec "h264" (libx264) with these options, one rgb24 VideoFrame refilled per
    frame (pts assigned by the encoder), yuv420p."""
    options = {"threads": "1", "thread_type": "slice", "preset": "ultrafast", "tune": "zerolatency", "crf": "23"}
    path.parent.mkdir(parents=True, exist_ok=True)
    container = av.open(str(path), mode="w")
    stream = container.add_stream("h264", rate=fps, options=options)
    stream.width = frames.shape[2]
    stream.height = frames.shape[1]
    stream.pix_fmt = "yuv420p"
    video_frame = av.VideoFrame(width=stream.width, height=stream.height, format="rgb24")
    frame_array = video_frame.to_ndarray(format="rgb24")
    assert np.shares_memory(frame_array, np.asarray(video_frame.planes[0])), "PyAV to_ndarray no longer a view"
    for frame in frames:
        frame_array[:] = frame
        container.mux(stream.encode(video_frame))
    container.mux(stream.encode(None))
    container.close()


def encode_lerobot(frames: np.ndarray, path: Path, fps: int, vcodec: str, g: int | None = 2,
                   crf: int | None = 30) -> None:
    """LeRobot v3.0 encode_video_frames (video_utils.py): add_stream(vcodec, fps, options={g, crf}), yuv420p,
    rgb24 frames from the PNGs (the v2.1 recorder runs the ffmpeg CLI with the same -vcodec/-pix_fmt/-g/-crf)."""
    options = {}
    if g is not None:
        options["g"] = str(g)
    if crf is not None:
        options["crf"] = str(crf)
    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), "w") as output:
        stream = output.add_stream(vcodec, fps, options=options)
        stream.pix_fmt = "yuv420p"
        stream.width = frames.shape[2]
        stream.height = frames.shape[1]
        for f in frames:
            output.mux(stream.encode(av.VideoFrame.from_ndarray(f, format="rgb24")))
        output.mux(stream.encode())


def concatenate_video_files(inputs: list[Path], output: Path) -> None:
    """LeRobot v3.0 concatenate_video_files: ffconcat demuxer, stream copy, movflags=faststart."""
    with tempfile.NamedTemporaryFile(mode="w", suffix=".ffconcat", delete=False) as f:
        f.write("ffconcat version 1.0\n")
        for p in inputs:
            f.write(f"file '{str(Path(p).resolve())}'\n")
        concat_path = f.name
    src = av.open(concat_path, mode="r", format="concat", options={"safe": "0"})
    with tempfile.NamedTemporaryFile(suffix=".mp4", delete=False) as f:
        tmp_out = f.name
    dst = av.open(tmp_out, mode="w", format="mp4", options={"movflags": "faststart"})
    stream_map = {}
    for s in src.streams:
        if s.type in ("video", "audio", "subtitle"):
            stream_map[s.index] = dst.add_stream_from_template(template=s, opaque=True)
            stream_map[s.index].time_base = s.time_base
    for packet in src.demux():
        if packet.stream.index not in stream_map or packet.dts is None:
            continue
        packet.stream = stream_map[packet.stream.index]
        dst.mux(packet)
    src.close()
    dst.close()
    shutil.move(tmp_out, output)
    Path(concat_path).unlink()


def video_duration_s(path: Path) -> float:
    """LeRobot v3.0 get_video_duration_in_s."""
    with av.open(str(path)) as c:
        vs = c.streams.video[0]
        if vs.duration is not None:
            return float(vs.duration * vs.time_base)
        return float(c.duration / av.time_base)


def video_info_v30(path: Path) -> dict:
    """LeRobot v3.0 get_video_info (PyAV): the feature's "info"."""
    with av.open(str(path)) as c:
        vs = c.streams.video[0]
        info = {
            "video.height": vs.height,
            "video.width": vs.width,
            "video.codec": vs.codec_context.codec.canonical_name,
            "video.pix_fmt": vs.pix_fmt,
            "video.is_depth_map": False,
            "video.fps": int(vs.base_rate),
            "video.channels": 3,
        }
        has_audio = len(c.streams.audio) > 0
    info["has_audio"] = has_audio
    return info


def video_info_v21(path: Path) -> dict:
    """LeRobot v2.1 get_video_info (ffprobe: r_frame_rate as num / den, codec_name, pix_fmt), same fields and order."""
    with av.open(str(path)) as c:
        vs = c.streams.video[0]
        rate = vs.base_rate
        info = {
            "video.fps": rate.numerator / rate.denominator,
            "video.height": vs.height,
            "video.width": vs.width,
            "video.channels": 3,
            "video.codec": vs.codec_context.codec.canonical_name,
            "video.pix_fmt": vs.pix_fmt,
            "video.is_depth_map": False,
            "has_audio": len(c.streams.audio) > 0,
        }
    return info


def decode_all(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Every frame as PyAV's frame.to_ndarray(format="rgb24") and its pts in seconds."""
    frames, pts = [], []
    with av.open(str(path)) as c:
        for fr in c.decode(video=0):
            frames.append(fr.to_ndarray(format="rgb24"))
            pts.append(float(fr.pts * fr.time_base))
    return np.stack(frames), np.asarray(pts, dtype=np.float64)


def nearest_frames(pts: np.ndarray, query: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Index of the frame nearest to each query time (argmin: a tie goes to the earlier frame) and the distance."""
    d = np.abs(pts[None, :] - query[:, None])
    idx = np.argmin(d, axis=1)
    return idx, d[np.arange(len(query)), idx]


# ------------------------------------------------------------------------------------------------------------------
# Parquet helpers
# ------------------------------------------------------------------------------------------------------------------

def arrow_type(dtype: str) -> pa.DataType:
    return {"float32": pa.float32(), "float64": pa.float64(), "int64": pa.int64(), "int32": pa.int32(),
            "bool": pa.bool_(), "string": pa.string()}[dtype]


def vector_array(values: np.ndarray, vector_type: str) -> pa.Array:
    """[T, D] -> a list column: fixed_size_list (HF datasets Sequence(length=D), polars Array), list or large_list."""
    T, D = values.shape
    flat = pa.array(values.reshape(-1))
    if vector_type == "fixed":
        return pa.FixedSizeListArray.from_arrays(flat, D)
    offsets = np.arange(0, T * D + 1, D, dtype=np.int64 if vector_type == "large_list" else np.int32)
    cls = pa.LargeListArray if vector_type == "large_list" else pa.ListArray
    return cls.from_arrays(pa.array(offsets), flat)


def hf_features_metadata(features: dict) -> bytes:
    """The "huggingface" schema metadata HF datasets (3.x) writes: Value / Sequence(length) per non-video feature."""
    out = {}
    for k, ft in features.items():
        if ft["dtype"] in ("video", "image"):
            continue
        value = {"dtype": ft["dtype"], "_type": "Value"}
        out[k] = value if list(ft["shape"]) == [1] else {"feature": value, "length": ft["shape"][0], "_type": "Sequence"}
    return json.dumps({"info": {"features": out}}).encode()


def episode_table(features: dict, ep: Episode, columns: dict, vector_type: str, hf_meta: bool) -> pa.Table:
    """An episode's rows in feature order (the LeRobot recorders' hf_features order), typed by the features."""
    arrays, fields = [], []
    for k, ft in features.items():
        if ft["dtype"] in ("video", "image"):
            continue
        v = columns[k]
        if list(ft["shape"]) == [1]:
            arr = pa.array(v, type=arrow_type(ft["dtype"])) if ft["dtype"] == "string" else \
                pa.array(np.asarray(v).astype(ft["dtype"]))
        else:
            arr = vector_array(np.asarray(v).astype(ft["dtype"]), vector_type)
        arrays.append(arr)
        fields.append(pa.field(k, arr.type))
    schema = pa.schema(fields, metadata={b"huggingface": hf_features_metadata(features)} if hf_meta else None)
    return pa.Table.from_arrays(arrays, schema=schema)


def compression(args, default: str):
    """--compression, else the writer's default; "none" writes uncompressed pages."""
    c = args.compression or default
    return None if c == "none" else c


def write_json(data, path: Path, ensure_ascii: bool = False) -> None:
    """LeRobot write_json: json.dump(indent=4, ensure_ascii=False) (DreamZero's converters: ensure_ascii default)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        json.dump(data, f, indent=4, ensure_ascii=ensure_ascii)


def write_jsonl(rows: list[dict], path: Path, ensure_ascii: bool = False) -> None:
    """jsonlines.Writer default (LeRobot v2.x): one json.dumps per line, ensure_ascii=False, default separators."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=ensure_ascii) + "\n")


# ------------------------------------------------------------------------------------------------------------------
# Statistics (LeRobot compute_episode_stats)
# ------------------------------------------------------------------------------------------------------------------

def feature_stats(array: np.ndarray, is_image: bool, quantiles: bool) -> dict:
    if is_image:  # [N, H, W, 3] uint8 -> per channel (3, 1, 1) in [0, 1]
        flat = array.reshape(-1, 3).astype(np.float64)
        shape = (3, 1, 1)
        # NOTE: the same values as LeRobot's float64 min/max/quantiles over axis 0, computed on one contiguous row per
        # channel (exact: order statistics), with the five quantiles in one partition: 3x faster
        rows = np.ascontiguousarray(array.reshape(-1, 3).T)
        st = {"min": rows.min(1).astype(np.float64), "max": rows.max(1).astype(np.float64), "mean": flat.mean(0),
              "std": flat.std(0)}
        if quantiles:
            qs = np.quantile(rows.astype(np.float64), DEFAULT_QUANTILES, axis=1)
            st.update({f"q{int(q * 100):02d}": qs[i] for i, q in enumerate(DEFAULT_QUANTILES)})
        st = {k: (v / 255.0).reshape(shape) for k, v in st.items()}
        st["count"] = np.array([len(array)])
        return {k: st[k] for k in ["min", "max", "mean", "std", "count"] + [k for k in st if k.startswith("q")]}
    a = array.astype(np.float64) if array.dtype == bool else array
    a2 = a.reshape(len(a), -1)
    st = {"min": a2.min(0), "max": a2.max(0), "mean": a2.mean(0), "std": a2.std(0), "count": np.array([len(a)])}
    if quantiles:
        st.update({f"q{int(q * 100):02d}": np.quantile(a2, q, axis=0) for q in DEFAULT_QUANTILES})
    return st


def episode_stats(features: dict, columns: dict, frames: dict, quantiles: bool) -> dict:
    out = {}
    for k, ft in features.items():
        if ft["dtype"] == "string":
            continue
        if ft["dtype"] in ("video", "image"):
            n = len(frames[k])
            idx = np.round(np.linspace(0, n - 1, min(n, max(100, min(int(n ** 0.75), 10000))))).astype(int)
            out[k] = feature_stats(frames[k][idx], True, quantiles)
        else:
            out[k] = feature_stats(np.asarray(columns[k]), False, quantiles)
    return out


def aggregate_stats(stats_list: list[dict]) -> dict:
    out = {}
    for k in stats_list[0]:
        ss = [s[k] for s in stats_list]
        means = np.stack([s["mean"] for s in ss])
        var = np.stack([s["std"] ** 2 for s in ss])
        counts = np.stack([s["count"] for s in ss]).astype(np.float64)
        total = counts.sum(0)
        c = counts
        while c.ndim < means.ndim:
            c = c[..., None]
        mean = (means * c).sum(0) / total
        std = np.sqrt(((var + (means - mean) ** 2) * c).sum(0) / total)
        agg = {"min": np.min(np.stack([s["min"] for s in ss]), 0), "max": np.max(np.stack([s["max"] for s in ss]), 0),
               "mean": mean, "std": std, "count": total.astype(np.int64)}
        for q in [q for q in ss[0] if q.startswith("q")]:
            agg[q] = (np.stack([s[q] for s in ss]) * c).sum(0) / total
        out[k] = agg
    return out


def to_json(stats: dict) -> dict:
    return {k: {s: np.asarray(v).tolist() for s, v in st.items()} for k, st in stats.items()}


# ------------------------------------------------------------------------------------------------------------------
# Writers
# ------------------------------------------------------------------------------------------------------------------

class Writer:
    def __init__(self, robot: Robot, args):
        self.robot = robot
        self.args = args
        self.width, self.height = args.size
        self.out = Path(args.out_dir)
        self.episodes, self.tasks = robot.make_episodes(args.lengths, args.seed)
        self.task_index = {t: i for i, t in enumerate(self.tasks)}
        self._frames_cache: dict[tuple[int, int], np.ndarray] = {}

    def frames(self, cam_index: int, ep: Episode) -> np.ndarray:
        key = (cam_index, ep.index)
        if key not in self._frames_cache:
            self._frames_cache = {k: v for k, v in self._frames_cache.items() if k[1] == ep.index}
            self._frames_cache[key] = synth_frames(self.robot, cam_index, ep, self.width, self.height, self.args.seed)
        return self._frames_cache[key]

    def log(self, msg: str) -> None:
        if not self.args.quiet:
            print(msg)

    # --- shared pieces of the LeRobot recorders -------------------------------------------------------------
    def recorder_features(self, keep_video_info: bool = False) -> dict:
        """features as the LeRobot recorders store them: {**features, **DEFAULT_FEATURES} (existing keys keep their
        place and take the default's value; new ones are appended)."""
        feats = self.robot.features(self.width, self.height)
        if not keep_video_info:
            for ft in feats.values():
                ft.pop("video_info", None)
        merged = {**feats, **json.loads(json.dumps(DEFAULT_FEATURES))}
        if self.args.timestamp_dtype:
            merged["timestamp"]["dtype"] = self.args.timestamp_dtype
        return merged

    def recorder_columns(self, ep: Episode, features: dict, first_index: int) -> dict:
        """LeRobotDataset.add_frame + save_episode: frame_index, timestamp = frame_index / fps, index,
        episode_index, task_index (of the frame's task)."""
        T = ep.length
        cols = {"observation.state": ep.state, "action": ep.action, **ep.columns,
                "timestamp": np.arange(T) / self.robot.fps,
                "frame_index": np.arange(T, dtype=np.int64),
                "episode_index": np.full(T, ep.index, dtype=np.int64),
                "index": np.arange(first_index, first_index + T, dtype=np.int64),
                "task_index": np.full(T, self.task_index[ep.frame_task], dtype=np.int64)}
        missing = [k for k, ft in features.items() if ft["dtype"] not in ("video", "image") and k not in cols]
        assert not missing, missing
        return cols

    def video_codec(self) -> str:
        return {"av1": "libsvtav1", "h264": "h264"}[self.args.codec or "av1"]

    def write_modality(self) -> None:
        write_json(self.robot.modality(self.args), self.out / "meta/modality.json", ensure_ascii=True)

    # --- results for --npy-dirs / --check ---------------------------------------------------------------------
    def record(self, ep: Episode, timestamps: np.ndarray, video_files: dict, from_ts: dict, state, action):
        self.written.append({"ep": ep, "timestamps": np.asarray(timestamps, dtype=np.float64), "videos": video_files,
                             "from_ts": from_ts, "state": state, "action": action})


class DreamZeroDroidV20(Writer):
    """scripts/data/convert_droid.py of DreamZero, output as is (LeRobot v2.0 layout, polars parquet)."""

    def write(self):
        r, a = self.robot, self.args
        self.written = []
        chunks = a.chunks_size
        self.write_modality()
        write_jsonl([{"task_index": i, "task": t} for i, t in enumerate(self.tasks)], self.out / "meta/tasks.jsonl",
                    ensure_ascii=True)
        ep_rows = []
        for ep in self.episodes:
            T = ep.length
            chunk = ep.index // chunks
            ts_dtype = a.timestamp_dtype or "float64"  # np.arange(n) / fps
            cols = {
                "observation.state": vector_array(ep.state, a.vector_type),
                "action": vector_array(ep.action, a.vector_type),
                "next.reward": pa.array(ep.columns["next.reward"]),
                "next.done": pa.array(ep.columns["next.done"]),
                "is_terminal": pa.array(ep.columns["is_terminal"]),
                "is_first": pa.array(ep.columns["is_first"]),
                "discount": pa.array(ep.columns["discount"]),
                "timestamp": pa.array((np.arange(T) / r.fps).astype(ts_dtype)),
                "episode_index": pa.array(np.full(T, ep.index, dtype=np.int64)),
                "frame_index": pa.array(np.arange(T, dtype=np.int64)),
                **{f"annotation.language.{k}": pa.array(ep.columns[f"annotation.language.{k}"]) for k in r.lang_keys},
                "task_index": pa.array(ep.columns["annotation.language.language_instruction"].copy()),
            }
            if a.index_column:  # not written by the converter (its features declare "index" anyway)
                first = sum(e.length for e in self.episodes[:ep.index])
                cols["index"] = pa.array(np.arange(first, first + T, dtype=np.int64))
            path = self.out / V2_DATA_PATH.format(episode_chunk=chunk, episode_index=ep.index)
            path.parent.mkdir(parents=True, exist_ok=True)
            # polars DataFrame.write_parquet defaults: zstd, one row group for a small frame.
            pq.write_table(pa.table(cols), path, compression=compression(a, "zstd"))
            videos = {}
            for ci, cam in enumerate(r.cameras):
                vk = r.video_key(cam)
                vpath = self.out / V2_VIDEO_PATH.format(episode_chunk=chunk, video_key=vk, episode_index=ep.index)
                if a.codec in (None, "h264"):
                    encode_dreamzero_h264(self.frames(ci, ep), vpath, r.fps)
                else:
                    encode_lerobot(self.frames(ci, ep), vpath, r.fps, self.video_codec())
                videos[cam] = vpath
            ep_rows.append({"episode_index": ep.index, "tasks": ep.episode_tasks, "length": T, "success": ep.success})
            self.record(ep, (np.arange(T) / r.fps).astype(ts_dtype), videos, {c: 0.0 for c in r.cameras},
                        ep.state, ep.action)
            self.log(f"  episode {ep.index}: {T} frames -> {path.relative_to(self.out)}")
        write_jsonl(ep_rows, self.out / "meta/episodes.jsonl", ensure_ascii=True)
        n = len(self.episodes)
        num_chunks = (n // chunks) + (1 if n % chunks else 0)
        feats = r.features(self.width, self.height)
        if a.codec == "av1":
            for k in r.cameras:
                feats[r.video_key(k)]["video_info"]["video.codec"] = "av1"
        if a.timestamp_dtype:
            feats["timestamp"]["dtype"] = a.timestamp_dtype
        info = {
            "codebase_version": "v2.0",
            "robot_type": r.robot_type,
            "total_episodes": n,
            "total_frames": sum(e.length for e in self.episodes),
            "total_tasks": len(self.tasks),
            "total_videos": len(r.cameras),  # sic: the converter counts cameras, not files
            "total_chunks": num_chunks,
            "chunks_size": chunks,
            "fps": r.fps,
            "splits": {"train": "0:100"},  # sic: hard-coded in convert_droid.py
            "data_path": V2_DATA_PATH,
            "video_path": V2_VIDEO_PATH,
            "features": feats,
        }
        write_json(info, self.out / "meta/info.json", ensure_ascii=True)


class LeRobotV21(Writer):
    """LeRobot v2.1 recorder (lerobot/common/datasets/lerobot_dataset.py @ 1c15bab), with convert_agibot.py's
    save_episode override for AgiBot."""

    def write(self):
        r, a = self.robot, self.args
        self.written = []
        agibot = r.name == "agibot"
        features = self.recorder_features(keep_video_info=agibot)
        chunks = a.chunks_size
        self.write_modality()
        if agibot:  # create_tasks_jsonl (json.dumps, ensure_ascii) before any episode; meta never adds tasks
            write_jsonl([{"task_index": i, "task": t} for i, t in enumerate(self.tasks)],
                        self.out / "meta/tasks.jsonl", ensure_ascii=True)
        ep_rows, stats_rows = [], []
        total_frames = 0
        for ep in self.episodes:
            T = ep.length
            chunk = ep.index // chunks
            cols = self.recorder_columns(ep, features, total_frames)
            table = episode_table(features, ep, cols, a.vector_type, hf_meta=True)
            path = self.out / V2_DATA_PATH.format(episode_chunk=chunk, episode_index=ep.index)
            path.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(table, path, compression=compression(a, "snappy"))  # datasets.Dataset.to_parquet
            videos, frames = {}, {}
            for ci, cam in enumerate(r.cameras):
                vk = r.video_key(cam)
                vpath = self.out / V2_VIDEO_PATH.format(episode_chunk=chunk, video_key=vk, episode_index=ep.index)
                # AgiBot: the source's AV1 files are copied (their GOP is unknown; 1 s here); else encode_video_frames.
                encode_lerobot(self.frames(ci, ep), vpath, r.fps, self.video_codec(), g=30 if agibot else 2)
                videos[cam] = vpath
                frames[vk] = self.frames(ci, ep)
            if agibot:
                # convert_agibot.py: self.meta.save_episode(episode_index, episode_length, [], {})
                ep_rows.append({"episode_index": ep.index, "tasks": [], "length": T})
                stats_rows.append({"episode_index": ep.index, "stats": {}})
            else:
                ep_rows.append({"episode_index": ep.index, "tasks": [ep.frame_task], "length": T})
                stats = episode_stats(features, cols, frames, quantiles=False)
                stats_rows.append({"episode_index": ep.index, "stats": to_json(stats)})
            self.record(ep, table.column("timestamp").to_numpy(), videos, {c: 0.0 for c in r.cameras},
                        ep.state, ep.action)
            total_frames += T
            self.log(f"  episode {ep.index}: {T} frames -> {path.relative_to(self.out)}")
        if not agibot:
            # The recorder's meta.add_task numbers tasks in the order they are added; all of them are added up
            # front (as for v3.0), so that annotation columns holding task indices resolve.
            write_jsonl([{"task_index": self.task_index[t], "task": t} for t in self.tasks],
                        self.out / "meta/tasks.jsonl")
        write_jsonl(ep_rows, self.out / "meta/episodes.jsonl")
        write_jsonl(stats_rows, self.out / "meta/episodes_stats.jsonl")
        for cam in r.cameras:  # update_video_info: ffprobe of episode 0's file
            features[r.video_key(cam)]["info"] = video_info_v21(self.written[0]["videos"][cam])
        n = len(self.episodes)
        info = {
            "codebase_version": "v2.1",
            "robot_type": r.robot_type,
            "total_episodes": n,
            "total_frames": total_frames,
            "total_tasks": 0 if agibot else len(self.tasks),  # AgiBot: the meta never saw a task
            "total_videos": n * len(r.cameras),
            "total_chunks": (n - 1) // chunks + 1,
            "chunks_size": chunks,
            "fps": r.fps,
            "splits": {"train": f"0:{n}"},
            "data_path": V2_DATA_PATH,
            "video_path": V2_VIDEO_PATH,
            "features": features,
        }
        write_json(info, self.out / "meta/info.json")


class LeRobotV30(Writer):
    """LeRobot v3.0 recorder (src/lerobot/datasets/lerobot_dataset.py @ v0.4.0): save_episode_tasks,
    _save_episode_data (ParquetWriter, one write_table per episode), _save_episode_video (encode, then move or
    concatenate), meta._save_episode_metadata (buffered pa.Table.from_pydict rows)."""

    def write(self):
        r, a = self.robot, self.args
        self.written = []
        features = self.recorder_features()
        chunks = a.chunks_size
        self.write_modality()
        # All tasks are registered up front (meta.save_episode_tasks), so that annotation columns holding task
        # indices (DROID language_instruction_2/_3, AgiBot action_text) resolve in meta/tasks.parquet.
        self.write_tasks()
        tmp_root = Path(tempfile.mkdtemp(prefix="lerobot_v30_"))
        data_writer, data_pos, data_count = None, (0, 0), 0
        vid_state = {cam: {"pos": (0, 0), "count": 0, "to_ts": 0.0} for cam in r.cameras}
        ep_meta_rows, all_stats = [], []
        total_frames = 0
        for ep in self.episodes:
            T = ep.length
            cols = self.recorder_columns(ep, features, total_frames)
            frames = {r.video_key(c): self.frames(ci, ep) for ci, c in enumerate(r.cameras)}
            stats = episode_stats(features, cols, frames, quantiles=True)
            all_stats.append(stats)
            table = episode_table(features, ep, cols, a.vector_type, hf_meta=True)
            # data file: a new one when the limit is reached (emulated by --episodes-per-file)
            if data_writer is not None and a.episodes_per_file and data_count >= a.episodes_per_file:
                data_writer.close()
                data_writer, data_pos, data_count = None, next_chunk_file(*data_pos, chunks), 0
            if data_writer is None:
                dpath = self.out / V3_DATA_PATH.format(chunk_index=data_pos[0], file_index=data_pos[1])
                dpath.parent.mkdir(parents=True, exist_ok=True)
                data_writer = pq.ParquetWriter(dpath, schema=table.schema, compression=compression(a, "snappy"),
                                               use_dictionary=True)
            data_writer.write_table(table)
            data_count += 1
            meta = {"episode_index": ep.index, "tasks": [ep.frame_task], "length": T,
                    "data/chunk_index": data_pos[0], "data/file_index": data_pos[1],
                    "dataset_from_index": total_frames, "dataset_to_index": total_frames + T}
            videos, from_ts = {}, {}
            for ci, cam in enumerate(r.cameras):
                vk = r.video_key(cam)
                st = vid_state[cam]
                tmp = tmp_root / vk / f"episode_{ep.index:06d}.mp4"
                encode_lerobot(frames[vk], tmp, r.fps, self.video_codec())
                dur = video_duration_s(tmp)
                limit = a.video_episodes_per_file or a.episodes_per_file
                if st["count"] == 0:
                    latest = 0.0
                    vpath = self.out / V3_VIDEO_PATH.format(video_key=vk, chunk_index=st["pos"][0],
                                                            file_index=st["pos"][1])
                    vpath.parent.mkdir(parents=True, exist_ok=True)
                    shutil.move(str(tmp), vpath)
                elif limit and st["count"] >= limit:
                    st["pos"], st["count"], latest = next_chunk_file(*st["pos"], chunks), 0, 0.0
                    vpath = self.out / V3_VIDEO_PATH.format(video_key=vk, chunk_index=st["pos"][0],
                                                            file_index=st["pos"][1])
                    vpath.parent.mkdir(parents=True, exist_ok=True)
                    shutil.move(str(tmp), vpath)
                else:
                    latest = st["to_ts"]
                    vpath = self.out / V3_VIDEO_PATH.format(video_key=vk, chunk_index=st["pos"][0],
                                                            file_index=st["pos"][1])
                    concatenate_video_files([vpath, tmp], vpath)
                    tmp.unlink()
                st["count"] += 1
                st["to_ts"] = latest + dur
                meta.update({f"videos/{vk}/chunk_index": st["pos"][0], f"videos/{vk}/file_index": st["pos"][1],
                             f"videos/{vk}/from_timestamp": latest, f"videos/{vk}/to_timestamp": latest + dur})
                videos[cam], from_ts[cam] = vpath, latest
            for k, s in stats.items():
                for sk, v in s.items():
                    meta[f"stats/{k}/{sk}"] = np.asarray(v).tolist()
            meta["meta/episodes/chunk_index"] = 0
            meta["meta/episodes/file_index"] = 0
            ep_meta_rows.append(meta)
            self.record(ep, table.column("timestamp").to_numpy(), videos, from_ts, ep.state, ep.action)
            total_frames += T
            self.log(f"  episode {ep.index}: {T} frames -> data file {data_pos}, video files "
                     f"{ {c: vid_state[c]['pos'] for c in r.cameras} }")
        data_writer.close()
        shutil.rmtree(tmp_root, ignore_errors=True)
        # meta/episodes: metadata_buffer_size = 10 rows per write_table, one file (pa.Table.from_pydict types)
        epath = self.out / V3_EPISODES_PATH.format(chunk_index=0, file_index=0)
        epath.parent.mkdir(parents=True, exist_ok=True)
        writer = None
        for i in range(0, len(ep_meta_rows), 10):
            batch = ep_meta_rows[i:i + 10]
            tbl = pa.Table.from_pydict({k: [row[k] for row in batch] for k in batch[0]})
            if writer is None:
                writer = pq.ParquetWriter(epath, schema=tbl.schema, compression="snappy", use_dictionary=True)
            writer.write_table(tbl.cast(writer.schema))
        writer.close()
        write_json(to_json(aggregate_stats(all_stats)), self.out / "meta/stats.json")
        for cam in r.cameras:  # update_video_info after episode 0: the file-000 of chunk-000
            features[r.video_key(cam)]["info"] = video_info_v30(
                self.out / V3_VIDEO_PATH.format(video_key=r.video_key(cam), chunk_index=0, file_index=0))
        n = len(self.episodes)
        info = {
            "codebase_version": "v3.0",
            "robot_type": r.robot_type,
            "total_episodes": n,
            "total_frames": total_frames,
            "total_tasks": len(self.tasks),
            "chunks_size": chunks,
            "data_files_size_in_mb": V3_DATA_FILES_SIZE_IN_MB,
            "video_files_size_in_mb": V3_VIDEO_FILES_SIZE_IN_MB,
            "fps": r.fps,
            "splits": {"train": f"0:{n}"},
            "data_path": V3_DATA_PATH,
            "video_path": V3_VIDEO_PATH,
            "features": features,
        }
        write_json(info, self.out / "meta/info.json")

    def write_tasks(self):
        """write_tasks: pandas DataFrame({"task_index": ...}, index=task strings).to_parquet() as pyarrow stores
        it: columns task_index, __index_level_0__, and the "pandas" schema metadata."""
        pandas_meta = {
            "index_columns": ["__index_level_0__"],
            "column_indexes": [{"name": None, "field_name": None, "pandas_type": "unicode", "numpy_type": "object",
                                "metadata": {"encoding": "UTF-8"}}],
            "columns": [
                {"name": "task_index", "field_name": "task_index", "pandas_type": "int64", "numpy_type": "int64",
                 "metadata": None},
                {"name": None, "field_name": "__index_level_0__", "pandas_type": "unicode", "numpy_type": "object",
                 "metadata": None}],
            "creator": {"library": "pyarrow", "version": pa.__version__},
            "pandas_version": "2.2.3",
        }
        schema = pa.schema([pa.field("task_index", pa.int64()), pa.field("__index_level_0__", pa.string())],
                           metadata={b"pandas": json.dumps(pandas_meta).encode()})
        tbl = pa.Table.from_arrays([pa.array(np.arange(len(self.tasks), dtype=np.int64)), pa.array(self.tasks)],
                                   schema=schema)
        path = self.out / V3_TASKS_PATH
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(tbl, path, compression="snappy")


def next_chunk_file(chunk_idx: int, file_idx: int, chunks_size: int) -> tuple[int, int]:
    """LeRobot v3.0 update_chunk_file_indices."""
    return (chunk_idx + 1, 0) if file_idx == chunks_size - 1 else (chunk_idx, file_idx + 1)


# ------------------------------------------------------------------------------------------------------------------
# dzr episode directories
# ------------------------------------------------------------------------------------------------------------------

def write_npy_dirs(w: Writer, root: Path, tolerance_s: float) -> list[str]:
    r = w.robot
    problems = []
    decoded: dict[Path, tuple[np.ndarray, np.ndarray]] = {}
    for rec in w.written:
        ep = rec["ep"]
        d = root / f"episode_{ep.index:06d}"
        d.mkdir(parents=True, exist_ok=True)
        for cam in r.cameras:
            vpath = rec["videos"][cam]
            if vpath not in decoded:
                decoded = {vpath: decode_all(vpath)}  # keep one file's frames at a time
            frames, pts = decoded[vpath]
            idx, dist = nearest_frames(pts, rec["timestamps"] + rec["from_ts"][cam])
            if dist.max() > tolerance_s:
                problems.append(f"{vpath}: episode {ep.index}: a row's nearest frame is {dist.max():.6f} s away")
            np.save(d / f"{cam}.npy", frames[idx])
        arrays, actions = r.npy_arrays(rec["state"], rec["action"])
        for k, v in arrays.items():
            np.save(d / f"{k}.npy", np.ascontiguousarray(v, dtype=np.float64))
        np.save(d / "actions.npy", np.ascontiguousarray(actions, dtype=np.float64))
        with open(d / "episode.yaml", "w", encoding="utf-8") as f:
            f.write(f"prompt: {json.dumps(ep.prompt, ensure_ascii=False)}\nfps: {r.fps}\n")
    return problems


# ------------------------------------------------------------------------------------------------------------------
# --check: read everything back
# ------------------------------------------------------------------------------------------------------------------

def check(w: Writer, npy_root: Path | None, tolerance_s: float) -> list[str]:
    r, out = w.robot, w.out
    errs = []
    info = json.loads((out / "meta/info.json").read_text())
    version = info["codebase_version"]
    feats = info["features"]
    modality = json.loads((out / "meta/modality.json").read_text())
    eps_by_index = {e.index: e for e in w.episodes}
    if version == "v3.0":
        tasks_tbl = pq.read_table(out / V3_TASKS_PATH)
        tasks = dict(zip(tasks_tbl.column("task_index").to_pylist(), tasks_tbl.column("__index_level_0__").to_pylist()))
        ep_meta = pq.read_table(out / V3_EPISODES_PATH.format(chunk_index=0, file_index=0)).to_pylist()
    else:
        tasks = {row["task_index"]: row["task"] for row in map(json.loads, open(out / "meta/tasks.jsonl"))}
        ep_meta = [json.loads(line) for line in open(out / "meta/episodes.jsonl")]
    if len(ep_meta) != len(w.episodes):
        errs.append(f"{len(ep_meta)} episodes in the metadata, {len(w.episodes)} written")
    total = 0
    for m in ep_meta:
        ep = eps_by_index[m["episode_index"]]
        T = m["length"]
        if T != ep.length:
            errs.append(f"episode {ep.index}: length {T} != {ep.length}")
        if version == "v3.0":
            dfile = out / info["data_path"].format(chunk_index=m["data/chunk_index"], file_index=m["data/file_index"])
            tbl = pq.read_table(dfile)
            idx = tbl.column("index").to_numpy()
            rows = tbl.slice(int(np.searchsorted(idx, m["dataset_from_index"])), T)
            if rows.column("index").to_numpy()[0] != m["dataset_from_index"]:
                errs.append(f"{dfile}: episode {ep.index} rows not at dataset_from_index")
        else:
            chunk = ep.index // info["chunks_size"]
            rows = pq.read_table(out / info["data_path"].format(episode_chunk=chunk, episode_index=ep.index))
        if rows.num_rows != T or rows.column("episode_index").to_pylist() != [ep.index] * T:
            errs.append(f"episode {ep.index}: {rows.num_rows} rows / wrong episode_index")
        ts = rows.column("timestamp").to_numpy().astype(np.float64)
        if not np.allclose(ts, np.arange(T) / info["fps"], atol=1e-6):
            errs.append(f"episode {ep.index}: timestamps are not frame_index / fps")
        state = np.stack(rows.column("observation.state").to_numpy(zero_copy_only=False))
        action = np.stack(rows.column("action").to_numpy(zero_copy_only=False))
        if not (np.array_equal(state, ep.state) and np.array_equal(action, ep.action)):
            errs.append(f"episode {ep.index}: state/action differ from what was generated")
        if state.shape[1] != feats["observation.state"]["shape"][0]:
            errs.append(f"episode {ep.index}: state width {state.shape[1]} != info.json")
        if list(rows.column("frame_index").to_numpy()) != list(range(T)):
            errs.append(f"episode {ep.index}: frame_index")
        if "index" in rows.column_names and rows.column("index").to_numpy()[0] != total:
            errs.append(f"episode {ep.index}: index starts at {rows.column('index').to_numpy()[0]}, expected {total}")
        # prompt as a reader would resolve it
        if r.name == "droid":
            ids = [rows.column(f"annotation.language.{k}").to_numpy()[0] for k in r.lang_keys]
            prompt = next((tasks[i] for i in ids if tasks[i] != "not provided"), None)
            if rows.column("task_index").to_numpy()[0] != ids[0]:
                errs.append(f"episode {ep.index}: task_index != language_instruction")
        elif r.name == "agibot":
            prompt = tasks[int(rows.column("task_index").to_numpy()[0])]
            for k in rows.column("annotation.language.action_text").to_pylist():
                if k not in tasks:
                    errs.append(f"episode {ep.index}: action_text {k} not in the task table")
                    break
        else:
            prompt = rows.column("annotation.task").to_pylist()[0]
            if tasks[int(rows.column("task_index").to_numpy()[0])] != prompt:
                errs.append(f"episode {ep.index}: task_index and annotation.task disagree")
        if prompt != ep.prompt:
            errs.append(f"episode {ep.index}: prompt {prompt!r} != {ep.prompt!r}")
        # modality slices cover the vectors
        for group, col in (("state", state), ("action", action)):
            for k, s in modality[group].items():
                if s["end"] > col.shape[1]:
                    errs.append(f"modality.json {group}.{k} [{s['start']}:{s['end']}] beyond width {col.shape[1]}")
        # videos
        for ci, cam in enumerate(r.cameras):
            vk = r.video_key(cam)
            if modality["video"][cam]["original_key"] != vk or feats[vk]["dtype"] != "video":
                errs.append(f"{cam}: modality/info video key mismatch")
            if version == "v3.0":
                vpath = out / info["video_path"].format(video_key=vk, chunk_index=m[f"videos/{vk}/chunk_index"],
                                                        file_index=m[f"videos/{vk}/file_index"])
                from_ts, to_ts = m[f"videos/{vk}/from_timestamp"], m[f"videos/{vk}/to_timestamp"]
            else:
                vpath = out / info["video_path"].format(episode_chunk=ep.index // info["chunks_size"], video_key=vk,
                                                        episode_index=ep.index)
                from_ts, to_ts = 0.0, None
            frames, pts = decode_all(vpath)
            if frames.shape[1:3] != (w.height, w.width):
                errs.append(f"{vpath}: frames {frames.shape[1:3]} != {(w.height, w.width)}")
            idx, dist = nearest_frames(pts, ts + from_ts)
            if dist.max() > tolerance_s:
                errs.append(f"{vpath}: episode {ep.index}: nearest frame {dist.max():.6f} s from a row timestamp")
            if len(set(idx.tolist())) != T:
                errs.append(f"{vpath}: episode {ep.index}: rows do not map to distinct frames")
            if version != "v3.0" and len(frames) != T:
                errs.append(f"{vpath}: {len(frames)} frames, {T} rows")
            if to_ts is not None and np.sum((pts >= from_ts - 1e-9) & (pts < to_ts - 1e-9)) != T:
                errs.append(f"{vpath}: episode {ep.index}: {np.sum((pts >= from_ts) & (pts < to_ts))} frames in "
                            f"[{from_ts}, {to_ts}), {T} rows")
            # the decoded frames look like what was encoded (lossy: a loose bound that a wrong frame fails)
            ref = w.frames(ci, ep).astype(np.int16)
            got = frames[idx].astype(np.int16)
            err = np.abs(got - ref).mean(axis=(1, 2, 3))
            # ... and each is nearer to its own source frame than to the previous one (catches an off-by-one)
            wrong = np.abs(frames[idx][1:].astype(np.int16) - ref[:-1]).mean(axis=(1, 2, 3))
            if err.max() > 20 or wrong.min() <= err.max():
                errs.append(f"{vpath}: episode {ep.index}: decoded frames differ from the encoded ones "
                            f"(mean abs err up to {err.max():.1f})")
            if npy_root is not None:
                d = npy_root / f"episode_{ep.index:06d}"
                npy = np.load(d / f"{cam}.npy")
                if not np.array_equal(npy, frames[idx]):
                    errs.append(f"{d}/{cam}.npy differs from the decoded frames")
        if npy_root is not None:
            d = npy_root / f"episode_{ep.index:06d}"
            arrays, actions = r.npy_arrays(state, action)
            for k, v in arrays.items():
                if not np.array_equal(np.load(d / f"{k}.npy"), v):
                    errs.append(f"{d}/{k}.npy differs from the parquet slice")
            if not np.array_equal(np.load(d / "actions.npy"), actions):
                errs.append(f"{d}/actions.npy differs from the parquet slices")
            y = (d / "episode.yaml").read_text()
            if f"prompt: {json.dumps(ep.prompt, ensure_ascii=False)}" not in y:
                errs.append(f"{d}/episode.yaml: prompt")
        total += T
    if info["total_frames"] != total:
        errs.append(f"info.json total_frames {info['total_frames']} != {total}")
    return errs


# ------------------------------------------------------------------------------------------------------------------

def tree_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="See the module docstring for what each KIND writes.")
    p.add_argument("kind", choices=KINDS)
    p.add_argument("out_dir")
    p.add_argument("--episodes", type=int, help="number of episodes (default: as many as --frames lists)")
    p.add_argument("--frames", default="40,33,57", help="frames per episode, cycled (default 40,33,57)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--npy-dirs", help="also write dzr episode directories DIR/episode_NNNNNN/")
    p.add_argument("--size", help="camera WxH (default: DROID 320x180, AgiBot and YAM 64x48)")
    p.add_argument("--codec", choices=["h264", "av1"],
                   help="video codec (default: droid_v20 h264 as the converter, else av1 = libsvtav1)")
    p.add_argument("--chunks-size", type=int, default=DEFAULT_CHUNK_SIZE,
                   help="episodes per chunk directory (v2.x) / files per chunk (v3.0); default 1000")
    p.add_argument("--episodes-per-file", type=int, default=0,
                   help="v3.0: start a new data file (and video file) after this many episodes (emulates the MB "
                        "limits); default 0 = one file")
    p.add_argument("--video-episodes-per-file", type=int, default=0, help="v3.0: the same for video files only")
    p.add_argument("--vector-type", choices=["fixed", "list", "large_list"], default="fixed",
                   help="arrow type of observation.state/action (default fixed_size_list, as HF datasets and polars "
                        "Array write)")
    p.add_argument("--timestamp-dtype", choices=["float32", "float64"],
                   help="override the timestamp dtype (default: droid_v20 float64 as the converter; LeRobot float32)")
    p.add_argument("--index-column", action=argparse.BooleanOptionalAction, default=False,
                   help="droid_v20: also write the 'index' column (the converter does not; LeRobot writers always do)")
    p.add_argument("--compression", choices=["zstd", "snappy", "gzip", "none"],
                   help="parquet compression (default: droid_v20 zstd as polars, LeRobot snappy)")
    p.add_argument("--agibot-modality", choices=["config", "converter"], default="config",
                   help="AgiBot modality.json: 'config' = waist_position 18:20 (the training config's keys), "
                        "'converter' = convert_agibot.py's waist_pitch/waist_lift")
    p.add_argument("--check", action="store_true", help="read the dataset back and verify it")
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args(argv)

    robot_name, version = args.kind.split("_")
    robot = ROBOTS[robot_name]
    lengths = [int(x) for x in args.frames.split(",") if x.strip()]
    n = args.episodes if args.episodes is not None else len(lengths)
    args.lengths = [lengths[i % len(lengths)] for i in range(n)]
    if n < 1 or min(args.lengths) < 5:
        p.error("need at least one episode of at least 5 frames")
    if args.size:
        w_, h_ = (int(v) for v in args.size.lower().split("x"))
        args.size = (w_, h_)
    else:
        args.size = robot.default_size
    out = Path(args.out_dir)
    # A fixture is regenerated whole; only a directory that holds one (or nothing) is replaced.
    if out.exists() and any(out.iterdir()):
        if not (out / "meta/info.json").is_file():
            p.error(f"{out} is not empty and holds no LeRobot dataset (meta/info.json); not replacing it")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    if args.npy_dirs:
        npy = Path(args.npy_dirs)
        if npy.exists() and any(not (c.is_dir() and c.name.startswith("episode_")) for c in npy.iterdir()):
            p.error(f"{npy} holds something else than episode_* directories; not replacing it")

    writer_cls = {"v20": DreamZeroDroidV20, "v21": LeRobotV21, "v30": LeRobotV30}[version]
    if version == "v20" and robot_name != "droid":
        p.error("v2.0 is only written for DROID (DreamZero's converter)")
    w = writer_cls(robot, args)
    if not args.quiet:
        print(f"{args.kind}: {n} episodes {args.lengths}, {robot.fps} fps, {args.size[0]}x{args.size[1]} -> {out}")
    w.write()
    tolerance_s = 1e-4  # LeRobotDataset tolerance_s default
    problems = []
    npy_root = None
    if args.npy_dirs:
        npy_root = Path(args.npy_dirs)
        if npy_root.exists():
            shutil.rmtree(npy_root)
        problems += write_npy_dirs(w, npy_root, tolerance_s)
    if args.check:
        problems += check(w, npy_root, tolerance_s)
    size = tree_size(out)
    print(f"{args.kind}: {out} {size / 1024:.1f} KiB"
          + (f"; {npy_root} {tree_size(npy_root) / 1024:.1f} KiB" if npy_root else "")
          + ("; check ok" if args.check and not problems else ""))
    for prob in problems:
        print(f"error: {prob}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
