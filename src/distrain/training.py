"""The training loop: devices, strategy, data, model, Keras fit, evaluation, saved artefacts."""
import time
from pathlib import Path

import tensorflow as tf
import tf_keras as keras

from . import data as data_lib
from .config import check_batch_divides
from .model import build_model, compile_model, make_optimizer
from .strategy import configure_devices, make_strategy, replica_devices


class EpochTimer(keras.callbacks.Callback):
    """Wall time of each epoch, for throughput that leaves out the first epoch's tracing."""

    def on_train_begin(self, logs=None):
        self.seconds = []

    def on_epoch_begin(self, epoch, logs=None):
        self._start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.seconds.append(time.perf_counter() - self._start)


def set_precision(enabled: bool) -> str:
    policy = "float32"
    if enabled:
        policy = "mixed_float16" if tf.config.list_physical_devices("GPU") else "mixed_bfloat16"
    keras.mixed_precision.set_global_policy(policy)
    return policy


def throughput(examples_per_epoch: int, epoch_seconds: list[float]) -> float:
    """Examples per second over the epochs after the first (all of them when there is only one)."""
    timed = epoch_seconds[1:] or epoch_seconds
    return examples_per_epoch * len(timed) / sum(timed)


def train(cfg, run_dir: Path, strategy=None):
    """Train as the config says; returns (results dict, model). Saves into run_dir."""
    t = cfg.trainer
    if strategy is None:
        configure_devices(cfg.strategy)
        strategy = make_strategy(cfg.strategy)
    policy = set_precision(t.mixed_precision)
    keras.utils.set_random_seed(t.seed)
    check_batch_divides(t.batch_size, strategy.num_replicas_in_sync)

    (x_train, y_train), (x_test, y_test) = data_lib.load(cfg.data, t.seed)
    train_ds = data_lib.make_dataset(x_train, y_train, t.batch_size, seed=t.seed,
                                     shuffle_buffer=cfg.data.shuffle_buffer)
    test_ds = data_lib.make_dataset(x_test, y_test, t.batch_size, seed=t.seed)

    with strategy.scope():
        model = build_model(cfg.model)
        optimizer = make_optimizer(cfg.optimizer, t.learning_rate)
        compile_model(model, optimizer, t)

    timer = EpochTimer()
    callbacks = [timer]
    if t.tensorboard:
        callbacks.append(keras.callbacks.TensorBoard(log_dir=str(run_dir / "tensorboard")))
    history = model.fit(train_ds, epochs=t.epochs, verbose=t.verbose, callbacks=callbacks)
    test_loss, test_accuracy = model.evaluate(test_ds, verbose=0)

    if t.save_model:
        save(model, optimizer, run_dir)
    results = {
        "strategy": cfg.strategy.name,
        "num_replicas": strategy.num_replicas_in_sync,
        "num_workers": 1,
        "num_ps": 0,
        "devices": replica_devices(strategy),
        "model": cfg.model.name,
        "model_params": model.count_params(),
        "optimizer": cfg.optimizer,
        "learning_rate": t.learning_rate,
        "epochs": t.epochs,
        "global_batch_size": t.batch_size,
        "per_replica_batch_size": t.batch_size // strategy.num_replicas_in_sync,
        "steps_per_execution": t.steps_per_execution,
        "precision_policy": policy,
        "jit_compile": t.jit_compile,
        "data": cfg.data.name,
        "data_source": cfg.data.source,
        "train_examples": len(y_train),
        "test_examples": len(y_test),
        "train_seconds": sum(timer.seconds),
        "epoch_seconds": timer.seconds,
        "examples_per_sec": throughput(len(y_train), timer.seconds),
        "test_accuracy": float(test_accuracy),
        "test_loss": float(test_loss),
        "final_train_loss": float(history.history["loss"][-1]),
        "history": {k: [float(v) for v in vs] for k, vs in history.history.items()},
        "seed": t.seed,
        "tensorflow_version": tf.__version__,
    }
    return results, model


def save(model, optimizer, run_dir: Path) -> None:
    """Layout: checkpoints/ (tf.train.CheckpointManager, for resuming) and saved_model/ (for serving)."""
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
    tf.train.CheckpointManager(checkpoint, str(run_dir / "checkpoints"), max_to_keep=3).save()
    model.save(str(run_dir / "saved_model"))
