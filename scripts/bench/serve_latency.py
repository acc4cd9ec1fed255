#!/usr/bin/env python3
"""Served latency against the offline call time (docs/PERF.md, "Serving"): starts `dzr serve --record`, runs one
session of an episode directory's frames on the official test client's schedule through loopback (openpi-client's
msgpack_numpy, websockets), stops the server with SIGINT, replays the recording with `dzr rollout`, and prints each
call's request-to-reply time (the server's log), its engine time, and the offline rollout's time of the same call,
and whether the served actions equal the replay's byte for byte.

Usage: serve_latency.py --dzr DZR --ckpt CKPT --episode EPISODE_DIR --work DIR [-- serve/rollout args: --config
       C --device cuda --tokenizer T]
"""
import argparse
import json
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import websockets.sync.client as ws_client
from openpi_client import msgpack_numpy

warnings.filterwarnings("ignore", message=r"connect\(\) must be used as a context manager")
CAMERAS = {"observation/exterior_image_0_left": "exterior_image_1_left",
           "observation/exterior_image_1_left": "exterior_image_2_left",
           "observation/wrist_image_left": "wrist_image_left"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dzr", required=True)
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--episode", required=True, type=Path)
    ap.add_argument("--work", required=True, type=Path)
    ap.add_argument("--prompt", default="Put the marker in the cup")
    ap.add_argument("args", nargs="*", help="after --: arguments of both dzr serve and dzr rollout")
    a = ap.parse_args()
    shutil.rmtree(a.work, ignore_errors=True)
    a.work.mkdir(parents=True)

    frames = {k: np.load(a.episode / f"{f}.npy") for k, f in CAMERAS.items()}
    joint = np.load(a.episode / "joint_position.npy")
    gripper = np.load(a.episode / "gripper_position.npy").reshape(len(joint), -1)
    n = min(len(v) for v in frames.values())
    calls = [([0], 0)] + [([max(t + o, 0) for o in (-23, -16, -8, 0)], t) for t in range(23, n, 24)]

    log = open(a.work / "serve.log", "w")
    server = subprocess.Popen([a.dzr, "serve", "--ckpt", a.ckpt, "--port", "0", "--record", str(a.work / "rec"),
                               *a.args], stdout=subprocess.PIPE, stderr=log, text=True)
    port, ready = [], threading.Event()

    def pump():
        for line in server.stdout:
            m = re.search(r"listening on ws://[^ ]*:(\d+)", line)
            if m:
                port.append(int(m.group(1)))
                ready.set()
        ready.set()

    threading.Thread(target=pump, daemon=True).start()
    t0 = time.time()
    if not ready.wait(900) or not port:
        server.kill()
        sys.exit(f"dzr serve did not start:\n{(a.work / 'serve.log').read_text()[-3000:]}")
    print(f"server ready after {time.time() - t0:.1f} s (load and warm-up)")

    ws = ws_client.connect(f"ws://127.0.0.1:{port[0]}", compression=None, max_size=None, open_timeout=30,
                           ping_interval=60, ping_timeout=600)
    msgpack_numpy.unpackb(ws.recv())
    packer = msgpack_numpy.Packer()
    client_ms, served = [], []
    for idx, anchor in calls:
        obs = {k: (v[idx][0] if len(idx) == 1 else v[idx]) for k, v in frames.items()}
        obs.update({"observation/joint_position": joint[anchor].astype(np.float64),
                    "observation/gripper_position": gripper[anchor].astype(np.float64),
                    "observation/cartesian_position": np.zeros(6, np.float64),
                    "prompt": a.prompt, "session_id": "latency", "endpoint": "infer"})
        t = time.perf_counter()
        ws.send(packer.pack(obs))
        reply = ws.recv()
        client_ms.append((time.perf_counter() - t) * 1e3)
        if isinstance(reply, str):
            sys.exit(f"error reply: {reply}")
        served.append(msgpack_numpy.unpackb(reply))
    ws.send(packer.pack({"endpoint": "reset"}))
    ws.recv()
    ws.close()
    server.send_signal(signal.SIGINT)
    rc = server.wait(300)
    log.close()
    text = (a.work / "serve.log").read_text(errors="replace")
    lines = re.findall(r"call (\d+): (\d+) frames?[^;]*?engine ([\d.]+) ms; ([\d.]+) ms request to reply", text)
    if rc != 0 or len(lines) != len(calls):
        sys.exit(f"dzr serve exit {rc}, {len(lines)} timed requests of {len(calls)}:\n{text[-3000:]}")

    rec = a.work / "rec" / "latency"
    p = subprocess.run([a.dzr, "rollout", str(rec), "--ckpt", a.ckpt, *a.args, "--out", str(a.work / "replay"),
                        "--no-report"], capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"replay failed:\n{p.stderr[-3000:]}")
    offline = [c["total_ms"] for c in json.load(open(a.work / "replay" / "latency" / "timing.json"))["calls"]]
    replay = np.load(a.work / "replay" / "latency" / "actions.npy")
    recorded = np.load(rec / "served_actions.npy")
    same_bytes = replay.tobytes() == recorded.tobytes() and recorded.tobytes() == np.stack(served).tobytes()

    print(f"{'call':>4} {'frames':>6} {'engine ms':>10} {'request->reply ms':>18} {'client round trip ms':>21} "
          f"{'offline call ms':>16}")
    for (k, t, eng, srv), cli, off in zip(lines, client_ms, offline):
        print(f"{k:>4} {t:>6} {float(eng):>10.1f} {float(srv):>18.1f} {cli:>21.1f} {off:>16.1f}")
    steady = range(1, len(calls))
    d_off = [float(lines[i][3]) - offline[i] for i in steady]
    d_eng = [float(lines[i][3]) - float(lines[i][2]) for i in steady]
    d_cli = [client_ms[i] - float(lines[i][3]) for i in steady]
    print(f"steady calls ({len(d_off)}): request->reply minus offline call: median {statistics.median(d_off):+.1f} ms "
          f"(max {max(d_off, key=abs):+.1f}); minus engine: median {statistics.median(d_eng):+.1f} ms; client round "
          f"trip minus request->reply: median {statistics.median(d_cli):+.1f} ms")
    print(f"served actions equal the offline replay's byte for byte: {same_bytes}")
    sys.exit(0 if same_bytes else 1)


if __name__ == "__main__":
    main()
