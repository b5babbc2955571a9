"""A task's output, line by line: what its log keeps, and what reaches the terminal (pure functions of
the lines, with which the supervisor copies the output), and the log file it goes to (TaskLog)."""
import logging
import threading
from pathlib import Path

from distrain.common.messages import is_error

log = logging.getLogger("distrain")

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
         b"Skipping full serialization of TF-Keras layer",  # a lazily built metric (R2Score): loads all the same
         b"PreemptionCheckpointHandler.total_run_calls (from",  # a deprecation inside TensorFlow, at SIGTERM
         b"ERROR:tensorflow:Worker /job:worker/", b"Local rendezvous is aborting with status",
         b"ERROR:tensorflow:Remote function on worker ",  # a ps task lost: retried, then the launcher acts
         # (gRPC's own words for it, which may come on a line of their own where two threads wrote at once)
         b"failed to connect to all addresses", b"Failed to connect to remote host",
         b"ERROR:tensorflow:Start cancelling closures due to error", b"RecvTensor cancelled for",
         b"Device filters can only be specified when initializing",  # a worker lost, then back
         b"OP_REQUIRES failed at",  # an op's error, which the task says in its own words
         b"Profiling is late by",  # a worker asked for its trace (trainer.profile under parameter servers)
         b"Aborting RingReduce with", b"BaseCollectiveExecutor::StartAbort",  # a synchronous peer lost:
         b"The error could be from a previous operation", b"[[{{function_node ",  # the task says so once
         b"The tasks have crashed. Check the task logs")  # (TensorFlow's coordination service, the same)


def is_noise(line: bytes) -> bool:
    return any(pattern in line for pattern in NOISE)


def last_state(line: bytes) -> bytes:
    """A line as its log keeps it: its last state where it was redrawn (a progress bar's carriage
    returns and backspaces), with its newline."""
    return line.rstrip(b"\r").rsplit(b"\r", 1)[-1].replace(b"\b", b"") + b"\n"


ERR, OUT = "stderr", "stdout"


class FirstError:
    """The first task of a run to say an error speaks for it: what the others say after it (a peer
    lost because of it) goes to their logs only."""

    def __init__(self):
        self.task, self._lock = None, threading.Lock()

    def may_say(self, task: str) -> bool:
        with self._lock:
            self.task = self.task or task
            return self.task == task


def route(line: bytes, prefixed: bool, quiet: bool = False, on_screen: bool = False) -> str | None:
    """Where a task's output line goes besides its log: ERR (the task's error line), OUT, or None (the
    log only). prefixed: the terminal is shared with other tasks, so lines go whole, with the task's
    name, and a quiet task (a synchronous worker other than the chief) shows only its errors; else a
    progress bar is shown as it is redrawn, and on_screen: part of this line is on the terminal already.
    TensorFlow's noise stays in the log."""
    last = last_state(line)
    if is_error(last):
        return ERR
    if prefixed:
        return None if quiet or is_noise(last) else OUT
    return OUT if on_screen or not is_noise(line) else None


class TaskLog:
    """A task's log file whose writes never raise out of the thread that copies the task's output: the
    first that fails (a full disk) is said once, and the task's lines still reach the terminal."""

    def __init__(self, path: Path, append: bool):
        self.path, self.file = path, None
        if not append:
            self._do(lambda: open(path, "wb").close())
        # (appending: the launcher's own lines, a task's stacks, go in between without being overwritten)
        self._do(lambda: setattr(self, "file", open(path, "ab")))

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
