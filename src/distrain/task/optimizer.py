"""The optimizer and its learning rate over the run: the config's `optimizer` and `schedule` nodes (a
tf_keras class named by `_target_`, with its arguments), the warm-up, and the scaling of the learning
rate with the global batch (trainer.lr_scaling)."""
import tf_keras as keras
from omegaconf import OmegaConf

from distrain.common.errors import ConfigError
from distrain.config.schema import lr_factor, update_batch
from distrain.config.targets import takes
from distrain.config.validate import instantiate, instantiate_as

# Keys of a schedule node that are distrain's, not the schedule class's.
WARMUP_KEYS = ("warmup_steps", "warmup_epochs")


@keras.saving.register_keras_serializable(package="distrain")
class Warmup(keras.optimizers.schedules.LearningRateSchedule):
    """A schedule (or a constant rate) times `factor`, ramped up linearly over the first `steps` steps
    (Goyal et al., "Accurate, Large Minibatch SGD": gradual warm-up, then the scaled rate)."""

    def __init__(self, schedule, factor: float = 1.0, steps: int = 0):
        self.schedule, self.factor, self.steps = schedule, float(factor), int(steps)

    def __call__(self, step):
        import tensorflow as tf

        step = tf.cast(step, tf.float32)
        rate = self.schedule(step) if callable(self.schedule) else tf.constant(self.schedule, tf.float32)
        ramp = tf.minimum(1.0, (step + 1.0) / self.steps) if self.steps else 1.0
        return tf.cast(rate, tf.float32) * self.factor * ramp

    def get_config(self):
        schedule = self.schedule
        if isinstance(schedule, keras.optimizers.schedules.LearningRateSchedule):
            schedule = keras.optimizers.schedules.serialize(schedule)
        return {"schedule": schedule, "factor": self.factor, "steps": self.steps}

    @classmethod
    def from_config(cls, config):
        schedule = config["schedule"]
        if isinstance(schedule, dict):
            schedule = keras.optimizers.schedules.deserialize(schedule)
        return cls(schedule, config["factor"], config["steps"])


def learning_rate(cfg, steps_per_epoch: int):
    """(The learning rate to give the optimizer: a float or a schedule, and one line saying it and why)."""
    t, node = cfg.trainer, cfg.schedule
    total = t.epochs * steps_per_epoch
    warmup = node.get("warmup_steps") or 0
    if node.get("warmup_epochs"):  # (not both: config.validate)
        warmup = max(1, round(node.warmup_epochs * steps_per_epoch))
    if warmup >= total:
        raise ConfigError(f"the warm-up ({warmup} steps) is not shorter than the run ({total} steps): lower "
                          "schedule.warmup_steps or schedule.warmup_epochs, or raise trainer.epochs")
    factor = lr_factor(t)
    said = [f"learning rate {t.learning_rate * factor:g}"]  # joined by spaces
    if factor != 1:
        said.append(f"(trainer.learning_rate {t.learning_rate:g} x {factor:g}: {t.lr_scaling} scaling, global batch "
                    f"{update_batch(t)} / reference {t.reference_batch_size})")
    if warmup:
        said.append(f"reached by a linear warm-up over the first {warmup} steps")
    schedule = t.learning_rate
    if node.get("_target_"):
        arguments = OmegaConf.masked_copy(node, [k for k in node if k not in (*WARMUP_KEYS, "name")])
        if "decay_steps" in arguments and arguments.decay_steps is None:
            arguments.decay_steps = total
        if "initial_learning_rate" in (takes(node._target_) or ()) and "initial_learning_rate" not in arguments:
            arguments.initial_learning_rate = t.learning_rate
        schedule = instantiate("schedule._target_", arguments, "it must name a tf_keras LearningRateSchedule (or a "
                               "function returning one) taking the schedule node's other keys")
        if not callable(schedule):
            raise ConfigError(f"schedule._target_={node._target_} returned {type(schedule).__name__}, not a "
                              "learning-rate schedule: name a tf_keras.optimizers.schedules class")
        said.append(f"{'then ' if warmup else ''}times the schedule {node.get('name') or node._target_}"
                    + (f" (decay over {arguments.decay_steps} steps)" if "decay_steps" in arguments else ""))
    if factor == 1 and not warmup:
        return schedule, " ".join(said)
    return Warmup(schedule, factor, warmup), " ".join(said)


def make_optimizer(cfg, steps_per_epoch: int, policy: str = "float32"):
    """(The config's optimizer, with its learning rate, one line saying that rate): float16 training
    wraps it in loss scaling, as its gradients underflow without."""
    rate, line = learning_rate(cfg, steps_per_epoch)
    node = cfg.optimizer
    optimizer = instantiate_as("optimizer._target_", node, keras.optimizers.Optimizer, "it must name a tf_keras "
                               "optimizer class (or a function returning one) taking learning_rate and the optimizer "
                               "node's other keys", "a tf_keras optimizer: name a tf_keras.optimizers class (import "
                               "tf_keras, not keras 3)", drop=("name",), learning_rate=rate)
    if policy == "mixed_float16":
        optimizer = keras.mixed_precision.LossScaleOptimizer(optimizer)
    return optimizer, f"optimizer: {node.get('name') or node._target_}, {line}"


def plain_keras(optimizer) -> bool:
    """Whether a process without distrain can load this optimizer (a SavedModel keeps it only then)."""
    return "distrain>" not in str(keras.optimizers.serialize(optimizer))
