"""`distrain evaluate RUN_DIR [overrides]` and `distrain predict RUN_DIR [overrides] out=PATH`: a run's
trained model on the run's test data, or on any data the overrides name, with the run's own loss,
metrics, class names and input pipeline. The run's config.yaml says everything the overrides do not.

They run in this process, under a strategy of one process (default, one_device, mirrored,
central_storage); clusters are not supported yet. The data is the named data's test split, read each
example once and in order: arrays by row, TFRecord shards by file (sorted) then record, an image folder's
test images by path (sorted). evaluate writes evaluations/<name>.json in the run directory, never over the
run's results nor an earlier evaluation; predict writes out=PATH whole or not at all."""
import csv
import io
import json
import sys
import time
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

from . import schema, storage
from .errors import ConfigError, print_error

OPTIONS = ("out", "checkpoint", "name", "overwrite")
FORMATS = (".npz", ".csv", ".tfrecord")
ONE_PROCESS = ("default", "one_device", "mirrored", "central_storage")
USAGE = {"evaluate": "distrain evaluate RUN_DIR [--config-dir DIR] [overrides, e.g. data=...] [checkpoint=latest|PATH] "
                     "[name=NAME]",
         "predict": "distrain predict RUN_DIR [--config-dir DIR] [overrides, e.g. data=...] out=PATH.npz|.csv|.tfrecord "
                    "[checkpoint=latest|PATH] [overwrite=true]"}


def main(command: str, argv: list, compose, help: bool = False) -> int:
    """The command: argv the run directory, then key=value arguments; compose(overrides) the config as a
    run's would be composed (--config-dir included); help: print the usage."""
    if help:
        print("usage: " + USAGE[command])
        return 0
    if not argv or "=" in argv[0]:
        print_error(f"{command} needs a run directory first: {USAGE[command]}")
        return 2
    run_dir, rest = Path(argv[0]), argv[1:]
    options = dict(a.split("=", 1) for a in rest if a.split("=", 1)[0] in OPTIONS)
    overrides = [a for a in rest if a.split("=", 1)[0] not in OPTIONS]
    try:
        out = _out(options) if command == "predict" else None
        cfg = settle(run_dir, compose, overrides)
        from .tfrecords import tensorflow_lines_to

        changed = _data_changed(overrides)
        with tensorflow_lines_to(run_dir / "evaluations", name=f"{command}.log"):
            if command == "evaluate":
                return evaluate(cfg, run_dir, options, changed)
            return predict(cfg, run_dir, options, out, changed)
    except ConfigError as exc:
        print_error(str(exc))
        return 2


def _out(options: dict) -> Path:
    if "out" not in options:
        raise ConfigError(f"predict needs out=PATH, where to write the predictions ({' or '.join(FORMATS)}): "
                          f"{USAGE['predict']}")
    out = Path(options["out"])
    if out.suffix not in FORMATS:
        raise ConfigError(f"out={out} is of no format predict writes: name a file ending in {' or '.join(FORMATS)}")
    if out.exists() and options.get("overwrite", "false").lower() != "true":
        raise ConfigError(f"out={out} exists: name another file, or set overwrite=true")
    return out


def _data_changed(overrides: list) -> bool:
    return any(o.lstrip("+~").split("=", 1)[0].split(".")[0] == "data" for o in overrides)


def settle(run_dir: Path, compose, overrides: list):
    """The run's config with what the overrides name replaced (a group choice replaces the whole node, as
    a run would compose it), checked."""
    from .config import _keys, validate
    from .rundir import RunDir

    saved_path = RunDir(run_dir).config
    if not saved_path.is_file():
        raise ConfigError(f"{run_dir} holds no distrain run (no config.yaml): give a run's directory, e.g. "
                          "outputs/DATE/TIME")
    merged = OmegaConf.load(saved_path)
    asked = compose(overrides)
    for key in _keys(overrides):
        if not key.startswith("hydra"):
            OmegaConf.update(merged, key, OmegaConf.select(asked, key), merge=False)
    cfg = validate(merged)
    if cfg.strategy.name not in ONE_PROCESS:
        raise ConfigError(f"strategy={cfg.strategy.name}: evaluate and predict run in one process for now; set "
                          f"strategy= one of {', '.join(ONE_PROCESS)}")
    return cfg


def load(cfg, run_dir: Path, options: dict, data_changed: bool):
    """(The data, the model with the run's trained weights compiled with its loss and metrics, whether it
    outputs probabilities, where the weights came from)."""
    import tf_keras as keras

    from . import data as data_lib
    from .context import RunContext
    from .inputs import load_data
    from .model import compile_model
    from .rundir import RunDir
    from .strategy import configure_devices, make_strategy
    from .training import build, set_precision

    cfg.trainer.steps_per_epoch = 1  # (nothing trains: the training split's size need not fit the batch)
    configure_devices(cfg.strategy)
    strategy = make_strategy(cfg.strategy)
    source, _ = data_lib.resolve_source(cfg.data)
    cfg.data.source = source
    # The run's data.json holds its own data files; other data is scanned here (a directory with none).
    where = RunDir(run_dir / "evaluations" / "no data.json" if data_changed else run_dir, cfg)
    policy = set_precision(cfg.trainer)
    keras.utils.set_random_seed(cfg.trainer.seed)
    data = load_data(cfg, RunContext.of(where, cfg).know_strategy(strategy))
    check_fits(run_dir, data)
    with strategy.scope():
        model, optimizer, probabilities, _ = build(cfg, data, policy)
    said = restore(model, run_dir, cfg, options.get("checkpoint"))
    compile_model(model, optimizer, cfg, probabilities)
    return data, model, probabilities, said


def check_fits(run_dir: Path, data) -> None:
    """The data's examples and classes against the trained model's (results.json's), both said."""
    from .rundir import RunDir

    trained = RunDir(run_dir).read_results() or {}
    if trained.get("input_shape") and list(trained["input_shape"]) != list(data.shape):
        raise ConfigError(f"the data's examples are {tuple(data.shape)}, the model takes {tuple(trained['input_shape'])}: "
                          "name data of the shape it was trained on (data.image_size, data.channels)")
    if trained.get("num_classes") and trained["num_classes"] != data.classes:
        raise ConfigError(f"the data has {data.classes} classes, the model {trained['num_classes']}: name data of the "
                          "classes it was trained on (data.num_classes)")


def restore(model, run_dir: Path, cfg, checkpoint: str | None) -> str:
    """The run's trained weights into `model`: its SavedModel's (a finished run), else (or with
    checkpoint=latest|PATH) a checkpoint's; what they were, in words."""
    import tensorflow as tf
    import tf_keras as keras

    from .rundir import RunDir

    saved = run_dir / "saved_model"
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
        raise ConfigError(f"checkpoint {path} does not fit the model of the run's config ({str(exc).splitlines()[0][:200]}): "
                          "name a checkpoint of this run") from None
    return f"checkpoint {path}"


def evaluate(cfg, run_dir: Path, options: dict, data_changed: bool) -> int:
    """The run's loss and metrics on the data's test split: one line, and evaluations/<name>.json."""
    from .training import evaluate as keras_evaluate

    data, model, _, said = load(cfg, run_dir, options, data_changed)
    start = time.perf_counter()
    figures = keras_evaluate(model, data.reader(cfg, training=False)(), data.test_steps(cfg.trainer.batch_size))
    seconds = time.perf_counter() - start
    name = options.get("name") or schema.label(cfg.data)
    found = {"data": schema.label(cfg.data), "data_source": cfg.data.source, "examples": data.test_examples,
             "weights": said, "strategy": cfg.strategy.name, "seconds": round(seconds, 3),
             **{k: float(np.mean(v)) for k, v in figures.items()}}
    path = _free(run_dir / "evaluations", name)
    storage.write_atomic(path, json.dumps(found, indent=2) + "\n")
    shown = ", ".join(f"{k} {v:.2%}" if "accuracy" in k else f"{k} {v:.4f}" for k, v in figures.items()
                      if np.ndim(v) == 0)
    print(f"Evaluated on {data.test_examples:,} examples of {found['data']} ({said}): {shown} | written to {path}",
          flush=True)
    return 0


def _free(directory: Path, name: str) -> Path:
    """directory/<name>.json, or <name>-2.json, ...: never an earlier evaluation's file."""
    directory.mkdir(parents=True, exist_ok=True)
    path, n = directory / f"{name}.json", 2
    while path.exists():
        path, n = directory / f"{name}-{n}.json", n + 1
    return path


def predict(cfg, run_dir: Path, options: dict, out: Path, data_changed: bool) -> int:
    """The model's outputs for every example of the data's test split, in order, into out (.npz: the
    outputs as predict() gives them, and each example's index; .csv: a row per example; .tfrecord: an
    Example per input, its index, source and outputs)."""
    import tensorflow as tf

    data, model, probabilities, said = load(cfg, run_dir, options, data_changed)
    images = data.reader(cfg, training=False)().map(lambda x, y: x)
    start = time.perf_counter()
    outputs = model.predict(images, steps=data.test_steps(cfg.trainer.batch_size), verbose=2 if sys.stdout.isatty() else 0)
    seconds = time.perf_counter() - start
    outputs = np.asarray(outputs, np.float32)
    if len(outputs) != data.test_examples:  # (each example once: the reader's promise, checked)
        raise ConfigError(f"predict gave {len(outputs)} outputs for {data.test_examples} examples: report this")
    index = np.arange(len(outputs))
    if out.suffix == ".npz":
        buffer = io.BytesIO()
        np.savez(buffer, predictions=outputs, index=index)
        storage.write_atomic(out, buffer.getvalue())
    elif out.suffix == ".tfrecord":
        _tfrecord(out, index, sources(data), outputs)
    else:
        classes = data.labels == "classes" and outputs.ndim == 2 and outputs.shape[1] == data.classes > 1
        shown = outputs if probabilities or not classes else tf.nn.softmax(outputs).numpy()
        storage.write_atomic(out, _csv(index, sources(data), shown, classes, data.class_names))
    print(f"Predicted {len(outputs):,} examples of {schema.label(cfg.data)} ({said}) in {seconds:.1f} s, "
          f"{len(outputs) / max(seconds, 1e-9):,.0f} examples/s: written to {out}", flush=True)
    return 0


def sources(data) -> list:
    """Where each test example came from: an image's path, a TFRecord file and record, or an array's row."""
    found = getattr(data, "found", None)
    if found is None:
        return [f"row {i}" for i in range(data.test_examples)]
    if found.kind == "images":
        return list(found.test_files)
    from .files import tfrecord_lengths

    return [f"{path}#{i}" for path in found.test_files for i, _ in enumerate(tfrecord_lengths(Path(path)))]


def _tfrecord(out: Path, index, where: list, outputs) -> None:
    """One tf.train.Example per input: its index, its source and its outputs (flattened), written to a
    temporary name and renamed (no half file under `out`)."""
    import os

    import tensorflow as tf

    tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")
    try:
        with tf.io.TFRecordWriter(str(tmp)) as writer:
            for i, w, row in zip(index, where, outputs.reshape(len(outputs), -1)):
                writer.write(tf.train.Example(features=tf.train.Features(feature={
                    "index": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(i)])),
                    "source": tf.train.Feature(bytes_list=tf.train.BytesList(value=[w.encode()])),
                    "outputs": tf.train.Feature(float_list=tf.train.FloatList(value=row))})).SerializeToString())
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)


def _csv(index, where: list, outputs, classes: bool, names) -> str:
    text = io.StringIO()
    writer = csv.writer(text)
    if classes:
        names = list(names or range(outputs.shape[1]))
        writer.writerow(["index", "source", "class", *(f"p_{n}" for n in names)])
        for i, w, row in zip(index, where, outputs):
            writer.writerow([i, w, names[int(np.argmax(row))], *(f"{p:.6g}" for p in row)])
    else:
        flat = outputs.reshape(len(outputs), -1)
        writer.writerow(["index", "source", *(f"output_{j}" for j in range(flat.shape[1]))])
        for i, w, row in zip(index, where, flat):
            writer.writerow([i, w, *(f"{v:.6g}" for v in row)])
    return text.getvalue()
