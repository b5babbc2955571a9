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
import time
from dataclasses import dataclass, field
from pathlib import Path

import portpicker
from omegaconf import OmegaConf

from . import cluster as cluster_lib
from . import data, report
from .cluster import READY
from .config import CLUSTER_STRATEGIES, ConfigError, validate

log = logging.getLogger("distrain")

STOP_GRACE_SECONDS = 10


class Interrupted(Exception):
    def __init__(self, signum):
        super().__init__(signal.Signals(signum).name)
        self.exit_code = 128 + signum


def _raise_interrupted(signum, frame):
    raise Interrupted(signum)


def die_with_parent():
    """Linux: this process gets SIGKILL when the process that started it dies, however it dies."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


@dataclass
class Task:
    """One child process. `name` prefixes its lines (when several share the terminal) and names its log.

    main: the run is over once every main task has exited.  essential: its failure ends the run
    (a parameter-server worker is not: the coordinator carries on with the others).
    """
    name: str
    argv: list
    env: dict = field(default_factory=dict)
    main: bool = True
    essential: bool = True
    spec: object = None  # the cluster.TaskSpec, for cluster tasks
    cores: set = None  # CPU affinity, when pinned
    proc: subprocess.Popen = None
    ready: bool = False

    def start(self, run_dir: Path, prefix: bool) -> None:
        self.log_path = run_dir / "logs" / f"{self.name}.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.env}
        self.proc = subprocess.Popen(
            self.argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            start_new_session=True,  # our signal handling decides when it stops, not the terminal's
            preexec_fn=self._in_child)
        self._pump = threading.Thread(target=self._copy_output, args=(f"[{self.name}] " if prefix else None,),
                                      daemon=True)
        self._pump.start()

    def _in_child(self) -> None:  # between fork and exec
        die_with_parent()
        if self.cores:
            os.sched_setaffinity(0, self.cores)

    def _copy_output(self, prefix) -> None:
        """Copy the output to our stdout (raw, or line by line with a prefix) and to the task's log.

        The log keeps only the last state of lines redrawn with carriage returns (progress bars).
        """
        out, pending = sys.stdout.buffer, b""
        with open(self.log_path, "wb") as logfile:
            for chunk in iter(lambda: self.proc.stdout.read1(65536), b""):
                if prefix is None:
                    out.write(chunk)
                    out.flush()
                *lines, pending = (pending + chunk).split(b"\n")
                for line in lines:
                    line = line.rstrip(b"\r").rsplit(b"\r", 1)[-1].replace(b"\b", b"") + b"\n"
                    self.ready = self.ready or READY.encode() in line
                    logfile.write(line)
                    if prefix is not None:
                        out.write(prefix.encode() + line)
                logfile.flush()
                if prefix is not None:
                    out.flush()
            if pending:
                logfile.write(pending.rsplit(b"\r", 1)[-1] + b"\n")

    def stop(self, sig=signal.SIGTERM) -> None:
        if self.proc and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, sig)  # the task's whole process group
            except ProcessLookupError:
                pass

    def log_tail(self, lines=15) -> str:
        self._pump.join(timeout=2)
        text = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        return "\n".join(f"    {line}" for line in text) or "    (no output)"

    def describe(self) -> dict:
        code = self.proc.poll() if self.proc else None
        state = "running" if code is None else f"exited {code}"
        spec = self.spec
        return {"name": self.name, "type": spec.type if spec else "local", "index": spec.index if spec else 0,
                "address": spec.address if spec else None, "pid": self.proc.pid if self.proc else None,
                "cores": sorted(self.cores) if self.cores else None,
                "state": state, "log": str(self.log_path)}


def run_tasks(tasks: list, run_dir: Path, startup_timeout=None, on_change=None) -> int:
    """Start the tasks and supervise them until the run is over; returns its exit status.

    Over when every main task has exited (status 0), an essential task fails (its status), tasks
    are not all up within startup_timeout seconds (1), or we are interrupted (128 + signal).
    Whatever happens, no task outlives this call.
    """
    previous = {s: signal.signal(s, _raise_interrupted) for s in (signal.SIGINT, signal.SIGTERM)}
    deadline = time.monotonic() + (startup_timeout or 0)
    seen = set()
    try:
        for task in tasks:
            task.start(run_dir, prefix=len(tasks) > 1)
        on_change and on_change()
        while True:
            for task in tasks:
                code = task.proc.poll()
                if code is None or task.name in seen:
                    continue
                seen.add(task.name)
                on_change and on_change()
                if code and task.essential:
                    if len(tasks) > 1:  # its lines were mixed with the others': recap them
                        print(f"error: task {task.name} exited with status {code}; the end of its log "
                              f"({task.log_path}):\n{task.log_tail()}", file=sys.stderr, flush=True)
                    return code
                if code:
                    log.warning("task %s exited with status %d: training carries on with the other workers",
                                task.name, code)
            if all(t.proc.poll() is not None for t in tasks if t.main):  # failures returned above
                for task in tasks:
                    if task.proc.poll() is not None:  # (servers still running are stopped below)
                        task._pump.join(timeout=5)  # their last lines reach the terminal and the logs
                return 0
            starting = [t for t in tasks if not t.ready and t.proc.poll() is None]
            if startup_timeout and starting and time.monotonic() > deadline:
                late = starting[0]
                print(f"error: task {late.name} did not come up within {startup_timeout} s "
                      f"(cluster.startup_timeout); the end of its log ({late.log_path}):\n{late.log_tail()}",
                      file=sys.stderr, flush=True)
                return 1
            if not starting:
                startup_timeout = None
            time.sleep(0.1)
    except Interrupted as exc:
        log.error("interrupted by %s: stopping %d task(s)", exc, len(tasks))
        return exc.exit_code
    finally:
        stop_all(tasks)
        on_change and on_change()
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
    """Check the config, settle the data source, record the config, run the task(s). Exit status."""
    try:
        validate(cfg)
        source, why = data.resolve_source(cfg.data)
        cfg = OmegaConf.merge(cfg, {"data": {"source": source}})
        if cfg.strategy.name in CLUSTER_STRATEGIES and cfg.cluster.name != "local":
            spec, task = (cluster_lib.from_tf_config(os.environ.get("TF_CONFIG"), cfg.strategy.name)
                          if cfg.cluster.name == "tf_config" else cluster_lib.from_manual(cfg.cluster, cfg.strategy.name))
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    log.info("data: %s from source %s (%s)", cfg.data.name, source, why)
    config_path = run_dir / "config.yaml"
    OmegaConf.save(cfg, config_path, resolve=True)
    log.info("config (also in %s):\n%s", config_path, OmegaConf.to_yaml(cfg, resolve=True))
    argv = [sys.executable, "-m", "distrain.task", str(config_path)]

    if cfg.strategy.name not in CLUSTER_STRATEGIES:
        return _finish(run_tasks([Task("train", argv)], run_dir), run_dir)
    if cfg.cluster.name == "local":
        return _finish(run_local_cluster(cfg, run_dir, argv), run_dir)
    # One task of a cluster spread over machines: this process plays the part TF_CONFIG gives it.
    log.info("this process is task %s:%d of %s", task.type, task.index, spec)
    return _finish(run_tasks([Task(task.name, argv, cluster_lib.task_env(spec, task), spec=task)], run_dir),
                   run_dir)


def run_local_cluster(cfg, run_dir: Path, argv: list) -> int:
    """Every task of the cluster as a process on this machine, inside a private network if possible."""
    c, strategy = cfg.cluster, cfg.strategy.name
    spec = cluster_lib.local_spec(strategy, c.workers, c.ps)
    # The evaluator is known to itself but not to the training tasks: strategies need not wait for it.
    evaluator = cluster_lib.TaskSpec("evaluator", 0, f"127.0.0.1:{portpicker.pick_unused_port()}") \
        if c.evaluator else None
    with cluster_lib.PrivateNetwork(enabled=c.isolate is not False) as net:
        if not net.available:
            if c.isolate is True:
                print(f"error: cluster.isolate=true but no private network is possible here ({net.reason}): "
                      "set cluster.isolate=auto to run without one", file=sys.stderr, flush=True)
                return 2
            log.warning("the cluster's servers are NOT isolated (%s): TensorFlow listens on every interface, "
                        "so anyone who can reach this machine can reach them; use a trusted network",
                        net.reason)
        tasks = []
        for task_type, addresses in spec.items():
            for index, address in enumerate(addresses):
                task = cluster_lib.TaskSpec(task_type, index, address)
                # The chief coordinates parameter servers and needs few threads; workers share the cores.
                env = {**cluster_lib.task_env(spec, task),
                       **cluster_lib.thread_caps(task_type, c.workers, c.threads_per_worker)}
                serves = strategy == "parameter_server" and task_type != "chief"
                cores = None
                if c.pin_workers and task_type == "worker":
                    cores = cluster_lib.worker_cores(index, int(env["TF_NUM_INTRAOP_THREADS"]))
                tasks.append(Task(task.name, net.wrap(argv), env, main=not serves,
                                  essential=not (serves and task_type == "worker"), spec=task, cores=cores))
        if evaluator:
            env = {**cluster_lib.task_env({**spec, "evaluator": [evaluator.address]}, evaluator),
                   **cluster_lib.thread_caps("evaluator", c.workers)}
            tasks.append(Task(evaluator.name, net.wrap(argv), env, essential=False, spec=evaluator))
        network = "private network namespace" if net.available else f"host network, not isolated ({net.reason})"
        log.info("local cluster (%s): %s", network, ", ".join(f"{t.name}={t.spec.address}" for t in tasks))

        def write_cluster_json():
            state = {"strategy": strategy, "network": network, "cluster": spec,
                     "tasks": [t.describe() for t in tasks if t.proc]}
            report.write_json(run_dir / "cluster.json", state)

        return run_tasks(tasks, run_dir, startup_timeout=c.startup_timeout, on_change=write_cluster_json)


def _finish(code: int, run_dir: Path) -> int:
    if code:
        log.error("the run failed with exit status %d; logs in %s", code, run_dir / "logs")
    return code
