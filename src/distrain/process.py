"""What a run's child processes do about their lifetime: none outlives the launcher, and a training
task stops cleanly on SIGTERM (no TensorFlow here)."""
import ctypes
import signal
import sys


def die_with_parent() -> None:
    """Linux: this process gets SIGKILL when the process that started it dies, however it dies."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class Preempted(Exception):
    """SIGTERM stopped training at a step boundary (its checkpoint saved, where checkpoints are on)."""


class Preemption:
    """SIGTERM, as a preempted machine or the launcher stopping the run sends it: the step under way
    finishes, a checkpoint of it is saved, and the task exits, so a resume starts from that step.
    Not for multi_worker_mirrored, whose workers would stop at different steps: TensorFlow's own
    handler takes SIGTERM there."""
    requested = False

    @classmethod
    def watch(cls) -> None:
        signal.signal(signal.SIGTERM, cls._request)

    @classmethod
    def _request(cls, signum, frame) -> None:
        cls.requested = True
