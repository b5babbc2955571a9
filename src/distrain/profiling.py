"""trainer.profile=[START,END]: a TensorFlow profiler trace of global steps START to END, on every
training task, into the run's TensorBoard logs (<run dir>/tensorboard/<task>/plugins/profile/), where
TensorBoard's Profile tab reads it (pip install tensorboard-plugin-profile). The epochs' calls are cut
at START and END (checkpoints.segments), so the trace holds those steps and no others."""
from pathlib import Path

import tensorflow as tf

from .errors import ConfigError


class Profile:
    def __init__(self, steps: list | None, log_dir: Path, total_steps: int):
        self.steps, self.log_dir, self.on = (tuple(steps) if steps else None), log_dir, False
        if self.steps and self.steps[1] > total_steps:
            raise ConfigError(f"trainer.profile={list(self.steps)} ends after the run's last global step "
                              f"({total_steps}): set trainer.profile=[START,END] with END <= {total_steps}")

    @property
    def marks(self) -> tuple:
        """The global steps where the epochs' calls must be cut."""
        return self.steps or ()

    def before(self, step: int) -> None:
        """Starts the trace where the global step about to be trained from is START."""
        if self.steps and step == self.steps[0] and not self.on:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            tf.profiler.experimental.start(str(self.log_dir))
            self.on = True

    def after(self, step: int) -> None:
        """Stops it once END is trained (and says where it is)."""
        if self.on and step >= self.steps[1]:
            tf.profiler.experimental.stop()
            self.on = False
            print(f"profile of global steps {self.steps[0]}-{self.steps[1]} written to {self.log_dir} "
                  f"(tensorboard --logdir {self.log_dir.parent}: its Profile tab)", flush=True)
