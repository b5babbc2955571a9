"""TensorBoard's HParams dashboard: each run a session (its hyperparameters, its metrics and how it
ended), a sweep one experiment (the hyperparameters it varies and the metrics it measures).

Written from what a run leaves (config.yaml, results.json, status.json), so a job that failed or was
killed is a session too, and a sweep's speed-ups (known only once every job has ended) are metrics.
The records are TensorBoard's own: hparams summaries from its hparams API (`summary_v2`, the functions
`tensorboard.plugins.hparams.api` exports, without the Keras callback that imports TensorFlow) and its
event-file record writer. No TensorFlow here: the launcher and the sweep's callback write these.
"""
import io
import math
import os
import time
from pathlib import Path

from tensorboard.compat.proto import event_pb2
from tensorboard.plugins.hparams import api_pb2, metadata, plugin_data_pb2
from tensorboard.plugins.hparams import summary_v2 as hp
from tensorboard.plugins.scalar.summary_v2 import scalar_pb
from tensorboard.summary.writer.record_writer import RecordWriter

from distrain.common import private, storage
from distrain.common.rundir import RunDir
from distrain.config import schema
from distrain.report.results import test_numbers

LOG_DIR = "tensorboard"  # <run dir>/tensorboard: the session; its train/ holds the per-epoch scalars
FILE = "events.out.tfevents.0.distrain-hparams"  # one per session, rewritten as the run's record grows

# The session's hyperparameters beyond the swept keys: name <- results.json key
FACTS = [("strategy", "strategy"), ("workers", "num_workers"), ("ps", "num_ps"), ("replicas", "num_replicas"),
         ("global_batch", "global_batch_size"), ("model", "model"), ("data", "data"), ("precision", "precision_policy")]
# Its metrics: the test loss and each test_<metric> of results.json, then these (tag <- results.json
# key; speedup and efficiency: the sweep's, from its summary), then each metric's last epoch_<name>
# from train/ (the per-epoch scalars).
SPEED = [("examples_per_sec", "examples_per_sec"), ("steps_per_sec", "steps_per_sec"),
         ("train_seconds", "train_seconds"), ("speedup", None), ("efficiency", None)]


def metrics(results: dict) -> list:
    """(tag, results.json key) of each number a run's results give the dashboard."""
    return [(key, key) for key in test_numbers(results)] + SPEED
STATUS = {"ok": api_pb2.STATUS_SUCCESS, "failed": api_pb2.STATUS_FAILURE, "interrupted": api_pb2.STATUS_FAILURE,
          "running": api_pb2.STATUS_RUNNING}


def log_session(run: RunDir, config: dict, swept: dict, row: dict | None = None) -> dict:
    """The run's session in <run_dir>/tensorboard: `swept` ({override key: value}) and its facts as
    hyperparameters, its results as metrics, its status.json as the session's end. `row`: the sweep
    summary's row of the job, for its speed-up and efficiency. Returns the hyperparameters."""
    results, status = run.read_results() or {}, run.read_status()
    values = {key: typed(value) for key, value in swept.items()} | facts(config, results)
    ended = _mtime(run.status)
    start = _mtime(run.config) or ended or time.time()
    num = (row or {}).get("job")
    num = status.get("job") if num is None else num
    summaries = [hp.hparams_pb(values, trial_id=f"job {num}" if num is not None else str(run.path),
                               start_time_secs=start)]  # (a sweep's job by its number, else the run directory)
    for tag, name in metrics(results):
        value = results.get(name) if name else (row or {}).get(tag)
        if isinstance(value, (int, float)) and math.isfinite(value):
            summaries.append(scalar_pb(tag, value))
    state = status.get("status") or ("ok" if results else "running")
    if state in STATUS and state != "running":
        end = plugin_data_pb2.SessionEndInfo(status=STATUS[state], end_time_secs=ended)
        # (the API has no session end: it is made as the API makes its own summaries)
        summaries.append(private.get("hparams_summary_pb")(metadata.SESSION_END_INFO_TAG,
                                        plugin_data_pb2.HParamsPluginData(session_end_info=end)))
    _write_events(run.tensorboard / FILE, summaries, wall_time=ended or start)
    return values, results


def log_experiment(log_dir: Path, sessions: list[tuple]) -> Path:
    """The experiment's columns, written once for a sweep in log_dir: every hyperparameter its sessions
    (log_session's) have, with the values they take as its domain, and every metric, named for people."""
    sessions, results = [values for values, _ in sessions], [found for _, found in sessions]
    names = list(dict.fromkeys(name for values in sessions for name in values))
    hparams = []
    for name in names:
        domain = sorted({v for values in sessions if (v := values.get(name)) is not None}, key=_order)
        hparams.append(hp.HParam(name, Swept(domain) if len({type(v) for v in domain}) == 1 else None))
    tags = list(dict.fromkeys(tag for found in results for tag, _ in metrics(found)))
    trained = list(dict.fromkeys(name for found in results for name in found.get("history") or {}
                                 if not name.startswith("val_")))
    columns = [hp.Metric(tag, display_name=tag.replace("_", " ")) for tag in tags or [t for t, _ in SPEED]]
    columns += [hp.Metric(f"epoch_{name}", group="train", display_name=f"final train {name}") for name in trained]
    return _write_events(Path(log_dir) / LOG_DIR / FILE, [hp.hparams_config_pb(hparams, columns)])


class Swept(hp.Discrete):
    """A hyperparameter's values, marked as differing where there are several: TensorBoard lists those
    first, and its table shows the first few as columns."""

    def update_hparam_info(self, hparam_info):
        super().update_hparam_info(hparam_info)
        hparam_info.differs = len(self.values) > 1


def facts(cfg: dict, results: dict) -> dict:
    """Strategy, workers, ps, replicas, global batch, model, data and precision: as results.json says,
    else (a run that failed before it finished) as much as its config.yaml says."""
    found = {name: results[key] for name, key in FACTS if results.get(key) is not None}
    if cfg and not results:
        strategy, cluster = cfg["strategy"]["name"], cfg.get("cluster", {})
        found["strategy"] = strategy
        if strategy not in schema.CLUSTER_STRATEGIES:
            found["workers"], found["ps"] = 1, 0
        elif cluster.get("name") == "local":  # (a real cluster's size is its spec's)
            found["workers"], found["ps"] = cluster.get("workers"), cluster.get("ps") if strategy == schema.PS else 0
        found["global_batch"] = cfg["trainer"]["batch_size"]
        found["model"], found["data"] = schema.label(cfg["model"]), schema.label(cfg["data"])
    return {name: typed(value) for name, value in found.items() if value is not None}


def typed(value):
    """A hyperparameter's value as TensorBoard takes it: a bool, number or string ("0.01" is 0.01)."""
    if isinstance(value, (bool, int, float)):
        return value
    text = str(value)
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _order(value):
    return (isinstance(value, str), value)


def _mtime(path: Path) -> float | None:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


def _write_events(path: Path, summaries: list, wall_time: float | None = None) -> Path:
    """An event file of these summaries, written whole (a TensorBoard reading the directory sees all of
    it or none). With `wall_time`, the same summaries make the same bytes (a kept run's files stay as
    they were)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    buffer, now = io.BytesIO(), wall_time or time.time()
    records = RecordWriter(buffer)
    records.write(event_pb2.Event(wall_time=now, file_version="brain.Event:2").SerializeToString())
    for summary in summaries:
        for value in summary.value:  # a session's map of hparams, in the order of its keys
            if value.metadata.plugin_data.plugin_name == metadata.PLUGIN_NAME:
                content = plugin_data_pb2.HParamsPluginData.FromString(value.metadata.plugin_data.content)
                value.metadata.plugin_data.content = content.SerializeToString(deterministic=True)
        records.write(event_pb2.Event(wall_time=now, step=0, summary=summary).SerializeToString(deterministic=True))
    return storage.write_atomic(path, buffer.getvalue())
