"""Supervises a run's task processes: starts them, streams and logs their output, watches them for
death and silence, restarts what may be restarted, and ends every one of them on success, failure,
Ctrl-C or SIGTERM. What to do when a task ends is decided by `restarts.decide`, a function of its state
alone; what of a task's output reaches the terminal, by `task_output.route`."""
import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from distrain.common import cluster as cluster_lib
from distrain.common import storage
from distrain.common.cluster import Task
from distrain.common.errors import print_error
from distrain.common.lifetime import die_with_parent
from distrain.common.messages import HEARTBEAT, POSITION, SCRATCH, STACKS, is_error, is_ready
from distrain.common.rundir import RunDir
from distrain.launcher import memory, stalls
from distrain.launcher.forkserver import ForkServer
from distrain.launcher.memory import Watch
from distrain.launcher.restarts import FAIL, LEAVE, RESTART_CLUSTER, RESTART_IT, SHRINK, Restarts, decide, signalled
from distrain.launcher.task_log import ERR, OUT, FirstError, TaskLog, is_noise, last_state, route
from distrain.report.results import seconds_since_start

log = logging.getLogger("distrain")

STOP_GRACE_SECONDS = 10
SAY_WAIT_SECONDS = 2.0  # tasks still stopping by then: the launcher says what it waits for, and how long
# What a data worker's restart costs the run (TensorFlow's guarantee under dynamic sharding: at most once)
LOST_SPLITS = {"data_worker": "; the trainers go on, and under data.service.sharding=dynamic the examples of the "
                              "split it was reading are skipped this pass"}
SETTLE_SECONDS = 0.5  # for the end of a task that took another down to be heard of (_ended)


class Interrupted(Exception):
    def __init__(self, signum):
        super().__init__(signal.Signals(signum).name)
        self.exit_code = 128 + signum


def _raise_interrupted(signum, frame):
    raise Interrupted(signum)


@dataclass
class Outcome:
    """How a run ended: exit status, ok/failed/interrupted, and for a failure what went wrong.
    `restart`: the whole cluster should start again (from its latest checkpoint)."""
    code: int
    status: str = "ok"
    error: str = ""
    log_tail: list = field(default_factory=list)
    restart: bool = False
    peak_rss_mib: dict = field(default_factory=dict)  # each task's peak resident memory, by its name
    cpu_seconds: dict = field(default_factory=dict)  # each task's CPU time, to the launcher's last look


@dataclass
class TaskProcess:
    """One child process, running a task of the run. `name` prefixes its lines (when several share the
    terminal) and names its log.

    main: the run is over once every main task has exited.  essential: its failure ends the run,
    or restarts the cluster (a sidecar evaluator's does not).  alone: it is restarted on its own, on
    the same address (a parameter-server worker: the coordinator retries its functions on the others
    meanwhile, then schedules on it again once it answers).  quiet: only its errors reach the terminal,
    the rest its log (a synchronous worker other than the chief: its progress is the chief's).
    """
    name: str
    argv: list
    env: dict = field(default_factory=dict)
    main: bool = True
    essential: bool = True
    alone: bool = False
    quiet: bool = False
    first_error: FirstError = field(default_factory=FirstError)  # shared by the tasks of one run
    task: Task | None = None  # its place in the cluster, for cluster tasks
    cluster: dict | None = None  # and the cluster spec: {job: [addresses]}
    cores: set | None = None  # CPU affinity, when pinned
    peer_timeout: float = 0  # > 0: the task keeps a heartbeat (process.Heartbeat) that must not stop this long
    stall_after: float = 0  # > 0: its training's step standing still this long is a stall (stalls.py)
    forks: ForkServer | None = None  # starts the task with TensorFlow imported, instead of running argv
    restarts: int = 0  # restarts taken already (the tasks of a restarted cluster carry theirs)
    # Its state, as the supervisor starts and watches it: never given to the constructor.
    proc: subprocess.Popen | None = field(init=False, default=None)
    prefix: str | None = field(init=False, default=None)  # of its lines on the terminal (None: as they come)
    log_path: Path | None = field(init=False, default=None)
    heartbeat: Path | None = field(init=False, default=None)  # the file whose time it sets as it makes progress
    ready: bool = field(init=False, default=False)
    ready_after: float | None = field(init=False, default=None)  # seconds from the command's start to "ready"
    hung: bool = field(init=False, default=False)
    ended_at: float | None = field(init=False, default=None)  # when the supervisor saw it end (monotonic clock)
    pump: threading.Thread | None = field(init=False, default=None)  # copies its output
    open_line: bool = field(init=False, default=False)  # a progress bar of its is on the terminal, no newline yet
    line_ended: bool = field(init=False, default=False)  # ... which the launcher ended (end_line) for a line of its own
    memory: Watch = field(init=False, default_factory=Watch)  # its peak resident memory, over its restarts too
    stacks_path: Path | None = field(init=False, default=None)  # where it dumps its stacks on SIGUSR1 (stalls.py)
    position_path: Path | None = field(init=False, default=None)  # where it keeps the global step it reached
    stall_seen: float = field(init=False, default=0.0)  # the time of the position whose stall was reported

    def start(self, run: RunDir, prefix: str | None) -> None:
        self.prefix = prefix
        self.log_path = run.log(self.name)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.ready = self.hung = False
        self.ended_at = None
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.env}
        # (In the run's scratch directory, which goes when it ends: `distrain stacks` writes what they say.)
        scratch = Path(os.environ.get(SCRATCH) or self.log_path.parent)
        self.stacks_path, self.position_path = scratch / f"{self.name}.stacks", scratch / f"{self.name}.step"
        self.position_path.unlink(missing_ok=True)
        env.update({STACKS: str(self.stacks_path), POSITION: str(self.position_path)})
        if self.peer_timeout:
            self.heartbeat = self.log_path.with_suffix(".heartbeat")
            self.heartbeat.unlink(missing_ok=True)
            env[HEARTBEAT] = str(self.heartbeat)
        self.proc = None
        if self.forks and self.forks.reason == "":
            try:
                self.proc = self.forks.spawn(self.argv, env, self.cores)
            except OSError as exc:
                log.warning("tasks start without TensorFlow imported in advance (%s; its log: %s)", exc,
                            self.forks.log_path)
        if self.proc is None:
            self.proc = subprocess.Popen(
                self.argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                start_new_session=True,  # our signal handling decides when it stops, not the terminal's
                preexec_fn=self._in_child)
        self.memory.started()
        self.pump = threading.Thread(target=self._copy_output, args=(prefix,), daemon=True)
        self.pump.start()

    def _in_child(self) -> None:  # between fork and exec
        die_with_parent()
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # a request for stacks, before it can answer (stalls.py)
        if self.cores:
            os.sched_setaffinity(0, self.cores)

    def _copy_output(self, prefix) -> None:
        """Copy the output to our stdout and to the task's log, line by line with `prefix` when one is
        given, else as it comes (progress bars redraw in place), as task_output.route says."""
        out, pending, shown = sys.stdout.buffer, b"", 0  # shown: bytes of `pending` already on the terminal
        err = sys.stderr.buffer  # a task's "error: ..." line goes where errors go
        # A restart goes on in the same log, and so does a task started again in its run directory (a
        # resumed run; a real cluster's task that its orchestrator started again).
        again = not self.restarts and self.log_path.exists()
        with TaskLog(self.log_path, append=bool(self.restarts) or again) as logfile:
            if self.restarts or again:
                logfile.write((f"--- restart {self.restarts} ---\n" if self.restarts else
                               f"--- started again at {time.strftime('%Y-%m-%d %H:%M:%S')} ---\n").encode())
            for chunk in iter(lambda: self.proc.stdout.read1(65536), b""):
                *lines, pending = (pending + chunk).split(b"\n")
                for line in lines:
                    last = last_state(line)
                    if not self.ready and is_ready(last):
                        self.ready = True
                        self.ready_after = self.ready_after or seconds_since_start(time.time())
                    logfile.write(last)
                    where = route(line, prefix is not None, self.quiet, on_screen=bool(shown))
                    if where == ERR and self.first_error.may_say(self.name):
                        out.flush()
                        err.write((prefix or "").encode() + last)
                        err.flush()
                    elif where == OUT and prefix is not None:
                        out.write(prefix.encode() + last)
                    elif where == OUT and (line[shown:] or not self.line_ended):  # (ended: end_line)
                        out.write(line[shown:] + b"\n")
                    shown, self.open_line, self.line_ended = 0, False, False
                if prefix is None and (b"\r" in pending or b"\b" in pending):  # a progress bar: show it now
                    out.write(pending[shown:])
                    shown, self.open_line = len(pending), True
                logfile.flush()
                out.flush()
            if pending:
                logfile.write(pending.rsplit(b"\r", 1)[-1] + b"\n")

    def end_line(self) -> None:
        """Ends the line of a progress bar this task left open on the terminal, before the launcher writes
        a line of its own there (the task's next line does not end it again)."""
        if self.open_line:
            sys.stdout.write("\n")
            sys.stdout.flush()
            self.open_line, self.line_ended = False, True

    def stalled(self) -> bool:
        """Its heartbeat, once it keeps one, stopped for longer than peer_timeout."""
        try:
            return self.peer_timeout > 0 and time.time() - self.heartbeat.stat().st_mtime > self.peer_timeout
        except (TypeError, FileNotFoundError):  # no heartbeat (yet, or any more)
            return False

    def stop(self, sig=signal.SIGTERM) -> None:
        if self.proc and self.proc.poll() is None:
            self.memory.look(self.proc.pid)  # its peak up to now: the last look may be 0.5 s old
            if self.hung or _stopped(self.proc.pid):  # stuck or frozen: it cannot save, nor act on SIGTERM
                sig = signal.SIGKILL
            try:
                os.killpg(self.proc.pid, sig)  # the task's whole process group
            except ProcessLookupError:
                pass

    def log_tail(self, lines=15) -> list:
        """The last lines of its log, without TensorFlow's start-up noise."""
        self.pump.join(timeout=2)
        text = self.log_path.read_text(errors="replace").splitlines()
        return [line for line in text if not is_noise(line.encode()) and not stalls.is_dump(line)][-lines:]

    def describe(self) -> dict:
        code = self.proc.poll() if self.proc else None
        state = "running" if code is None else f"exited {code}"
        task = self.task
        return {"name": self.name, "type": task.type if task else "local", "index": task.index if task else 0,
                "address": task.address if task else None, "pid": self.proc.pid if self.proc else None,
                "cores": sorted(self.cores) if self.cores else None,
                "state": state, "restarts": self.restarts, "seconds_to_ready": self.ready_after,
                "peak_rss_mib": round(self.memory.peak, 1), "log": str(self.log_path)}


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


def run_tasks(tasks: list, run: RunDir, startup_timeout=None, on_change=None, job=None,
              restarts: Restarts | None = None, probe_peers: bool = False, stop=None) -> Outcome:
    """Start the tasks and supervise them until the run is over.

    Over when every main task has exited (ok), an essential task fails (its status), tasks are not
    all up within startup_timeout seconds (1), or we are interrupted (128 + signal), here or, for a
    sweep's job, in another job of the sweep (job.stopped_by), or `stop()` gives how it ends (launch.py:
    a trial its pruner stopped, a tracking store that cannot be used). `on_change(status)`
    hears of every change of state ("running", then how the run ended). Whatever happens, no task
    outlives this call.
    """
    previous = {s: signal.signal(s, _raise_interrupted) for s in (signal.SIGINT, signal.SIGTERM)}
    deadline = time.monotonic() + (startup_timeout or 0)
    seen, outcome, looks = set(), Outcome(1, "failed"), 0
    changed = on_change or (lambda status: None)
    try:
        _check_stopped(job)
        _start_all(tasks, run, job)
        changed("running")
        while True:
            _check_stopped(job)
            ended = _ended(tasks, seen, run, restarts, changed) or _grown(tasks, restarts) or (stop and stop())
            if ended is None and all(t.proc.poll() == 0 or (t.proc.poll() is not None and t.name in seen)
                                     for t in tasks if t.main):  # (a failure not yet acted on: not over)
                for task in tasks:
                    if task.proc.poll() is not None:  # (servers still running are stopped below)
                        task.pump.join(timeout=5)  # their last lines reach the terminal and the logs
                ended = Outcome(0)
            starting = [t for t in tasks if not t.ready and t.proc.poll() is None]
            if ended is None and startup_timeout and starting and time.monotonic() > deadline:
                ended = _not_up(starting, startup_timeout, probe_peers)
            if ended is not None:
                outcome = ended
                return outcome
            if not starting:
                startup_timeout = None
            looks = memory.look_at(tasks, looks)
            stalls.look(tasks, run)
            time.sleep(0.1)
    except Interrupted as exc:
        if job:
            job.say_stopped(exc.exit_code - 128)  # the sweep's other jobs stop too
        for task in tasks:
            task.end_line()
        log.error("interrupted by %s%s: stopping %d task(s) at the end of their step", exc,
                  " (Ctrl-C)" if exc.exit_code == 128 + signal.SIGINT else "", len(tasks))
        outcome = Outcome(exc.exit_code, "interrupted", f"interrupted by {exc}")
        return outcome
    finally:
        for s in previous:  # stopping is bounded (STOP_GRACE_SECONDS): a second Ctrl-C must not cut it short
            signal.signal(s, signal.SIG_IGN)
        # Recorded before the tasks are stopped, in case whoever interrupted us kills us next.
        run.write_status(outcome.status, outcome.code, outcome.error, outcome.log_tail, job)
        changed(outcome.status)
        stop_all(tasks)
        changed(outcome.status)
        for s, handler in previous.items():
            signal.signal(s, handler)
        outcome.peak_rss_mib = {t.name: round(t.memory.peak, 1) for t in tasks if t.memory.peak}
        outcome.cpu_seconds = {t.name: round(t.memory.cpu, 1) for t in tasks if t.memory.cpu}


def _start_all(tasks: list, run: RunDir, job) -> None:
    first_error = FirstError()
    for task in tasks:  # a prefix tells apart the lines of several tasks, or of a sweep's jobs
        task.first_error = first_error
        names = ([f"#{job.num}"] if job else []) + ([task.name] if len(tasks) > 1 else [])
        task.start(run, prefix=f"[{' '.join(names)}] " if names else None)


def _check_stopped(job) -> None:
    signum = job.stopped_by() if job else None
    if signum:
        raise Interrupted(signum)


def _ended(tasks: list, seen: set, run: RunDir, restarts: Restarts | None, changed) -> Outcome | None:
    """Acts on each task that ended or hung since the last look, as decide() says: None while the
    run goes on, else how it ends (or that the cluster must restart)."""
    # A task killed by a signal first: the others it takes down with it exit on their own after. Their
    # ends may be heard of in another order, so a task that failed on its own is acted on once no other
    # end has come for SETTLE_SECONDS.
    now = time.monotonic()
    killed = any((t.proc.poll() or 0) < 0 for t in tasks if t.name not in seen)
    for task in sorted(tasks, key=lambda t: (t.proc.poll() or 0) >= 0):
        code = task.proc.poll()
        task.ended_at = task.ended_at or (now if code is not None else None)
        if code is None and task.stalled():  # alive, but stuck waiting on a peer
            task.hung, code = True, 1
            why = (f"task {task.name} made no progress for {task.peer_timeout:g} s (cluster.peer_timeout): "
                   "a worker or ps task it waits for stopped answering")
        elif code is None or task.name in seen or (code > 0 and not killed and now - task.ended_at < SETTLE_SECONDS):
            continue
        else:
            why = task.memory.why_ended(task.name, code)
        seen.add(task.name)
        changed("running")
        others = [t for t in tasks if t.alone and t is not task and t.proc.poll() is None
                  and same_kind(t.task, task.task and task.task.type)]
        gone = restarts.gone() if restarts else []
        action = decide(code, alone=task.alone, essential=task.essential,
                        may_restart=bool(restarts and restarts.may_restart(task)), others_running=bool(others),
                        one_departed=bool(gone), may_restart_cluster=bool(restarts and restarts.may_restart_cluster()),
                        may_shrink=bool(restarts and restarts.may_shrink(task)))
        if task.alone and action == RESTART_CLUSTER:
            why += (f" ({', '.join(gone)} left the run, and TensorFlow's coordinator takes a worker back only once "
                    "every worker answers)")
        if action == RESTART_IT:
            restarts.take(task, code, why, "it on its own address" + LOST_SPLITS.get(task.task and task.task.type, ""),
                          [task])
            task.restarts = restarts.per_task[task.name]
            task.start(run, task.prefix)
            seen.discard(task.name)
            changed("running")  # its new pid
        elif action == LEAVE:
            task.stop()  # (one that hung: for good)
            restarts.leave(task, None if task.hung else code, why, len(others))
            changed("running")  # cluster.json: it left
        elif action == RESTART_CLUSTER:
            restarts.take(task, None if task.hung else code, why, "the cluster from its latest checkpoint", tasks,
                          whole=True)
            return Outcome(code, "restarting", why, restart=True)
        elif action == SHRINK:
            restarts.shrink(task, None if task.hung else code, why, stalls.step_of(task.position_path),
                            storage.checkpoint_step(run.latest_checkpoint()))
            return Outcome(code, "restarting", why, restart=True)
        elif action == FAIL:
            return _failed(task, code, why, len(tasks), restarts, run)
        elif code:
            log.warning("%s: the run goes on without it", why)
    return None


def same_kind(task: Task | None, task_type: str | None) -> bool:
    """Whether a task is of this type (a parameter-server worker, a data worker)."""
    return (task.type if task else None) == task_type


def _grown(tasks: list, restarts: Restarts | None) -> Outcome | None:
    """A cluster that shrank, whose restart budget has renewed, every task training (a step taken: its
    preemption handler in place): it restarts larger, stopped as a preemption stops it (a step saved)."""
    if restarts and restarts.may_grow() and all(t.proc.poll() is None and stalls.step_of(t.position_path) is not None
                                                for t in tasks if t.main):
        return Outcome(0, "restarting", restarts.grow(), restart=True)
    return None


def _failed(task: TaskProcess, code: int, why: str, count: int, restarts: Restarts | None, run: RunDir) -> Outcome:
    """How the run ends when `task`'s end (code, and `why` in words) fails it, of `count` tasks: its error
    line, said on the terminal where the task's own lines cannot have said it."""
    error = restarts.exhausted(why, task) if restarts else why
    if task.alone and code != 2:  # the last worker
        error = (f"{restarts.spent(why, task)}, and no other worker is left; raise cluster.max_restarts, "
                 "or read the workers' logs for why they die")
    tail = task.log_tail()
    said = [line for line in tail if is_error(line)]
    if said and code == 2:  # the task named the cause itself (bad input it found): that is the error
        error = said[-1]
    lone = count == 1 and not (task.task or task.hung or task.memory.killed)  # (a training's)
    if lone and code < 0 and not said:  # (alone on the terminal: a signal left it nothing to say)
        error = signalled(task.name, code, str(run), bool(run.latest_checkpoint()))
        task.end_line()
        print_error(error)
    # The exit status a shell reads: 2 bad input, else 1 (the task's own end is in the line); 128+N: run_tasks'.
    outcome = Outcome(2 if code == 2 else 1, "failed", error, tail)
    # (its lines were mixed with the others'; it could not say it ran out of memory itself)
    if (count > 1 or task.hung or task.memory.killed) and not said:
        print_failure(outcome, task.log_path)
    return outcome


def _not_up(starting: list, startup_timeout: float, probe_peers: bool) -> Outcome:
    """The run's end when tasks are not up in time: they are killed, the first named with its log."""
    late = starting[0]
    error = f"task {late.name} did not come up within {startup_timeout:g} s (cluster.startup_timeout)"
    if probe_peers:  # on a real cluster, name the peers it waits for that do not answer
        silent = cluster_lib.unanswered(cluster_lib.peers(late.cluster, late.task))
        error += (f": no answer from {', '.join(f'{n} ({why})' for n, why in silent.items())}; "
                  "start those tasks or fix their addresses") if silent else \
            ": every peer answers, so read its log below; or raise cluster.startup_timeout"
    for task in starting:  # nothing to save yet: no grace period
        task.stop(signal.SIGKILL)
    outcome = Outcome(1, "failed", error, late.log_tail())  # (it waits for the last output)
    print_failure(outcome, late.log_path)
    return outcome


def stop_all(tasks: list) -> None:
    """SIGTERM every task still running, then SIGKILL what has not ended within one grace period.

    The tasks that train go first: on SIGTERM they finish the step under way and checkpoint it, which
    under parameter servers needs the ps and worker servers, stopped only then. A chief none of whose
    workers is left cannot finish its step (its functions wait for a worker): SIGKILL at once, as the
    grace period would end."""
    deadline = (started := time.monotonic()) + STOP_GRACE_SECONDS
    workers = [t for t in tasks if t.alone and same_kind(t.task, "worker")]
    stranded = bool(workers) and all(t.proc is None or t.proc.poll() is not None for t in workers)
    for group in ([t for t in tasks if t.main], [t for t in tasks if not t.main]):
        for task in group:
            task.stop(signal.SIGKILL if stranded and task.main else signal.SIGTERM)
        waiting = [t for t in group if t.proc is not None]
        for until in (min(deadline, started + SAY_WAIT_SECONDS), deadline):
            for task in waiting:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    task.proc.wait(timeout=max(0.0, until - time.monotonic()))
            if (still := [t.name for t in waiting if t.proc.poll() is None]) and until < deadline:
                log.warning("waiting up to %.0f s more for %s to save the step under way and stop%s, then SIGKILL",
                            max(0.0, deadline - time.monotonic()), ", ".join(still),
                            " (a synchronous peer lost can hold it up)" if len(tasks) > 1 else "")
        for task in waiting:
            if task.proc.poll() is None:
                task.stop(signal.SIGKILL)
                task.proc.wait()
