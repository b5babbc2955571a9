"""A task's side of where it is (launcher/stalls.py asks and reads): its Python stacks (all threads),
dumped on SIGUSR1 into the file the launcher named, and the global step its training reached.

A task dumps its stacks with faulthandler on SIGUSR1: in C, from the signal handler, so it answers even
while its main thread waits inside TensorFlow (an all-reduce, a remote call) without returning to Python.
Runs in the task processes; no TensorFlow, nothing but a file write per tenth of a second.
"""
import faulthandler
import os
import signal
import time
from pathlib import Path

from distrain.common.messages import POSITION, STACKS

_dump_file = None  # (kept open: faulthandler writes to its descriptor)


def answer_stack_requests() -> None:
    """Dump this process's stacks, all threads, into the file the launcher named, on each SIGUSR1."""
    global _dump_file
    path = os.environ.get(STACKS)
    if path and hasattr(signal, "SIGUSR1"):
        _dump_file = open(path, "a")  # (appending: the launcher empties it before each request)
        faulthandler.register(signal.SIGUSR1, file=_dump_file, all_threads=True)


class Position:
    """The global step this task's training reached, in the file the launcher named (written at most
    ten times a second); the file goes when training ends, so that evaluating or saving is no stall."""

    def __init__(self):
        self.path, self.written = os.environ.get(POSITION), 0.0

    def at(self, step: int) -> None:
        now = time.monotonic()
        if self.path and now - self.written >= 0.1:
            Path(self.path).write_text(str(step))
            self.written = now

    def done(self) -> None:
        if self.path:
            Path(self.path).unlink(missing_ok=True)
