"""Supervises a run's task processes: starts them, streams and logs their output, watches them for
death and silence, restarts what may be restarted, and ends every one of them on success, failure,
Ctrl-C or SIGTERM. What to do when a task ends is decided by `decide`, a function of its state alone."""
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from . import cluster as cluster_lib
from . import report
from .errors import print_error
from .forkserver import ForkServer
from .process import die_with_parent
from .protocol import is_error, is_ready

log = logging.getLogger("distrain")

STOP_GRACE_SECONDS = 10
SETTLE_SECONDS = 0.5  # for the end of a task that took another down to be heard of (_ended)


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
         b"function remotely due to", b"Additional GRPC error information from remote",
         b"This could happen if the remote target has been", b":UNKNOWN:Error received from peer",
         b"Ignoring an error encountered when deleting remote tensors",
         b"encountered the following error when processing", b"\t [[{{node ",
         b"MultiDeviceSaver.save.<locals>.tf_function_save",  # its checkpoints under parameter servers
         b"ERROR:tensorflow:Worker /job:worker/", b"Local rendezvous is aborting with status",
         b"ERROR:tensorflow:Remote function on worker ",  # a ps task lost: retried, then the launcher acts
         b"ERROR:tensorflow:Start cancelling closures due to error", b"RecvTensor cancelled for",
         b"Device filters can only be specified when initializing",  # a worker lost, then back
         b"OP_REQUIRES failed at",  # an op's error, which the task says in its own words
         b"Aborting RingReduce with", b"BaseCollectiveExecutor::StartAbort",  # a synchronous peer lost:
         b"The error could be from a previous operation", b"[[{{function_node ")  # the task says so once


def is_noise(line: bytes) -> bool:
    return any(pattern in line for pattern in NOISE)


@dataclass
class Outcome:
    """How a run ended: exit status, ok/failed/interrupted, and for a failure what went wrong.
    `restart`: the whole cluster should start again (from its latest checkpoint)."""
    code: int
    status: str = "ok"
    error: str = ""
    log_tail: list = field(default_factory=list)
    restart: bool = False


LEFT = "no: it left the run"  # the record of a worker past its budget (Restarts.leave)


class Restarts:
    """The restart budgets of a local cluster, and the record of each restart. cluster.max_restarts
    counts, over the last cluster.restart_window seconds (0: ever), the restarts of each task restarted
    alone (a parameter-server worker) and, apart, the restarts of the whole cluster."""
    CLUSTER = "the cluster"

    def __init__(self, limit: int, window: float = 0.0, clock=time.time):
        self.limit, self.window, self.clock, self.done = limit, window, clock, []
        self.per_task = Counter()  # times each task was started again

    def _counted(self, task) -> list:
        """The restarts that count against the budget `task` draws on: its own if it restarts alone."""
        return self._within_window(task.name if task.alone else self.CLUSTER)

    def _within_window(self, budget: str) -> list:
        since = self.clock() - self.window if self.window else float("-inf")
        return [r for r in self.done if r["budget"] == budget and r["time"] >= since]

    def left(self, task) -> bool:
        return len(self._counted(task)) < self.limit

    def gone(self) -> list[str]:
        """The workers that left the run since the cluster last started (a restart of it brings all back)."""
        since = max((i + 1 for i, r in enumerate(self.done) if r["budget"] == self.CLUSTER), default=0)
        return sorted({r["task"] for r in self.done[since:] if r["restarted"] == LEFT})

    def cluster_left(self) -> bool:
        """Whether a lost essential task would restart the cluster (rather than end the run)."""
        return len(self._within_window(self.CLUSTER)) < self.limit

    def take(self, task, code: int | None, why: str, what: str, restarted: list, whole: bool = False) -> None:
        """`task` exited with `code` (None: it hung), as `why` says: the `restarted` tasks start again
        (`whole`: the cluster, from the cluster's budget whatever the task)."""
        budget = self.CLUSTER if whole or not task.alone else task.name
        self.done.append({"task": task.name, "exit_status": code, "restarted": what, "budget": budget,
                          "time": round(self.clock(), 3)})
        self.per_task.update(t.name for t in restarted)
        log.warning("%s: restarting %s (restart %d of %d%s, cluster.max_restarts)", why, what,
                    len(self._within_window(budget)), self.limit, self._within())

    def leave(self, task, code: int | None, why: str, others: int) -> None:
        """`task`, past its budget, leaves the run to the `others` like it."""
        spent = self.spent(why, task)
        self.done.append({"task": task.name, "exit_status": code, "restarted": LEFT,
                          "budget": task.name, "time": round(self.clock(), 3)})
        log.warning("%s: it leaves the run, which goes on with %d worker(s)", spent, others)

    def spent(self, why: str, task) -> str:
        """`why` a task ended, with how much of the budget it drew on was spent, if any was."""
        counted = self._counted(task)
        if not counted:
            return why
        whom = f"{task.name} was" if task.alone else "the cluster was"
        return f"{why} and {whom} restarted {len(counted)} time(s) already{self._within()} " \
               f"(cluster.max_restarts={self.limit})"

    def exhausted(self, why: str, task) -> str:
        """The line for a task past its budget: spent(), and what to do about it."""
        if not self._counted(task):
            return why
        return f"{self.spent(why, task)}; raise cluster.max_restarts, or read its log for why it keeps dying"

    def _within(self) -> str:
        return f" within {self.window:g} s (cluster.restart_window)" if self.window else ""


class FirstError:
    """The first task of a run to say an error speaks for it: what the others say after it (a peer
    lost because of it) goes to their logs only."""

    def __init__(self):
        self.task, self._lock = None, threading.Lock()

    def may_say(self, task: str) -> bool:
        with self._lock:
            self.task = self.task or task
            return self.task == task


@dataclass
class Task:
    """One child process. `name` prefixes its lines (when several share the terminal) and names its log.

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
    spec: object = None  # the cluster.TaskSpec, for cluster tasks
    cores: set = None  # CPU affinity, when pinned
    proc: subprocess.Popen = None
    ready: bool = False
    ready_after: float = None  # seconds from the command's start to its first "ready" line
    restarts: int = 0
    peer_timeout: float = 0  # > 0: the task keeps a heartbeat (process.Heartbeat) that must not stop this long
    hung: bool = False
    ended_at: float = None  # when the supervisor first saw it ended (monotonic clock)
    forks: ForkServer = None  # starts the task with TensorFlow imported, instead of running argv

    def start(self, run_dir: Path, prefix: str | None) -> None:
        self.prefix = prefix
        self.log_path = run_dir / "logs" / f"{self.name}.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.ready = self.hung = False
        self.ended_at = None
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
                    last = line.rstrip(b"\r").rsplit(b"\r", 1)[-1].replace(b"\b", b"") + b"\n"
                    if not self.ready and is_ready(last):
                        self.ready = True
                        self.ready_after = self.ready_after or report.seconds_since_start(time.time())
                    logfile.write(last)
                    if is_error(last):
                        if self.first_error.may_say(self.name):
                            out.flush()
                            err.write((prefix or "").encode() + last)
                            err.flush()
                    elif prefix is not None:
                        if not (self.quiet or is_noise(last)):
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


class TaskLog:
    """A task's log file whose writes never raise out of the thread that copies the task's output: the
    first that fails (a full disk) is said once, and the task's lines still reach the terminal."""

    def __init__(self, path: Path, append: bool):
        self.path, self.file = path, None
        self._do(lambda: setattr(self, "file", open(path, "ab" if append else "wb")))

    def write(self, data: bytes) -> None:
        if self.file:
            self._do(lambda: self.file.write(data))

    def flush(self) -> None:
        if self.file:
            self._do(self.file.flush)

    def _do(self, action) -> None:
        try:
            action()
        except OSError as exc:
            log.warning("cannot write %s (%s): the task's lines are no longer kept there", self.path,
                        exc.strerror or exc)
            self.close()

    def close(self) -> None:
        file, self.file = self.file, None
        if file:
            try:
                file.close()
            except OSError:  # (its buffer could not be written either)
                pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


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


# What to do about a task that ended (or hung): decide() picks one.
GO_ON, RESTART_IT, LEAVE, RESTART_CLUSTER, FAIL = "go on", "restart it", "leave", "restart the cluster", "fail"


def decide(code: int, alone: bool, essential: bool, restarts_left: bool, others_left: bool = False,
           one_left: bool = False, cluster_left: bool = False) -> str:
    """What a task's end means for the run. code: its exit status (1 if it hung); alone: it can be
    restarted on its own (a parameter-server worker); essential: the run cannot go on without it (not
    a sidecar evaluator); restarts_left: its budget (cluster.max_restarts) allows another restart;
    others_left: other tasks like it still run, so that one past its budget may leave the run to them;
    one_left: a task like it has left the run already, so that one restarted alone could not rejoin
    (TensorFlow's coordinator takes a worker back only once every worker answers): the cluster
    restarts instead, as cluster_left (the cluster's budget) allows.
    A status of 2 is a configuration error, which a restart would repeat and leaving would hide."""
    if code == 0:
        return GO_ON
    can_restart = restarts_left and code != 2
    if alone and code != 2:
        if can_restart and not one_left:
            return RESTART_IT
        if can_restart and cluster_left:
            return RESTART_CLUSTER
        if others_left:
            return LEAVE
        return FAIL if essential else GO_ON
    if essential:
        return RESTART_CLUSTER if can_restart else FAIL
    return GO_ON


def run_tasks(tasks: list, run_dir: Path, startup_timeout=None, on_change=None, job=None,
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
    changed = on_change or (lambda status: None)
    try:
        first_error = FirstError()
        for task in tasks:  # a prefix tells apart the lines of several tasks, or of a sweep's jobs
            task.first_error = first_error
            names = ([f"#{job.num}"] if job else []) + ([task.name] if len(tasks) > 1 else [])
            task.start(run_dir, prefix=f"[{' '.join(names)}] " if names else None)
        changed("running")
        while True:
            ended = _ended(tasks, seen, run_dir, restarts, changed)
            if ended is None and all(t.proc.poll() == 0 or (t.proc.poll() is not None and t.name in seen)
                                     for t in tasks if t.main):  # (a failure not yet acted on: not over)
                for task in tasks:
                    if task.proc.poll() is not None:  # (servers still running are stopped below)
                        task._pump.join(timeout=5)  # their last lines reach the terminal and the logs
                ended = Outcome(0)
            starting = [t for t in tasks if not t.ready and t.proc.poll() is None]
            if ended is None and startup_timeout and starting and time.monotonic() > deadline:
                ended = _not_up(starting, startup_timeout, probe_peers)
            if ended is not None:
                outcome = ended
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
        changed(outcome.status)
        stop_all(tasks)
        changed(outcome.status)
        for s, handler in previous.items():
            signal.signal(s, handler)


def _ended(tasks: list, seen: set, run_dir: Path, restarts: Restarts | None, changed) -> Outcome | None:
    """Acts on each task that ended or hung since the last look, as decide() says: None while the
    run goes on, else how it ends (or that the cluster must restart)."""
    # A task killed by a signal first: the others it takes down with it exit on their own after. Their
    # ends may be heard of in another order, so a task that failed on its own is acted on once no other
    # end has come for SETTLE_SECONDS.
    now = time.monotonic()
    killed = any((t.proc.poll() or 0) < 0 for t in tasks if t.name not in seen)
    for task in sorted(tasks, key=lambda t: (t.proc.poll() or 0) >= 0):
        code = task.proc.poll()
        if code is not None:
            task.ended_at = task.ended_at or now
        if code is None and task.stalled():  # alive, but stuck waiting on a peer
            task.hung, code = True, 1
            why = (f"task {task.name} made no progress for {task.peer_timeout:g} s (cluster.peer_timeout): "
                   "a worker or ps task it waits for stopped answering")
        elif code is None or task.name in seen or (code > 0 and not killed and now - task.ended_at < SETTLE_SECONDS):
            continue
        else:
            why = f"task {task.name} exited with status {code}"
        seen.add(task.name)
        changed("running")
        others = [t for t in tasks if t.alone and t is not task and t.proc.poll() is None]
        gone = restarts.gone() if restarts else []
        action = decide(code, task.alone, task.essential, bool(restarts and restarts.left(task)), bool(others),
                        bool(gone), bool(restarts and restarts.cluster_left()))
        if task.alone and action == RESTART_CLUSTER:
            why += (f" ({', '.join(gone)} left the run, and TensorFlow's coordinator takes a worker back only once "
                    "every worker answers)")
        if action == RESTART_IT:
            restarts.take(task, code, why, "it on its own address", [task])
            task.restarts = restarts.per_task[task.name]
            task.start(run_dir, task.prefix)
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
        elif action == FAIL:
            error = restarts.exhausted(why, task) if restarts else why
            if task.alone and code != 2:  # the last worker
                error = (f"{restarts.spent(why, task)}, and no other worker is left; raise cluster.max_restarts, "
                         "or read the workers' logs for why they die")
            outcome = Outcome(code, "failed", error, task.log_tail())
            said = any(map(is_error, outcome.log_tail))  # its own line: enough
            if (len(tasks) > 1 or task.hung) and not said:  # (its lines were mixed with the others')
                print_failure(outcome, task.log_path)
            return outcome
        elif code:
            log.warning("task %s exited with status %d: the run goes on without it", task.name, code)
    return None


def _not_up(starting: list, startup_timeout: float, probe_peers: bool) -> Outcome:
    """The run's end when tasks are not up in time: they are killed, the first named with its log."""
    late = starting[0]
    error = f"task {late.name} did not come up within {startup_timeout:g} s (cluster.startup_timeout)"
    if probe_peers:  # on a real cluster, name the peers it waits for that do not answer
        silent = cluster_lib.unanswered(cluster_lib.peers(*cluster_lib.from_tf_config(late.env["TF_CONFIG"], None)))
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

