"""What a run's child processes do about their lifetime: none outlives the launcher and none leaves its
temporary files behind (a training task's SIGTERM: task/preemption.py). No TensorFlow."""
import atexit
import contextlib
import ctypes
import gc
import os
import signal
import sys
import time

from distrain.common.messages import HEARTBEAT, SCRATCH


def die_with_parent() -> None:
    """Linux: this process gets SIGKILL when the process that started it dies, however it dies."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


@contextlib.contextmanager
def kept_for_good():
    """For the imports of a process that lives on what they make (a task's, its fork server's: TensorFlow,
    Keras and distrain, 490,000 objects). The cyclic garbage collector pauses over them: the collections
    the import sets off find almost nothing to free and cost 0.5 of its 2.5 CPU-s (measured). Then what
    was made is frozen, out of the sight of later collections (a full one would take 0.28 s for these
    objects alone) and of a forked child's, whose pages it leaves shared (Python's advice for a process
    that forks without exec)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()


_CLEANUPS = []  # what a task removes as it ends, exit_now() or not


def on_exit(cleanup) -> None:
    """Run `cleanup` as this task ends, exit_now() or not."""
    _CLEANUPS.append(cleanup)


def exit_now(code: int):
    """End this task process with `code` once its output is flushed and its temporary files are gone,
    skipping the interpreter's shutdown: with TensorFlow loaded that costs about a second of CPU and,
    on a cluster, waits on the peers, with nothing left to save (the run's files are written and closed)."""
    _clean_up()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


@atexit.register  # (a task that ends by an exception)
def _clean_up() -> None:
    for cleanup in _CLEANUPS:
        cleanup()


def scratch() -> str | None:
    """Where a task keeps temporary files: its run's scratch directory, which the launcher removes even
    when a task is killed; else (None: a task started without the launcher) the system's."""
    return os.environ.get(SCRATCH)


class Heartbeat:
    """This task's sign of progress, for the launcher: a file (protocol.HEARTBEAT) whose time is set
    at each pet. When it stops for cluster.peer_timeout seconds, the launcher ends the task and says
    why. A thread in the task could not: TensorFlow holds the interpreter's lock while it waits on a
    hung peer (registering a checkpoint's function on every task, say), which never times out."""

    def __init__(self, grace: float = 60.0):
        self.path = os.environ.get(HEARTBEAT)
        self.pet(ahead=grace)  # before the first pet: tracing, and each task's first call

    def pet(self, ahead: float = 0.0) -> None:
        if self.path:
            now = time.time() + ahead
            with open(self.path, "a"):
                os.utime(self.path, (now, now))

    def stop(self) -> None:
        """No longer watched: what follows (evaluation, saving the model) waits on no peer."""
        if self.path:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
