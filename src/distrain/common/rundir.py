"""A run's directory: where each file a run leaves lies, and the one place each is written and read.

    config.yaml     the resolved config every task reads        (the launcher)
    status.json     how the run ended                           (the launcher; a sweep marks killed jobs)
    results.json    what the run measured                       (the chief; the launcher adds its restarts)
    cluster.json    a local cluster's tasks                     (the launcher)
    evaluation.json the evaluator task's evaluations            (the evaluator)
    metrics.csv     a row per epoch (logger=csv, mlflow)        (the chief)
    mlflow.json     its MLflow run, and the epochs logged there (the tracker: the launcher of the chief)
    data.json       data in files: the files, their examples and classes (the launcher)
    job.json        a clustered evaluate's or predict's parts, in its directory (the command)
    logs/           a log per task
    data_service/   the tf.data service's dispatcher's journal (data.service.workers)   (the dispatcher)
    checkpoints/    or trainer.checkpoint_dir                   (the chief)
    saved_model/    and class_names.txt in it, where the data named its classes (the chief)
    tensorboard/

No TensorFlow here: the launcher, the sweep's summary and the tasks all use it.
"""
import csv
import io
import json
import os
from pathlib import Path

import yaml

from distrain.common import storage

CONFIG, STATUS, RESULTS, CLUSTER, EVALUATION, DATA = "config.yaml", "status.json", "results.json", "cluster.json", \
    "evaluation.json", "data.json"
METRICS, TRACKED, JOB = "metrics.csv", "mlflow.json", "job.json"
CLASS_NAMES = "class_names.txt"  # beside a SavedModel: a classifier's class names, in output order


def write_json(path: Path, content: dict) -> Path:
    return storage.write_atomic(path, json.dumps(content, indent=2) + "\n")


def read_json(path: Path) -> dict | None:
    """A JSON file, or None where it is missing or unreadable (a run that never finished)."""
    try:
        content = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return content if isinstance(content, dict) else None


class RunDir:
    """The files of the run in `path`. cfg: the run's config, for where it keeps its checkpoints
    (trainer.checkpoint_dir); without it, what the run's config.yaml says."""

    def __init__(self, path, cfg=None):
        self.path = Path(path)
        self._cfg = cfg

    def __truediv__(self, name) -> Path:
        return self.path / name

    def __str__(self) -> str:
        return str(self.path)

    # -- where things lie
    config = property(lambda self: self.path / CONFIG)
    status = property(lambda self: self.path / STATUS)
    results = property(lambda self: self.path / RESULTS)
    cluster = property(lambda self: self.path / CLUSTER)
    evaluation = property(lambda self: self.path / EVALUATION)
    metrics = property(lambda self: self.path / METRICS)
    tracked = property(lambda self: self.path / TRACKED)
    job = property(lambda self: self.path / JOB)
    data = property(lambda self: self.path / DATA)  # data in files: what the launcher found (files.FileData)
    logs = property(lambda self: self.path / "logs")  # a log per task, and the fork server's
    saved_model = property(lambda self: self.path / "saved_model")
    tensorboard = property(lambda self: self.path / "tensorboard")  # the HParams session; train/: the scalars
    data_service = property(lambda self: self.path / "data_service")  # the dispatcher's state, for its restarts

    def log(self, name: str) -> Path:
        """A task's log (train, worker-0, ...), or the fork server's."""
        return self.logs / f"{name}.log"

    def _trainer(self) -> dict:
        if self._cfg is not None:
            return self._cfg["trainer"]
        return (self.read_config() or {}).get("trainer") or {}

    @property
    def checkpoints(self) -> Path:
        """Where the chief keeps the run's checkpoints: trainer.checkpoint_dir, else <run dir>/checkpoints."""
        return Path(self._trainer().get("checkpoint_dir") or self.path / "checkpoints")

    @property
    def kept_checkpoints(self) -> Path | None:
        """Where the run keeps its checkpoints, or None if it keeps none (trainer.save_model=false)."""
        return self.checkpoints if self._trainer().get("save_model", True) else None

    def has_checkpoint(self) -> bool:
        return (self.checkpoints / "checkpoint").exists()  # CheckpointManager's index

    def latest_checkpoint(self) -> str | None:
        return storage.latest_checkpoint(self.checkpoints)

    # -- the files, each written here alone
    def write_config(self, text: str) -> Path:
        return storage.write_atomic(self.config, text)

    def read_config(self) -> dict | None:
        """The run's config.yaml as plain values (no OmegaConf), or None where there is none."""
        try:
            content = yaml.safe_load(self.config.read_text())
        except (OSError, yaml.YAMLError):
            return None
        return content if isinstance(content, dict) else None

    def write_status(self, status: str, code: int | None, error: str = "", log_tail=(), job=None) -> None:
        """How the run ended: ok, failed or interrupted, its exit status, and for a failure its error line
        and the end of the failing task's log (what a sweep summary shows for a failed job). A full disk
        is said, not raised."""
        content = {"status": status, "exit_status": code, "error": error, "log_tail": list(log_tail)}
        if job is not None:
            content.update(job=job.num, swept=job.swept)
        storage.record(write_json, self.status, content)

    def read_status(self) -> dict:
        return read_json(self.status) or {}

    def snapshot(self) -> dict:
        """What a command refused in this run's directory must leave as it found it: every file but the
        checkpoints and the SavedModel (which a refused command never writes), as its bytes, or as its
        length where it is large (1 MB: a long log, TensorBoard's events, which are only appended to)."""
        found = {}
        for path in self._files():
            size = path.stat().st_size
            found[path.relative_to(self.path)] = size if size > 2 ** 20 else path.read_bytes()
        return found

    def restore(self, snapshot: dict) -> None:
        """The run's files as snapshot() found them: rewritten ones get their bytes back, grown ones their
        length, new ones go, gone ones come back."""
        for path in self._files():
            kept = snapshot.get(path.relative_to(self.path))
            if kept is None:
                path.unlink()
            elif isinstance(kept, int):
                os.truncate(path, min(kept, path.stat().st_size))
            elif path.read_bytes() != kept:
                storage.record(storage.write_atomic, path, kept)
        for name, kept in snapshot.items():
            if isinstance(kept, bytes) and not (self.path / name).exists():
                (self.path / name).parent.mkdir(parents=True, exist_ok=True)
                storage.record(storage.write_atomic, self.path / name, kept)
        held = {parent for name in snapshot for parent in Path(name).parents}
        for folder in sorted((p for p in self.path.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            if folder.relative_to(self.path) not in held and not any(folder.iterdir()):
                folder.rmdir()  # (made by the refused command, and empty again)

    def _files(self) -> list:
        skipped = (self.checkpoints, self.saved_model)
        return [path for path in self.path.rglob("*") if path.is_file() and not path.is_symlink()
                and not any(path.is_relative_to(s) for s in skipped)]

    def read_class_names(self) -> list | None:
        """The trained model's class names (class_names.txt beside its SavedModel), where the data named them."""
        path = self.saved_model / CLASS_NAMES
        return path.read_text().splitlines() if path.is_file() else None

    def ended(self) -> str | None:
        """How the run ended, as its status.json says (ok, failed, interrupted; running if its launcher
        was killed), or None if it recorded none."""
        return self.read_status().get("status")

    def mark_interrupted(self, why: str) -> bool:
        """A run still "running" (its process killed before it could say how it ended) was interrupted,
        and so was its cluster. Whether it was running."""
        status = self.read_status()
        if status.get("status") != "running":
            return False
        storage.record(write_json, self.status, {**status, "status": "interrupted", "exit_status": 130, "error": why})
        cluster = read_json(self.cluster)
        if cluster and cluster.get("status") in ("running", "restarting"):
            self.write_cluster({**cluster, "status": "interrupted"})
        return True

    def write_results(self, results: dict) -> Path:
        return write_json(self.results, results)

    def read_results(self) -> dict | None:
        return read_json(self.results)

    def add_to_results(self, facts: dict) -> None:
        """The launcher's facts (its restarts) added to the chief's results.json, if there is one."""
        results = self.read_results()
        if results is not None:
            storage.record(write_json, self.results, {**results, **facts})

    def write_metrics(self, rows: list) -> Path:
        """metrics.csv, whole (a row per epoch: results.epoch_rows), so a reader never sees half a row."""
        columns = list(dict.fromkeys(name for row in rows for name in row))
        out = io.StringIO()
        writer = csv.DictWriter(out, columns)
        writer.writeheader()
        writer.writerows(rows)
        return storage.write_atomic(self.metrics, out.getvalue())

    def read_metrics(self) -> list | None:
        """metrics.csv's rows as numbers (a cell left empty: no value that epoch), or None where there is none."""
        try:
            with open(self.metrics, newline="") as f:
                return [{k: float(v) if k != "epoch" else int(v) for k, v in row.items() if v not in ("", None)}
                        for row in csv.DictReader(f)]
        except (OSError, ValueError, csv.Error):
            return None

    def write_tracked(self, content: dict) -> None:
        storage.record(write_json, self.tracked, content)

    def read_tracked(self) -> dict:
        return read_json(self.tracked) or {}

    def write_cluster(self, state: dict) -> None:
        storage.record(write_json, self.cluster, state)

    def write_data(self, found: dict) -> Path:
        return write_json(self.data, found)

    def read_data(self) -> dict | None:
        return read_json(self.data)

    def write_job(self, job: dict) -> Path:
        return write_json(self.job, job)

    def read_job(self) -> dict | None:
        return read_json(self.job)

    def write_evaluation(self, evaluations: dict) -> Path:
        return write_json(self.evaluation, evaluations)
