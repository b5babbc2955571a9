"""SIGTERM as preemption, in a training task: the step under way finishes, its checkpoint is saved, and
the task exits (Preempted); multi_worker_mirrored workers agree on that step through TensorFlow's
PreemptionCheckpointHandler. Runs in the task process; costs a signal handler, or one call per training
call on a synchronous cluster."""
import os
import shutil
import signal
import tempfile

import tensorflow as tf

from distrain.common.lifetime import on_exit, scratch


class Preempted(Exception):
    """SIGTERM stopped training at a step boundary (its checkpoint saved, where checkpoints are on).
    mid_epoch: within an epoch (a progress bar's line is still open)."""

    def __init__(self, global_step: int, mid_epoch: bool = False):
        super().__init__(global_step)
        self.mid_epoch = mid_epoch


class _Agreed(Exception):
    """TensorFlow's preemption handler: every worker has reached the step agreed to stop at."""


class Preemption:
    """SIGTERM, as a preempted machine or the launcher stopping the run sends it: the step under way
    finishes, a checkpoint of it is saved, and the task exits, so a resume starts from that step.

    multi_worker_mirrored workers must all stop at the same step: there TensorFlow's
    PreemptionCheckpointHandler takes SIGTERM and agrees on the step through the cluster's coordination
    service (no collective per step). Its own save is left empty: the training loop saves the run's
    checkpoint, with its position, once due() says so on every worker alike."""
    requested = False
    _handler = None

    @classmethod
    def watch(cls, strategy=None) -> None:
        """strategy: a MultiWorkerMirroredStrategy, whose workers agree on the step; else SIGTERM is
        this process's own business."""
        if strategy is None:
            signal.signal(signal.SIGTERM, cls._request)
            return
        bookkeeping = tempfile.mkdtemp(prefix="distrain-preemption-", dir=scratch())  # the handler's; nothing is saved
        on_exit(lambda: shutil.rmtree(bookkeeping, ignore_errors=True))
        cls._handler = tf.distribute.experimental.PreemptionCheckpointHandler(
            strategy.cluster_resolver, tf.train.Checkpoint(), checkpoint_dir=os.path.join(bookkeeping, "agreement"),
            termination_config=tf.distribute.experimental.TerminationConfig(
                exit_fn=cls._agree, save_fn=lambda *args, **kwargs: None))

    @classmethod
    def due(cls) -> bool:
        """Whether to stop after the step just run. Call it after every training call, on every worker."""
        if cls._handler is not None and not cls.requested:
            try:
                cls._handler.save_checkpoint_if_preempted()
            except _Agreed:
                cls.requested = True
        return cls.requested

    @classmethod
    def _request(cls, signum, frame) -> None:
        cls.requested = True

    @staticmethod
    def _agree() -> None:
        raise _Agreed()
