"""SIGTERM as preemption, in a training task: the step under way finishes, its checkpoint is saved, and
the task exits (Preempted); multi_worker_mirrored workers agree on that step through TensorFlow's
PreemptionCheckpointHandler. Runs in the task process; costs a signal handler, or one call per training
call on a synchronous cluster."""
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path

import tensorflow as tf

from distrain.common.lifetime import on_exit, scratch
from distrain.common.messages import VERDICT

VERDICT_SECONDS = 30  # a launcher that does not judge an epoch in this time lets the training go on


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
    heard = False  # SIGTERM came (on a synchronous cluster, before the workers agree on the step)
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
        agreeing = signal.getsignal(signal.SIGTERM)  # (the handler's own: heard first, then passed on)

        def hear(signum, frame):
            cls.heard = True
            if callable(agreeing):
                agreeing(signum, frame)
        signal.signal(signal.SIGTERM, hear)

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
        cls.requested = cls.heard = True

    @classmethod
    def await_verdict(cls, epoch: int) -> bool:
        """Under a pruner (report/trial.py) the launcher judges each epoch as metrics.csv gains its row, and
        every training task waits for the verdict at the epoch's end: the epoch let go on (False), or
        SIGTERM for a pruned trial (True: stop here, every task of a synchronous cluster at this same
        step, with no agreement needed). Bounded by VERDICT_SECONDS; at once without a pruner."""
        path = os.environ.get(VERDICT)
        deadline = time.monotonic() + VERDICT_SECONDS
        while path and not cls.heard and time.monotonic() < deadline:
            try:
                if int(Path(path).read_text()) >= epoch:
                    return False
            except (OSError, ValueError):  # (none yet)
                pass
            time.sleep(0.01)
        return bool(path) and cls.heard

    @staticmethod
    def _agree() -> None:
        raise _Agreed()
