"""Starts a local cluster's task processes with TensorFlow already imported.

Importing TensorFlow takes a task about 3.5 s of CPU before it does anything: a cluster of 4 tasks
on 2 cores spends 7 s of its start-up there, and every restarted task again. The fork server
imports it once per run, then forks a task in milliseconds: each child becomes the task process
`python -m distrain.task CONFIG` would be (its own process group, environment, output pipe, cores), with
a clean TensorFlow (no device, no server, no thread started before the fork).

A process that runs several runs in turn (a sweep's jobs under the basic launcher, a script calling
distrain) keeps one server for all of them (`shared`), one-task runs and local clusters alike, and
evaluate's and predict's tasks too: the first run imports TensorFlow, the next ones' tasks start at once.

Python's multiprocessing has a fork server too, but its children are not such processes (no session
of their own, no normal interpreter exit, no output pipe, outside the cluster's network namespace);
this one runs inside the namespace, so its children are too.
"""
import atexit
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import types
from pathlib import Path

from distrain.common.cpu import ONEDNN
from distrain.common.lifetime import die_with_parent, exit_now, kept_for_good

READY_TIMEOUT = 60.0  # seconds for the server's imports, however loaded the machine
_SHARED: dict = {}  # (what TensorFlow reads as it is imported, wrap) -> the server kept for the next run
IMPORT_TIME_ENV = (ONEDNN,)  # what TensorFlow reads from the environment as it is imported, once per server


class ForkServer:
    """A fork server: `spawn()` starts a task as its command (python -m MODULE CONFIG) would. `label`
    names the server in `ps` (a run's config, or "(shared)").

    `wrap(argv)` runs the server where the tasks must run (PrivateNetwork.wrap). If the server
    cannot start, `available` is False, and `reason` says why: tasks then start the usual way."""

    def __init__(self, label: str, log_path: Path, wrap=lambda argv: argv, env: dict | None = None):
        self.label, self.log_path, self.wrap, self.env = str(label), log_path, wrap, env or {}
        self.available, self.reason, self.proc = False, "", None
        self._children, self._exited, self._replies, self._lock = {}, {}, [], threading.Lock()
        self._replied = threading.Condition(self._lock)

    def __enter__(self):
        self._sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with theirs, open(self.log_path, "wb") as log_file:
            # One BLAS thread: the server must hold no thread when it forks (numpy's BLAS starts some).
            env = {**os.environ, **self.env, "PYTHONUNBUFFERED": "1", "OPENBLAS_NUM_THREADS": "1"}
            self.proc = subprocess.Popen(
                self.wrap([sys.executable, "-m", "distrain.launcher.forkserver", self.label, str(theirs.fileno())]),
                env=env,
                pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
                start_new_session=True, preexec_fn=die_with_parent)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        return self

    def _read(self) -> None:
        """The server's messages: "ready", "pid N" for each spawn, "exit N STATUS" as children end."""
        while True:
            try:
                message = self._sock.recv(256).decode()
            except OSError:
                message = ""
            with self._lock:
                if not message:  # the server is gone, and its children with it (die_with_parent)
                    self.available, self.reason = False, self.reason or "the fork server exited"
                    for child in self._children.values():
                        child.ended(-signal.SIGKILL)
                    self._replied.notify_all()
                    return
                kind, *values = message.split()
                if kind == "ready":
                    self.available = True
                elif kind == "pid":
                    self._replies.append(int(values[0]))
                elif kind == "exit":  # (a child that ended at once may be no child of ours yet)
                    pid, status = int(values[0]), int(values[1])
                    if pid in self._children:
                        self._children.pop(pid).ended(status)
                    else:
                        self._exited[pid] = status
                self._replied.notify_all()

    def wait_ready(self) -> bool:
        """Whether the server is up (it imports TensorFlow first: a few seconds)."""
        with self._lock:
            self._replied.wait_for(lambda: self.available or self.reason, timeout=READY_TIMEOUT)
            if not self.available and not self.reason:
                self.reason = f"not ready within {READY_TIMEOUT:g} s"
            return self.available

    def spawn(self, argv: list, env: dict, cores) -> "Child":
        """The task process `argv` (... python -m MODULE CONFIG, perhaps wrapped: the server runs where the
        tasks do) would start, with this environment (the whole of it), CPU affinity and this process's
        working directory."""
        if not self.wait_ready():
            raise OSError(f"no fork server: {self.reason}")
        *_, module, config = argv
        out, theirs = os.pipe()
        request = {"env": env, "cores": sorted(cores) if cores else None, "cwd": os.getcwd(), "module": module,
                   "config": str(config)}
        try:
            with self._lock:
                socket.send_fds(self._sock, [json.dumps(request).encode()], [theirs])
                self._replied.wait_for(lambda: self._replies or not self.available, timeout=READY_TIMEOUT)
                pid = self._replies.pop(0) if self._replies else None
                if pid is not None:
                    child = self._children[pid] = Child(pid, os.fdopen(out, "rb"))
                    if pid in self._exited:  # it ended before we got here
                        child.ended(self._exited.pop(pid))
                    return child
                # Unanswered: a late answer would be taken for the next task's, so no more tasks from here.
                self.reason = self.reason or f"no answer within {READY_TIMEOUT:g} s"
        finally:
            os.close(theirs)
        os.close(out)
        raise OSError(f"no fork server: {self.reason}")

    def __exit__(self, *exc):
        try:  # the server exits when its socket is shut (close alone would wait for our reader's recv)
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        if self.proc:
            if not self.available:  # still importing (the run ended first), or gone: nothing to wait for
                self.proc.kill()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(timeout=5)


def shared(log_path: Path, wrap=None, env: dict | None = None) -> ForkServer:
    """The server of this process, started by its first run (or evaluate, predict), kept for the next
    (until this process exits) while the environment TensorFlow reads as it is imported (IMPORT_TIME_ENV,
    as this process has it now with `env` over it: the server inherits it) and where the tasks run (`wrap`:
    a local cluster's network) stay the same. The server's output goes to the first run's log_path."""
    env = env or {}
    key = (tuple(env.get(name, os.environ.get(name)) for name in IMPORT_TIME_ENV), wrap)
    server = _SHARED.get(key)
    if server is None or server.reason:  # (one that died is replaced)
        if server is not None:
            server.__exit__()
        server = _SHARED[key] = ForkServer("(shared)", log_path, wrap or (lambda argv: argv), env).__enter__()
        if len(_SHARED) == 1:
            atexit.register(_close_shared)
    return server


def _close_shared() -> None:
    while _SHARED:
        _SHARED.popitem()[1].__exit__()


class Child:
    """A task the fork server started, as much of subprocess.Popen as the launcher uses."""

    def __init__(self, pid: int, stdout):
        self.pid, self.stdout, self.returncode = pid, stdout, None
        self._ended = threading.Event()

    def ended(self, status: int) -> None:
        self.returncode = status
        self._ended.set()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout=None) -> int:
        if not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired(f"task process {self.pid}", timeout)
        return self.returncode


def serve(fd: int):
    """The server: import what a task imports, then fork a task for each request until the launcher
    closes the socket. Returns (in the child only) the request the child is to carry out."""
    sock = socket.socket(fileno=fd)
    with kept_for_good():  # (a task's collections then skip them all)
        from distrain.task import main as task  # noqa: F401 - TensorFlow, Keras and the training code, once for all tasks

        convert_ahead()
    sock.send(b"ready")
    while True:
        readable = select.select([sock], [], [], 0.1)[0]
        _reap(sock)
        if not readable:
            continue
        message, fds, _, _ = socket.recv_fds(sock, 1 << 20, 1)
        if not message:
            return None  # the launcher is done: our children die with us
        pid = os.fork()
        if pid == 0:
            sock.close()
            return json.loads(message), fds[0]
        _own_group(pid)  # here too, so that it is one before the launcher hears of the child
        os.close(fds[0])
        sock.send(f"pid {pid}".encode())


def convert_ahead() -> None:
    """Make here, once, the autograph conversions every task makes (0.15 s of CPU a task, measured):
    autograph keeps them by code object, and the tasks forked from here find them made. Python source
    transformed, no TensorFlow op: nothing a fork must not inherit. Best effort: what is not found here
    is converted by the task as before."""
    from distrain.common import private
    from distrain.task import metrics, runners, training

    try:
        converter, api = private.get("autograph_converter"), private.get("autograph_api")
        functional_saver, signature_serialization = private.get("functional_saver"), private.get(
            "signature_serialization")
        Model, saving_utils = private.get("keras_model_class"), private.get("keras_saving_utils")  # noqa: N806

        # The keys of tf.function's conversions: the function it is given, and the calls in it that Keras
        # converts itself (a loss's call, a metric's update_state and result).
        given = converter.ProgramContext(converter.ConversionOptions(recursive=True, user_requested=True,
                                                                     optional_features=None))
        within = converter.ProgramContext(given.options.call_options())
        # (A function defined inside another is made anew at each call: converted here from its code.)
        made_inside = [*_inside(Model.make_test_function, "test_function"),
                       *_inside(saving_utils.trace_model_call, "_wrapped_model"),
                       *_inside(signature_serialization.canonicalize_signatures, "signature_wrapper"),
                       *_inside(functional_saver.MultiDeviceSaver.save, "tf_function_save"),
                       *_inside(training.per_worker_dataset, "<lambda>")]
        # Autograph writes each conversion to a file it then imports: here in a directory of its own, gone
        # once they are imported (the server's TMPDIR may be no run's scratch directory, or none).
        with tempfile.TemporaryDirectory(prefix="distrain-autograph-") as where:
            tempfile.tempdir = where
            for functions, context in (([runners.forward_pass, metrics.growth, *made_inside], given),
                                       ([metrics.Float32.call, metrics.Float32Metric.update_state,
                                         metrics.Float32Metric.result], within)):
                for function in functions:
                    api._TRANSPILER.transform(function, context)
    except Exception:  # noqa: BLE001 - another TensorFlow's internals: the tasks convert them as before
        pass
    finally:
        tempfile.tempdir = None


def _inside(outer, name: str) -> list:
    """The functions named `name` defined inside `outer`, made from their code (each free variable an
    empty cell: converted, never called)."""
    return [types.FunctionType(code, outer.__globals__, name, None, tuple(types.CellType() for _ in code.co_freevars))
            for code in outer.__code__.co_consts if isinstance(code, types.CodeType) and code.co_name == name]


def _reap(sock) -> None:
    """Tell the launcher of every child that ended, with its status as Popen.returncode gives it."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        sock.send(f"exit {pid} {os.waitstatus_to_exitcode(status)}".encode())


def _own_group(pid: int) -> None:
    """Make the child `pid` (0: this process) a process group of its own: the parent and the child
    both do, as shells do, since either may run first."""
    try:
        os.setpgid(pid, 0)
    except OSError:  # the child did already, or has exited
        pass


def become_task(request: dict, out: int) -> int:
    """In a forked child: turn into the task process the launcher asked for (`python -m MODULE CONFIG`,
    run from the launcher's directory), and run it."""
    import setproctitle

    # What `ps` and `pgrep -f CONFIG` show, as for a task started by exec (before the environment changes:
    # setproctitle moves it out of the way of the longer command line).
    setproctitle.setproctitle(f"{sys.executable} -m {request['module']} {request['config']}")
    _own_group(0)  # the launcher signals the task as a whole (the server has no terminal to share)
    die_with_parent()
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    os.environ.clear()
    os.environ.update(request["env"])
    tempfile.tempdir = None  # (TMPDIR is the run's: read again)
    os.chdir(request["cwd"])
    sys.path[0] = request["cwd"]  # what `python -m` puts first: the user's modules are found there
    if request["cores"]:
        os.sched_setaffinity(0, request["cores"])
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    import importlib

    module = importlib.import_module(request["module"])  # (a package: its __main__, as `python -m` runs)
    if hasattr(module, "__path__"):
        module = importlib.import_module(f"{request['module']}.__main__")
    return module.main([request["config"]])


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher decides when tasks stop
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # a request for stacks, before a task can answer it (stacks.py)
    # Its command line names its label (a run's config: `ps` tells the runs apart) and its socket.
    forked = serve(int(sys.argv[2]))
    exit_now(become_task(*forked) if forked else 0)  # the server too: it has nothing to save
