#!/usr/bin/env python3
"""The rollout report in a real browser (ctest label `browser`).

Makes the sample rollout (tiny random checkpoint, synthetic episode, 3 calls on the CPU, --save-video),
opens report.html and the episode page in headless Chromium through the DevTools protocol on a pipe
(--remote-debugging-pipe), and checks what a reader would see: no console errors or failed loads,
the episode in the summary table, every plot drawn (a non-empty SVG), and, when this dzr build
encodes video, both videos loaded (readyState, duration, size) and playing together. Screenshots
and the page self-check results are saved under --artifacts.

Standard library only. Exit 77 (ctest: skipped) when no Chromium is installed.
"""
import argparse
import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse

SKIP = 77
BROWSERS = ("chromium-headless-shell", "chromium", "chromium-browser", "google-chrome")


class Browser:
    """Chromium with the DevTools protocol on fds 3 (commands in) and 4 (replies out)."""

    def __init__(self, exe, log_path, profile):
        cmd_r, self._cmd_w = os.pipe()
        self._res_r, res_w = os.pipe()

        def wire_fds():
            # NOTE: copy above 10 first, so moving onto 3 and 4 cannot overwrite one of the pipes.
            a = fcntl.fcntl(cmd_r, fcntl.F_DUPFD, 10)
            b = fcntl.fcntl(res_w, fcntl.F_DUPFD, 10)
            os.dup2(a, 3)
            os.dup2(b, 4)

        self._log = open(log_path, "w")
        self.proc = subprocess.Popen(
            [exe, "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe", "--no-first-run",
             "--user-data-dir=" + profile, "--autoplay-policy=no-user-gesture-required", "--hide-scrollbars",
             "--mute-audio", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT, pass_fds=(3, 4),
            preexec_fn=wire_fds)
        os.close(cmd_r)
        os.close(res_w)
        self._buf = b""
        self._next_id = 0
        self.events = []
        self.session = None

    def _read_message(self, deadline):
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no answer from the browser")
            ready, _, _ = select.select([self._res_r], [], [], left)
            if ready:
                chunk = os.read(self._res_r, 1 << 20)
                if not chunk:
                    raise RuntimeError("the browser closed the DevTools pipe (see the browser log)")
                self._buf += chunk
        msg, self._buf = self._buf.split(b"\0", 1)
        return json.loads(msg)

    def call(self, method, params=None, timeout=30, session=True):
        self._next_id += 1
        msg = {"id": self._next_id, "method": method, "params": params or {}}
        if session and self.session:
            msg["sessionId"] = self.session
        os.write(self._cmd_w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            if "method" in reply:
                self.events.append(reply)

    def wait_event(self, method, timeout=30):
        deadline = time.monotonic() + timeout
        for i, e in enumerate(self.events):
            if e["method"] == method:
                return self.events.pop(i)
        while True:
            e = self._read_message(deadline)
            if e.get("method") == method:
                return e
            if "method" in e:
                self.events.append(e)

    def close(self):
        try:
            self.call("Browser.close", session=False, timeout=5)
        except Exception:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


def console_errors(events):
    """Exceptions, console.error/assert and browser log errors (failed loads) seen so far."""
    errors = []
    for e in events:
        p = e.get("params", {})
        if e["method"] == "Runtime.exceptionThrown":
            d = p.get("exceptionDetails", {})
            errors.append("exception: " + d.get("exception", {}).get("description", d.get("text", "?")))
        elif e["method"] == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            errors.append("console." + p["type"] + ": " + " ".join(str(a.get("value", a.get("description", "")))
                                                                  for a in p.get("args", [])))
        elif e["method"] == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
            errors.append("log: " + p["entry"].get("text", "") + " " + p["entry"].get("url", ""))
    return errors


def open_page(browser, url, artifacts, name):
    """Loads `url`, runs the page's self-check, saves a screenshot; returns (self-check, errors)."""
    browser.events.clear()
    browser.call("Emulation.setDeviceMetricsOverride", {"width": 1280, "height": 900, "deviceScaleFactor": 1,
                                                        "mobile": False})
    browser.call("Page.navigate", {"url": url})
    browser.wait_event("Page.loadEventFired")
    result = browser.call("Runtime.evaluate", {"expression": "window.dzrSelfTest ? dzrSelfTest(15000) : null",
                                               "awaitPromise": True, "returnByValue": True}, timeout=60)
    check = result.get("result", {}).get("value")
    height = browser.call("Runtime.evaluate", {"expression": "document.documentElement.scrollHeight",
                                               "returnByValue": True})["result"]["value"]
    browser.call("Emulation.setDeviceMetricsOverride", {"width": 1280, "height": min(int(height), 6000),
                                                        "deviceScaleFactor": 1, "mobile": False})
    shot = browser.call("Page.captureScreenshot", {"format": "png"})
    with open(os.path.join(artifacts, name + ".png"), "wb") as f:
        f.write(base64.b64decode(shot["data"]))
    with open(os.path.join(artifacts, name + ".selftest.json"), "w") as f:
        json.dump(check, f, indent=2)
    return check, console_errors(browser.events)


def run(cmd, **kw):
    print("+ " + " ".join(cmd), flush=True)
    return subprocess.run(cmd, check=True, **kw)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dzr", required=True, help="the dzr binary")
    ap.add_argument("--source", required=True, help="the repository root (configs/, tests/data/)")
    ap.add_argument("--work", required=True, help="scratch directory (recreated)")
    ap.add_argument("--artifacts", required=True, help="where screenshots and self-check results go")
    args = ap.parse_args()

    exe = os.environ.get("DZR_CHROMIUM") or next((shutil.which(b) for b in BROWSERS if shutil.which(b)), None)
    if not exe:
        print("skipped: no Chromium found (" + ", ".join(BROWSERS) + "); scripts/test.sh installs "
              "chromium-headless-shell")
        return SKIP

    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(args.work)
    os.makedirs(args.artifacts, exist_ok=True)
    src = args.source
    info = run([args.dzr, "info"], capture_output=True, text=True).stdout
    with_video = "report videos: none" not in info
    run([args.dzr, "ckpt", "make", "--config", os.path.join(src, "configs/tiny.yaml"), "--seed", "0", "--dtype", "f32",
         "--tokenizer", os.path.join(src, "tests/data/tokenizer/spiece.model"), "--out", os.path.join(args.work, "ckpt")],
        stdout=subprocess.DEVNULL)
    episode = os.path.join(args.work, "episodes", "episode_000")
    run([args.dzr, "episode", "synth", "--out", episode], stdout=subprocess.DEVNULL)
    out = os.path.join(args.work, "out")
    run([args.dzr, "rollout", episode, "--ckpt", os.path.join(args.work, "ckpt"), "--config",
         os.path.join(src, "configs/tiny.yaml"), "--device", "cpu", "--out", out, "--save-video", "--no-warmup",
         "--quiet", "--set", "rollout.max_chunks=2"], stdout=subprocess.DEVNULL)

    failures = []

    def expect(ok, what):
        print(("ok   " if ok else "FAIL ") + what, flush=True)
        if not ok:
            failures.append(what)

    with tempfile.TemporaryDirectory() as profile:
        browser = Browser(exe, os.path.join(args.artifacts, "browser.log"), profile)
        try:
            target = browser.call("Target.createTarget", {"url": "about:blank"}, session=False)["targetId"]
            browser.session = browser.call("Target.attachToTarget", {"targetId": target, "flatten": True},
                                           session=False)["sessionId"]
            for domain in ("Page", "Runtime", "Log"):
                browser.call(domain + ".enable")

            index_url = "file://" + urllib.parse.quote(os.path.abspath(os.path.join(out, "report.html")))
            check, errors = open_page(browser, index_url, args.artifacts, "report_index")
            expect(check is not None and check.get("page") == "index", "report.html loads and runs its script")
            expect(not errors and check and not check["errors"], "report.html: no console errors " + str(
                errors + (check["errors"] if check else [])))
            rows = check["rows"] if check else []
            expect([r["name"] for r in rows] == ["episode_000"] and rows[0]["status"] == "ok",
                   "the summary table lists episode_000 as ok: " + str(rows))

            page_url = urllib.parse.urljoin(index_url, rows[0]["href"]) if rows else index_url
            check, errors = open_page(browser, page_url, args.artifacts, "report_episode")
            expect(check is not None and check.get("page") == "episode", "the episode page loads and runs its script")
            expect(not errors and check and not check["errors"], "episode page: no console errors " + str(
                errors + (check["errors"] if check else [])))
            plots = check["plots"] if check else []
            expect(len(plots) == 8 + 2 + 2, f"12 plots (8 action dims, MSE per call and step, timing): {len(plots)}")
            empty = [p["title"] for p in plots if not (p["width"] > 0 and p["height"] > 0 and p["marks"] > 0)]
            expect(not empty, "every plot is drawn (a visible SVG with lines or bars): empty " + str(empty))
            videos = check["videos"] if check else []
            if with_video:
                expect(len(videos) == 2, f"two videos (predicted, observed): {len(videos)}")
                bad = [v for v in videos if not (v["readyState"] >= 2 and v["duration"] and v["duration"] > 0
                                                 and v["width"] > 0 and v["error"] == 0)]
                expect(not bad, "both videos load (readyState >= 2, duration > 0, frame size, no error): " + str(videos))
                # Play both with the page's own button; they run together.
                browser.call("Runtime.evaluate", {"expression": "document.querySelector('.controls .play').click()"})
                time.sleep(1.5)
                times = browser.call("Runtime.evaluate", {
                    "expression": "Array.from(document.querySelectorAll('video')).map(v => [v.currentTime, v.paused])",
                    "returnByValue": True})["result"]["value"]
                expect(all(t > 0 and not p for t, p in times) and abs(times[0][0] - times[1][0]) < 0.3,
                       "'play both' plays both videos in sync (time, paused): " + str(times))
            else:
                images = check["images"] if check else []
                expect(not videos and len(images) == 1 and images[0]["width"] > 0,
                       "without a video encoder: a frame strip image instead: " + str(images))
            expect(not console_errors(browser.events), "no console errors to the end: " +
                   str(console_errors(browser.events)))
        finally:
            browser.close()

    print(f"screenshots: {args.artifacts}/report_index.png, {args.artifacts}/report_episode.png")
    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
