"""The training loop, as wiring: the task set up (setup.py), its runner, the epochs, evaluation, saved
artefacts. The pieces live in their own modules: input_data.py (the data a task trains on, and its
readers), runners.py (the steps and how they are called), checkpoints.py, model.py, and report/results.py."""
import shutil
import tempfile
import time
from pathlib import Path

import tensorflow as tf
import tf_keras as keras
from omegaconf import OmegaConf

from distrain.common import private, storage
from distrain.common.errors import ConfigError, Diverged, first_line
from distrain.common.lifetime import scratch
from distrain.common.rundir import CLASS_NAMES, RunDir
from distrain.config import schema
from distrain.config.validate import instantiate_as
from distrain.data import arrays
from distrain.report import results
from distrain.report.timesplit import PARTS, probe_seconds, read_alone
from distrain.task import data_service
from distrain.task.checkpoints import Checkpoints, Progress, joined, resized_line, resume, segments
from distrain.task.context import RunContext
from distrain.task.input_data import TrainingData, load_data
from distrain.task.metrics import Tally, check_loss, check_metrics_read_the_outputs, make_loss, make_metrics
from distrain.task.model import compile_model, rebuilt_from_config
from distrain.task.optimizer import plain_keras
from distrain.task.preemption import Preempted, Preemption
from distrain.task.profiling import Profile
from distrain.task.runners import KEPT, AsyncEpochs, SyncEpochs, make_train_steps, whole_weights
from distrain.task.setup import build, onednn_on, set_up, strategy_of
from distrain.task.strategy import gpu_peak_mib
from distrain.task.worker_idx import train_file_hashes


def train(cfg, run_dir, strategy=None, context: RunContext | None = None):
    """Train as the config says; returns (results dict, model). The chief saves into run_dir. context:
    this task's place in the run, as task.main builds it; None: this process alone.

    One loop for every strategy: an epoch is a series of calls to a tf.function of a few training steps,
    which synchronous strategies call in every worker alike (gradients all-reduced inside the step), and
    a parameter-server coordinator schedules on whichever worker is free. The runner is what differs."""
    strategy = strategy or strategy_of(cfg)
    context = context or RunContext.of(RunDir(run_dir, cfg), cfg).know_strategy(strategy)
    t, chief, run = cfg.trainer, context.chief, context.run
    data, model, optimizer, probabilities, policy, lines = set_up(cfg, context, strategy, load_data,
                                                                  announce=bool(t.verbose) and chief)
    if t.verbose and chief:
        print("\n".join(lines), flush=True)
    # Every worker of a synchronous cluster must checkpoint (saving reads replicated variables together),
    # but only the chief's checkpoints are kept.
    out = run if chief else RunDir(tempfile.mkdtemp(prefix="distrain-worker-", dir=scratch()), {"trainer": {}})
    saves = Checkpoints(model, optimizer, out.checkpoints, t.keep_checkpoints) if t.save_model else None
    progress = resume(saves or Checkpoints(model, optimizer, out.path), run.checkpoints, data.steps, t.epochs) \
        if t.resume else Progress()  # every task reads the chief's checkpoints
    before = joined(progress, context.topology.workers, context.replicas, progress.resumed_from_step or 0)
    if before and chief:
        print(resized_line(before, progress, schema.update_batch(t), data.streamed,
                           context.topology.parameter_servers), flush=True)
    # Resumed, the data goes on from the batch after the last one trained: the batches an uninterrupted
    # run would have seen. Files, at another size: their shares change, so they are read afresh.
    skip = 0 if before and data.streamed else (progress.epoch * data.steps + progress.step) * t.accumulate_steps
    where = run.tensorboard / (context.task.name if context.task else "train")
    workers = context.cluster.get("worker", []) if context.topology.parameter_servers else []
    profile = Profile(t.get("profile"), where, t.epochs * data.steps, workers)  # (checked before anything trains)
    runner = make_runner(strategy, context, cfg, data, model, optimizer, probabilities, skip)
    KEPT.append(runner)  # (never deleted: runners.KEPT)
    callbacks = make_callbacks(cfg, model, data.steps, announce=bool(t.verbose) and chief)
    compiled = bool(t.validate_every or cfg.get("callbacks"))
    if compiled:  # evaluate() during training, and callbacks' model.optimizer
        compile_model(model, optimizer, cfg, probabilities)
    rebuild = lambda: build(cfg, data, policy)[:2]
    validate = make_validate(cfg, data, model, context.topology, rebuild, probabilities)
    run_epochs(runner, progress, t, data.steps, saves, out.tensorboard if t.tensorboard is True else None,
               validate, callbacks, profile, epoch_file(cfg, run, data.steps) if chief else None)
    model, test, facts = finish(cfg, context, data, runner, model, rebuild, probabilities, compiled, progress)
    if not chief:
        shutil.rmtree(out.path, ignore_errors=True)
    return results.results(cfg, data, progress, test, facts | about(model, probabilities, policy)), model


def finish(cfg, context: RunContext, data, runner, model, rebuild, probabilities: bool, compiled: bool,
           progress: Progress) -> tuple:
    """After the epochs: (the trained model, its test figures, the facts of the run for results.json).
    The input pipeline read alone for a moment (1% of the training time) on the chief, the test split
    evaluated, and the SavedModel written by the chief."""
    t, chief = cfg.trainer, context.chief
    timed = chief and t.time_split
    # (through the data service, a job of its own: what it delivers)
    rate, cpu_per_example = read_alone(served(data.reader(cfg), cfg, context, -1, 1, say=False)(),
                                       probe_seconds(sum(progress.epoch_seconds))) if timed else (None, None)
    trained, optimizer = runner.finish(model, rebuild)
    if trained is not model or not compiled:  # (else compiled so already: its test function traced once)
        compile_model(trained, optimizer, cfg, probabilities)  # for evaluate()
    test = keras_evaluate(trained, data.reader(cfg, training=False)(), data.test_steps(t.batch_size))
    saved = runner.to_save(trained, optimizer, rebuild, chief) if t.save_model else None
    if saved:
        compile_model(*saved, cfg, probabilities, plain=True)  # loads without distrain, and trains on
        save_model(saved[0], context.run.saved_model, data.class_names, include_optimizer=plain_keras(saved[1]),
                   pixels=data.shape if data.pixels else None)
    facts = runner.describe(t.batch_size) | {"input_examples_per_sec": rate, "input_cpu_per_example": cpu_per_example}
    if where := data_service.address(cfg.data):  # (its examples/s: input_examples_per_sec, read through it)
        facts["data_service"] = {**OmegaConf.to_container(cfg.data.service), "address": where}
    return trained, test, facts


def about(model, probabilities: bool, policy: str) -> dict:
    """The model's size and outputs, and what it computed with (results.json)."""
    return {"model_params": model.count_params(), "model_outputs": "probabilities" if probabilities else "logits",
            "precision_policy": policy, "onednn": onednn_on(), "tensorflow_version": tf.__version__,
            **({"gpu_peak_mib": gpus} if (gpus := gpu_peak_mib()) else {})}  # (the chief's own GPUs)


def make_runner(strategy, context: RunContext, cfg, data: TrainingData, model, optimizer, probabilities: bool,
                skip: int = 0):
    """The epochs' runner for this strategy: AsyncEpochs (parameter servers) or SyncEpochs (the others),
    with the loss (from probabilities where the model ends with a softmax) and the metrics they sum.
    skip: the global batches the synchronous input passes over (a resumed run's)."""
    t = cfg.trainer
    loss = make_loss(cfg.loss, probabilities)
    outputs = model(data.sample, training=False)
    if t.verbose and context.chief and data.labels != "classes" and outputs.dtype.size < 4:
        print(f"warning: model {model.name} outputs {outputs.dtype.name} "
              f"({keras.mixed_precision.global_policy().name}), and Keras's evaluate rounds float labels to the "
              "outputs' type: give its last layer dtype='float32' (as Keras's mixed-precision guide says), or set "
              "trainer.mixed_precision=false", flush=True)
    outputs = tf.cast(outputs, tf.float32)
    guessed = "" if schema.labels_read(cfg.loss, cfg.data) else data.labels
    check_loss(loss, data.sample_labels, outputs, schema.label(cfg.loss), guessed)
    check_metrics_read_the_outputs(cfg.get("metrics"), probabilities)
    tally = Tally(make_metrics(cfg.get("metrics")), data.sample_labels, outputs)  # (local variables: results)
    train_steps = make_train_steps(strategy, model, optimizer, t.jit_compile, loss, tally, t.time_split,
                                   t.accumulate_steps, t.batch_size)
    topology = context.topology
    if topology.parameter_servers:
        runner = AsyncEpochs(strategy, train_steps, per_worker_dataset(strategy, context, data, cfg, skip), model,
                             optimizer,
                             tally, data.steps, t.steps_per_execution, topology.workers, topology.ps)
    else:
        train = served(data.reader(cfg, skip=skip), cfg, context, skip, topology.workers)
        said = train.sharding_line(topology.workers) if topology.workers > 1 and context.chief else ""
        if said:
            print(said, flush=True)
        runner = SyncEpochs(strategy, train_steps, strategy.distribute_datasets_from_function(train), optimizer,
                            tally, t.steps_per_execution, progress=t.verbose == 1, workers=topology.workers)
    if t.verbose:
        print(f"{data.steps} steps per epoch, up to {runner.per_call} per tf.function call", flush=True)
    return runner


def served(reader, cfg, context: RunContext, skip: int, pipelines: int, say: bool = True):
    """The training reader, through the tf.data service where the run has one (data.service: each of
    `pipelines` input pipelines reads its batches from the data workers), said once by the chief."""
    where = data_service.address(cfg.data)
    if not where:
        return reader
    if say and context.chief and cfg.trainer.verbose:
        s = cfg.data.service
        print(f"input: the tf.data service at {where}{f' ({s.workers} data worker(s))' if s.workers else ''}, "
              f"sharding {s.sharding}: " + ("each example at most once a pass across the trainers" if
                                             s.sharding == "dynamic" else "each trainer reads every example a pass"),
              flush=True)
    return reader.serve(where, context.run, skip, pipelines)


def per_worker_dataset(strategy, context: RunContext, data: TrainingData, cfg, skip: int = 0):
    """Parameter servers: each worker reads its own shard of the training set, shuffled and repeated,
    from files where the data is in files (on a local cluster, other data is written to files once); or
    its batches from the tf.data service (data.service)."""
    if data_service.address(cfg.data):
        train = served(data.reader(cfg, topology=context.topology), cfg, context, skip, 0)
        return lambda: strategy.distribute_datasets_from_function(train)
    if data.streamed:  # each worker streams its own files, on its own machine
        train = data.reader(cfg, topology=context.topology)
        print(train.sharding_line(context.topology.workers), flush=True)
        return lambda: strategy.distribute_datasets_from_function(train)
    source = cfg.data
    if source.source != "idx" and context.topology.local:
        source = arrays.TemporaryIdx(data.x_train, data.y_train)  # a local cluster: its workers read the same disk
    train = data.reader(cfg, topology=context.topology, idx_files=source,
                   expect=train_file_hashes(source))  # of the coordinator's copy, for the workers'
    return lambda: strategy.distribute_datasets_from_function(train)


def save_model(model, path: Path, class_names=None, include_optimizer: bool = True, pixels=None) -> None:
    """The trained model as a SavedModel, with class_names.txt beside it where the data names its classes
    (an image folder's), one per line in the order of the outputs. One that cannot be saved so (some
    subclassed models) is a warning: the run's training is done, and its checkpoints hold the weights.
    include_optimizer: false where the optimizer needs distrain to load (a warm-up or scaled rate).
    A model plain Keras rebuilds from its config is saved without a traced function per layer (0.2 s
    of CPU less, measured), with the serving signature Keras would give it. pixels: the shape of one
    image, where the run read uint8 images: its serving signature takes them as they are (serving_signatures)."""
    try:
        rebuilt = rebuilt_from_config(model)
        keras_own = private.get("default_save_signature")(model) if rebuilt else None
        signatures = serving_signatures(model, pixels, keras_own, class_names) if pixels else keras_own
        if rebuilt:
            model.save(str(path), include_optimizer=include_optimizer, save_traces=False, signatures=signatures)
        else:
            model.save(str(path), include_optimizer=include_optimizer, signatures=signatures)
        if class_names:
            storage.write_atomic(path / CLASS_NAMES, "\n".join(class_names) + "\n")
    except Exception as exc:  # noqa: BLE001 - whatever Keras cannot serialise
        print(f"warning: the model could not be saved as a SavedModel in {path} ({type(exc).__name__}: "
              f"{first_line(str(exc))}); its checkpoints hold the trained weights",
              flush=True)


def serving_signatures(model, shape, keras_own=None, class_names=None) -> dict:
    """A SavedModel's signatures for a model of images of `shape`: `serving_default` takes uint8 pixels as
    the data gave them, with or without a channel axis of 1 (any rank: reshaped to one image's shape),
    scales them as training did (/ 255) and gives the model's outputs under its output's name, and `class`
    (the name of the highest output) where the data named its classes; `serving_float` takes what the
    model takes (Keras's own signature, where it gives one: a model plain Keras rebuilds from its config)."""
    name = model.inputs[0].name.split(":")[0] if model.inputs else "images"  # (a subclassed model has none)
    names = tf.constant([str(n) for n in class_names]) if class_names else None
    output = model.output_names[0] if len(getattr(model, "output_names", None) or []) == 1 else "outputs"

    @tf.function(input_signature=[tf.TensorSpec(None, tf.uint8, name=name)])
    def pixels(images):
        outputs = model(tf.reshape(tf.cast(images, tf.float32) / 255.0, [-1, *shape]), training=False)
        if not isinstance(outputs, tf.Tensor):  # (several outputs: as the model gives them)
            return {f"{output}_{i}": o for i, o in enumerate(tf.nest.flatten(outputs))}
        found = {output: outputs}
        if names is not None:
            found["class"] = tf.gather(names, tf.argmax(outputs, axis=-1))
        return found

    return {"serving_default": pixels, **({"serving_float": keras_own} if keras_own is not None else {})}


def make_callbacks(cfg, model, steps: int, announce: bool) -> keras.callbacks.CallbackList:
    """The config's callbacks node as Keras's CallbackList, set to the model, each callback Watched;
    per-batch hooks, which the training loop does not call, are said in one line each."""
    watched = []
    for name, entry in (cfg.get("callbacks") or {}).items():
        callback = instantiate_as(f"callbacks.{name}._target_", entry, keras.callbacks.Callback, "it must name a "
                                  "tf_keras callback class taking the entry's other keys", "a tf_keras callback: name "
                                  "a tf_keras.callbacks class (import tf_keras, not keras 3)")
        if announce and _batch_hooks(callback):
            print(f"warning: callbacks.{name} ({type(callback).__name__}) has per-batch hooks, which distrain does not "
                  "call: it runs at epoch ends only", flush=True)
        watched.append(Watched(str(name), callback))
    return keras.callbacks.CallbackList(watched, model=model, epochs=cfg.trainer.epochs, steps=steps,
                                        verbose=cfg.trainer.verbose)


class Watched(keras.callbacks.Callback):
    """A callback of the config as the epoch loop calls it: at the epochs whose logs hold what it
    monitors (one watching validation acts at the epochs that validate); `stopped` says why, where it
    set model.stop_training."""

    def __init__(self, name: str, callback):
        super().__init__()
        self.name, self.callback, self.stopped = name, callback, ""

    def set_model(self, model):
        super().set_model(model)
        self.callback.set_model(model)

    def set_params(self, params):
        super().set_params(params)
        self.callback.set_params(params)

    def on_train_begin(self, logs=None):
        self.callback.on_train_begin(logs)

    def on_epoch_end(self, epoch, logs=None):
        monitor = str(getattr(self.callback, "monitor", ""))
        if monitor.startswith("val_") and monitor not in logs:
            return
        going = not self.model.stop_training
        self.callback.on_epoch_end(epoch, dict(logs))
        if going and self.model.stop_training:
            self.stopped = f"callbacks.{self.name} ({type(self.callback).__name__}) stopped training after " \
                f"epoch {epoch + 1}"

    def on_train_end(self, logs=None):
        self.callback.on_train_end(logs)


def _batch_hooks(callback) -> bool:
    """Whether a callback overrides Keras's per-batch training hooks (the loop calls epoch hooks only)."""
    base = keras.callbacks.Callback
    return any(getattr(type(callback), hook) is not getattr(base, hook)
               for hook in ("on_batch_begin", "on_batch_end", "on_train_batch_begin", "on_train_batch_end"))


def keras_evaluate(model, dataset, steps) -> dict:
    """Keras's evaluate(): {loss, each metric}. A loss or metric that fails there (only evaluate traces
    it with Keras's casts and cross-replica reads) is one line, not a traceback and a restart."""
    try:
        return model.evaluate(dataset, steps=steps, verbose=0, return_dict=True)
    except (ValueError, TypeError, NotImplementedError) as exc:  # (a peer lost is a tf.errors.OpError)
        said = ([line.strip() for line in str(exc).splitlines() if line.strip()] or [""])[-1][:300]
        said = said if said.startswith(type(exc).__name__) else f"{type(exc).__name__}: {said}"
        raise ConfigError(f"evaluating the model with the config's loss and metrics failed ({said}): check that "
                          "loss and metrics fit the model's outputs and labels, or remove the metric that fails "
                          "(~metrics.NAME); under mixed precision try trainer.mixed_precision=false") from None


def make_validate(cfg, data, model, topology, rebuild, probabilities: bool):
    """A function giving the test data's {loss, each metric} with the weights trained so far, for
    trainer.validate_every; None without. Parameter servers: on a copy here (the model lives on the
    ps tasks); else every worker evaluates its share, as Keras's evaluate() does."""
    if not cfg.trainer.validate_every:
        return None
    test = data.reader(cfg, training=False, validation=True)()
    steps = data.test_steps(cfg.trainer.batch_size)
    if topology.synchronous:
        return lambda: keras_evaluate(model, test, steps)
    local, optimizer = rebuild()
    compile_model(local, optimizer, cfg, probabilities)

    def on_a_copy():
        local.set_weights(whole_weights(model))
        return keras_evaluate(local, test, steps)
    return on_a_copy


def epoch_file(cfg, run: RunDir, steps: int):
    """metrics.csv's writer, called with the progress at each epoch's end, where a logger reads it (csv;
    mlflow, whose tracker logs its rows), else None."""
    t = cfg.trainer
    if not {"csv", "mlflow"} & set(cfg.get("logger") or {}):
        return None
    def write(path: Path, progress: Progress) -> None:
        run.write_metrics(results.epoch_rows(progress.history, progress.epoch_seconds, steps * schema.update_batch(t),
                                            t.epochs, t.validate_every))
    return lambda progress: storage.record(write, run.metrics, progress)  # (a full disk: said, not raised)


def run_epochs(runner, progress: Progress, t, steps: int, saves, log_dir: Path | None, validate=None,
               callbacks: keras.callbacks.CallbackList | None = None, profile: Profile | None = None,
               rows=None) -> None:
    """Train from where `progress` stands to the last epoch, keeping it up to date; checkpoints at
    every epoch end and every t.checkpoint_every_steps global steps; TensorBoard logs in log_dir
    (train/, and validation/ for validate()'s). validate(): every t.validate_every epochs and after the
    last. callbacks (make_callbacks): called at each epoch's end with its logs (every worker of a
    synchronous cluster has the same), before its checkpoint; one that sets model.stop_training ends
    the training there. rows(progress): metrics.csv's rows (epoch_file), after each epoch's checkpoint."""
    history, callbacks = progress.history, callbacks or keras.callbacks.CallbackList([])
    profile = profile or Profile(None, Path(), 0)
    board = Scalars(log_dir, validate is not None) if log_dir else None
    if callbacks.model is not None:
        callbacks.model.stop_training = False
    callbacks.on_train_begin()
    for epoch in range(progress.epoch, t.epochs):
        if runner.progress:
            print(f"Epoch {epoch + 1}/{t.epochs}", flush=True)
        train_epoch(runner, progress, t, steps, epoch, saves, profile)
        totals, split = runner.end(progress.epoch_seconds[-1])
        split = split if t.time_split else {}
        logs = dict(runner.tally.values(totals))
        if validate and ((epoch + 1) % t.validate_every == 0 or epoch + 1 == t.epochs):
            logs |= {f"val_{name}": value for name, value in validate().items()}
        for name, value in logs.items():
            history.setdefault(name, []).append(value)
        for part in PARTS if split else ():  # (not in the callbacks' logs: no metric of the model)
            history.setdefault(f"time_{part}", []).append(split[part])
        if split.get("steps_seconds"):  # (the steps' own seconds: their rate, which the bound weighs)
            history.setdefault("time_steps_seconds", []).append(round(split["steps_seconds"], 4))
        runner.show(logs)
        progress.epoch, progress.step, progress.totals, progress.seconds = epoch + 1, 0, [0.0] * len(totals), 0.0
        if t.verbose and not runner.progress:
            values = " - ".join(f"{name}: {value:.4f}" for name, value in logs.items())
            print(f"Epoch {epoch + 1}/{t.epochs} - {runner.epoch_line(steps)} - {progress.epoch_seconds[-1]:.1f}s - "
                  f"{values}", flush=True)
        callbacks.on_epoch_end(epoch, logs)  # (before the checkpoint: a learning rate it changes is kept)
        progress.stopped_early = progress.stopped_early or next((c.stopped for c in callbacks if c.stopped), "")
        if saves:
            saves.save(progress, (epoch + 1) * steps)
        if rows:  # (after its checkpoint: a restarted run has every epoch of its rows)
            rows(progress)
        # An Optuna trial's pruner judges the row: every training task waits, and stops here if pruned.
        if epoch + 1 < t.epochs and (Preemption.await_verdict(progress.epoch) or Preemption.requested):
            raise Preempted((epoch + 1) * steps)
        if board:
            board.write(epoch, logs, {"epoch_examples_per_sec": steps * schema.update_batch(t) /
                                      progress.epoch_seconds[-1]}
                        | {f"epoch_time_{part}": split[part] for part in PARTS if split} | runner.scalars()
                        | ({"epoch_workers": progress.membership[-1]["workers"]} if progress.membership else {}))
        if progress.stopped_early:
            if t.verbose:
                print(progress.stopped_early, flush=True)
            break
    callbacks.on_train_end()
    if board:
        board.close()


def train_epoch(runner, progress: Progress, t, steps: int, epoch: int, saves, profile: Profile) -> None:
    """The steps of one epoch from progress.step on, checkpointing within it where due (or preempted),
    tracing the steps of trainer.profile."""
    def diverged(step: int):  # before any checkpoint of the diverged weights
        raise Diverged(f"the training loss became NaN or infinite in epoch {epoch + 1}, step {step} (global step "
                       f"{epoch * steps + step}): lower trainer.learning_rate (now {t.learning_rate}), or with "
                       "trainer.mixed_precision use float32; the checkpoints written before it are kept")

    start, started_cpu, every = time.perf_counter(), time.process_time(), t.checkpoint_every_steps
    runner.begin(steps, progress.step, progress.totals or [0.0] * runner.tally.size)
    runner.step_base = epoch * steps  # (its position: the global step)
    for calls in segments(progress.step, steps, runner.per_call, every, epoch * steps, profile.marks):
        profile.before(epoch * steps + progress.step)
        progress.step += runner.run(calls, on_nan=diverged if t.stop_on_nan else None, stop=Preemption.due)
        profile.after(epoch * steps + progress.step)
        due = every and (epoch * steps + progress.step) % every == 0
        if saves and progress.step < steps and (due or Preemption.requested):  # a checkpoint within the epoch
            progress.totals = runner.totals()
            progress.seconds += time.perf_counter() - start
            start = time.perf_counter()
            saves.save(progress, epoch * steps + progress.step)
        if Preemption.requested and progress.step < steps:
            raise Preempted(epoch * steps + progress.step, mid_epoch=True)
    progress.epoch_seconds.append(progress.seconds + time.perf_counter() - start)
    progress.epoch_cpu_seconds.append(time.process_time() - started_cpu)


class Scalars:
    """TensorBoard's per-epoch scalars, named as Keras's TensorBoard callback names them: train/ (and
    validation/ where the run validates)."""

    def __init__(self, log_dir: Path, validates: bool):
        self.train = tf.summary.create_file_writer(str(log_dir / "train"))
        self.validation = tf.summary.create_file_writer(str(log_dir / "validation")) if validates else None

    def write(self, epoch: int, logs: dict, more: dict) -> None:
        with self.train.as_default(step=epoch):
            for name, value in logs.items():
                if not name.startswith("val_"):
                    tf.summary.scalar(f"epoch_{name}", value)
            for name, value in more.items():
                tf.summary.scalar(name, value)
        if self.validation and any(name.startswith("val_") for name in logs):
            with self.validation.as_default(step=epoch):
                for name, value in logs.items():
                    if name.startswith("val_"):
                        tf.summary.scalar(f"epoch_{name[4:]}", value)

    def close(self) -> None:
        for writer in (self.train, self.validation):
            if writer:
                writer.close()
