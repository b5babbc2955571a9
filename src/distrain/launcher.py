"""Runs training in child processes and owns them: streams and logs their output, relays their
exit status, and ends every one of them on success, failure, Ctrl-C or SIGTERM.

The launcher never imports TensorFlow: logical devices and started servers cannot be undone inside
a process, so each run (and, on a cluster, each task) gets a fresh one.
"""
import contextlib
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import portpicker
from omegaconf import OmegaConf

from . import cluster as cluster_lib
from . import cpu, data, report, schema
from .cluster import READY
from .config import CLUSTER_STRATEGIES, ConfigError, checkpoint_dir, has_checkpoint, resumed, validate
from .errors import print_error
from .forkserver import ForkServer
from .process import SCRATCH, die_with_parent

log = logging.getLogger("distrain")

STOP_GRACE_SECONDS = 10


class Interrupted(Exception):
    def __init__(self, signum):
        super().__init__(signal.Signals(signum).name)
        self.exit_code = 128 + signum


def _raise_interrupted(signum, frame):
    raise Interrupted(signum)


# TensorFlow's lines that no setting hides any more: kept in the task logs, not shown on the terminal. Its
# start-up, the coordinator's retries while a parameter-server worker is down (the launcher says why), and
# its report of each function a failed one cancelled (the run's own error line says why).
NOISE = (b"All log messages before absl::InitializeLog()", b"oneDNN custom operations are on",
         b"Could not find cuda drivers", b"failed call to cuInit", b"Unable to register cu",
         b"computation placer already registered", b"TF-TRT Warning",
         b"This TensorFlow binary is optimized", b"To enable the following instructions",
         b"GeneratorDatasetOp::Dataset will not be optimized",
         b"function remotely due to failed to connect", b"Additional GRPC error information from remote",
         b"This could happen if the remote target has been", b":UNKNOWN:Error received from peer",
         b"Ignoring an error encountered when deleting remote tensors",
         b"encountered the following error when processing", b"\t [[{{node ",
         b"MultiDeviceSaver.save.<locals>.tf_function_save",  # its checkpoints under parameter servers
         b"ERROR:tensorflow:Worker /job:worker/", b"Local rendezvous is aborting with status",
         b"Device filters can only be specified when initializing")  # a worker lost, then back


def is_noise(line: bytes) -> bool:
    return any(pattern in line for pattern in NOISE)


@dataclass
class Job:
    """Where a run stands in a sweep: its number, and the values swept for it (e.g. "cluster.workers=2")."""
    num: int
    swept: str = ""

    def __str__(self) -> str:
        return f"#{self.num}" + (f" ({self.swept})" if self.swept else "")


@dataclass
class Outcome:
    """How a run ended: exit status, ok/failed/interrupted, and for a failure what went wrong.
    `restart`: the whole cluster should start again (from its latest checkpoint)."""
    code: int
    status: str = "ok"
    error: str = ""
    log_tail: list = field(default_factory=list)
    restart: bool = False


class Restarts:
    """The restart budget of a local cluster (cluster.max_restarts), shared by all its tasks, and the
    record of each restart. A task that exits with status 2 gave a configuration error: restarting it
    would not help."""

    def __init__(self, limit: int):
        self.limit, self.done = limit, []
        self.per_task = Counter()  # times each task was started again

    def allow(self, task, code: int) -> bool:
        return code != 2 and len(self.done) < self.limit

    def take(self, task, code: int | None, why: str, what: str, restarted: list) -> None:
        """`task` exited with `code` (None: it hung), as `why` says: the `restarted` tasks start again."""
        self.done.append({"task": task.name, "exit_status": code, "restarted": what})
        self.per_task.update(t.name for t in restarted)
        log.warning("%s: restarting %s (restart %d of %d, cluster.max_restarts)", why, what, len(self.done),
                    self.limit)

    def exhausted(self, why: str) -> str:
        return (f"{why} and the cluster was restarted {len(self.done)} time(s) already "
                f"(cluster.max_restarts={self.limit}); raise cluster.max_restarts, or read its log for why it "
                "keeps dying") if self.done else why


@dataclass
class Task:
    """One child process. `name` prefixes its lines (when several share the terminal) and names its log.

    main: the run is over once every main task has exited.  essential: its failure ends the run,
    or restarts the cluster (a sidecar evaluator's does not).  alone: it is restarted on its own, on
    the same address (a parameter-server worker: the coordinator retries its functions on the others
    meanwhile, then schedules on it again once it answers).
    """
    name: str
    argv: list
    env: dict = field(default_factory=dict)
    main: bool = True
    essential: bool = True
    alone: bool = False
    spec: object = None  # the cluster.TaskSpec, for cluster tasks
    cores: set = None  # CPU affinity, when pinned
    proc: subprocess.Popen = None
    ready: bool = False
    ready_after: float = None  # seconds from the command's start to its first "ready" line
    restarts: int = 0
    peer_timeout: float = 0  # > 0: the task keeps a heartbeat (process.Heartbeat) that must not stop this long
    hung: bool = False
    forks: ForkServer = None  # starts the task with TensorFlow imported, instead of running argv

    def start(self, run_dir: Path, prefix: str | None) -> None:
        self.prefix = prefix
        self.log_path = run_dir / "logs" / f"{self.name}.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.ready = self.hung = False
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.env}
        if self.peer_timeout:
            self.heartbeat = self.log_path.with_suffix(".heartbeat")
            self.heartbeat.unlink(missing_ok=True)
            env["DISTRAIN_HEARTBEAT"] = str(self.heartbeat)
        self.proc = None
        if self.forks and self.forks.reason == "":
            try:
                self.proc = self.forks.spawn(env, self.cores)
            except OSError as exc:
                log.warning("tasks start without TensorFlow imported in advance (%s; its log: %s)", exc,
                            self.forks.log_path)
        if self.proc is None:
            self.proc = subprocess.Popen(
                self.argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                start_new_session=True,  # our signal handling decides when it stops, not the terminal's
                preexec_fn=self._in_child)
        self._pump = threading.Thread(target=self._copy_output, args=(prefix,), daemon=True)
        self._pump.start()

    def _in_child(self) -> None:  # between fork and exec
        die_with_parent()
        if self.cores:
            os.sched_setaffinity(0, self.cores)

    def _copy_output(self, prefix) -> None:
        """Copy the output to our stdout and to the task's log, line by line with `prefix` when one is
        given, else as it comes (progress bars redraw in place). TensorFlow's start-up noise goes to
        the log only. The log keeps only the last state of lines redrawn with carriage returns."""
        out, pending, shown = sys.stdout.buffer, b"", 0  # shown: bytes of `pending` already on the terminal
        err = sys.stderr.buffer  # a task's "error: ..." line goes where errors go
        with open(self.log_path, "ab" if self.restarts else "wb") as logfile:  # a restart goes on in the same log
            if self.restarts:
                logfile.write(f"--- restart {self.restarts} ---\n".encode())
            for chunk in iter(lambda: self.proc.stdout.read1(65536), b""):
                *lines, pending = (pending + chunk).split(b"\n")
                for line in lines:
                    last = line.rstrip(b"\r").rsplit(b"\r", 1)[-1].replace(b"\b", b"") + b"\n"
                    if not self.ready and READY.encode() in last:
                        self.ready = True
                        self.ready_after = self.ready_after or report.seconds_since_start(time.time())
                    logfile.write(last)
                    if last.startswith(b"error:"):
                        out.flush()
                        err.write((prefix or "").encode() + last)
                        err.flush()
                    elif prefix is not None:
                        if not is_noise(last):
                            out.write(prefix.encode() + last)
                    elif shown or not is_noise(line):
                        out.write(line[shown:] + b"\n")
                    shown = 0
                if prefix is None and (b"\r" in pending or b"\b" in pending):  # a progress bar: show it now
                    out.write(pending[shown:])
                    shown = len(pending)
                logfile.flush()
                out.flush()
            if pending:
                logfile.write(pending.rsplit(b"\r", 1)[-1] + b"\n")

    def stalled(self) -> bool:
        """Its heartbeat, once it keeps one, stopped for longer than peer_timeout."""
        try:
            return self.peer_timeout > 0 and time.time() - self.heartbeat.stat().st_mtime > self.peer_timeout
        except (AttributeError, FileNotFoundError):  # no heartbeat (yet, or any more)
            return False

    def stop(self, sig=signal.SIGTERM) -> None:
        if self.proc and self.proc.poll() is None:
            if self.hung or _stopped(self.proc.pid):  # stuck or frozen: it cannot save, nor act on SIGTERM
                sig = signal.SIGKILL
            try:
                os.killpg(self.proc.pid, sig)  # the task's whole process group
            except ProcessLookupError:
                pass

    def log_tail(self, lines=15) -> list:
        """The last lines of its log, without TensorFlow's start-up noise."""
        self._pump.join(timeout=2)
        text = self.log_path.read_text(errors="replace").splitlines()
        return [line for line in text if not is_noise(line.encode())][-lines:]

    def describe(self) -> dict:
        code = self.proc.poll() if self.proc else None
        state = "running" if code is None else f"exited {code}"
        spec = self.spec
        return {"name": self.name, "type": spec.type if spec else "local", "index": spec.index if spec else 0,
                "address": spec.address if spec else None, "pid": self.proc.pid if self.proc else None,
                "cores": sorted(self.cores) if self.cores else None,
                "state": state, "restarts": self.restarts, "seconds_to_ready": self.ready_after,
                "log": str(self.log_path)}


def _stopped(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] in ("T", "t")  # the state, after the command's name


def print_failure(outcome: Outcome, log_path: Path) -> None:
    """The run's error line, with the end of the failed task's log indented below it."""
    tail = "\n".join(f"    {line}" for line in outcome.log_tail) or "    (no output)"
    print_error(f"{outcome.error}; the end of its log ({log_path}):\n{tail}")


def run_tasks(tasks: list, run_dir: Path, startup_timeout=None, on_change=None, job: Job | None = None,
              restarts: Restarts | None = None, probe_peers: bool = False) -> Outcome:
    """Start the tasks and supervise them until the run is over.

    Over when every main task has exited (ok), an essential task fails (its status), tasks are not
    all up within startup_timeout seconds (1), or we are interrupted (128 + signal). `on_change(status)`
    hears of every change of state ("running", then how the run ended). Whatever happens, no task
    outlives this call.
    """
    previous = {s: signal.signal(s, _raise_interrupted) for s in (signal.SIGINT, signal.SIGTERM)}
    deadline = time.monotonic() + (startup_timeout or 0)
    seen, outcome = set(), Outcome(1, "failed")
    try:
        for task in tasks:  # a prefix tells apart the lines of several tasks, or of a sweep's jobs
            names = ([f"#{job.num}"] if job else []) + ([task.name] if len(tasks) > 1 else [])
            task.start(run_dir, prefix=f"[{' '.join(names)}] " if names else None)
        on_change and on_change("running")
        while True:
            # A task killed by a signal first: the others it takes down with it exit on their own after.
            for task in sorted(tasks, key=lambda t: (t.proc.poll() or 0) >= 0):
                code = task.proc.poll()
                if code is None and task.stalled():  # alive, but stuck waiting on a peer
                    task.hung, code = True, 1
                    why = (f"task {task.name} made no progress for {task.peer_timeout:g} s (cluster.peer_timeout): "
                           "a worker or ps task it waits for stopped answering")
                elif code is None or task.name in seen:
                    continue
                else:
                    why = f"task {task.name} exited with status {code}"
                seen.add(task.name)
                on_change and on_change("running")
                if code and task.alone and restarts and restarts.allow(task, code):
                    restarts.take(task, code, why, "it on its own address", [task])
                    task.restarts = restarts.per_task[task.name]
                    task.start(run_dir, task.prefix)
                    seen.discard(task.name)
                    on_change and on_change("running")  # its new pid
                    continue
                if code and task.essential and restarts and restarts.allow(task, code):
                    restarts.take(task, None if task.hung else code, why, "the cluster from its latest checkpoint",
                                  tasks)
                    outcome = Outcome(code, "restarting", why, restart=True)
                    return outcome
                if code and task.essential:
                    outcome = Outcome(code, "failed", restarts.exhausted(why) if restarts else why, task.log_tail())
                    said = any(line.startswith("error:") for line in outcome.log_tail)  # its own line: enough
                    if (len(tasks) > 1 or task.hung) and not said:  # (its lines were mixed with the others')
                        print_failure(outcome, task.log_path)
                    return outcome
                if code:
                    log.warning("task %s exited with status %d: the run goes on without it", task.name, code)
            if all(t.proc.poll() is not None for t in tasks if t.main):  # failures returned above
                for task in tasks:
                    if task.proc.poll() is not None:  # (servers still running are stopped below)
                        task._pump.join(timeout=5)  # their last lines reach the terminal and the logs
                outcome = Outcome(0)
                return outcome
            starting = [t for t in tasks if not t.ready and t.proc.poll() is None]
            if startup_timeout and starting and time.monotonic() > deadline:
                late = starting[0]
                error = f"task {late.name} did not come up within {startup_timeout:g} s (cluster.startup_timeout)"
                if probe_peers:  # on a real cluster, name the peers it waits for that do not answer
                    silent = cluster_lib.unanswered(cluster_lib.peers(*cluster_lib.from_tf_config(
                        late.env["TF_CONFIG"], None)))
                    error += (f": no answer from {', '.join(f'{n} ({why})' for n, why in silent.items())}; "
                              "start those tasks or fix their addresses") if silent else \
                        ": every peer answers, so read its log below; or raise cluster.startup_timeout"
                for task in starting:  # nothing to save yet: no grace period
                    task.stop(signal.SIGKILL)
                outcome = Outcome(1, "failed", error, late.log_tail())  # (it waits for the last output)
                print_failure(outcome, late.log_path)
                return outcome
            if not starting:
                startup_timeout = None
            time.sleep(0.1)
    except Interrupted as exc:
        log.error("interrupted by %s: stopping %d task(s)", exc, len(tasks))
        outcome = Outcome(exc.exit_code, "interrupted", f"interrupted by {exc}")
        return outcome
    finally:
        for s in previous:  # stopping is bounded (STOP_GRACE_SECONDS): a second Ctrl-C must not cut it short
            signal.signal(s, signal.SIG_IGN)
        # Recorded before the tasks are stopped, in case whoever interrupted us kills us next.
        report.write_status(run_dir, outcome.status, outcome.code, outcome.error, outcome.log_tail, job)
        on_change and on_change(outcome.status)
        stop_all(tasks)
        on_change and on_change(outcome.status)
        for s, handler in previous.items():
            signal.signal(s, handler)


def stop_all(tasks: list) -> None:
    """SIGTERM every task still running, then SIGKILL what has not ended within one grace period.

    The tasks that train go first: on SIGTERM they finish the step under way and checkpoint it, which
    under parameter servers needs the ps and worker servers, stopped only then."""
    deadline = time.monotonic() + STOP_GRACE_SECONDS
    for group in ([t for t in tasks if t.main], [t for t in tasks if not t.main]):
        for task in group:
            task.stop()
        for task in group:
            if task.proc is None:
                continue
            try:
                task.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                task.stop(signal.SIGKILL)
                task.proc.wait()


def launch(cfg, run_dir: Path, job: Job | None = None, overrides=()) -> int:
    """Check the config, settle the data source, record the config, run the task(s). Exit status.

    `job` is set when the run is one job of a sweep: its lines carry the job number, and the resolved
    config goes to launcher.log only. `overrides` (this command's) matter to a resumed run."""
    if job:  # a job's start-up is timed from its own start (results.json: seconds_to_first_step)
        os.environ["DISTRAIN_STARTED"] = str(time.time())
        # Before anything can interrupt it: a sweep's process that is killed before it records how its
        # job ended (joblib's workers, on Ctrl-C) leaves this, which the sweep then marks interrupted.
        report.write_status(run_dir, "running", None, job=job)
    try:
        cfg = validate(cfg)
        if cfg.trainer.resume:
            auto = cfg.trainer.resume == "auto"
            cfg = validate(resumed(cfg, run_dir, list(overrides)))
            if cfg.trainer.resume:
                log.info("resuming the run in %s", run_dir)
            elif auto:
                log.info("trainer.resume=auto: no checkpoint in %s yet, so the run starts from the beginning",
                         checkpoint_dir(cfg, run_dir))
        source, why = data.resolve_source(cfg.data)
        cfg = OmegaConf.merge(cfg, {"data": {"source": source}})
        on_this_machine = cfg.strategy.name not in CLUSTER_STRATEGIES or cfg.cluster.name == "local"
        if on_this_machine:  # (a ps task elsewhere needs no data)
            data.check_files(cfg.data)
        if cfg.strategy.name in CLUSTER_STRATEGIES and cfg.cluster.name != "local":
            spec, task = cluster_lib.this_task(cfg.cluster, cfg.strategy.name)
    except ConfigError as exc:
        print_error(str(exc))
        return _finish(Outcome(2, "failed", f"error: {exc}"), run_dir, job)
    log.info("data: %s from source %s (%s)", schema.label(cfg.data), source, why)
    config_path = run_dir / "config.yaml"
    report.write_text(config_path, OmegaConf.to_yaml(cfg, resolve=True))  # whole, though every task writes it
    (logging.getLogger("distrain.config") if job else log).info(
        "config (also in %s):\n%s", config_path, OmegaConf.to_yaml(cfg, resolve=True))
    argv = [sys.executable, "-m", "distrain.task", str(config_path)]

    with environment(cpu.onednn_env(cfg.trainer.onednn)):  # read by TensorFlow as each task starts
        if cfg.strategy.name not in CLUSTER_STRATEGIES:
            return _finish(run_tasks([Task("train", argv)], run_dir, job=job), run_dir, job)
        if cfg.cluster.name == "local":
            return _finish(run_local_cluster(cfg, run_dir, argv, job), run_dir, job)
        # One task of a cluster spread over machines: this process plays the part TF_CONFIG gives it.
        log.info("this process is task %s:%d of %s", task.type, task.index, spec)
        env = {**cluster_lib.task_env(spec, task), **(cluster_lib.slurm_gpus() if cfg.cluster.name == "slurm" else {})}
        return _finish(run_tasks([Task(task.name, argv, env, spec=task,
                                       peer_timeout=coordinator_timeout(cfg, task.type))], run_dir,
                                 startup_timeout=cfg.cluster.startup_timeout, job=job, probe_peers=True), run_dir, job)


@contextlib.contextmanager
def environment(values: dict):
    """These variables in os.environ, which every task (and the fork server) inherits, for one run;
    as they were after it (the next job of a sweep may choose otherwise)."""
    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextlib.contextmanager
def scratch_dir():
    """A directory for the tasks' temporary files (process.scratch()), removed even if a task was killed."""
    with tempfile.TemporaryDirectory(prefix="distrain-scratch-") as path:
        os.environ[SCRATCH] = path
        try:
            yield path
        finally:
            os.environ.pop(SCRATCH, None)


def run_local_cluster(cfg, run_dir: Path, argv: list, job: Job | None = None) -> Outcome:
    """Every task of the cluster as a process on this machine, inside a private network if possible.

    An essential task that dies restarts the whole cluster, which resumes from its latest checkpoint
    (every synchronous worker needs every other; the ps tasks hold the only copy of the variables); a
    parameter-server worker is restarted alone. Up to cluster.max_restarts restarts in all."""
    c, strategy = cfg.cluster, cfg.strategy.name
    per_worker = int(cluster_lib.thread_caps("worker", c.workers, c.threads_per_worker)["TF_NUM_INTRAOP_THREADS"])
    restarts = Restarts(c.max_restarts)
    with cluster_lib.PrivateNetwork(enabled=c.isolate is not False) as net, \
            cluster_lib.CoreLocks(c.workers * per_worker if c.pin_workers else 0) as cores, scratch_dir():
        if not net.available:
            if c.isolate is True:
                error = (f"cluster.isolate=true but no private network is possible here ({net.reason}): "
                         "set cluster.isolate=auto to run without one")
                print_error(error)
                return Outcome(2, "failed", f"error: {error}")
            log.warning("the cluster's servers are NOT isolated (%s): TensorFlow listens on every interface, "
                        "so anyone who can reach this machine can reach them; use a trusted network",
                        net.reason)
        if cores.shared:
            log.warning("cluster.pin_workers: %s", cores.shared)
        network = "private network namespace" if net.available else f"host network, not isolated ({net.reason})"
        # Started only now, so that a run refused above imports nothing. argv[-1]: the run's config.
        with ForkServer(argv[-1], run_dir / "logs" / "forkserver.log", net.wrap) as forks:
            while True:
                spec, tasks = _cluster_tasks(cfg, argv, net, cores.cores, per_worker, forks)
                for task in tasks:  # after a restart of the cluster, each task's log goes on
                    task.restarts = restarts.per_task[task.name]
                log.info("local cluster (%s): %s", network, ", ".join(f"{t.name}={t.spec.address}" for t in tasks))

                def write_cluster_json(status: str):
                    state = {"strategy": strategy, "network": network, "status": status, "cluster": spec,
                             "restarts": restarts.done, "tasks": [t.describe() for t in tasks if t.proc]}
                    report.write_json(run_dir / "cluster.json", state)

                outcome = run_tasks(tasks, run_dir, startup_timeout=c.startup_timeout, on_change=write_cluster_json,
                                    job=job, restarts=restarts)
                if not outcome.restart:
                    _record_restarts(run_dir, restarts)
                    return outcome
                cfg = _resuming(cfg, run_dir)


def _cluster_tasks(cfg, argv: list, net, cores: list, per_worker: int, forks) -> tuple[dict, list]:
    """The cluster spec (ports picked free) and a Task for each of its tasks."""
    c, strategy = cfg.cluster, cfg.strategy.name
    spec = cluster_lib.local_spec(strategy, c.workers, c.ps)
    tasks = []
    for task_type, addresses in spec.items():
        for index, address in enumerate(addresses):
            task = cluster_lib.TaskSpec(task_type, index, address)
            # The chief coordinates parameter servers and needs few threads; workers share the cores.
            env = {**cluster_lib.task_env(spec, task), **cluster_lib.thread_caps(task_type, c.workers, c.threads_per_worker)}
            serves = strategy == "parameter_server" and task_type != "chief"
            pinned = cluster_lib.worker_cores(index, per_worker, cores) if c.pin_workers and task_type == "worker" else None
            tasks.append(Task(task.name, net.wrap(argv), env, main=not serves, alone=serves and task_type == "worker",
                              spec=task, cores=pinned, peer_timeout=coordinator_timeout(cfg, task_type), forks=forks))
    if c.evaluator:  # known to itself but not to the training tasks: strategies need not wait for it
        evaluator = cluster_lib.TaskSpec("evaluator", 0, f"127.0.0.1:{portpicker.pick_unused_port()}")
        env = {**cluster_lib.task_env({**spec, "evaluator": [evaluator.address]}, evaluator),
               **cluster_lib.thread_caps("evaluator", c.workers)}
        tasks.append(Task(evaluator.name, net.wrap(argv), env, essential=False, spec=evaluator, forks=forks))
    return spec, tasks


def coordinator_timeout(cfg, task_type: str) -> float:
    """The parameter-server chief keeps a heartbeat, which must not stop for cluster.peer_timeout."""
    return cfg.cluster.peer_timeout if cfg.strategy.name == "parameter_server" and task_type == "chief" else 0


def _resuming(cfg, run_dir: Path):
    """The config for a restarted cluster: resume from the latest checkpoint if there is one."""
    if not has_checkpoint(cfg, run_dir):
        log.warning("no checkpoint yet in %s: the cluster starts from the beginning", checkpoint_dir(cfg, run_dir))
        return cfg
    cfg = OmegaConf.merge(cfg, {"trainer": {"resume": True}})
    report.write_text(run_dir / "config.yaml", OmegaConf.to_yaml(cfg, resolve=True))  # what the restarted tasks read
    return cfg


def _record_restarts(run_dir: Path, restarts: Restarts) -> None:
    """The launcher's restarts, added to the chief's results.json."""
    results = report.read_results(run_dir)
    if results is not None and restarts.done:
        report.write_results(run_dir, {**results, "task_restarts": restarts.done})


def _finish(outcome: Outcome, run_dir: Path, job: Job | None) -> int:
    """Record how the run ended in status.json (run_tasks wrote it already, before stopping the tasks;
    not so a run refused before it started), draw a finished run's curves.png, say it in one line."""
    report.write_status(run_dir, outcome.status, outcome.code, outcome.error, outcome.log_tail, job)
    results = report.read_results(run_dir) if outcome.status == "ok" else None
    if results:
        try:
            from . import plots  # matplotlib: only once there is something to draw
            plots.curves(results, run_dir / "curves.png")
        except Exception as exc:  # noqa: BLE001 - a plot that fails must not fail a finished run
            log.warning("curves.png not drawn: %s", exc)
    if job:
        if outcome.status == "ok":
            log.info("job %s: ok%s", job, f" - {report.short_line(results)}" if results else "")
        else:
            log.error("job %s: %s (exit status %d)%s", job, outcome.status, outcome.code,
                      f" - {outcome.error}" if outcome.error else "")
    elif outcome.code and (run_dir / "logs").exists():  # (a run refused before it started said why already)
        log.error("the run %s with exit status %d; logs in %s",
                  "was interrupted" if outcome.status == "interrupted" else "failed", outcome.code, run_dir / "logs")
    return outcome.code
