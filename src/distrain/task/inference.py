"""Evaluate and predict on the task side: the run's trained model set up as its training was
(`load_trained`, through setup.py), its outputs computed in this process (`evaluate_here`, `predict_here`)
or scored from a cluster's (`score`); and `compute_parts`, the work of one task of a clustered evaluate or
predict (inference/cluster_parts.py; main.py gives the task its role): a multi_worker_mirrored worker
computes its parts (into job.json's parts_dir); under parameter servers the ps and worker tasks serve
while the chief reads every part and schedules its batches on the workers. Runs in the command's process
(evaluate and predict on one process) or in the cluster's tasks."""
import collections
import sys
import time
from pathlib import Path

import numpy as np
import tensorflow as tf
import tf_keras as keras

from distrain.common import cluster as cluster_lib
from distrain.common.errors import ConfigError, first_line
from distrain.common.messages import say_ready
from distrain.common.rundir import RunDir
from distrain.common.topology import Topology
from distrain.config.validate import importable
from distrain.data import arrays
from distrain.inference import cluster_parts
from distrain.task.context import RunContext
from distrain.task.failures import lost_peer
from distrain.task.input_data import load_test_data
from distrain.task.model import check_model, compile_model
from distrain.task.optimizer import make_optimizer
from distrain.task.setup import Built, onednn_line, set_up, strategy_of
from distrain.task.training import keras_evaluate

AHEAD = 64  # batches scheduled on the workers beyond the one the coordinator waits for


def compute_parts(cfg, context: RunContext, job: dict) -> None:
    """This task's parts of a clustered evaluate or predict (job.json: the run, its parts, where they go):
    a multi_worker_mirrored worker computes its own; under parameter servers the coordinator schedules the
    batches of every part on the workers. A lost peer is raised as PeerLost."""
    spec, task, ps = context.cluster, context.task, context.topology.parameter_servers
    if ps:  # (the coordinator: up once its ps and workers are)
        cluster_lib.wait_for_peers(cluster_lib.peers(spec, task))
    strategy = strategy_of(cfg, context, default=not ps)
    print(onednn_line(), flush=True)
    data, model, _, _ = load_trained(cfg, Path(job["run_dir"]), job, False, strategy, context.run)
    say_ready(task)
    plan = [tuple(p) for p in job["parts"]]
    mine = range(len(plan)) if ps else range(cluster_lib.rank(spec, task), len(plan), context.topology.workers)
    directory = Path(job["parts_dir"])
    todo = cluster_parts.todo(directory, list(mine))
    step = tf.function(lambda x: model(x, training=False), reduce_retracing=True)  # (Keras's predict_step)
    # One dataset for all its parts (its functions traced once), batches within parts (cluster_parts.py)
    ds = data.reader(cfg, training=False, examples=[plan[k] for k in todo])() if todo else []
    batches = scheduled(step, strategy, ds) if ps else ((np.asarray(step(x), np.float32), y.numpy()) for x, y in ds)
    progress = Progress(task.name, len(todo), len(mine))
    try:
        for k, outputs, labels in by_part(batches, todo, plan):
            cluster_parts.write(directory, k, plan[k][0], outputs, labels if job["labels"] else None)
            progress.one_more(len(outputs))
    except tf.errors.OpError as exc:  # (a parameter server lost)
        if (lost := lost_peer(exc, cfg, during="while computing the outputs")) is None:
            raise
        raise lost from exc


def load_trained(cfg, run_dir: Path, options: dict, data_changed: bool, strategy=None, where=None):
    """(The data, the model with the run's trained weights compiled with its loss and metrics, whether it
    outputs probabilities, where the weights came from), set up as a training task is (setup.py) under
    `strategy` (by default the config's, or on a cluster this process's default: inference/cluster_parts.py
    runs the cluster). where: the RunDir whose data.json holds the data files found (by default the
    run's, for its own data)."""
    cfg.trainer.steps_per_epoch = 1  # (nothing trains: the training split's size need not fit the batch)
    strategy = strategy or strategy_of(cfg, default=Topology.of(cfg).clustered)
    arrays.settle_source(cfg)
    # The run's data.json holds its own data files; other data is scanned here (a directory with none).
    where = where or RunDir(run_dir / "evaluations" / "no data.json" if data_changed else run_dir, cfg)
    trained = RunDir(run_dir).read_results() or {}
    if "num_classes" in cfg.data and not cfg.data.num_classes and trained.get("num_classes"):
        cfg.data.num_classes = trained["num_classes"]  # (the model's outputs, whatever labels the test split holds)
    saved = RunDir(run_dir).saved_model
    target = cfg.model.get("_target_")
    # The SavedModel whole where the model's code is not here (and no checkpoint is named).
    loads_whole = bool(target and not importable(target) and options.get("checkpoint") is None and saved.is_dir())

    def read(cfg, context):
        """The test data, checked against the trained model's inputs and classes."""
        data = load_test_data(cfg, context.know_strategy(strategy), RunDir(run_dir).read_class_names())
        if data_changed and getattr(data, "found", None) is not None:  # (files found: how, and their classes)
            print(f"data: {data.found.how}", flush=True)
        check_fits(trained, data)
        return data

    def whole(data, policy) -> Built:
        model = keras.models.load_model(str(saved), compile=False)  # (the model whole, without its code)
        return Built(model, make_optimizer(cfg, data.steps, policy)[0],
                     check_model(model, data.sample, data.classes, data.labels == "classes"), "")

    data, model, optimizer, probabilities, _, _ = set_up(cfg, RunContext.of(where, cfg), strategy, read,
                                                         whole=whole if loads_whole else None)
    said = f"the SavedModel {saved}, whole: no module of model._target_={target} here" if loads_whole else \
        restore(model, run_dir, cfg, options.get("checkpoint"))
    compile_model(model, optimizer, cfg, probabilities)
    return data, model, probabilities, said


def evaluate_here(cfg, data, model) -> dict:
    """The compiled loss and metrics of the test split, computed in this process (Keras's evaluate)."""
    return keras_evaluate(model, data.reader(cfg, training=False)(), data.test_steps(cfg.trainer.batch_size))


def predict_here(cfg, data, model):
    """The model's outputs for every example of the test split, in order, computed in this process."""
    images = data.reader(cfg, training=False)().map(lambda x, y: x)
    return model.predict(images, steps=data.test_steps(cfg.trainer.batch_size),
                         verbose=1 if sys.stdout.isatty() else 0)  # (a progress bar)


def check_fits(trained: dict, data) -> None:
    """The data's examples and classes against the trained model's (its results.json), both said."""
    if trained.get("input_shape") and list(trained["input_shape"]) != list(data.shape):
        raise ConfigError(f"the data's examples are {tuple(data.shape)}, the model takes "
                          f"{tuple(trained['input_shape'])}: name data of the shape it was trained on "
                          "(data.image_size, data.channels)")
    if trained.get("num_classes") and trained["num_classes"] != data.classes:
        raise ConfigError(f"the data has {data.classes} classes, the model {trained['num_classes']}: name data of the "
                          "classes it was trained on (data.num_classes)")


def restore(model, run_dir: Path, cfg, checkpoint: str | None) -> str:
    """The run's trained weights into `model`: its SavedModel's (a finished run), else (or with
    checkpoint=latest|PATH) a checkpoint's; what they were, in words."""
    saved = RunDir(run_dir).saved_model
    if checkpoint is None and saved.is_dir():
        loaded = keras.models.load_model(str(saved), compile=False)
        theirs = loaded.get_weights()
        if [w.shape for w in theirs] == [w.shape for w in model.get_weights()]:
            model.set_weights(theirs)
            return f"the SavedModel {saved}"
    directory = RunDir(run_dir, cfg).checkpoints
    path = tf.train.latest_checkpoint(str(directory)) if checkpoint in (None, "latest") else checkpoint
    if not path or not (Path(path + ".index").exists() or Path(path).with_suffix(".index").exists()):
        raise ConfigError(f"{'checkpoint=' + checkpoint if checkpoint not in (None, 'latest') else directory} holds no "
                          f"checkpoint: name one (checkpoint=PATH, e.g. {directory}/ckpt-N), or a run that saved its "
                          "model (trainer.save_model=true)")
    try:
        tf.train.Checkpoint(model=model).restore(path).expect_partial().assert_existing_objects_matched()
    except (AssertionError, ValueError, tf.errors.OpError) as exc:
        raise ConfigError(f"checkpoint {path} does not fit the model of the run's config "
                          f"({first_line(str(exc))}): name a checkpoint of this run") from None
    return f"checkpoint {path}"


def score(model, outputs, labels, batch_size: int) -> dict:
    """The model's compiled loss and metrics of these outputs and labels, batch by batch as evaluate()
    takes them (its test_step: compute_loss, then compute_metrics)."""
    model.reset_metrics()
    figures = {}
    for i in range(0, len(outputs), batch_size):
        y, y_pred = tf.constant(labels[i:i + batch_size]), tf.constant(outputs[i:i + batch_size])
        model.compute_loss(y=y, y_pred=y_pred)
        figures = model.compute_metrics(None, y, y_pred, None)
    return {k: np.asarray(v) for k, v in figures.items()}


def by_part(batches, todo: list, plan: list):
    """(k, outputs, labels) of each part k of `todo` in turn, from the (outputs, labels) of its batches."""
    outputs, labels = [], []
    parts_left = iter(todo)
    k = next(parts_left, None)
    for out, y in batches:
        outputs.append(out)
        labels.append(y)
        if sum(map(len, outputs)) == plan[k][1] - plan[k][0]:
            yield k, np.concatenate(outputs), np.concatenate(labels)
            outputs, labels, k = [], [], next(parts_left, None)
    if outputs or k is not None:  # (the reader's promise: the examples of the parts, no more, no fewer)
        raise RuntimeError(f"the parts' examples and the batches read do not match at part {k}: report this")


def scheduled(step, strategy, ds):
    """The (outputs, labels) of each batch in turn, computed by the workers: a function per batch,
    scheduled on whichever worker is free (and run again on another if its worker is lost), fetched in
    order. Up to AHEAD batches are scheduled ahead of the one awaited."""
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    waiting = collections.deque()
    for x, y in ds:
        waiting.append((coordinator.schedule(step, args=(x,)), y.numpy()))
        if len(waiting) > AHEAD:
            yield _fetched(*waiting.popleft())
    while waiting:
        yield _fetched(*waiting.popleft())


def _fetched(remote, labels) -> tuple:
    return np.asarray(remote.fetch(), np.float32), labels


class Progress:
    """A line every few seconds: the parts done of this task's, and its examples/s."""

    def __init__(self, name: str, todo: int, mine: int, every: float = 5.0):
        self.name, self.todo, self.mine, self.every = name, todo, mine, every
        self.done = self.examples = 0
        self.start = self.said = time.monotonic()
        if todo < mine:
            print(f"{name}: {mine - todo} of its {mine} parts were written before it (re)started; "
                  f"it computes the other {todo}", flush=True)

    def one_more(self, examples: int) -> None:
        self.done, self.examples = self.done + 1, self.examples + examples
        now = time.monotonic()
        if now - self.said >= self.every or self.done == self.todo:
            self.said = now
            print(f"{self.name}: {self.done} of {self.todo} parts, {self.examples:,} examples, "
                  f"{self.examples / max(now - self.start, 1e-9):,.0f} examples/s", flush=True)

