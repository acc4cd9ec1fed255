#!/usr/bin/env python3
"""`dzr serve` end to end, driven by the official client stack (openpi_client's msgpack_numpy, websockets).

Starts `dzr serve` on a random checkpoint on the CPU and checks, against the protocol of the official
DreamZero server (eval_utils/policy_server.py, socket_test_optimized_AR.py, test_client_AR.py):
  - the config map sent on connect;
  - infer replies (float32 [24, 8]) and the reset reply;
  - a whole session on the official test client's frame schedule (frame [0], then [a-23, a-16, a-8, a] for
    a = 23, 47, ...) from samples/episode_000, recorded with --record and replayed by `dzr rollout` into the same
    actions, byte for byte;
  - a second client that connects while the first is served waits, then gets the actions of a fresh offline rollout;
  - a client that vanishes mid-request costs nothing: the next client gets the offline rollout's actions;
  - bad messages (missing key, wrong dtype, wrong shape, garbage, unknown endpoint, oversized, a text frame, NaN state)
    each get a text error and a close code, and the server answers a good request after them;
  - the server's RSS stays flat over a soak of short sessions;
  - with --max-sessions 2, two clients served at once whose calls alternate (A1, B1, A2, B2, ...) each get the
    actions of an offline rollout of their own frames (their recordings replayed), and a third client waits until
    one of them disconnects;
  - SIGINT lets the request in flight finish, closes the connection (1001) and prints the timing summary.
Every check but the last runs on the tiny config shrunk further (MICRO_GEOMETRY: a call takes ~0.1 s instead of
~1.2 s; what they check does not depend on the geometry; DZR_LONG_TESTS=1 runs them on the tiny geometry,
docs/CI.md), all on one server but the sessions', which has its own (--max-sessions 2); SIGINT needs a request
that is surely still running when the signal comes, so it gets a server of the tiny geometry itself.

Usage: test_serve.py DZR [--tools DZR_TOOLS] [--source-dir DIR] [--keep]
  DZR        the binary whose `serve` is tested
  --tools    the binary for `ckpt make`, `episode convert` and `rollout` (default: DZR); it must hold the same
             engine build, since replays are compared bit for bit
Exit codes: 0 passed, 1 failed, 77 skipped (the Python packages or the sample's video decoding are missing).
"""
import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

SKIP = 77
PROMPT = "Put the blue block in the bowl"
CAMERAS = {  # RoboArena key -> the episode's camera file (DreamZero's video key)
    "observation/exterior_image_0_left": "exterior_image_1_left",
    "observation/exterior_image_1_left": "exterior_image_2_left",
    "observation/wrist_image_left": "wrist_image_left",
}
# configs/tiny.yaml with a 64x128 canvas (32 tokens per latent frame) and 9-frame clips, for `ckpt make`, `rollout`
# and `serve` alike (tests/support/micro_geometry.h); none with DZR_LONG_TESTS=1
MICRO_GEOMETRY = [] if os.environ.get("DZR_LONG_TESTS", "0") not in ("", "0") else [
    "--set", "model.canvas_height=64", "--set", "model.canvas_width=128",
    "--set", "model.dit.frame_seqlen=32", "--set", "model.num_frames=9"]
EXPECTED_CONFIG = {
    "image_resolution": [180, 320],
    "needs_wrist_camera": True,
    "n_external_cameras": 2,
    "needs_stereo_camera": False,
    "needs_session_id": True,
    "action_space": "joint_position",
}

try:
    import numpy as np
    import msgpack
    import websockets
    import websockets.sync.client as ws_client
    from websockets.exceptions import ConnectionClosed
    from openpi_client import msgpack_numpy
except ImportError as e:  # pragma: no cover - the skip path
    print(f"test_serve: skipped: a Python package is missing ({e}); "
          "pip install openpi-client websockets msgpack numpy", flush=True)
    sys.exit(SKIP)


# websockets 14+ wants connect() as a context manager; the official client (policy_client.py) calls it plainly too
warnings.filterwarnings("ignore", message=r"connect\(\) must be used as a context manager")


class Failure(Exception):
    pass


def check(cond, what):
    if not cond:
        raise Failure(what)


# ---- the client -------------------------------------------------------------------------------------------------
class Client:
    """A RoboArena policy client as the official one behaves (eval_utils/policy_client.py): the config on connect,
    msgpack_numpy requests with an "endpoint" key, a text reply meaning an error."""

    def __init__(self, port, open_timeout=10):
        self.ws = ws_client.connect(f"ws://127.0.0.1:{port}", compression=None, max_size=None,
                                    open_timeout=open_timeout, ping_interval=60, ping_timeout=600)
        self.config = msgpack_numpy.unpackb(self.ws.recv())
        self.packer = msgpack_numpy.Packer()

    def send_raw(self, data):
        self.ws.send(data)
        return self.ws.recv()

    def infer(self, obs):
        reply = self.send_raw(self.packer.pack({**obs, "endpoint": "infer"}))
        if isinstance(reply, str):
            raise Failure(f"the server answered an infer with an error: {reply}")
        return msgpack_numpy.unpackb(reply)

    def reset(self):
        return self.send_raw(self.packer.pack({"endpoint": "reset"}))

    def close(self):
        self.ws.close()

    def close_code(self, timeout=10):
        """The close code the server sent (waits for the close)."""
        try:
            while True:
                self.ws.recv(timeout=timeout)
        except ConnectionClosed as e:
            return e.rcvd.code if e.rcvd else None


class Episode:
    """The sample episode's frames and state, and the official test client's schedule over them."""

    def __init__(self, directory):
        self.frames = {k: np.load(directory / f"{f}.npy") for k, f in CAMERAS.items()}
        self.joint = np.load(directory / "joint_position.npy")
        self.gripper = np.load(directory / "gripper_position.npy").reshape(len(self.joint), -1)
        n = min(len(v) for v in self.frames.values())
        # test_client_AR.py: frame [0]; then [a-23, a-16, a-8, a] for a = 23, 47, ... while a < n; the state of
        # a call is the state at its anchor (dzr's rollout, docs/FORMATS.md "Frame schedule")
        self.calls = [([0], 0)] + [([max(a + o, 0) for o in (-23, -16, -8, 0)], a) for a in range(23, n, 24)]

    def obs(self, call, session_id, state_dtype=np.float64):
        idx, anchor = self.calls[call]
        o = {}
        for key, frames in self.frames.items():
            sel = frames[idx]
            o[key] = sel[0] if len(idx) == 1 else sel
        o["observation/joint_position"] = self.joint[anchor].astype(state_dtype)
        o["observation/gripper_position"] = self.gripper[anchor].astype(state_dtype)
        o["observation/cartesian_position"] = np.zeros(6, dtype=np.float32)
        o["prompt"] = PROMPT
        o["session_id"] = session_id
        return o


# ---- the server -------------------------------------------------------------------------------------------------
class Server:
    def __init__(self, dzr, args, env, log_path):
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen([dzr, "serve", *args], stdout=subprocess.PIPE, stderr=self.log, text=True, env=env)
        self.stdout = []
        self.port = None
        ready = threading.Event()

        def pump():
            for line in self.proc.stdout:
                self.stdout.append(line)
                m = re.search(r"listening on ws://[^ ]*:(\d+)", line)
                if m:
                    self.port = int(m.group(1))
                    ready.set()
            ready.set()

        self.thread = threading.Thread(target=pump, daemon=True)
        self.thread.start()
        if not ready.wait(300) or self.port is None:
            self.proc.kill()
            raise Failure(f"dzr serve did not start:\n{self.log_text()}")
        self.log_path = log_path

    def log_text(self):
        if not self.log.closed:
            self.log.flush()
        return Path(self.log.name).read_text(errors="replace")

    def rss_kib(self):
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise Failure("no VmRSS")

    def wait_log(self, pattern, count=1, timeout=60):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if len(re.findall(pattern, self.log_text())) >= count:
                return
            time.sleep(0.05)
        raise Failure(f"the server log never showed {count} x '{pattern}':\n{self.log_text()[-3000:]}")

    def stop(self, sig=signal.SIGINT, timeout=120):
        """Signals the server (sig None: it was signalled already) and waits for its exit code."""
        if sig is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise Failure("dzr serve did not stop after SIGINT")
        self.thread.join(10)
        self.log.close()
        return rc


def run(cmd, env, what):
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        raise Failure(f"{what} failed ({p.returncode}): {' '.join(map(str, cmd))}\n{p.stdout}\n{p.stderr}")
    return p


# ---- the checks -------------------------------------------------------------------------------------------------
def run_session(port, ep, session_id, state_dtype=np.float64, reset=True):
    c = Client(port)
    actions = [c.infer(ep.obs(k, session_id, state_dtype)) for k in range(len(ep.calls))]
    if reset:
        check(c.reset() == "reset successful", "reset reply")
    c.close()
    return np.stack(actions)


def check_handshake_and_replies(port, ep):
    c = Client(port)
    check(c.config == EXPECTED_CONFIG, f"config on connect: {c.config}")
    check(isinstance(c.config["image_resolution"], list) and isinstance(c.config["n_external_cameras"], int),
          "config value types")
    a = c.infer(ep.obs(0, "handshake"))
    check(isinstance(a, np.ndarray) and a.shape == (24, 8) and a.dtype == np.float32, f"infer reply {type(a)}")
    check(np.isfinite(a).all(), "finite actions")
    # numpy str scalars for the strings, as a client holding np.str_ values packs them
    b = c.infer({**ep.obs(1, "handshake", np.float32), "prompt": np.str_(PROMPT), "session_id": np.str_("handshake")})
    check(b.shape == (24, 8) and b.dtype == np.float32, "second infer reply")
    r = c.reset()
    check(r == "reset successful", f"reset reply: {r!r}")
    c.close()


def check_bad_messages(port, ep, big_bytes):
    pk = msgpack_numpy.Packer()
    good = {**ep.obs(0, "bad"), "endpoint": "infer"}

    def variant(**changes):
        o = dict(good)
        for k, v in changes.items():
            if v is None:
                o.pop(k)
            else:
                o[k] = v
        return pk.pack(o)

    wrist = "observation/wrist_image_left"
    cases = [
        ("missing key", variant(**{"observation/joint_position": None}), "missing key 'observation/joint_position'", 1008),
        ("missing endpoint", variant(endpoint=None), "missing key 'endpoint'", 1008),
        ("wrong dtype", variant(**{wrist: good[wrist].astype(np.float32)}), "expected uint8 frames", 1008),
        ("wrong shape", variant(**{wrist: np.zeros((224, 224, 3), np.uint8)}), "got shape [224, 224, 3]", 1008),
        ("wrong state shape", variant(**{"observation/joint_position": np.zeros(6)}), "expected 7 floats", 1008),
        ("NaN state", variant(**{"observation/gripper_position": np.array([np.nan])}), "is nan", 1008),
        ("prompt not str", variant(prompt=7), "'prompt': expected a str", 1008),
        ("unknown endpoint", variant(endpoint="act"), "unknown endpoint 'act'", 1008),
        ("garbage bytes", bytes(range(256)) * 4, "dzr serve: error: ", 1008),
        ("not a map", msgpack.packb([1, 2, 3]), "expected a map", 1008),
        ("truncated", variant()[:-100], "not a msgpack message", 1008),
        ("oversized", variant(padding=np.zeros(big_bytes, np.uint8)), "more than the server's limit", 1009),
        ("text frame", "hello", "got a text frame", 1003),
    ]
    for name, data, expect, code in cases:
        c = Client(port)
        reply = c.send_raw(data)
        check(isinstance(reply, str), f"{name}: expected a text error, got {type(reply)}")
        check(reply.startswith("dzr serve: error: ") and expect in reply, f"{name}: error text {reply!r}")
        got = c.close_code()
        check(got == code, f"{name}: close code {got}, expected {code}")
        # the server still answers a good request afterwards
        g = Client(port)
        a = g.infer(ep.obs(0, f"after-{name}"))
        check(a.shape == (24, 8), f"after {name}: a good request")
        g.close()
        print(f"  bad message '{name}': text error + close {code}; the next request served", flush=True)


def infer_in_thread(client, observations):
    """A queued client's requests on a thread: returns it (started) and a dict that gets "actions" or "error"."""
    got = {}

    def infer_all():
        try:
            got["actions"] = [client.infer(obs) for obs in observations]
        except Exception as e:  # noqa: BLE001 - the caller reports it
            got["error"] = e

    t = threading.Thread(target=infer_all)
    t.start()
    return t, got


def check_queue(server, port, ep, offline):
    """A second client waits while the first is served, then gets the actions of a fresh offline rollout."""
    a = Client(port)
    first = [a.infer(ep.obs(0, "first")), a.infer(ep.obs(1, "first"))]
    b = Client(port)  # the handshake and the config come at once
    check(b.config == EXPECTED_CONFIG, "the waiting client's config")
    server.wait_log(r"client \d+ queued")
    t, got = infer_in_thread(b, [ep.obs(k, "second") for k in range(len(ep.calls))])
    time.sleep(2.0)
    check(t.is_alive() and not got, "the second client was answered while the first was still connected")
    first += [a.infer(ep.obs(k, "first")) for k in range(2, len(ep.calls))]
    a.close()
    t.join(300)
    check("error" not in got, f"second client: {got.get('error')}")
    b.close()
    first, second_actions = np.stack(first), np.stack(got["actions"])
    check(first.tobytes() == offline.tobytes(), "the first client's actions differ from the offline rollout's")
    check(second_actions.tobytes() == offline.tobytes(), "the queued client's actions differ from the offline rollout's")


def check_vanish(server, port, ep, offline):
    """A client that disconnects mid-request: the request finishes, the reply is dropped, the next client is clean."""
    c = Client(port)
    c.infer(ep.obs(0, "vanish"))
    c.ws.send(c.packer.pack({**ep.obs(1, "vanish"), "endpoint": "infer"}))
    c.ws.socket.close()  # gone without a close handshake, while the call runs
    server.wait_log(r"reply dropped")
    after = run_session(port, ep, "after-vanish", reset=False)
    check(after.tobytes() == offline.tobytes(), "after a vanished client, the actions differ from the offline rollout's")


def check_record_notes(server, port, ep, record):
    """serve.json says when a recording cannot replay exactly, and why."""
    import json

    def session(sid, calls):
        c = Client(port)
        for obs in calls:
            c.infer(obs)
        c.close()
        server.wait_log(rf"session '{sid}' recorded")
        return json.loads((record / sid / "serve.json").read_text())

    # call 1's oldest frame is not call 0's frame, but the schedule puts both at frame 0
    first = ep.obs(0, "conflict")
    for key in CAMERAS:
        first[key] = ep.frames[key][10]
    j = session("conflict", [first, ep.obs(1, "conflict")])
    check(not j["replay_exact"] and any("differs from the frame an earlier call used" in p for p in j["problems"]),
          f"frame conflict not reported: {j}")
    # the prompt changes mid-session
    second = {**ep.obs(1, "prompt-change"), "prompt": "Pick up the red cup"}
    j = session("prompt-change", [ep.obs(0, "prompt-change"), second])
    check(not j["replay_exact"] and any("prompt" in p for p in j["problems"]), f"prompt change not reported: {j}")
    # one call is too short for a rollout
    j = session("one-call", [ep.obs(0, "one-call")])
    check(not j["replay_exact"] and j["frames"] == 1, f"one-call session: {j}")
    j = json.loads((record / "recorded_session" / "serve.json").read_text())
    check(j["replay_exact"] and j["problems"] == [] and j["frames_per_call"] == [1, 4, 4, 4, 4], f"exact: {j}")


def check_soak(server, port, ep, sessions=6):
    """RSS after each of several short sessions (a 1-frame and a 4-frame call, then a disconnect) stays flat."""
    rss = []
    ended = len(re.findall(r"session '[^']*' ended", server.log_text()))
    for s in range(sessions):
        c = Client(port)
        c.infer(ep.obs(0, f"soak-{s}"))
        c.infer(ep.obs(1, f"soak-{s}"))
        c.close()
        server.wait_log(r"session '[^']*' ended", ended + s + 1)
        rss.append(server.rss_kib())
    # NOTE: the tolerance: the first session may still grow the allocator's pools, so the growth is counted from the
    # second; what a session handles is large, so a leak of any of it shows: one 4-frame call's frames are 3 cameras
    # x 4 x 180x320x3 = 2.0 MiB, its message as much, and a leak of either per session adds >= 8 MiB over the 4
    # sessions compared. The allocator's own noise measured here is 0 to 0.7 MiB; 3 MiB sits between the two.
    growth = max(rss[1:]) - rss[1]
    print(f"  soak: RSS after each session (KiB): {rss}; growth after the first {growth} KiB", flush=True)
    check(growth <= 3 * 1024, f"RSS grew by {growth} KiB over {sessions - 1} sessions: {rss}")


def flipped_obs(ep, call, session_id):
    """Another client's call: the episode's frames mirrored left to right, another prompt."""
    o = ep.obs(call, session_id)
    for key in CAMERAS:
        o[key] = np.ascontiguousarray(o[key][..., ::-1, :])
    o["prompt"] = "Pick up the red cup"
    return o


def check_sessions(server, port, ep, offline, replay):
    """--max-sessions 2: two clients' calls interleave, each as its own offline rollout; a third waits for a place."""
    a, b = Client(port), Client(port)
    served = {"A": [], "B": []}
    for k in range(len(ep.calls)):
        served["A"].append(a.infer(ep.obs(k, "A")))
        served["B"].append(b.infer(flipped_obs(ep, k, "B")))
    check(not re.search(r"client \d+ queued", server.log_text()), "a second client queued with --max-sessions 2")
    c = Client(port)
    server.wait_log(r"client \d+ queued")
    t, got = infer_in_thread(c, [ep.obs(k, "C") for k in range(2)])
    time.sleep(1.0)
    check(t.is_alive() and not got, "the third client was answered while two were served")
    a.close()
    t.join(120)
    check("error" not in got and "actions" in got, f"third client: {got.get('error')}")
    c.close()
    b.close()
    server.wait_log(r"session '[ABC]' recorded", 3)
    third_actions = np.stack(got["actions"])
    check(third_actions.tobytes() == offline[:2].tobytes(),
          "the third client's actions differ from the offline rollout's")
    replayed = replay(["A", "B"])
    for sid, actions in served.items():
        actions = np.stack(actions)
        check(actions.tobytes() == replayed[sid].tobytes(),
              f"session {sid}: the served actions differ from its offline replay (max "
              f"{np.abs(actions - replayed[sid]).max()})")
    check(np.stack(served["A"]).tobytes() == offline.tobytes(), "session A differs from the offline rollout")
    check(np.stack(served["A"]).tobytes() != np.stack(served["B"]).tobytes(), "sessions A and B got the same actions")


def check_sigint(server, port, ep):
    """SIGINT while a request runs: the reply still comes, then the close (1001), then the summary and exit 0."""
    c = Client(port)
    c.infer(ep.obs(0, "sigint"))
    c.ws.send(c.packer.pack({**ep.obs(1, "sigint"), "endpoint": "infer"}))
    time.sleep(0.1)
    server.proc.send_signal(signal.SIGINT)
    reply = c.ws.recv(timeout=120)
    check(not isinstance(reply, str), f"the request in flight got an error at SIGINT: {reply}")
    check(msgpack_numpy.unpackb(reply).shape == (24, 8), "the request in flight was answered")
    code = c.close_code()
    check(code == 1001, f"close code at shutdown: {code}")
    rc = server.stop(sig=None)
    check(rc == 0, f"dzr serve exited {rc} after SIGINT")
    out = "".join(server.stdout)
    check("served " in out and "infer, 4 frames" in out, f"no timing summary on exit:\n{out}")
    # the request was in flight when the signal came: the server logged the stop before the call's engine line
    log = server.log_text()
    stop_at, call_at = log.find(": SIGINT: stopping"), log.find("session 'sigint' call 1:")
    check(0 <= stop_at < call_at, f"SIGINT did not come while the request ran (log at {stop_at}, call at {call_at}):"
          f"\n{log[-3000:]}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dzr")
    ap.add_argument("--tools")
    ap.add_argument("--source-dir", default=str(Path(__file__).resolve().parents[2]))
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    a = ap.parse_args()
    dzr, tools, src = os.path.abspath(a.dzr), os.path.abspath(a.tools or a.dzr), Path(a.source_dir)
    tmp = Path(tempfile.mkdtemp(prefix="dzr-serve-test-"))
    # NOTE: one OpenBLAS thread: the server and the rollouts then round their GEMMs alike (scripts/ci/sample_baseline.sh)
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
    server = None
    try:
        cfg = src / "configs" / "tiny.yaml"
        ckpt, ep_dir = tmp / "ckpt", tmp / "episode_000"
        make = [tools, "ckpt", "make", "--config", cfg, "--seed", "0", "--dtype", "f32", "--tokenizer",
                src / "tests/data/tokenizer/spiece.model"]
        run([*make, *MICRO_GEOMETRY, "--out", ckpt], env, "dzr ckpt make")
        conv = subprocess.run([tools, "episode", "convert", src / "samples/episode_000", "--out", ep_dir], env=env,
                              capture_output=True, text=True)
        if conv.returncode != 0:
            print(f"test_serve: skipped: {tools} cannot decode the sample's .mp4 cameras:\n{conv.stderr}")
            return SKIP
        ep = Episode(ep_dir)
        rollout = ["rollout", "--ckpt", ckpt, "--config", cfg, *MICRO_GEOMETRY, "--device", "cpu", "--quiet",
                   "--no-plots", "--no-report"]
        run([tools, *rollout[:1], ep_dir, *rollout[1:], "--out", tmp / "offline"], env, "offline rollout")
        offline = np.load(tmp / "offline" / "episode_000" / "actions.npy")
        check(offline.shape == (len(ep.calls), 24, 8), f"offline actions {offline.shape}")

        # --max-message-mb 3: a 4-frame request is 2.0 MiB (3 cameras x 4 x 180x320x3); 3.5 MiB is over
        record = tmp / "record"
        server = Server(dzr, ["--ckpt", str(ckpt), "--config", str(cfg), *MICRO_GEOMETRY, "--device", "cpu",
                              "--port", "0", "--record", str(record), "--max-message-mb", "3"], env, tmp / "serve.log")
        port = server.port
        print(f"dzr serve on port {port} (log {server.log_path})", flush=True)

        check_handshake_and_replies(port, ep)
        print("ok: handshake, infer reply (24, 8) float32, reset", flush=True)

        served = run_session(port, ep, "recorded session", state_dtype=np.float32)
        server.wait_log(r"session 'recorded session' recorded")
        rec = record / "recorded_session"
        check((rec / "episode.yaml").exists(), f"no recorded episode in {record}: {os.listdir(record)}")
        check(np.load(rec / "served_actions.npy").tobytes() == served.tobytes(), "served_actions.npy")
        replay = run([tools, *rollout[:1], rec, *rollout[1:], "--out", tmp / "replay"], env, "replay rollout")
        replayed = np.load(tmp / "replay" / "recorded_session" / "actions.npy")
        check(replayed.tobytes() == served.tobytes(),
              f"the replay of the recording differs from the served actions (max {np.abs(replayed - served).max()})")
        print(f"ok: a {len(ep.calls)}-call session recorded and replayed by dzr rollout, byte for byte", flush=True)

        check_queue(server, port, ep, offline)
        print("ok: a second client waits for the first, then gets the offline rollout's actions", flush=True)
        check_vanish(server, port, ep, offline)
        print("ok: a client vanishing mid-request; the next one gets the offline rollout's actions", flush=True)
        check_bad_messages(port, ep, 3 << 20)
        print("ok: bad messages answered with text errors; the server keeps serving", flush=True)
        check_record_notes(server, port, ep, record)
        print("ok: serve.json names what keeps a recording from replaying exactly", flush=True)
        check_soak(server, port, ep)
        print("ok: RSS flat over the soak", flush=True)
        rc = server.stop()
        check(rc == 0, f"dzr serve exited {rc} after SIGINT while idle")

        # two sessions on one engine, their calls interleaved (--max-sessions 2)
        record2 = tmp / "record_sessions"
        server = Server(dzr, ["--ckpt", str(ckpt), "--config", str(cfg), *MICRO_GEOMETRY, "--device", "cpu",
                              "--port", "0", "--record", str(record2), "--max-sessions", "2"], env,
                        tmp / "serve_sessions.log")

        def replay(sessions):
            run([tools, *rollout[:1], *[record2 / sid for sid in sessions], *rollout[1:], "--out",
                 tmp / "replay_sessions"], env, "replay of the sessions")
            return {sid: np.load(tmp / "replay_sessions" / sid / "actions.npy") for sid in sessions}

        check_sessions(server, server.port, ep, offline, replay)
        rc = server.stop()
        check(rc == 0, f"dzr serve --max-sessions 2 exited {rc} after SIGINT")
        print("ok: --max-sessions 2: two interleaved clients each get their offline replay's actions, a third waits",
              flush=True)

        # SIGINT on a server of the tiny geometry, whose 4-frame call (~1 s) is surely running 0.1 s after it came
        # (--no-warmup: the first server ran the warm-up)
        ckpt_tiny, record = tmp / "ckpt_tiny", tmp / "record_tiny"
        run([*make, "--out", ckpt_tiny], env, "dzr ckpt make (tiny)")
        server = Server(dzr, ["--ckpt", str(ckpt_tiny), "--config", str(cfg), "--device", "cpu", "--port", "0",
                              "--record", str(record), "--no-warmup"], env, tmp / "serve_tiny.log")
        check_sigint(server, server.port, ep)
        check((record / "sigint" / "served_actions.npy").exists(), "the session open at SIGINT was not recorded")
        print("ok: SIGINT finishes the request in flight, closes with 1001, prints the summary", flush=True)
        print("test_serve: 1 passed, 0 failed")
        return 0
    except Failure as e:
        print(f"test_serve: FAILED: {e}", flush=True)
        if server:
            print(f"--- server log (tail) ---\n{server.log_text()[-4000:]}", flush=True)
        print("test_serve: 0 passed, 1 failed")
        return 1
    finally:
        if server and server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait()
        if a.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
