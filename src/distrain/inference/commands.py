"""`distrain evaluate RUN_DIR [overrides]` and `distrain predict RUN_DIR [overrides] out=PATH`: a run's
trained model on the run's test data, or on any data the overrides name, with the run's own loss,
metrics, class names and input pipeline. The run's config.yaml says everything the overrides do not.

They run in this process under a strategy of one process (default, one_device, mirrored,
central_storage), or on a cluster of this machine (multi_worker_mirrored, parameter_server with
cluster=local), which computes the outputs in parts (cluster_parts.py) while this process merges them. The
data is the named data's test split, read each example once and in order: arrays by row, TFRecord shards
by file (sorted) then record, an image folder's test images by path (sorted). evaluate writes
evaluations/<name>.json in the run directory, never over the run's results nor an earlier evaluation;
predict writes out=PATH whole or not at all."""
import contextlib
import itertools
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

from distrain.common import cpu, storage
from distrain.common.errors import ConfigError, fail, first_line, print_error
from distrain.common.rundir import RunDir
from distrain.config import schema
from distrain.config.overrides import combinations, keys_of, split
from distrain.inference import cluster_parts, predictions

OPTIONS = ("out", "checkpoint", "name", "overwrite", "part_size")
FORMATS = (".npz", ".csv", ".tfrecord")
USAGE = {"evaluate": "distrain evaluate RUN_DIR [RUN_DIR ...] [-m] [--config-dir DIR] [overrides, e.g. data=...] "
                     "[checkpoint=latest|PATH] [name=NAME] [part_size=N]",
         "predict": "distrain predict RUN_DIR [RUN_DIR ...] [-m] [--config-dir DIR] [overrides, e.g. data=...] "
                    "out=PATH.npz|.csv|.tfrecord [checkpoint=latest|PATH] [overwrite=true] [part_size=N]"}


def main(command: str, argv: list, compose, help: bool = False, multirun: bool = False) -> int:
    """The command: argv the run directories (one, or several: a sweep's, `multirun/DATE/TIME/*`), then
    key=value arguments; compose(overrides) the config as a run's would be composed (--config-dir
    included); help: print the usage; multirun (-m): a,b values of the overrides make a job each. Several
    jobs end with a table of them."""
    if help:
        print("usage: " + USAGE[command])
        return 0
    runs = [Path(a) for a in itertools.takewhile(lambda a: "=" not in a, argv)]
    rest = argv[len(runs):]
    if not runs:
        print_error(f"{command} needs a run directory first: {USAGE[command]}")
        return 2
    options = dict(a.split("=", 1) for a in rest if a.split("=", 1)[0] in OPTIONS)
    overrides = [a for a in rest if a.split("=", 1)[0] not in OPTIONS]
    try:
        if command == "predict":  # (before any job: each would say it)
            _out(options, exists_ok=True)
        swept, varied = combinations(overrides) if multirun else ([overrides], [])
        if len(runs) > 1:  # (a shell's glob of a sweep's directory names its files and tensorboard/ too)
            passed = [run for run in runs if not RunDir(run).config.is_file()]
            runs = [run for run in runs if run not in passed]
            if passed:
                print(f"passed over (no config.yaml: no run): {', '.join(map(str, passed))}", flush=True)
            if not runs:
                raise ConfigError(f"none of the {len(passed)} paths given holds a distrain run (a config.yaml): give "
                                  "runs' directories, e.g. multirun/DATE/TIME/*")
        jobs = [(run, job) for run in runs for job in swept]
        if len(jobs) == 1:
            return 0 if one(command, *jobs[0], options, compose) else 2
    except ConfigError as exc:
        return fail(exc)
    return several(command, jobs, options, compose, varied)


def one(command: str, run_dir: Path, overrides: list, options: dict, compose) -> dict:
    """One evaluation or prediction: what it wrote ({} if it failed, saying why in one line, and leaving
    the run's evaluations/ as it found it)."""
    made = not (run_dir / "evaluations").exists()
    found = RunDir(run_dir / "evaluations").snapshot() if not made else {}
    try:
        out = _out(options) if command == "predict" else None
        cfg = settle(run_dir, compose, overrides, options.get("checkpoint"))
        from distrain.data.write_tfrecords import tensorflow_lines_to
        from distrain.launcher.launch import environment

        changed = _data_changed(overrides)
        # The kernels the run trained with (trainer.onednn), in this process's TensorFlow (imported after
        # this) and the cluster's tasks: a fork server this process kept from a run is used again.
        # (made inside the environment: the cluster's fork server starts with it)
        clustered = lambda: cluster_parts.Cluster(cfg, run_dir, command) if _clustered(cfg) else \
            contextlib.nullcontext()
        with environment(cpu.onednn_env(cfg.trainer.onednn)), \
                tensorflow_lines_to(run_dir / "evaluations", name=f"{command}.log"), clustered() as cluster:
            if command == "evaluate":
                return evaluate_run(cfg, run_dir, options, changed, cluster)
            return predict_run(cfg, run_dir, options, out, changed, cluster)
    except ConfigError as exc:
        fail(exc)
        if isinstance(exc, cluster_parts.ClusterFailed):  # (its logs say why)
            return {}
        if made:  # a refusal leaves the run as it found it
            shutil.rmtree(run_dir / "evaluations", ignore_errors=True)
        else:
            RunDir(run_dir / "evaluations").restore(found)
        return {}


def several(command: str, jobs: list, options: dict, compose, varied: list) -> int:
    """Each job in turn (a failed one recorded, the others go on), then a table of them all; exit status 1
    if any failed. predict's out=NAME.EXT becomes NAME-<job>.EXT for each."""
    rows = []
    for n, (run, overrides) in enumerate(jobs):
        values = {k: v for k, v in map(split, overrides) if k in varied}
        print(f"[#{n}] {command} {run} {' '.join(overrides)}".rstrip(), flush=True)
        mine = {**options, "out": _numbered(options["out"], n)} if "out" in options else options
        try:
            found = one(command, run, overrides, mine, compose)
        except Exception as exc:  # noqa: BLE001 - one failed job is a recorded failure, not the end of the sweep
            print_error(f"job #{n} failed: {type(exc).__name__}: {first_line(str(exc), 300)}")
            found = {}
        rows.append({"#": n, "run": str(run), **values, "status": "ok" if found else "failed", **found})
        if keras := sys.modules.get("tf_keras"):  # (imported by the job, where its start-up lines go to its log)
            keras.backend.clear_session()
    print(table(rows, varied), flush=True)
    return 0 if all(r["status"] == "ok" for r in rows) else 1


def _numbered(out: str, n: int) -> str:
    path = Path(out)
    return str(path.with_name(f"{path.stem}-{n}{path.suffix}"))


def table(rows: list, varied: list) -> str:
    """The jobs, a line each: their run, swept values and status, then what each wrote: evaluate's
    examples and figures, predict's examples, seconds and file."""
    hidden = ("data", "data_source", "weights", "strategy", "workers")
    columns = ["#", "run", *varied, "status"]
    columns += [k for k in dict.fromkeys(k for r in rows for k in r) if k not in columns and k not in hidden]
    cells = [[_cell(r.get(k)) for k in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(line, widths)).rstrip() for line in [columns, *cells])


def _cell(value) -> str:
    if value is None:
        return "-"
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def _out(options: dict, exists_ok: bool = False) -> Path:
    """Where predict writes (checked; exists_ok: whether it may exist, not only with overwrite=true)."""
    if "out" not in options:
        raise ConfigError(f"predict needs out=PATH, where to write the predictions ({' or '.join(FORMATS)}): "
                          f"{USAGE['predict']}")
    out = Path(options["out"])
    if out.suffix not in FORMATS:
        raise ConfigError(f"out={out} is of no format predict writes: name a file ending in {' or '.join(FORMATS)}")
    if out.is_dir():  # (now, not once every output is computed: overwrite=true cannot replace it)
        raise ConfigError(f"out={out} is a directory: name a file")
    if out.exists() and not exists_ok and options.get("overwrite", "false").lower() != "true":
        raise ConfigError(f"out={out} exists: name another file, or set overwrite=true")
    if not out.parent.is_dir():  # (now, not once every output is computed)
        raise ConfigError(f"out={out}: there is no directory {out.parent}: create it, or name a file in one that "
                          "exists")
    if why := storage.cannot_write_in(out.parent):
        raise ConfigError(f"out={out}: {why}: name a file where you can write")
    return out


def _data_changed(overrides: list) -> bool:
    return any(key.split(".")[0] == "data" for key in keys_of(overrides))


def settle(run_dir: Path, compose, overrides: list, checkpoint: str | None = None):
    """The run's config with what the overrides name replaced (a group choice replaces the whole node, as
    a run would compose it), checked. The model's code need not be here where the run's SavedModel is used
    (no checkpoint named): it holds the model."""
    from distrain.config.validate import validate

    saved_path = RunDir(run_dir).config
    if not saved_path.is_file():
        raise ConfigError(f"{run_dir} holds no distrain run (no config.yaml): give a run's directory, e.g. "
                          "outputs/DATE/TIME")
    merged = OmegaConf.load(saved_path)
    try:  # (the keys of the run's own options: `data.test_files=...` on a run of data=tfrecord is tfrecord's)
        asked = compose(runs_choices(merged, overrides) + overrides)
    except Exception:  # noqa: BLE001 - an option of the user's own, not in a config directory: as they are
        asked = compose(overrides)
    for key in keys_of(overrides):
        if not key.startswith("hydra"):
            OmegaConf.update(merged, key, OmegaConf.select(asked, key), merge=False)
    whole = checkpoint is None and RunDir(run_dir).saved_model.is_dir()
    try:
        cfg = validate(merged, model_code=not whole)
    except ConfigError as exc:
        if str(exc).startswith("model._target_="):
            raise ConfigError(f"{exc} (a checkpoint needs the model's code; the run's SavedModel, where there is "
                              "one, does not)") from None
        raise
    return cfg


def runs_choices(saved, overrides: list) -> list:
    """The run's own option (`group=name`) of each config group whose keys the overrides set without
    choosing an option of it."""
    keys = keys_of(overrides)
    groups = sorted({key.split(".")[0] for key in keys if "." in key} - set(keys))
    return [f"{group}={saved[group].name}" for group in groups
            if OmegaConf.is_dict(saved.get(group)) and saved[group].get("name")]


def evaluate_run(cfg, run_dir: Path, options: dict, data_changed: bool, cluster=None) -> int:
    """The run's loss and metrics on the data's test split: one line, and evaluations/<name>.json. On a
    cluster, the tasks compute the outputs (cluster_parts.py) and this process the figures from them, as Keras's
    evaluate() computes them from its test_step's."""
    from distrain.task.inference import evaluate_here, load_trained, score

    data, model, _, said = load_trained(cfg, run_dir, options, data_changed)
    if not data.labelled:
        raise ConfigError(f"evaluate needs labels, and {schema.label(cfg.data)} holds inputs alone "
                          f"({_unlabelled(cfg.data)}): give labelled data, or use distrain predict for the outputs")
    start = time.perf_counter()
    if cluster:
        found, _ = cluster.compute(data, options)
        if found is None:
            return _computed(cluster, data)
        figures = score(model, found["outputs"], found["labels"], cfg.trainer.batch_size)
    else:
        figures = evaluate_here(cfg, data, model)
    seconds = time.perf_counter() - start
    name = options.get("name") or schema.label(cfg.data)
    found = {"data": schema.label(cfg.data), "data_source": cfg.data.source, "examples": data.test_examples,
             "weights": said, "strategy": cfg.strategy.name, **_workers(cfg, cluster), "seconds": round(seconds, 3),
             **{k: float(np.mean(v)) for k, v in figures.items()}}
    path = _free(run_dir / "evaluations", name)
    storage.write_atomic(path, json.dumps(found, indent=2) + "\n")
    shown = ", ".join(f"{k} {v:.2%}" if "accuracy" in k else f"{k} {v:.4f}" for k, v in figures.items()
                      if np.ndim(v) == 0)
    print(f"Evaluated on {data.test_examples:,} examples of {found['data']} ({said}{_on(cfg, cluster)}): {shown} | "
          f"written to {path}", flush=True)
    return found


def _computed(cluster, data) -> dict:
    """What this machine's task did, where another machine's command merges the parts (the chief's)."""
    from distrain.common.cluster import chief_of
    from distrain.common.topology import Topology

    chief = chief_of(cluster.spec)
    if cluster.task.type == "evaluator":
        said = "nothing to compute here"
    elif Topology.of(cluster.cfg).parameter_servers:
        said = f"served {chief}, whose command wrote the outputs of the {data.test_examples:,} examples"
    else:
        said = f"its parts of the {data.test_examples:,} examples are written; the command of {chief} merges them"
    print(f"{cluster.task.name}: {said}", flush=True)
    return {"examples": data.test_examples, "task": cluster.task.name}


def _unlabelled(data) -> str:
    """Where the data holds no label, in its own terms."""
    if data.source == "tfrecord":
        return f"its records have no {data.label_key}"
    if data.source == "images":
        return f"{data.path} has no test/<class>/ folders"
    return f"{data.path} has no y_test or y"


def _clustered(cfg) -> bool:
    from distrain.common.topology import Topology

    return Topology.of(cfg).clustered


def _workers(cfg, cluster) -> dict:
    """The workers that computed the outputs, on a cluster."""
    from distrain.common.topology import Topology

    return {"workers": Topology.of(cfg, cluster.spec).workers} if cluster else {}


def _on(cfg, cluster) -> str:
    """Where the examples were computed, where not in this process."""
    workers = _workers(cfg, cluster).get("workers")
    return f"; {workers} worker{'s' if workers > 1 else ''}, {cfg.strategy.name}" if cluster else ""


def _free(directory: Path, name: str) -> Path:
    """directory/<name>.json, or <name>-2.json, ...: never an earlier evaluation's file."""
    directory.mkdir(parents=True, exist_ok=True)
    path, n = directory / f"{name}.json", 2
    while path.exists():
        path, n = directory / f"{name}-{n}.json", n + 1
    return path


def predict_run(cfg, run_dir: Path, options: dict, out: Path, data_changed: bool, cluster=None) -> int:
    """The model's outputs for every example of the data's test split, in order, into out (.npz: the
    outputs as predict() gives them, and each example's index; .csv: a row per example; .tfrecord: an
    Example per input, its index, source and outputs: predictions.py)."""
    from distrain.task.inference import load_trained, predict_here

    data, model, probabilities, said = load_trained(cfg, run_dir, options, data_changed)
    start = time.perf_counter()
    if cluster:
        found, _ = cluster.compute(data, options)
        if found is None:
            return _computed(cluster, data)
        outputs = found["outputs"]
    else:
        outputs = predict_here(cfg, data, model)
    seconds = time.perf_counter() - start
    outputs = np.asarray(outputs, np.float32)
    if len(outputs) != data.test_examples:  # (each example once: the reader's promise, checked)
        raise ConfigError(f"predict gave {len(outputs)} outputs for {data.test_examples} examples: report this")
    predictions.write(out, outputs, data, probabilities)
    print(f"Predicted {len(outputs):,} examples of {schema.label(cfg.data)} ({said}{_on(cfg, cluster)}) in "
          f"{seconds:.1f} s, {len(outputs) / max(seconds, 1e-9):,.0f} examples/s: written to {out}", flush=True)
    return {"examples": len(outputs), "seconds": round(seconds, 3), "out": str(out)}
