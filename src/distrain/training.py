"""The training loop: devices, strategy, data, model, Keras fit, evaluation, saved artefacts."""
import shutil
import tempfile
import time
from pathlib import Path

import tensorflow as tf
import tf_keras as keras

from . import data as data_lib
from .config import ConfigError, check_batch_divides
from .model import build_model, compile_model, hits, make_optimizer
from .strategy import cluster_size, configure_devices, is_chief, make_strategy, replica_devices


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
    """Train as the config says; returns (results dict, model). The chief saves into run_dir."""
    if strategy is None:
        configure_devices(cfg.strategy)
        strategy = make_strategy(cfg.strategy)
    if isinstance(strategy, tf.distribute.ParameterServerStrategy):
        return train_async(cfg, run_dir, strategy)
    t = cfg.trainer
    policy = set_precision(t.mixed_precision)
    keras.utils.set_random_seed(t.seed)
    check_batch_divides(t.batch_size, strategy.num_replicas_in_sync)

    (x_train, y_train), (x_test, y_test) = data_lib.load(cfg.data, t.seed)
    steps = len(y_train) // t.batch_size
    if steps == 0:
        raise ConfigError(f"trainer.batch_size={t.batch_size} is larger than the {len(y_train)} training "
                          f"examples: set trainer.batch_size={len(y_train)} or less")
    train_ds = distributed_train_dataset(strategy, x_train, y_train, cfg)
    test_ds = data_lib.make_dataset(x_test, y_test, t.batch_size, seed=t.seed)

    with strategy.scope():
        model = build_model(cfg.model)
        optimizer = make_optimizer(cfg.optimizer, t.learning_rate)
        compile_model(model, optimizer, t)

    chief = is_chief(strategy)
    # Every worker of a synchronous cluster must save (saving reads replicated variables together),
    # but only the chief's copy is kept.
    out_dir = run_dir if chief else Path(tempfile.mkdtemp(prefix="distrain-worker-"))
    timer = EpochTimer()
    callbacks = [timer]
    if t.save_model:
        callbacks.append(EpochCheckpoint(checkpoint_manager(model, optimizer, checkpoint_dir(cfg, out_dir, chief))))
    if t.tensorboard:
        callbacks.append(keras.callbacks.TensorBoard(log_dir=str(out_dir / "tensorboard")))
    history = model.fit(train_ds, epochs=t.epochs, steps_per_epoch=steps, verbose=t.verbose, callbacks=callbacks)
    test_loss, test_accuracy = model.evaluate(test_ds, verbose=0)
    if t.save_model:
        model.save(str(out_dir / "saved_model"))
    if not chief:
        shutil.rmtree(out_dir, ignore_errors=True)

    workers, ps = cluster_size(strategy)
    results = base_results(cfg, strategy, model, policy, len(y_train), len(y_test), steps * t.batch_size,
                           timer.seconds)
    results.update({
        "num_workers": workers,
        "num_ps": ps,
        "per_replica_batch_size": t.batch_size // strategy.num_replicas_in_sync,
        "test_accuracy": float(test_accuracy),
        "test_loss": float(test_loss),
        "final_train_loss": float(history.history["loss"][-1]),
        "history": {k: [float(v) for v in vs] for k, vs in history.history.items()},
    })
    return results, model


def distributed_train_dataset(strategy, images, labels, cfg):
    """Every input pipeline (one per worker) builds the same shuffled global batches and keeps the
    slice for its own replicas, one per-replica batch per element: the global batch is exactly the
    one a single device would take. Every step is a full global batch (the remainder is dropped)."""
    t = cfg.trainer

    def dataset_fn(context):
        replicas_here = context.num_replicas_in_sync // context.num_input_pipelines
        ds = data_lib.make_dataset(images, labels, t.batch_size, seed=t.seed, drop_remainder=True, repeat=True,
                                   shuffle_buffer=cfg.data.shuffle_buffer,
                                   part=(context.input_pipeline_id, context.num_input_pipelines))
        return ds.rebatch(context.get_per_replica_batch_size(t.batch_size)) if replicas_here > 1 else ds

    return strategy.distribute_datasets_from_function(dataset_fn)


def base_results(cfg, strategy, model, policy, train_examples, test_examples, epoch_examples,
                 epoch_seconds) -> dict:
    """The results every strategy reports; epoch_examples: examples trained on per epoch."""
    t = cfg.trainer
    return {
        "strategy": cfg.strategy.name,
        "num_replicas": strategy.num_replicas_in_sync,
        "devices": replica_devices(strategy),
        "model": cfg.model.name,
        "model_params": model.count_params(),
        "optimizer": cfg.optimizer,
        "learning_rate": t.learning_rate,
        "epochs": t.epochs,
        "global_batch_size": t.batch_size,
        "steps_per_execution": t.steps_per_execution,
        "precision_policy": policy,
        "jit_compile": t.jit_compile,
        "data": cfg.data.name,
        "data_source": cfg.data.source,
        "train_examples": train_examples,
        "test_examples": test_examples,
        "train_seconds": sum(epoch_seconds),
        "epoch_seconds": epoch_seconds,
        "examples_per_sec": throughput(epoch_examples, epoch_seconds),
        "seed": t.seed,
        "tensorflow_version": tf.__version__,
    }


def train_async(cfg, run_dir: Path, strategy):
    """Asynchronous SGD: this process is the coordinator (chief); variables live on the ps tasks and
    the coordinator schedules functions of `steps_per_schedule` steps on whichever worker is free.
    A worker that dies loses nothing: its scheduled functions run again on the others."""
    t = cfg.trainer
    policy = set_precision(t.mixed_precision)
    keras.utils.set_random_seed(t.seed)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    workers, ps = cluster_size(strategy)
    print(f"coordinator up: {workers} worker(s), {ps} ps task(s)", flush=True)

    (x_train, y_train), (x_test, y_test) = data_lib.load(cfg.data, t.seed)
    # An epoch is one pass over the data, ending at a join(): with too few scheduled functions per
    # epoch, workers idle while the last ones finish. Keep at least 4 per worker.
    steps_per_epoch = max(1, len(y_train) // t.batch_size)
    per_schedule = max(1, min(cfg.strategy.steps_per_schedule, steps_per_epoch // (4 * workers)))
    schedules = max(1, steps_per_epoch // per_schedule)
    print(f"coordinator: {schedules} functions of {per_schedule} steps per epoch", flush=True)

    with strategy.scope():
        model = build_model(cfg.model)
        optimizer = make_optimizer(cfg.optimizer, t.learning_rate)
        optimizer.build(model.trainable_variables)
    print(placement_table(model.variables + optimizer.variables, ps), flush=True)

    def dataset_fn(input_context):
        # Each worker reads its own shard of the training set, shuffled and repeated.
        worker = tf.distribute.coordinator.experimental_get_current_worker_index()
        return data_lib.make_dataset(x_train, y_train, input_context.get_per_replica_batch_size(t.batch_size),
                                     seed=t.seed, shuffle_buffer=cfg.data.shuffle_buffer, repeat=True,
                                     shard=(workers, worker))

    iterator = iter(coordinator.create_per_worker_dataset(
        lambda: strategy.distribute_datasets_from_function(dataset_fn)))
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

    @tf.function
    def train_steps(iterator):
        """`per_schedule` steps on one worker. Loss and accuracy are summed here and returned, not kept
        in metric variables: those would live on the ps tasks and cost remote updates every step."""
        def step(images, labels):
            with tf.GradientTape() as tape:
                logits = model(images, training=True)
                loss = tf.nn.compute_average_loss(loss_fn(labels, logits))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss, tf.reduce_sum(hits(labels, logits)), tf.cast(tf.size(labels), tf.float32)

        totals = tf.zeros([3])
        for _ in tf.range(per_schedule):
            per_replica = strategy.run(step, args=next(iterator))
            totals += tf.stack([strategy.reduce("SUM", v, axis=None) for v in per_replica])
        return tf.distribute.coordinator.experimental_get_current_worker_index(), totals

    manager = checkpoint_manager(model, optimizer, checkpoint_dir(cfg, run_dir)) if t.save_model else None
    epoch_seconds, history = [], {"loss": [], "accuracy": []}
    worker_steps = {i: 0 for i in range(workers)}
    for epoch in range(t.epochs):
        start = time.perf_counter()
        done = [coordinator.schedule(train_steps, args=(iterator,)) for _ in range(schedules)]
        coordinator.join()
        epoch_seconds.append(time.perf_counter() - start)
        loss_sum, correct, examples = 0.0, 0.0, 0.0
        for remote in done:
            worker, (step_losses, step_correct, step_examples) = remote.fetch()
            worker_steps[int(worker)] += per_schedule
            loss_sum, correct, examples = loss_sum + step_losses, correct + step_correct, examples + step_examples
        history["loss"].append(float(loss_sum) / (schedules * per_schedule))  # mean over the epoch's steps
        history["accuracy"].append(float(correct) / float(examples))
        per_worker = ", ".join(f"worker {i}: {n}" for i, n in worker_steps.items())
        print(f"Epoch {epoch + 1}/{t.epochs} - global step {int(optimizer.iterations.numpy())} "
              f"({per_worker}) - loss: {history['loss'][-1]:.4f} - accuracy: {history['accuracy'][-1]:.4f} "
              f"- {epoch_seconds[-1]:.1f}s", flush=True)
        if manager:
            manager.save(checkpoint_number=epoch + 1)

    # Inline evaluation: a local copy of the trained weights, on the coordinator.
    evaluated = build_model(cfg.model)
    evaluated.set_weights(model.get_weights())
    compile_model(evaluated, make_optimizer(cfg.optimizer, t.learning_rate), t)
    test_loss, test_accuracy = evaluated.evaluate(
        data_lib.make_dataset(x_test, y_test, t.batch_size, seed=t.seed), verbose=0)
    if t.save_model:
        evaluated.save(str(run_dir / "saved_model"))

    results = base_results(cfg, strategy, model, policy, len(y_train), len(y_test),
                           schedules * per_schedule * t.batch_size, epoch_seconds)
    results.update({
        "num_replicas": workers * strategy.num_replicas_in_sync,
        "num_workers": workers,
        "num_ps": ps,
        "per_replica_batch_size": t.batch_size // strategy.num_replicas_in_sync,
        "steps_per_schedule": per_schedule,
        "global_steps": int(optimizer.iterations.numpy()),
        "worker_steps": {str(i): n for i, n in worker_steps.items()},
        "steps_per_sec": throughput(schedules * per_schedule, epoch_seconds),
        "test_accuracy": float(test_accuracy),
        "test_loss": float(test_loss),
        "final_train_loss": history["loss"][-1],
        "history": history,
    })
    return results, evaluated


def placement_table(variables, num_ps: int) -> str:
    """Which ps task holds each variable (shards listed one by one): what replica_device_setter did."""
    lines = [f"variable placement over {num_ps} ps task(s):"]
    for variable in variables:
        for shard in getattr(variable, "variables", [variable]):  # a ShardedVariable lists its shards
            spec = tf.DeviceSpec.from_string(shard.device)
            lines.append(f"  {shard.name:<40} {str(tuple(shard.shape)):<16} {spec.job}:{spec.task}")
    return "\n".join(lines)


def checkpoint_dir(cfg, run_dir: Path, chief: bool = True) -> Path:
    """Where ckpt-<epoch> goes: trainer.checkpoint_dir if set (the chief's), else <run dir>/checkpoints."""
    if chief and cfg.trainer.checkpoint_dir:
        return Path(cfg.trainer.checkpoint_dir)
    return run_dir / "checkpoints"


def checkpoint_manager(model, optimizer, directory: Path) -> tf.train.CheckpointManager:
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
    return tf.train.CheckpointManager(checkpoint, str(directory), max_to_keep=3)


class EpochCheckpoint(keras.callbacks.Callback):
    """Saves ckpt-<epoch> after every epoch: for a sidecar evaluator now, for resuming later."""

    def __init__(self, manager):
        super().__init__()
        self.manager = manager

    def on_epoch_end(self, epoch, logs=None):
        self.manager.save(checkpoint_number=epoch + 1)


def evaluate_checkpoints(cfg, run_dir: Path) -> dict:
    """The evaluator task: evaluate each checkpoint the chief writes, until the last epoch's."""
    t = cfg.trainer
    set_precision(t.mixed_precision)
    (_, _), (x_test, y_test) = data_lib.load(cfg.data, t.seed)
    test_ds = data_lib.make_dataset(x_test, y_test, t.batch_size, seed=t.seed)
    model = build_model(cfg.model)
    compile_model(model, make_optimizer(cfg.optimizer, t.learning_rate), t)
    directory = checkpoint_dir(cfg, run_dir)
    print(f"evaluator: waiting for checkpoints in {directory}", flush=True)
    evaluations = []
    for path in tf.train.checkpoints_iterator(str(directory)):  # each newest checkpoint, once
        try:
            tf.train.Checkpoint(model=model).restore(path).expect_partial()
        except (tf.errors.NotFoundError, tf.errors.DataLossError):  # pruned before we got to it
            continue
        loss, accuracy = model.evaluate(test_ds, verbose=0)
        epoch = int(path.rsplit("-", 1)[-1])
        evaluations.append({"checkpoint": Path(path).name, "epoch": epoch, "loss": loss, "accuracy": accuracy})
        print(f"evaluator: epoch {epoch} ({Path(path).name}): test loss {loss:.4f}, accuracy {accuracy:.4f}",
              flush=True)
        if epoch >= t.epochs:
            break
    return {"checkpoint_dir": str(directory), "evaluations": evaluations}
