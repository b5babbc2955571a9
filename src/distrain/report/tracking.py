"""MLflow tracking (logger=mlflow): one MLflow run per distrain run, and one parent run per sweep with
a nested run per job; `distrain log DIR...` (log_after.py) logs finished runs and sweeps after the fact.

It runs in the launcher of the chief (no TensorFlow), never in a task: one process logs, whatever the
workers, restarts and resizes, and a tracking server that stops answering costs a warning, never a
training step. Everything it logs comes from the run directory (config.yaml, metrics.csv's rows, which
the chief rewrites at each epoch's end, results.json, status.json, the logs, the SavedModel), so a run
logged live and one logged after the fact are logged alike. Which MLflow run is the run's, and how many
of its epochs are logged there, is kept in the run's mlflow.json per tracking URI: a resumed run, a
restarted one and `distrain log` go on with the same MLflow run, logging each epoch once.

Costs: importing MLflow and creating the run, 2.5 s of the launcher's CPU, beside the tasks' start (Beside;
a sweep's parent run beside its jobs' fork server, callbacks.ForkServerAhead); a call to a server per few seconds of
training while epochs end; the model's files copied once at the end (0.5 s). A 2-epoch run's wall: 0.87-1.07x
logger=tensorboard's (benchmarks/tracking.py).
"""
import contextlib
import importlib.metadata
import io
import logging
import os
import platform
import re
import subprocess
import threading
import warnings
from pathlib import Path

from distrain.common import private
from distrain.common.errors import ConfigError, print_error
from distrain.common.rundir import RunDir
from distrain.config import schema
from distrain.config.overrides import split
from distrain.report import mlflow_store
from distrain.report.results import epoch_rows

log = logging.getLogger("distrain")

FOLLOW_SECONDS = 2.0  # how often the launcher looks for epochs to log while the tasks train
# MLflow's limits (mlflow.utils.validation): a parameter's value, and the entries of one call.
MAX_VALUE, MAX_PARAMS, MAX_METRICS = 6000, 100, 1000
# results.json's measured numbers, logged as the run's metrics (its other facts are parameters or tags).
MEASURED = {"train_seconds", "seconds_to_first_step", "examples_per_sec", "steps_per_sec", "global_steps",
            "final_train_loss", "input_examples_per_sec", "steps_examples_per_sec", "input_cpu_share",
            "input_cpu_per_example", "model_params", "restarts", "task_restarts", "final_num_workers"}
# status.json's status -> MLflow's ("running": a launcher killed before it recorded the end)
STATUS = {"ok": "FINISHED", "failed": "FAILED", "interrupted": "KILLED", "running": "KILLED", "pruned": "KILLED"}
ARTIFACTS = ["config.yaml", "results.json", "status.json", "metrics.csv", "curves.png", "cluster.json"]
SWEEP_ARTIFACTS = ["summary.csv", "summary.md", "scaling.png", "optimization_results.yaml", "multirun.yaml"]
MODEL_CODE = Path(__file__).with_name("mlflow_model.py")


def wanted(config) -> bool:
    return "mlflow" in ((config or {}).get("logger") or {})


def settings(config) -> dict:
    """logger.mlflow's keys with their defaults made: the tracking URI (a SQLite store in outputs/ beside
    the runs, absolute), the experiment (<data>-<model>)."""
    found = dict(((config or {}).get("logger") or {}).get("mlflow") or {})
    uri = found.get("tracking_uri") or f"sqlite:///{os.path.abspath('outputs/mlflow.db')}"
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):  # relative: from here
        uri = f"sqlite:///{os.path.abspath(uri.removeprefix('sqlite:///'))}"
    experiment = found.get("experiment") or \
        f"{schema.label(config.get('data') or {})}-{schema.label(config.get('model') or {})}"
    return {**found, "tracking_uri": uri, "experiment": experiment}


def say_lost(uri: str, why: str, run: RunDir) -> None:
    """The one line of a store lost while the run trains (once)."""
    log.warning("mlflow: cannot log to %s (%s): the run goes on, and its directory keeps everything; "
                "`distrain log %s` completes the MLflow run", uri, why, run)


def flat(config: dict, prefix: str = "") -> dict:
    """The config as MLflow's parameters: dotted keys, each value as text cut to MLflow's limit."""
    params = {}
    for key, value in config.items():
        if isinstance(value, dict) and value:
            params |= flat(value, f"{prefix}{key}.")
        else:
            params[f"{prefix}{key}"] = str(value)[:MAX_VALUE]
    return params


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


class Tracked:
    """The MLflow run of one run directory (a run's, or a sweep's parent), as its mlflow.json keeps it."""

    def __init__(self, run: RunDir, config: dict, name: str, parent: dict | None = None):
        self.run, self.config, self.settings = run, config, settings(config)
        self.uri = self.settings["tracking_uri"]
        self.client = mlflow_store.connect(self.uri)
        self.state = run.read_tracked().get(self.uri) or {}
        self.lock, self.said, self.stop = threading.Lock(), False, threading.Event()
        self.follower = None
        self.made = not self._open()  # (by this command: a refused one deletes it again, put_back)
        if self.made:
            self._create(name, parent)

    def _open(self) -> bool:
        """The run's MLflow run goes on (resumed, restarted, logged after the fact), if it is there."""
        if not self.state.get("run_id"):
            return False
        try:
            found = self.client.get_run(self.state["run_id"])
        except Exception:  # noqa: BLE001 - gone from this store (deleted, a new database): a new one
            return False
        return found.info.lifecycle_stage != "deleted"

    def _create(self, name: str, parent: dict | None) -> None:
        s = self.settings
        experiment = parent["experiment_id"] if parent else \
            mlflow_store.experiment_id(self.client, s["experiment"], self.uri)
        tags = {"distrain.version": importlib.metadata.version("distrain"), "machine": platform.node(),
                "mlflow.source.name": "distrain", **{k: str(v) for k, v in (s.get("tags") or {}).items()}}
        if (commit := _git_commit()) is not None:
            tags["mlflow.source.git.commit"] = commit
        if parent:
            tags["mlflow.parentRunId"] = parent["run_id"]
        made = self.client.create_run(experiment, run_name=s.get("run_name") or name, tags=tags)
        self.state = {"run_id": made.info.run_id, "experiment_id": experiment,
                      "experiment": parent["experiment"] if parent else s["experiment"],
                      "epochs_logged": 0}
        self._save()
        from mlflow.entities import Param

        items = [Param(k[:250], v) for k, v in self.params().items()]
        for at in range(0, len(items), MAX_PARAMS):
            self.client.log_batch(self.run_id, params=items[at:at + MAX_PARAMS])
        if self.run.config.exists():
            self.client.log_artifact(self.run_id, str(self.run.config))

    def params(self) -> dict:
        """The MLflow run's parameters: the config, flattened."""
        return flat({k: v for k, v in self.config.items() if k != "hydra"})

    run_id = property(lambda self: self.state["run_id"])

    def _save(self) -> None:
        self.run.write_tracked({**self.run.read_tracked(), self.uri: self.state})

    def where(self) -> str:
        """Where the run went, in one line: its page in MLflow's UI, where the store is a server's."""
        page = f" ({self.uri.rstrip('/')}/#/experiments/{self.state['experiment_id']}/runs/{self.run_id})" \
            if self.uri.startswith(("http://", "https://")) and self.state.get("experiment_id") else ""
        return f"mlflow: run {self.run_id} in experiment {self.state['experiment']} at {self.uri}{page}"

    # -- epochs
    def log_epochs(self, rows: list | None = None) -> int:
        """The epochs not logged yet (metrics.csv's rows, else those a finished run's results.json gives),
        each metric at its epoch as the step. How many were logged."""
        from mlflow.entities import Metric

        rows = self.run.read_metrics() if rows is None else rows
        with self.lock:
            done = self.state.get("epochs_logged", 0)
            new = [row for row in rows or [] if row["epoch"] > done]
            if not new:
                return 0
            now = _millis()
            items = [Metric(name, float(value), now, row["epoch"]) for row in new for name, value in row.items()
                     if name != "epoch" and value is not None]
            for at in range(0, len(items), MAX_METRICS):
                self.client.log_batch(self.run_id, metrics=items[at:at + MAX_METRICS])
            self.state["epochs_logged"] = new[-1]["epoch"]
            self._save()
        return len(new)

    def follow(self) -> None:
        """Log each epoch as metrics.csv gains it, in a thread, until finish()."""
        def loop():
            while not self.stop.wait(FOLLOW_SECONDS):
                try:
                    self.log_epochs()
                except Exception as exc:  # noqa: BLE001 - a tracker that fails never fails the training
                    self.lost(exc)
                    return
        self.follower = threading.Thread(target=loop, name="mlflow", daemon=True)
        self.follower.start()

    def lost(self, exc: Exception) -> None:
        if not self.said:
            self.said = True
            say_lost(self.uri, mlflow_store.short(exc), self.run)

    def put_back(self) -> None:
        """After a refused command (the run's files put back as it found them): its MLflow run as it was,
        ended as the run's status.json says, or gone where the command made it."""
        self.stop.set()
        try:
            if self.made:
                self.client.delete_run(self.run_id)
            else:
                self.client.set_terminated(self.run_id, STATUS.get(self.run.read_status().get("status"), "FAILED"))
        except Exception as exc:  # noqa: BLE001 - a store that fails: the refusal is the line that matters
            self.lost(exc)

    # -- the end
    def finish(self) -> None:
        """After the run: the epochs left, the results as metrics, the run's files and model, its status
        (and error line). A store that fails is a warning."""
        self.stop.set()
        if self.follower:
            self.follower.join(timeout=30)
        try:
            self._finish()
        except Exception as exc:  # noqa: BLE001 - the run is over and kept: logging it is what failed
            self.lost(exc)
            return
        log.info(self.where())

    def _finish(self) -> None:
        results, status = self.run.read_results() or {}, self.run.read_status()
        rows = self.run.read_metrics()
        if rows is None and results.get("history"):  # a run made without metrics.csv: its results say
            rows = rows_of(results, self.config)
        self.log_epochs(rows)
        self._log_results(results)
        for name in ARTIFACTS:
            if (self.run / name).exists():
                self.client.log_artifact(self.run_id, str(self.run / name))
        if self.run.logs.is_dir():
            self.client.log_artifacts(self.run_id, str(self.run.logs), "logs")
        step = results.get("global_steps")  # (a resumed run's model is another: logged anew)
        if status.get("status") == "ok" and self.settings.get("log_model", True) and self.run.saved_model.is_dir() \
                and self.state.get("model_at_step") != step:
            self.state |= {"model": self._log_model(results), "model_at_step": step}
        if status.get("error"):  # (a trial its Optuna search pruned: tagged pruned, with the epoch)
            self.client.set_tag(self.run_id, "pruned" if status.get("status") == "pruned" else "error",
                                status["error"][:MAX_VALUE])
        self.client.set_terminated(self.run_id, STATUS.get(status.get("status"), "FAILED"))
        self.state["finished"] = True
        self._save()
        if results:
            self.run.add_to_results({"mlflow_run_id": self.run_id, "mlflow_tracking_uri": self.uri})

    def _log_results(self, results: dict) -> None:
        from mlflow.entities import Metric

        numbers = {k: v for k, v in results.items() if (k in MEASURED or k.startswith("test_"))
                   and isinstance(v, (int, float)) and not isinstance(v, bool)}
        numbers |= {f"time_split_{k}": v for k, v in (results.get("time_split") or {}).items()}
        numbers |= {f"peak_rss_mib_{k}": v for k, v in (results.get("peak_rss_mib") or {}).items()}
        now = _millis()
        self.client.log_batch(self.run_id, metrics=[Metric(k, float(v), now, 0) for k, v in numbers.items()],
                              tags=[_tag(k, results[k]) for k in ("strategy", "num_workers", "num_ps", "num_replicas",
                                                                  "precision_policy", "tensorflow_version")
                                    if k in results])

    def _log_model(self, results: dict) -> str:
        """The SavedModel as an MLflow pyfunc model (mlflow_model.py loads it with tf_keras). Its signature
        gives the outputs (a column per class where the run named them); the inputs, which it takes in
        more than one form (uint8 images as the data gave them, with or without a channel axis of 1, or
        floats as the model takes them), are said in its metadata, not enforced by a schema of one form
        (MLflow's checks a tensor's exact dtype and rank). Its URI."""
        import mlflow
        import numpy as np
        from mlflow.models import ModelSignature
        from mlflow.types import ColSpec, Schema, TensorSpec

        names = self.run.read_class_names()
        outputs = Schema([ColSpec("float", n) for n in names]) if names else \
            Schema([TensorSpec(np.dtype("float32"), (-1, results.get("num_classes") or -1))])
        shape = list(results.get("input_shape") or [])
        bare = shape[:-1] if shape[-1:] == [1] else shape
        inputs = (f"uint8 images of shape (-1, {', '.join(map(str, shape))})"
                  + (f" or (-1, {', '.join(map(str, bare))})" if bare != shape else "")
                  + " as the data gave them (scaled / 255 as training scaled them), or float32 as the model takes "
                  f"them (-1, {', '.join(map(str, shape))})")
        signature = ModelSignature(outputs=outputs)
        tf = importlib.metadata.version("tensorflow")
        # (quiet: its advice on input examples, and the links it prints as the run is left)
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            mlflow.set_tracking_uri(self.uri)
            with mlflow.start_run(run_id=self.run_id):  # (the model is the run's)
                info = mlflow.pyfunc.log_model(name="model", python_model=str(MODEL_CODE),
                                               artifacts={"saved_model": str(self.run.saved_model)},
                                               signature=signature, metadata={"inputs": inputs},
                                               pip_requirements=[f"tensorflow=={tf}", f"tf-keras=={tf}",
                                                                 f"mlflow=={importlib.metadata.version('mlflow')}"])
        return info.model_uri


def _yaml(path: Path) -> dict:
    import yaml

    try:
        found = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return {}
    return found if isinstance(found, dict) else {}


def _tag(key: str, value):
    from mlflow.entities import RunTag

    return RunTag(key, str(value))


def _millis() -> int:
    import time

    return int(time.time() * 1000)


def rows_of(results: dict, config: dict) -> list:
    """The epochs' rows of a finished run from its results.json (a run made without metrics.csv)."""
    history, trainer = results["history"], (config or {}).get("trainer") or {}
    steps = results.get("steps_per_epoch") or round(results["global_steps"] / max(1, len(history.get("loss", []))))
    return epoch_rows(history, results.get("epoch_seconds") or [], steps * results["global_batch_size"],
                             trainer.get("epochs", results.get("epochs", 0)), trainer.get("validate_every", 0))


class TrackedSweep(Tracked):
    """A sweep's parent run: the sweep's overrides as parameters; at its end its summary, plot and Optuna's
    best, and FAILED where a job failed."""

    def params(self) -> dict:
        return dict(self.config.get("sweep") or {})  # the sweep's overrides and search space (start_sweep)

    def where(self) -> str:
        return super().where().replace("mlflow: run", "mlflow: the sweep's run", 1) + ", a run nested in it per job"

    def _finish(self) -> None:
        for name in SWEEP_ARTIFACTS:
            if (self.run / name).exists():
                self.client.log_artifact(self.run_id, str(self.run / name))
        best = _yaml(self.run / "optimization_results.yaml")
        if isinstance(best.get("best_value"), (int, float)):
            self.client.log_metric(self.run_id, "best_value", float(best["best_value"]))
        ends = {RunDir(path.parent).ended() for path in self.run.path.glob("*/config.yaml")}
        self.client.set_terminated(self.run_id, "FINISHED" if ends == {"ok"} else
                                   "KILLED" if "interrupted" in ends else "FAILED")
        self.state["finished"] = True
        self._save()


def start(config: dict, run: RunDir, job=None) -> "Beside":
    """A run's MLflow run (a sweep's job: nested in the sweep's), following its epochs as they end, made
    beside the tasks' start (Beside). A server that takes no connection: a one-line ConfigError now."""
    uri = settings(config)["tracking_uri"]
    mlflow_store.answers(uri)
    parent = RunDir(run.path.parent).read_tracked().get(uri) if job else None

    def make() -> Tracked:
        tracked = made(Tracked, run, config, str(job) if job else "/".join(run.path.parts[-2:]), parent, live=True)
        tracked.follow()
        return tracked
    return Beside(make, uri, run)


class Beside:
    """A run's Tracked, made in a thread while its tasks start: MLflow's import and the run's creation
    (2.5 s) leave a short run's critical path. refused: the ConfigError of a store that cannot be used,
    once known (the launcher then ends the run, as for bad input); finish(): the Tracked's, once made."""

    def __init__(self, make, uri: str, run: RunDir):
        self.uri, self.run, self.tracked, self.refused, self.lost, self.said = uri, run, None, None, None, False
        self.thread = threading.Thread(target=self._make, args=(make,), name="mlflow-start", daemon=True)
        self.thread.start()

    def _make(self, make) -> None:
        try:
            self.tracked = make()
        except mlflow_store.Unreachable as exc:  # (it answered as the tasks started: a server lost since)
            self.lost = exc
            return
        except ConfigError as exc:
            self.refused = exc
            return
        if self.tracked.settings.get("log_model", True):
            with contextlib.suppress(Exception):  # (only sooner: log_model makes it anyway)
                private.get("mlflow_requirements_map")()

    def say_refused(self) -> int:
        """The refusal's one line, said once (as the launcher ends the run, or at the end); its exit status."""
        if not self.said:
            self.said = True
            print_error(self.refused)
        return 2

    def wait(self) -> "Beside":
        self.thread.join(timeout=120)
        return self

    def finish(self) -> None:
        """As Tracked's; a store found unusable only after the tasks ended: its one line (the run is kept)."""
        if self.wait().tracked:
            self.tracked.finish()
        elif self.refused:
            self.say_refused()
        elif self.lost:
            say_lost(self.uri, self.lost.why, self.run)


def start_sweep(config: dict, sweep_dir: Path) -> Tracked:
    """A sweep's parent run, which its jobs find in the sweep directory's mlflow.json. Its parameters: the
    sweep's overrides, and a search's space (hydra.sweeper.params) as search.<key>."""
    sweep_dir.mkdir(parents=True, exist_ok=True)
    hydra = config.get("hydra") or {}
    overrides = (hydra.get("overrides") or {}).get("task") or []
    swept = dict(split(o) for o in overrides if "=" in o and not o.startswith("hydra"))
    swept |= {f"search.{k}": str(v) for k, v in ((hydra.get("sweeper") or {}).get("params") or {}).items()}
    return made(TrackedSweep, RunDir(sweep_dir), {**config, "sweep": swept}, "/".join(sweep_dir.parts[-2:]))


def made(kind, run: RunDir, config: dict, name: str, parent: dict | None = None, live: bool = False) -> Tracked:
    """The MLflow run of `run` (live: running again, where a resumed run finished it before), or a one-line
    ConfigError."""
    try:
        tracked = kind(run, config, name, parent)
        if live:
            tracked.client.update_run(tracked.run_id, "RUNNING")
            tracked.state["finished"] = False
        return tracked
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - MLflow's errors are many: each is one line here
        lost = re.search(r"\[Errno -?\d+\]|Max retries exceeded|Connection (refused|reset|aborted)", str(exc))
        why = mlflow_store.short(exc)
        line = f"mlflow: the run cannot be created at {settings(config)['tracking_uri']} ({why})"
        raise (mlflow_store.Unreachable(line, why) if lost else ConfigError(line)) from None
