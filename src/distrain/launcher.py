"""Runs training in child processes and owns them: streams and logs their output, relays their
exit status, and ends every one of them on success, failure, Ctrl-C or SIGTERM.

The launcher never imports TensorFlow: logical devices and started servers cannot be undone inside
a process, so each run (and, on a cluster, each task) gets a fresh one.
"""
import ctypes
import logging
import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import OmegaConf

from . import data
from .config import ConfigError, validate

log = logging.getLogger("distrain")

STOP_GRACE_SECONDS = 10


class Interrupted(Exception):
    def __init__(self, signum):
        super().__init__(signal.Signals(signum).name)
        self.exit_code = 128 + signum


def _raise_interrupted(signum, frame):
    raise Interrupted(signum)


def _die_with_parent():  # runs in the child between fork and exec
    if sys.platform.startswith("linux"):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


@dataclass
class Task:
    """One child process: `name` prefixes its lines (when several share the terminal) and names its log."""
    name: str
    argv: list
    env: dict = field(default_factory=dict)
    proc: subprocess.Popen = None

    def start(self, run_dir: Path, prefix: bool) -> None:
        log_path = run_dir / "logs" / f"{self.name}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.env}
        self.proc = subprocess.Popen(
            self.argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            start_new_session=True,  # our signal handling decides when it stops, not the terminal's
            preexec_fn=_die_with_parent)
        self._pump = threading.Thread(target=_pump, args=(self.proc.stdout, log_path,
                                                         f"[{self.name}] " if prefix else None), daemon=True)
        self._pump.start()

    def stop(self, sig=signal.SIGTERM) -> None:
        if self.proc and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, sig)  # the task's whole process group
            except ProcessLookupError:
                pass

    def join_output(self) -> None:
        self._pump.join(timeout=5)


def _pump(stream, log_path: Path, prefix) -> None:
    """Copy a child's output to our stdout (raw, or line by line with a prefix) and to its log.

    The log keeps only the last state of lines redrawn with carriage returns (progress bars).
    """
    out = sys.stdout.buffer
    pending = b""
    with open(log_path, "wb") as logfile:
        for chunk in iter(lambda: stream.read1(65536), b""):
            if prefix is None:
                out.write(chunk)
                out.flush()
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                line = line.rstrip(b"\r").rsplit(b"\r", 1)[-1].replace(b"\b", b"") + b"\n"
                logfile.write(line)
                if prefix is not None:
                    out.write(prefix.encode() + line)
            logfile.flush()
            if prefix is not None:
                out.flush()
        if pending:
            logfile.write(pending.rsplit(b"\r", 1)[-1] + b"\n")


def run_tasks(tasks: list, run_dir: Path) -> int:
    """Start the tasks, wait for all to end, and return the first non-zero exit status (or 0).

    Whatever happens, no task outlives this call.
    """
    previous = {s: signal.signal(s, _raise_interrupted) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        for task in tasks:
            task.start(run_dir, prefix=len(tasks) > 1)
        codes = [task.proc.wait() for task in tasks]
        for task in tasks:
            task.join_output()
        return next((c for c in codes if c), 0)
    except Interrupted as exc:
        log.error("interrupted by %s: stopping %d task(s)", exc, len(tasks))
        return exc.exit_code
    finally:
        stop_all(tasks)
        for s, handler in previous.items():
            signal.signal(s, handler)


def stop_all(tasks: list) -> None:
    """SIGTERM every task still running, then SIGKILL what has not ended within the grace period."""
    for task in tasks:
        task.stop()
    for task in tasks:
        if task.proc is None:
            continue
        try:
            task.proc.wait(timeout=STOP_GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            task.stop(signal.SIGKILL)
            task.proc.wait()


def launch(cfg, run_dir: Path) -> int:
    """Check the config, settle the data source, record the config, run the training. Exit status."""
    try:
        validate(cfg)
        source, why = data.resolve_source(cfg.data)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    log.info("data: %s from source %s (%s)", cfg.data.name, source, why)
    cfg = OmegaConf.merge(cfg, {"data": {"source": source}})
    config_path = run_dir / "config.yaml"
    OmegaConf.save(cfg, config_path, resolve=True)
    log.info("config (also in %s):\n%s", config_path, OmegaConf.to_yaml(cfg, resolve=True))

    tasks = [Task("train", [sys.executable, "-m", "distrain.task", str(config_path)])]
    code = run_tasks(tasks, run_dir)
    if code:
        log.error("training failed with exit status %d; its log: %s", code, run_dir / "logs" / "train.log")
    return code
