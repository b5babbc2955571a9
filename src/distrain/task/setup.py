"""The one set-up of a task, shared by training, the evaluator task, evaluate/predict and the benchmarks,
in named steps in the order a task takes them: its devices and strategy (`strategy_of`), its precision
(`set_precision`), then `set_up`: the seed, the data, the model and optimizer built in the strategy's
scope (`build`) and the accuracy their outputs settle. Runs in the task process (or the process of an
in-process evaluate/predict); costs what building the model costs."""
import os
from collections.abc import Callable
from typing import NamedTuple

import tensorflow as tf
import tf_keras as keras

from distrain.common import private
from distrain.common.cpu import ONEDNN
from distrain.common.messages import ONEDNN_WHY
from distrain.task.metrics import pick_accuracy
from distrain.task.model import build_model, check_model
from distrain.task.optimizer import make_optimizer
from distrain.task.strategy import configure_devices, gpu_capabilities, make_strategy, precision_policy


def strategy_of(cfg, context=None, peer_timeout: float | None = None, default: bool = False):
    """The devices set up (first thing in a process), then the config's strategy (default: TensorFlow's
    default strategy, where this process computes alone, as a task of a clustered evaluate or predict)."""
    configure_devices(cfg.strategy)
    return tf.distribute.get_strategy() if default else make_strategy(cfg.strategy, context, peer_timeout)


def set_precision(cfg, announce: bool = False) -> str:
    """Sets Keras's dtype policy for trainer.mixed_precision on this machine's devices and returns it;
    `announce` says which and why, and on a CPU what trainer.jit_compile costs."""
    t = cfg.trainer
    policy, why = precision_policy(t.mixed_precision, sharded=bool(cfg.strategy.get("variable_partitioner")))
    keras.mixed_precision.set_global_policy(policy)
    if announce:
        print(f"precision: {policy} ({why})", flush=True)
        print(onednn_line(), flush=True)
    if announce and t.jit_compile and not gpu_capabilities():
        print("warning: trainer.jit_compile=true on a CPU: XLA's CPU kernels run this model several times slower "
              "than TensorFlow's own (oneDNN), under plain Keras too (benchmarks/run.py measures it); XLA is for "
              "GPUs", flush=True)
    return policy


def onednn_line() -> str:
    """What the task runs, from TensorFlow itself (started by now), and why."""
    why = os.environ.get(ONEDNN_WHY) or (f"{ONEDNN}={os.environ[ONEDNN]}" if ONEDNN in os.environ
                                         else "TensorFlow's default")
    return f"cpu kernels: {'oneDNN' if onednn_on() else 'Eigen, oneDNN off'} ({why})"


def onednn_on() -> bool:
    """Whether TensorFlow (started in this process) runs its oneDNN kernels."""
    return bool(private.get("util_port").IsMklEnabled())


class Built(NamedTuple):
    """What build() makes, in the current strategy's scope."""
    model: keras.Model
    optimizer: keras.optimizers.Optimizer
    probabilities: bool  # the model outputs probabilities (else logits)
    optimizer_line: str  # the optimizer and its learning rate, in words


def build(cfg, data, policy: str) -> Built:
    """The model and its optimizer, built and checked against the data (the loss is checked against the
    outputs where the training step is made: training.make_runner)."""
    model = build_model(cfg.model, data.shape, data.classes)
    # (The forward pass builds a subclassed model's variables.)
    probabilities = check_model(model, data.sample, data.classes, data.labels == "classes")
    optimizer, line = make_optimizer(cfg, data.steps, policy)
    optimizer.build(model.trainable_variables)
    return Built(model, optimizer, probabilities, line)


def settle_accuracy(cfg, data, probabilities: bool) -> str:
    """Sets cfg.metrics' `auto` entries to the accuracy Keras's "accuracy" picks for these labels and
    outputs, known once the model is built (before anything compiles or makes metrics); the line that
    says which, or ""."""
    cfg.metrics, picked = pick_accuracy(cfg.get("metrics"), data.labels, probabilities)
    return picked


class Task(NamedTuple):
    """A task set up: its data, model, optimizer, outputs, precision, and what it said of them."""
    data: object  # input_data.TrainingData
    model: keras.Model
    optimizer: keras.optimizers.Optimizer
    probabilities: bool
    policy: str
    lines: list  # the accuracy picked, the optimizer: a chief's lines to print


def set_up(cfg, context, strategy, read: Callable, announce: bool = False,
           whole: Callable | None = None) -> Task:
    """The task's precision (said where `announce`), seed, data (`read(cfg, context)`: input_data's
    load_data or load_test_data), and in the strategy's scope its model and optimizer: `whole(data,
    policy)`'s Built (a model loaded whole), or built from the config where no `whole` is given."""
    policy = set_precision(cfg, announce)
    keras.utils.set_random_seed(cfg.trainer.seed)
    data = read(cfg, context)
    with strategy.scope():
        built = whole(data, policy) if whole else build(cfg, data, policy)
    picked = settle_accuracy(cfg, data, built.probabilities)
    return Task(data, built.model, built.optimizer, built.probabilities, policy,
                [line for line in (picked, built.optimizer_line) if line])
