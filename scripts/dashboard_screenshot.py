#!/usr/bin/env python3
"""A screenshot of TensorBoard's HParams dashboard for a sweep (or run) directory, taken by headless
Chromium from a TensorBoard server this script starts on 127.0.0.1 and stops.

    python scripts/dashboard_screenshot.py multirun/DATE/TIME docs/hparams.png [--install]

--install: install Debian's chromium package (as root) where no Chromium is found. Without it, a
machine without Chromium exits with status 3 and says so (tests skip there).
"""
import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import portpicker

NO_BROWSER = 3
BROWSERS = ("chromium", "chromium-browser", "google-chrome")


def browser(install: bool) -> str | None:
    found = next((path for name in BROWSERS if (path := shutil.which(name))), None)
    if found or not install:
        return found
    if os.geteuid() != 0:
        sys.exit("error: --install needs root (apt-get install chromium); install Debian's chromium package, "
                 "then run this again")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-qq", "chromium"], check=True, env=env)
    return shutil.which("chromium")


def serve(logdir: Path, port: int, log) -> subprocess.Popen:
    """TensorBoard on 127.0.0.1:port, once it answers (its own process group: stopped whole)."""
    tensorboard = Path(sys.executable).parent / "tensorboard"
    server = subprocess.Popen([str(tensorboard) if tensorboard.exists() else "tensorboard", "--logdir", str(logdir),
                               "--host", "127.0.0.1", "--port", str(port), "--reload_interval", "0"],
                              stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"tensorboard exited with status {server.returncode} (its log: {log.name})")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/data/plugins_listing", timeout=5):
                return server
        except OSError:
            time.sleep(0.5)
    stop(server)
    raise RuntimeError(f"tensorboard did not answer within 90 s (its log: {log.name})")


def stop(server: subprocess.Popen) -> None:
    try:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=20)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()


def screenshot(chromium: str, url: str, out: Path, size=(1600, 900)) -> None:
    """Chromium renders the page headless, its scripts given 20 s of virtual time, into out (PNG)."""
    with tempfile.TemporaryDirectory(prefix="distrain-chromium-") as profile:
        subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                        f"--user-data-dir={profile}", f"--window-size={size[0]},{size[1]}",
                        "--virtual-time-budget=20000", f"--screenshot={out.resolve()}", url],
                       check=True, capture_output=True, timeout=180)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("logdir", type=Path, help="a sweep directory (multirun/DATE/TIME) or a run's")
    parser.add_argument("out", type=Path, help="the PNG to write")
    parser.add_argument("--install", action="store_true", help="apt-get install chromium if no Chromium is found")
    args = parser.parse_args()
    if not args.logdir.is_dir():
        print(f"error: {args.logdir} is not a directory: give a sweep directory (multirun/DATE/TIME)", file=sys.stderr)
        return 2
    chromium = browser(args.install)
    if not chromium:
        print("skipped: no Chromium here (run with --install, as root, for Debian's chromium package)",
              file=sys.stderr)
        return NO_BROWSER
    args.out.parent.mkdir(parents=True, exist_ok=True)
    port = portpicker.pick_unused_port()
    with tempfile.NamedTemporaryFile("w", prefix="tensorboard-", suffix=".log", delete=False) as log:
        server = serve(args.logdir, port, log)
        try:
            screenshot(chromium, f"http://127.0.0.1:{port}/#hparams", args.out)
        finally:
            stop(server)
    os.unlink(log.name)
    print(f"written: {args.out} (TensorBoard's HParams dashboard of {args.logdir})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
