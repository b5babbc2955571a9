"""The training loop: devices, strategy, data, model, training steps, evaluation, saved artefacts."""
import shutil
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np
import tensorflow as tf
import tf_keras as keras

from . import cpu, report
from . import data as data_lib
from .checkpoints import Checkpoints, Progress, read_position, resume, segments
from .config import check_batch_divides, checkpoint_dir
from .errors import ConfigError, Diverged
from .model import Crossentropy, build_model, check_model, compile_model, hits, make_optimizer
from .process import Heartbeat, Preempted, Preemption, scratch
from .report import seconds_since_start
from .strategy import (cluster_size, cluster_spec, configure_devices, gpu_capabilities, is_chief, make_strategy,
                       precision_policy, replica_devices)


def set_precision(t, announce: bool = False) -> str:
    """Sets Keras's dtype policy for t.mixed_precision on this machine's devices and returns it;
    `announce` says which and why, and on a CPU what t.jit_compile costs."""
    policy, why = precision_policy(t.mixed_precision)
    keras.mixed_precision.set_global_policy(policy)
    if announce:
        print(f"precision: {policy} ({why})", flush=True)
        print(cpu.onednn_line(), flush=True)
    if announce and t.jit_compile and not gpu_capabilities():
        print("warning: trainer.jit_compile=true on a CPU: XLA's CPU kernels run this model several times slower "
              "than TensorFlow's own (oneDNN), under plain Keras too (benchmarks/run.py measures it); XLA is for "
              "GPUs", flush=True)
    return policy


# The runners, never deleted: deleting the coordinator's functions removes them from every remote
# task, which after a worker's restart takes seconds (12 s for a run's functions, measured), and
# deleting a multi_worker_mirrored input iterator can wait 1.2 s for the peers (seen in 6 of 10 runs
# with TensorBoard's scalars). A task's process ends without (task.main); the tests clear this.
KEPT = []


class Data(NamedTuple):
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    classes: int
    steps: int  # global steps an epoch

    @property
    def shape(self) -> tuple:
        return self.x_train.shape[1:]


def train(cfg, run_dir: Path, strategy=None):
    """Train as the config says; returns (results dict, model). The chief saves into run_dir.

    One loop for every strategy. An epoch is a series of calls to `train_steps`, a tf.function of a
    few training steps: synchronous strategies call it in every worker process alike (gradients are
    all-reduced inside the step); under parameter servers this process is the coordinator and
    schedules the calls on whichever worker is free (asynchronous SGD). The runner (make_runner) is
    what differs.
    """
    if strategy is None:
        configure_devices(cfg.strategy)
        strategy = make_strategy(cfg.strategy)
    t, chief = cfg.trainer, is_chief(strategy)
    policy = set_precision(t, announce=bool(t.verbose) and chief)
    keras.utils.set_random_seed(t.seed)
    data = load_data(cfg, strategy)
    with strategy.scope():
        model, optimizer, probabilities = build(cfg, data, policy)
    # Every worker of a synchronous cluster must save (saving reads replicated variables together),
    # but only the chief's copy is kept.
    out_dir = run_dir if chief else Path(tempfile.mkdtemp(prefix="distrain-worker-", dir=scratch()))
    saves = Checkpoints(model, optimizer, checkpoint_dir(cfg, out_dir) if chief else out_dir / "checkpoints",
                        t.keep_checkpoints) if t.save_model else None
    progress = resume(saves or Checkpoints(model, optimizer, out_dir), checkpoint_dir(cfg, run_dir), data.steps) \
        if t.resume else Progress()  # every task reads the chief's checkpoints
    runner = make_runner(strategy, cfg, data, model, optimizer, probabilities, progress)
    KEPT.append(runner)  # (never deleted: above)
    run_epochs(runner, progress, t, data.steps, saves, out_dir / "tensorboard" / "train" if t.tensorboard is True else None)
    model, optimizer = runner.finish(model, rebuild=lambda: build(cfg, data, policy)[:2])
    compile_model(model, optimizer, t, probabilities)  # for evaluate(), and so that the SavedModel can train on
    test = model.evaluate(data_lib.make_dataset(data.x_test, data.y_test, t.batch_size, seed=t.seed), verbose=0)
    if t.save_model:
        save_model(model, out_dir / "saved_model")
    if not chief:
        shutil.rmtree(out_dir, ignore_errors=True)
    return report.results(cfg, data, progress, test, runner.describe(t.batch_size) | about(model, probabilities, policy)), \
        model


def load_data(cfg, strategy) -> Data:
    """The training and test arrays, checked against the batch and the replicas."""
    t = cfg.trainer
    if not isinstance(strategy, tf.distribute.ParameterServerStrategy):  # (there: a batch per worker's step)
        check_batch_divides(t.batch_size, strategy.num_replicas_in_sync)
    (x_train, y_train), (x_test, y_test) = data_lib.load(cfg.data, t.seed)
    steps = len(y_train) // t.batch_size
    if steps == 0:
        raise ConfigError(f"trainer.batch_size={t.batch_size} is larger than the {len(y_train)} training "
                          f"examples: set trainer.batch_size={len(y_train)} or less")
    return Data(x_train, y_train, x_test, y_test, data_lib.num_classes(cfg.data, (y_train, y_test)), steps)


def build(cfg, data: Data, policy: str) -> tuple:
    """(model, optimizer, whether the model outputs probabilities), built in the current strategy's scope."""
    model = build_model(cfg.model, data.shape, data.classes)
    probabilities = check_model(model, data.x_train, data.classes)  # (builds a subclassed model's variables)
    optimizer = make_optimizer(cfg.optimizer, cfg.trainer.learning_rate, policy)
    optimizer.build(model.trainable_variables)
    return model, optimizer, probabilities


def about(model, probabilities: bool, policy: str) -> dict:
    """The model's size and outputs, and what it computed with (results.json)."""
    return {"model_params": model.count_params(), "model_outputs": "probabilities" if probabilities else "logits",
            "precision_policy": policy, "onednn": cpu.onednn_on(), "tensorflow_version": tf.__version__}


def make_runner(strategy, cfg, data: Data, model, optimizer, probabilities: bool, progress: Progress):
    """The epochs' runner for this strategy: AsyncEpochs (parameter servers) or SyncEpochs (the others)."""
    t = cfg.trainer
    train_steps = make_train_steps(strategy, model, optimizer, t.jit_compile, probabilities)
    if isinstance(strategy, tf.distribute.ParameterServerStrategy):
        runner = AsyncEpochs(strategy, train_steps, per_worker_dataset(strategy, data.x_train, data.y_train, cfg),
                             model, optimizer, data.steps, t.steps_per_execution)
    else:
        # Resumed, the data goes on from the batch after the last one trained: the batches an
        # uninterrupted run would have seen.
        dataset = distributed_train_dataset(strategy, data.x_train, data.y_train, cfg,
                                            skip=progress.epoch * data.steps + progress.step)
        runner = SyncEpochs(strategy, train_steps, dataset, optimizer, t.steps_per_execution, progress=t.verbose == 1)
    if t.verbose:
        print(f"{data.steps} steps per epoch, up to {runner.per_call} per tf.function call", flush=True)
    return runner


def save_model(model, path: Path) -> None:
    """The trained model as a SavedModel. One that cannot be saved so (some subclassed models) is a
    warning: the run's training is done, and its checkpoints hold the weights."""
    try:
        model.save(str(path))
    except Exception as exc:  # noqa: BLE001 - whatever Keras cannot serialise
        print(f"warning: the model could not be saved as a SavedModel in {path} ({type(exc).__name__}: "
              f"{str(exc).splitlines()[0][:200] if str(exc) else ''}); its checkpoints hold the trained weights",
              flush=True)


def run_epochs(runner, progress: Progress, t, steps: int, saves, log_dir: Path | None) -> None:
    """Train from where `progress` stands to the last epoch, keeping it up to date; checkpoints at
    every epoch end and every t.checkpoint_every_steps global steps; TensorBoard logs in log_dir."""
    history = progress.history
    writer = tf.summary.create_file_writer(str(log_dir)) if log_dir else None

    def diverged(epoch: int, step: int):  # before any checkpoint of the diverged weights
        raise Diverged(f"the training loss became NaN or infinite in epoch {epoch + 1}, step {step} (global step "
                       f"{epoch * steps + step}): lower trainer.learning_rate (now {t.learning_rate}), or with "
                       "trainer.mixed_precision use float32; the checkpoints written before it are kept")

    for epoch in range(progress.epoch, t.epochs):
        if runner.progress:
            print(f"Epoch {epoch + 1}/{t.epochs}", flush=True)
        start = time.perf_counter()
        runner.begin(steps, progress.step, progress.totals)
        for calls in segments(progress.step, steps, runner.per_call, t.checkpoint_every_steps, epoch * steps):
            progress.step += runner.run(calls, on_nan=(lambda step, e=epoch: diverged(e, step)) if t.stop_on_nan
                                        else None, stop=Preemption.due)
            if saves and progress.step < steps:  # a checkpoint within the epoch (due, or preempted)
                progress.totals = runner.totals()
                progress.seconds += time.perf_counter() - start
                start = time.perf_counter()
                saves.save(progress, epoch * steps + progress.step)
            if Preemption.requested and progress.step < steps:
                raise Preempted(epoch * steps + progress.step)
        loss_sum, correct, examples = runner.end()
        progress.epoch_seconds.append(progress.seconds + time.perf_counter() - start)
        history["loss"].append(loss_sum / examples)
        history["accuracy"].append(correct / examples)
        progress.epoch, progress.step, progress.totals, progress.seconds = epoch + 1, 0, [0.0, 0.0, 0.0], 0.0
        if t.verbose and not runner.progress:
            print(f"Epoch {epoch + 1}/{t.epochs} - {runner.epoch_line(steps)} - {progress.epoch_seconds[-1]:.1f}s - "
                  f"loss: {history['loss'][-1]:.4f} - accuracy: {history['accuracy'][-1]:.4f}", flush=True)
        if saves:
            saves.save(progress, (epoch + 1) * steps)
        if Preemption.requested and epoch + 1 < t.epochs:
            raise Preempted((epoch + 1) * steps)
        if writer:  # TensorBoard's scalars, as Keras names its epoch logs
            scalars = {f"epoch_{name}": values[-1] for name, values in history.items()}
            scalars["epoch_examples_per_sec"] = steps * t.batch_size / progress.epoch_seconds[-1]
            with writer.as_default(step=epoch):
                for name, value in (scalars | runner.scalars()).items():
                    tf.summary.scalar(name, value)
    if writer:
        writer.close()


def make_train_steps(strategy, model, optimizer, jit_compile: bool, probabilities: bool = False):
    """A tf.function that runs `steps` training steps on this worker's replicas and returns this
    worker's [sum of losses, correct predictions, examples]. The sums stay local: Keras metrics would
    be synchronised across the workers at every step (multi-worker mirrored) or live on the ps tasks.
    probabilities: the model ends with a softmax, so its loss is taken from probabilities, not logits."""
    loss_fn = Crossentropy(from_logits=not probabilities, reduction="none")
    scaled = isinstance(optimizer, keras.mixed_precision.LossScaleOptimizer)

    @tf.function(jit_compile=jit_compile)
    def gradients(images, labels):
        """Forward and backward pass; XLA compiles this part only, never the cross-worker all-reduce."""
        with tf.GradientTape() as tape:
            logits = model(images, training=True)
            losses = loss_fn(labels, logits)
            loss = tf.nn.compute_average_loss(losses)  # over the global batch: replica gradients sum to the mean
            if scaled:
                loss = optimizer.get_scaled_loss(loss)
        grads = tape.gradient(loss, model.trainable_variables)
        if scaled:
            grads = optimizer.get_unscaled_gradients(grads)
        stats = tf.stack([tf.reduce_sum(losses), tf.reduce_sum(hits(labels, logits)),
                          tf.cast(tf.size(labels), tf.float32)])
        return grads, stats

    def step(images, labels):
        grads, stats = gradients(images, labels)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))  # all-reduces across replicas
        return stats

    @tf.function
    def train_steps(iterator, steps):
        totals = tf.zeros([3])
        for _ in tf.range(steps):
            per_replica = strategy.run(step, args=next(iterator))
            totals += tf.add_n(strategy.experimental_local_results(per_replica))
        return totals

    return train_steps


class SyncEpochs:
    """Synchronous strategies: every worker process makes each call itself. Gradients are all-reduced
    inside every step; the loss and accuracy sums only when asked for (checkpoints, epoch end)."""

    first_step_at = None  # time.time() when the first call returned

    def __init__(self, strategy, train_steps, dataset, optimizer, per_call: int, progress: bool):
        self.strategy, self.train_steps, self.iterator = strategy, train_steps, iter(dataset)
        self.optimizer, self.per_call, self.progress = optimizer, per_call, progress

    def begin(self, steps: int, done: int, carried: list) -> None:
        """An epoch of `steps` steps, `done` of them already (resumed), whose sums so far are `carried`."""
        self.local, self.carried, self.done = tf.zeros([3]), np.array(carried, np.float32), done
        self.bar = keras.utils.Progbar(steps, stateful_metrics=["loss", "accuracy"]) if self.progress else None
        if self.bar and done:
            self.bar.update(done)

    def run(self, calls: list, on_nan=None, stop=None) -> int:
        """The calls, or those before stop() says to stop; the steps they ran. on_nan(step) as soon as
        this worker's loss is no number (the workers share their weights, so they diverge together)."""
        ran = 0
        for steps in calls:
            self.local += self.train_steps(self.iterator, tf.constant(steps))
            self.done, ran = self.done + steps, ran + steps
            self.first_step_at = self.first_step_at or time.time()
            if on_nan and not np.isfinite(self.local[0].numpy()):
                on_nan(self.done)
            if self.bar and self.done < self.bar.target:  # this worker's running values
                self.bar.update(self.done, bar_values(self.local + self.carried), finalize=False)
            if stop and stop():
                break
        return ran

    def totals(self) -> list:
        """[loss sum, correct, examples] of the epoch so far over every worker (all of them must ask)."""
        return (across_workers(self.strategy, self.local).numpy() + self.carried).tolist()

    def end(self) -> list:
        totals = self.totals()
        if self.bar:  # the last update shows the whole cluster's values
            self.bar.update(self.done, bar_values(totals), finalize=True)
        return totals

    def epoch_line(self, steps: int) -> str:
        return f"{steps} steps"

    def scalars(self) -> dict:
        """The epoch's scalars for TensorBoard beyond loss, accuracy and speed."""
        return {"epoch_learning_rate": learning_rate(self.optimizer)}

    def finish(self, model, rebuild) -> tuple:
        """The trained model and its optimizer, to evaluate and save in this process: these."""
        return model, self.optimizer

    def describe(self, batch_size: int) -> dict:
        replicas = self.strategy.num_replicas_in_sync
        return {"num_replicas": replicas, "num_workers": cluster_size(self.strategy)[0], "num_ps": 0,
                "devices": replica_devices(self.strategy), "per_replica_batch_size": batch_size // replicas,
                "steps_per_execution": self.per_call, "global_steps": int(self.optimizer.iterations.numpy()),
                "seconds_to_first_step": seconds_since_start(self.first_step_at)}


def learning_rate(optimizer) -> float:
    """The optimizer's learning rate now (a schedule's at this step)."""
    rate = optimizer.learning_rate
    return float(keras.backend.get_value(rate(optimizer.iterations) if callable(rate) else rate))


def bar_values(totals) -> list:
    return [("loss", totals[0] / totals[2]), ("accuracy", totals[1] / totals[2])]


def across_workers(strategy, local):
    """The sum of every worker's `local` (one all-reduce); a single process already holds it all."""
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return local
    share = local / len(strategy.extended.worker_devices)  # each of this worker's replicas holds a share
    return strategy.reduce("SUM", strategy.experimental_distribute_values_from_function(lambda _: share),
                           axis=None)


class AsyncEpochs:
    """Parameter servers: this process is the coordinator. It schedules the calls on whichever worker
    is free and waits for them all, counting each worker's steps. A worker that dies loses nothing:
    its calls run again on the others."""
    progress = False
    first_step_at = None  # time.time() when the first call returned

    def __init__(self, strategy, train_steps, dataset_fn, model, optimizer, steps: int, steps_per_execution: int):
        self.strategy = strategy
        workers, ps = cluster_size(strategy)
        print(placement_table(model.variables + optimizer.variables, ps), flush=True)
        # An epoch ends at a join(): with too few functions per epoch, workers idle while the last ones
        # finish. Keep at least 4 per worker.
        self.per_call = max(1, min(steps_per_execution, steps // (4 * workers)))
        self.coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
        # Kept for the run: a worker builds its dataset later, and again after a restart, from files
        # that dataset_fn may own (data.TemporaryIdx).
        self.dataset_fn = dataset_fn
        self.iterator = iter(self.coordinator.create_per_worker_dataset(dataset_fn))
        self.optimizer = optimizer
        self.worker_steps = [0] * workers
        self.logged_steps = [0] * workers  # as the last epoch's scalars counted them
        print(f"coordinator up: {workers} worker(s)", flush=True)
        # TensorFlow waits without end for a call on a hung worker or ps task (it retries only on
        # tasks that fail), and so does a checkpoint, which registers a function on every task: the
        # launcher watches this heartbeat instead.
        self.heartbeat = Heartbeat()

        @tf.function
        def scheduled(iterator, steps):
            return tf.distribute.coordinator.experimental_get_current_worker_index(), train_steps(iterator, steps)
        self.scheduled = scheduled

    def begin(self, steps: int, done: int, carried: list) -> None:
        self.sums, self.done = np.array(carried, np.float64), done

    def run(self, calls: list, on_nan=None, stop=None) -> int:
        """The calls, scheduled at once and joined (so all of them run); on_nan(step) if the loss is
        then no number. Returns the steps run."""
        remote = [(steps, self.coordinator.schedule(self.scheduled, args=(self.iterator, tf.constant(steps))))
                  for steps in calls]
        for steps, value in remote:
            try:
                worker, worker_totals = value.fetch()  # once the call has run, on whichever worker took it
            except tf.errors.UnavailableError:  # it ran, but its worker died before its sums were copied here
                continue  # (a failed ps or call is raised again by join() below)
            finally:
                self.heartbeat.pet()
            self.first_step_at = self.first_step_at or time.time()
            self.worker_steps[int(worker)] += steps
            self.sums += worker_totals
        self.coordinator.join()
        self.done += sum(calls)
        if on_nan and not np.isfinite(self.sums[0]):
            on_nan(self.done)
        return sum(calls)

    def totals(self) -> list:
        return self.sums.tolist()

    end = totals

    def epoch_line(self, steps: int) -> str:
        per_worker = ", ".join(f"worker {i}: {n}" for i, n in enumerate(self.worker_steps))
        return f"global step {int(self.optimizer.iterations.numpy())} ({per_worker})"

    def scalars(self) -> dict:
        """The learning rate, and the steps each worker ran this epoch (asynchronous: a slow or lost
        worker runs fewer)."""
        ran = {f"epoch_steps_worker_{i}": n - before for i, (n, before) in
               enumerate(zip(self.worker_steps, self.logged_steps))}
        self.logged_steps = list(self.worker_steps)
        return {"epoch_learning_rate": learning_rate(self.optimizer), **ran}

    def finish(self, model, rebuild) -> tuple:
        """A copy of the trained model and a fresh optimizer here on the coordinator (rebuild() makes
        them), to evaluate and save: the trained variables live on the ps tasks."""
        self.heartbeat.stop()
        local, optimizer = rebuild()
        local.set_weights(model.get_weights())
        return local, optimizer

    def describe(self, batch_size: int) -> dict:
        workers, ps = cluster_size(self.strategy)
        replicas = self.strategy.num_replicas_in_sync  # per worker
        return {"num_replicas": replicas * workers, "num_workers": workers, "num_ps": ps,
                "devices": replica_devices(self.strategy), "per_replica_batch_size": batch_size // replicas,
                "steps_per_execution": self.per_call, "global_steps": int(self.optimizer.iterations.numpy()),
                "seconds_to_first_step": seconds_since_start(self.first_step_at),
                "worker_steps": {str(i): n for i, n in enumerate(self.worker_steps)}}


def distributed_train_dataset(strategy, images, labels, cfg, skip: int = 0):
    """Every input pipeline (one per worker) builds the same shuffled global batches and keeps the
    slice for its own replicas, one per-replica batch per element: the global batch is exactly the
    one a single device would take. Every step is a full global batch (the remainder is dropped).
    `skip` global batches are passed over (a resumed run)."""
    t = cfg.trainer

    def dataset_fn(context):
        replicas_here = context.num_replicas_in_sync // context.num_input_pipelines
        ds = data_lib.make_dataset(images, labels, t.batch_size, seed=t.seed, drop_remainder=True, repeat=True,
                                   shuffle_buffer=cfg.data.shuffle_buffer, skip=skip,
                                   part=(context.input_pipeline_id, context.num_input_pipelines))
        return ds.rebatch(context.get_per_replica_batch_size(t.batch_size)) if replicas_here > 1 else ds

    return strategy.distribute_datasets_from_function(dataset_fn)


def per_worker_dataset(strategy, images, labels, cfg):
    """Parameter servers: each worker reads its own shard of the training set, shuffled and repeated."""
    workers, _ = cluster_size(strategy)
    source = cfg.data
    if source.source != "idx" and data_lib.on_this_machine(cluster_spec(strategy)):
        source = data_lib.TemporaryIdx(images, labels)  # a local cluster: its workers read the same disk
    expect = data_lib.train_file_hashes(source)  # of the coordinator's copy of the files, for the workers'
    return lambda: strategy.distribute_datasets_from_function(
        worker_dataset_fn(images, labels, cfg, workers, source, expect))


def worker_dataset_fn(images, labels, cfg, workers: int, source=None, expect=None):
    """The dataset function each worker runs. Data in IDX files (`source`, else cfg.data, with
    source=idx) is read by the worker itself, and checked against `expect`; other data goes to the
    workers inside this function, through the coordinator."""
    t = cfg.trainer

    def dataset_fn(context):
        worker = tf.distribute.coordinator.experimental_get_current_worker_index()
        on_worker = data_lib.read_train_files(source or cfg.data, (images, labels), expect)  # ops run on the worker
        return data_lib.make_dataset(*(on_worker or (images, labels)), context.get_per_replica_batch_size(t.batch_size),
                                     seed=t.seed, shuffle_buffer=cfg.data.shuffle_buffer, repeat=True,
                                     shard=(workers, worker), n=len(labels))

    return dataset_fn


def placement_table(variables, num_ps: int) -> str:
    """Which ps task holds each variable (shards listed one by one): what replica_device_setter did."""
    lines = [f"variable placement over {num_ps} ps task(s):"]
    for variable in variables:
        for shard in getattr(variable, "variables", [variable]):  # a ShardedVariable lists its shards
            spec = tf.DeviceSpec.from_string(shard.device)
            lines.append(f"  {shard.name:<40} {str(tuple(shard.shape)):<16} {spec.job}:{spec.task}")
    return "\n".join(lines)


def evaluate_checkpoints(cfg, run_dir: Path) -> dict:
    """The evaluator task: evaluate each checkpoint the chief writes, until the last epoch's."""
    t = cfg.trainer
    set_precision(t)
    (x_train, y_train), (x_test, y_test) = data_lib.load(cfg.data, t.seed)
    test_ds = data_lib.make_dataset(x_test, y_test, t.batch_size, seed=t.seed)
    classes = data_lib.num_classes(cfg.data, (y_train, y_test))
    model = build_model(cfg.model, x_train.shape[1:], classes)
    compile_model(model, make_optimizer(cfg.optimizer, t.learning_rate), t, check_model(model, x_train, classes))
    directory = checkpoint_dir(cfg, run_dir)
    print(f"evaluator: waiting for checkpoints in {directory}", flush=True)
    evaluations = []
    for path in tf.train.checkpoints_iterator(str(directory)):  # each newest checkpoint, once
        try:
            tf.train.Checkpoint(model=model).restore(path).expect_partial()
        except tf.errors.NotFoundError:  # pruned before we got to it
            continue
        except (tf.errors.OpError, ValueError) as exc:  # cut short (a full disk): the next one will do
            print(f"evaluator: skipped {Path(path).name}, which cannot be read ({type(exc).__name__})", flush=True)
            continue
        position = read_position(path)
        if position is None:  # pruned before we got to it
            continue
        loss, accuracy = model.evaluate(test_ds, verbose=0)
        epoch, step = position.epoch, position.step  # epochs finished, steps into the next
        evaluations.append({"checkpoint": Path(path).name, "epoch": epoch, "step": step, "loss": loss,
                            "accuracy": accuracy})
        where = f"epoch {epoch}" + (f" + {step} steps" if step else "")
        print(f"evaluator: {where} ({Path(path).name}): test loss {loss:.4f}, accuracy {accuracy:.4f}", flush=True)
        if epoch >= t.epochs:
            break
    return {"checkpoint_dir": str(directory), "evaluations": evaluations}
