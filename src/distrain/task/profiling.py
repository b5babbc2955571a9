"""trainer.profile=[START,END]: a TensorFlow profiler trace of global steps START to END, on every
training task, into the run's TensorBoard logs (<run dir>/tensorboard/<task>/plugins/profile/), where
TensorBoard's Profile tab reads it (pip install tensorboard-plugin-profile). The epochs' calls are cut
at START and END (checkpoints.segments), so the trace holds those steps and no others.

Under parameter servers the coordinator traces itself, and asks each worker's server (TensorFlow's gRPC
server answers the profiler) for a trace of as long as START to END should take at the pace so far: the
workers run whatever the coordinator schedules, so their traces hold about those steps."""
import threading
import time
from pathlib import Path

import tensorflow as tf

from distrain.common.errors import ConfigError


class Profile:
    def __init__(self, steps: list | None, log_dir: Path, total_steps: int, workers=()):
        self.steps, self.log_dir, self.on = (tuple(steps) if steps else None), log_dir, False
        self.workers, self.pace, self.remote = list(workers), None, None  # (parameter servers' workers)
        if self.steps and self.steps[1] > total_steps:
            raise ConfigError(f"trainer.profile={list(self.steps)} ends after the run's last global step "
                              f"({total_steps}): set trainer.profile=[START,END] with END <= {total_steps}")

    @property
    def marks(self) -> tuple:
        """The global steps where the epochs' calls must be cut."""
        return self.steps or ()

    def before(self, step: int) -> None:
        """Starts the trace where the global step about to be trained from is START."""
        self.pace = self.pace or (time.monotonic(), step)
        if self.steps and step == self.steps[0] and not self.on:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            tf.profiler.experimental.start(str(self.log_dir))
            self.on = True
            if self.workers:
                self._trace_workers(step)

    def _trace_workers(self, step: int) -> None:
        since, first = self.pace
        per_step = (time.monotonic() - since) / (step - first) if step > first else 0.05
        milliseconds = max(500, int(1000 * per_step * (self.steps[1] - self.steps[0])))
        where = self.log_dir.parent / "workers"
        self.remote = threading.Thread(target=tf.profiler.experimental.client.trace, daemon=True, args=(
            ",".join(f"grpc://{address}" for address in self.workers), str(where), milliseconds))
        self.remote.start()

    def after(self, step: int) -> None:
        """Stops it once END is trained (and says where it is)."""
        if self.on and step >= self.steps[1]:
            tf.profiler.experimental.stop()
            self.on = False
            if self.remote:
                self.remote.join(timeout=60)  # (the workers' traces written, as long as they were asked for)
            workers = f", the workers' to {self.log_dir.parent / 'workers'}" if self.remote else ""
            print(f"profile of global steps {self.steps[0]}-{self.steps[1]} written to {self.log_dir}{workers} "
                  f"(tensorboard --logdir {self.log_dir.parent}: its Profile tab)", flush=True)
