"""What a task's errors mean for the run, as the lines it says: a peer lost (a collective aborted, a
parameter server gone, a peer that stopped answering) as PeerLost, a full disk as a ConfigError that says
what was kept. Runs in the task processes (training, the evaluator task, evaluate's and predict's tasks)."""
import re

from distrain.common import storage
from distrain.common.errors import ConfigError, PeerLost
from distrain.common.rundir import RunDir


def lost_peer(exc: Exception, cfg, during: str = "mid-training") -> PeerLost | None:
    """A TensorFlow error that says a peer died or stopped answering (a collective aborted, a
    parameter server gone), as PeerLost (`during`: what the cluster was doing); None for any other error."""
    import tensorflow as tf

    if isinstance(exc, PeerLost):
        return exc
    if not isinstance(exc, tf.errors.OpError):
        return None
    text = exc.message
    hung = re.search(r"unhealthy \(stopped sending heartbeats\):\s*(\S+)", text)
    if hung:
        task = re.sub(r"/job:(\w+)/replica:\d+/task:(\d+)", r"\1 \2", hung.group(1))
        return PeerLost(f"{task} stopped answering for {cfg.cluster.peer_timeout:g} s (cluster.peer_timeout) "
                        f"{during}", hung=True)
    if isinstance(exc, (tf.errors.UnavailableError, tf.errors.AbortedError)) or "Collective ops is aborted" in text:
        cause = re.search(r"aborted by: ([^\n]+)", text) or re.search(r"([^\n]*(?:unavailable|failed to connect|"
                                                                       r"reset|closed)[^\n]*)", text, re.I)
        why = f" ({cause.group(1).strip()[:160]})" if cause else ""
        return PeerLost(f"a task of the cluster was lost {during}{why}")
    if isinstance(exc, tf.errors.InternalError) and "from remote target /job:" in text:  # another task failed
        # the step inside TensorFlow (seen once, in a restarted cluster: a request that arrived corrupt)
        cause = re.search(r"\}\}\s*([^\n|]+)", text)
        why = cause.group(1).strip()[:160] if cause else type(exc).__name__
        return PeerLost(f"a task of the cluster failed {during} ({why})")
    return None


def full_disk(exc: Exception, run: RunDir, clean: bool = False) -> ConfigError | None:
    """A full disk, as one line saying what was kept; else None. clean: this task writes the run
    directory (the chief), and removes the files the full disk cut short."""
    if clean and storage.is_full(exc):
        storage.remove_partial(run.path, run.checkpoints)
    return storage.full_disk(exc, run.path, run.kept_checkpoints)
