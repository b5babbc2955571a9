"""MLflow tracking (logger=mlflow), against a real `mlflow server` this module starts on 127.0.0.1 with a
SQLite store in a temporary directory (and stops), read back with MlflowClient: one MLflow run per run
whatever its workers, restarts and resumes; a sweep's parent with a run per job; a server lost mid-run
costs a warning, and `distrain log` completes the run; the default store needs no server.

Every multi-process test is bounded in time and checks that no process it caused is left behind.
"""
import json
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

from distrain.common.rundir import RunDir
from distrain.config.validate import validate
from distrain.report import results as report
from distrain.report import tracking

from helpers import (
    RUN_TIMEOUT,
    MlflowServer,
    assert_nothing_left,
    here,
    kill_in_epoch_2,
    make_cfg,
    run_cli,
    sweep_cli,
    while_running,
)

TINY = ["model=mlp", "data=synthetic", "data.train_examples=512", "data.test_examples=128", "trainer.batch_size=64",
        "trainer.verbose=2"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("mlflow")
    found = MlflowServer(root).start()
    yield found
    found.stop()
    assert_nothing_left(root)


def distrain_log(cwd: Path, *args) -> tuple[int, str, str]:
    """`distrain log ARGS` from cwd, in this process (as the docs' commands run): exit status, stdout, stderr."""
    return here(cwd, ["log", *map(str, args)])


def tracked(run_dir: Path, uri: str) -> dict:
    return json.loads((run_dir / "mlflow.json").read_text())[uri]


def steps(client, run_id: str, key: str) -> list:
    return sorted(m.step for m in client.get_metric_history(run_id, key))


def runs_of(client, experiment: str) -> list:
    found = client.get_experiment_by_name(experiment)
    return client.search_runs([found.experiment_id]) if found else []


def same_predictions(model_uri: str, run_dir: Path, uri: str) -> float:
    """The largest difference between the MLflow model's pyfunc predictions and plain Keras's, on 16
    random inputs of the run's shape."""
    import mlflow
    import tf_keras

    shape = json.loads((run_dir / "results.json").read_text())["input_shape"]
    x = np.random.default_rng(0).random((16, *shape), dtype=np.float32)
    mlflow.set_tracking_uri(uri)
    pyfunc = mlflow.pyfunc.load_model(model_uri).predict(x)
    keras = tf_keras.models.load_model(str(run_dir / "saved_model")).predict(x, verbose=0)
    control = tf_keras.models.load_model(str(run_dir / "saved_model")).predict(x[::-1], verbose=0)
    assert np.abs(pyfunc - control).max() > 1e-3  # (the comparison can fail: other inputs, other outputs)
    return float(np.abs(pyfunc - keras).max())


@pytest.mark.slow
def test_a_two_worker_run_killed_restarted_and_resumed_is_one_mlflow_run(server, tmp_path):
    """multi_worker_mirrored on 2 workers, worker-1 killed in epoch 2 (the cluster restarts from its
    checkpoint), then resumed for one epoch more: one MLflow run, each epoch's metrics once, the config
    as parameters, the run's files, and a model whose pyfunc predicts as plain Keras."""
    run_dir = tmp_path / "run"
    args = [*TINY, "strategy=multi_worker_mirrored", "cluster.workers=2", "cluster.max_restarts=1", "logger=mlflow",
            f"logger.mlflow.tracking_uri={server.uri}", "logger.mlflow.experiment=workers",
            "+logger.mlflow.tags.team=vision", "trainer.epochs=3", "trainer.steps_per_epoch=30"]
    code, out = while_running(run_dir, *args, chaos=kill_in_epoch_2(run_dir / "logs" / "worker-1.log", run_dir,
                                                                    "worker-1"))
    assert code == 0, out[-3000:]
    assert json.loads((run_dir / "results.json").read_text())["task_restarts"], out[-3000:]
    first = tracked(run_dir, server.uri)
    done = run_cli(run_dir, *args, "trainer.resume=true", "trainer.epochs=4")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    client = server.client()
    (run,) = runs_of(client, "workers")  # one run: not one per worker, restart or resume
    state = tracked(run_dir, server.uri)
    assert run.info.run_id == first["run_id"] == state["run_id"] and run.info.status == "FINISHED"
    assert f"mlflow: run {run.info.run_id} in experiment workers at {server.uri} ({server.uri}/#/experiments/" \
           f"{run.info.experiment_id}/runs/{run.info.run_id})" in done.stdout + done.stderr  # (its page in the UI)
    assert "View run" not in done.stdout + done.stderr  # (MLflow's own links: ours is the line above)
    for key in ("loss", "accuracy", "time_compute", "epoch_examples_per_sec"):
        assert steps(client, run.info.run_id, key) == [1, 2, 3, 4], key
    assert run.data.params["strategy.name"] == "multi_worker_mirrored" and run.data.params["cluster.workers"] == "2"
    assert run.data.tags["team"] == "vision" and run.data.tags["num_workers"] == "2"
    assert run.data.tags["num_replicas"] == "2" and "distrain.version" in run.data.tags
    results = json.loads((run_dir / "results.json").read_text())
    assert run.data.metrics["test_accuracy"] == pytest.approx(results["test_accuracy"])
    assert results["mlflow_run_id"] == run.info.run_id
    files = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"config.yaml", "results.json", "metrics.csv", "curves.png", "logs"} <= files
    assert "worker-1.log" in {Path(a.path).name for a in client.list_artifacts(run.info.run_id, "logs")}
    assert same_predictions(state["model"], run_dir, server.uri) < 1e-5
    assert_nothing_left(tmp_path)


@pytest.mark.slow
def test_a_parameter_server_run_is_logged_by_its_coordinator_alone(server, tmp_path):
    run_dir = tmp_path / "run"
    done = run_cli(run_dir, *TINY, "strategy=parameter_server", "cluster.workers=2", "cluster.ps=1",
                   "trainer.epochs=2", "logger=mlflow", f"logger.mlflow.tracking_uri={server.uri}",
                   "logger.mlflow.experiment=ps")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    client = server.client()
    (run,) = runs_of(client, "ps")
    assert run.data.tags["strategy"] == "parameter_server" and run.data.tags["num_ps"] == "1"
    assert steps(client, run.info.run_id, "loss") == [1, 2]
    assert same_predictions(tracked(run_dir, server.uri)["model"], run_dir, server.uri) < 1e-5
    assert_nothing_left(tmp_path)


@pytest.mark.slow
def test_a_sweep_is_a_parent_run_with_a_nested_run_per_job(server, tmp_path):
    sweep_dir = tmp_path / "sweep"
    out = sweep_cli(sweep_dir, *TINY, "trainer.epochs=1", "trainer.learning_rate=0.001,0.002",
                    "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "trainer.save_model=false", "logger=mlflow",
                    f"logger.mlflow.tracking_uri={server.uri}", "logger.mlflow.experiment=sweep")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    client = server.client()
    runs = runs_of(client, "sweep")
    parent = tracked(sweep_dir, server.uri)["run_id"]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent]
    assert len(runs) == 3 and len(children) == 2, [r.data.tags for r in runs]
    assert sorted(r.data.params["trainer.learning_rate"] for r in children) == ["0.001", "0.002"]
    assert all(r.info.status == "FINISHED" for r in runs)
    assert {"summary.csv", "summary.md"} <= {a.path for a in client.list_artifacts(parent)}
    assert client.get_run(parent).data.params["trainer.learning_rate"] == "0.001,0.002"
    # The same sweep logged after the fact (as one made without the logger: no mlflow.json), elsewhere.
    copy = tmp_path / "copy"
    shutil.copytree(sweep_dir, copy)
    for found in copy.rglob("mlflow.json"):
        found.unlink()
    code, out, err = distrain_log(tmp_path, copy, f"logger.mlflow.tracking_uri={server.uri}",
                                  "logger.mlflow.experiment=after")
    assert code == 0, out + err
    after = runs_of(client, "after")
    parent = tracked(copy, server.uri)["run_id"]
    assert len(after) == 3 and sorted(r.data.tags.get("mlflow.parentRunId") == parent for r in after) == \
        [False, True, True]
    assert sorted(steps(client, r.info.run_id, "loss") for r in after) == [[], [1], [1]]
    assert_nothing_left(tmp_path)


@pytest.mark.slow
def test_a_server_lost_mid_run_costs_a_warning_and_distrain_log_completes_the_run(server, tmp_path):
    """The server stops once the run's task has started (its MLflow run made before): the run goes on to
    rc 0 with one warning; with the server back, `distrain log RUN` logs the rest (each epoch once, the
    model), and again says it is logged."""
    run_dir = tmp_path / "run"
    args = [*TINY, "trainer.epochs=6", "trainer.steps_per_epoch=100", "logger=mlflow",
            f"logger.mlflow.tracking_uri={server.uri}", "logger.mlflow.experiment=lost"]

    def chaos(run):
        deadline = time.monotonic() + RUN_TIMEOUT
        # (its MLflow run is made beside the task's start: a server lost before that is another test's)
        while not ((run_dir / "logs" / "train.log").exists() and (run_dir / "mlflow.json").exists()):
            assert run.poll() is None and time.monotonic() < deadline, "the task never started"
            time.sleep(0.05)
        server.stop()
    try:
        code, out = while_running(run_dir, *args, chaos=chaos)
    finally:
        server.stop()
        server.start()
    assert code == 0, out[-3000:]
    assert out.count(f"mlflow: cannot log to {server.uri}") == 1, out[-3000:]
    assert f"distrain log {run_dir}" in out
    state = tracked(run_dir, server.uri)
    assert state["epochs_logged"] < 6 and not state.get("finished")
    code, out, err = distrain_log(tmp_path, run_dir, f"logger.mlflow.tracking_uri={server.uri}")
    assert code == 0, out + err
    client = server.client()
    (run,) = runs_of(client, "lost")
    assert run.info.status == "FINISHED" and steps(client, run.info.run_id, "loss") == [1, 2, 3, 4, 5, 6]
    assert tracked(run_dir, server.uri)["model"]
    code, out, err = distrain_log(tmp_path, run_dir, f"logger.mlflow.tracking_uri={server.uri}")
    assert code == 0 and "logged already" in out, out + err
    assert len(runs_of(client, "lost")) == 1
    assert_nothing_left(tmp_path)


@pytest.mark.slow
def test_the_default_store_needs_no_server_and_a_run_logged_after_the_fact_is_logged_alike(tmp_path):
    """logger=mlflow with no URI: a SQLite store in outputs/. The same run's directory without metrics.csv
    (as a run made with logger=tensorboard has none), logged after the fact, gives the same epochs' metrics
    from its results.json. Control: its history changed, they differ."""
    from mlflow.tracking import MlflowClient

    run_dir = tmp_path / "run"
    done = run_cli(run_dir, *TINY, "trainer.epochs=3", "trainer.validate_every=2", "logger=mlflow",
                   "trainer.save_model=false")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    uri = f"sqlite:///{tmp_path}/outputs/mlflow.db"  # (beside the runs Hydra makes from here)
    live = tracked(run_dir, uri)
    client = MlflowClient(uri)

    def history(run_id):
        return {k: [(m.step, m.value) for m in sorted(client.get_metric_history(run_id, k), key=lambda m: m.step)]
                for k in client.get_run(run_id).data.metrics if k not in ("seconds_to_first_step",)}

    for name, change in (("copy", None), ("changed", 0.5)):
        copy = tmp_path / name
        shutil.copytree(run_dir, copy)
        (copy / "metrics.csv").unlink()
        (copy / "mlflow.json").unlink()
        if change:
            results = json.loads((copy / "results.json").read_text())
            results["history"]["loss"][1] += change
            (copy / "results.json").write_text(json.dumps(results))
        code, out, err = distrain_log(tmp_path, copy)
        assert code == 0, out + err
        after = tracked(copy, uri)["run_id"]
        assert (history(after) == history(live["run_id"])) == (change is None), name
    assert [s for s, _ in history(live["run_id"])["val_loss"]] == [2, 3]
    failed = run_cli(tmp_path / "diverged", *TINY, "trainer.epochs=1", "optimizer=sgd", "trainer.learning_rate=1e30",
                     "logger=mlflow")  # (a run that fails: its MLflow run is marked so, with its error line)
    assert failed.returncode == 2, failed.stdout[-3000:] + failed.stderr[-3000:]
    run = client.get_run(tracked(tmp_path / "diverged", uri)["run_id"])
    assert run.info.status == "FAILED" and "NaN" in run.data.tags["error"], run.data.tags
    assert_nothing_left(tmp_path)


HISTORY = {"loss": [1.0, 0.5, 0.25], "accuracy": [0.5, 0.7, 0.9], "time_input": [0.1, 0.2, 0.1],
           "time_steps_seconds": [1.0, 1.0, 1.0], "val_loss": [0.6, 0.3]}


@pytest.mark.parametrize("epochs, every, validated", [(3, 2, [2, 3]), (3, 1, [1, 2]), (5, 2, [2])])
def test_an_epoch_s_row_holds_its_figures_and_its_validation_where_it_validated(epochs, every, validated):
    """metrics.csv's rows (and what a tracker logs per epoch) from a history: val_* at the epochs that
    validated (every validate_every-th and the last of `epochs`: a run stopped early validated fewer)."""
    history = {**HISTORY, "val_loss": HISTORY["val_loss"][:len(validated)]}
    rows = report.epoch_rows(history, [2.0, 1.0, 4.0], 1000, epochs, every)
    assert [r["epoch"] for r in rows] == [1, 2, 3] and [r["loss"] for r in rows] == history["loss"]
    assert [r["epoch"] for r in rows if r["val_loss"] is not None] == validated
    assert [r["epoch_examples_per_sec"] for r in rows] == [500.0, 1000.0, 250.0]
    assert all("time_steps_seconds" not in r for r in rows)


def test_metrics_csv_is_read_back_as_it_was_written(tmp_path):
    run = RunDir(tmp_path)
    rows = report.epoch_rows(HISTORY, [2.0, 1.0, 4.0], 1000, 3, 2)
    run.write_metrics(rows)
    header = (tmp_path / "metrics.csv").read_text().splitlines()[0]
    assert header == "epoch,loss,accuracy,time_input,val_loss,epoch_examples_per_sec"
    assert run.read_metrics() == [{k: v for k, v in row.items() if v is not None} for row in rows]
    assert RunDir(tmp_path / "none").read_metrics() is None


def test_the_config_is_flattened_to_parameters_mlflow_takes(tmp_path, monkeypatch):
    params = tracking.flat({"trainer": {"epochs": 3, "tags": {}}, "strategy": {"devices": ["/cpu:0", "/cpu:1"]},
                            "note": "x" * 7000})
    assert params == {"trainer.epochs": "3", "trainer.tags": "{}", "strategy.devices": "['/cpu:0', '/cpu:1']",
                      "note": "x" * tracking.MAX_VALUE}
    monkeypatch.chdir(tmp_path)
    found = tracking.settings(validate(make_cfg("logger=mlflow", "model=mlp", "data=synthetic")))
    assert found["tracking_uri"] == f"sqlite:///{tmp_path}/outputs/mlflow.db" and found["experiment"] == "synthetic-mlp"
    named = tracking.settings({"logger": {"mlflow": {"tracking_uri": "sqlite:///here.db", "experiment": "e"}}})
    assert named["tracking_uri"] == f"sqlite:///{tmp_path}/here.db" and named["experiment"] == "e"


@pytest.mark.parametrize("chosen, loggers", [("tensorboard", ["tensorboard"]), ("csv", ["csv"]),
                                             ("[tensorboard,mlflow]", ["tensorboard", "mlflow"]),
                                             ("many", ["tensorboard", "csv", "mlflow"])])
def test_the_logger_group_takes_one_option_or_several(chosen, loggers):
    cfg = validate(make_cfg(f"logger={chosen}"))
    assert list(cfg.logger) == loggers
    assert tracking.wanted(cfg) == ("mlflow" in loggers)


def test_a_store_lost_while_the_run_is_made_is_a_lost_server(caplog, capsys, tmp_path):
    """MLflow's run is made beside the tasks' start: a server that stops answering meanwhile costs the
    lost server's one warning, the run kept; the control: a store that answers and refuses is bad input."""
    from distrain.common.errors import ConfigError
    from distrain.common.rundir import RunDir
    from distrain.report import mlflow_store, tracking

    def lost():
        raise mlflow_store.Unreachable("mlflow: the run cannot be created at http://127.0.0.1:1 (Connection refused)",
                                   "Connection refused")

    beside = tracking.Beside(lost, "http://127.0.0.1:1", RunDir(tmp_path))
    beside.finish()
    assert beside.refused is None and caplog.text.count("mlflow: cannot log to http://127.0.0.1:1 (Connection "
                                                        "refused): the run goes on") == 1

    def deleted():
        raise ConfigError("the MLflow experiment x is deleted: restore it")

    refused = tracking.Beside(deleted, "http://127.0.0.1:1", RunDir(tmp_path)).wait()
    assert refused.lost is None and str(refused.refused).startswith("the MLflow experiment x is deleted")
    capsys.readouterr()
    assert refused.say_refused() == 2  # (as the launcher ends the run), then at its end: said once
    refused.finish()
    assert capsys.readouterr().err.count("error: the MLflow experiment x is deleted") == 1


@pytest.mark.slow
def test_a_refused_resume_leaves_the_runs_mlflow_run_as_it_was(tmp_path):
    """trainer.resume=true with fewer epochs than the run trained is refused by its task (exit 2): the run's
    MLflow run stays FINISHED (it was left RUNNING), no other run is made; the control: a resume that
    trains ends it FINISHED again, with its new epochs."""
    from mlflow.tracking import MlflowClient

    run_dir = tmp_path / "run"
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    tracked = ["logger=mlflow", f"logger.mlflow.tracking_uri={uri}", "logger.mlflow.log_model=false"]
    assert run_cli(run_dir, *TINY, "trainer.epochs=2", *tracked).returncode == 0
    client = MlflowClient(uri)
    run_id = json.loads((run_dir / "mlflow.json").read_text())[uri]["run_id"]
    experiment = client.get_run(run_id).info.experiment_id
    refused = run_cli(run_dir, *TINY, "trainer.epochs=1", "trainer.resume=true", *tracked)
    assert refused.returncode == 2 and "has trained 2 epoch(s) already" in refused.stderr, refused.stderr[-2000:]
    assert client.get_run(run_id).info.status == "FINISHED"
    assert [r.info.run_id for r in client.search_runs([experiment])] == [run_id]
    assert run_cli(run_dir, *TINY, "trainer.epochs=3", "trainer.resume=true", *tracked).returncode == 0
    assert client.get_run(run_id).info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(run_id, "loss")] == [1, 2, 3]


@pytest.mark.slow
def test_a_sweep_s_jobs_fork_from_a_server_started_beside_its_parent_run(tmp_path):
    """A sweep whose jobs run one after another in its process: the fork server they fork from started as
    the sweep started (its log in the sweep's logs/), importing TensorFlow while MLflow makes the parent run,
    not by the first job. Control: a run started alone starts its own (its log in the run's logs/)."""
    sweep_dir = tmp_path / "sweep"
    out = sweep_cli(sweep_dir, *TINY, "trainer.epochs=1", "trainer.learning_rate=0.001,0.002",
                    "trainer.save_model=false", "logger=mlflow", process=True)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert (sweep_dir / "logs" / "forkserver.log").exists()
    assert [RunDir(sweep_dir / job).ended() for job in ("0", "1")] == ["ok", "ok"]
    assert not list(sweep_dir.glob("*/logs/forkserver.log"))
    alone = run_cli(tmp_path / "alone", *TINY, "trainer.epochs=1", "trainer.save_model=false", process=True)
    assert alone.returncode == 0 and (tmp_path / "alone" / "logs" / "forkserver.log").exists()
    assert_nothing_left(tmp_path)
