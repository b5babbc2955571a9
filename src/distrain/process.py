"""What every child process of a run does so that none outlives the launcher (no TensorFlow here)."""
import ctypes
import signal
import sys


def die_with_parent() -> None:
    """Linux: this process gets SIGKILL when the process that started it dies, however it dies."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
