"""Sweeps (`python train.py -m ...`): a summary table and a plot at the end, whatever the launcher,
and a failed job that is a failed row rather than the end of the sweep.

Every multi-process test is bounded in time and checks that no process it caused is left behind.
"""
import csv
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import portpicker
import pytest
import yaml

from distrain.common import cluster
from distrain.common.rundir import RunDir
from distrain.launcher import supervisor, task_log
from distrain.report import dashboard, sweep

from helpers import ROOT, RUN_TIMEOUT, assert_nothing_left, ctrl_c, make_cfg, sweep_cli, tensorboard_values

TINY = ["model=mlp", "data=synthetic", "data.train_examples=512", "data.test_examples=128", "trainer.epochs=2",
        "trainer.batch_size=64", "trainer.save_model=false", "trainer.verbose=2"]
PNG = b"\x89PNG\r\n\x1a\n"
DISTRAIN = str(Path(sys.executable).parent / "distrain")  # the installed command


def read_csv(path: Path) -> list:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def is_png(path: Path) -> bool:
    return path.exists() and path.read_bytes()[:8] == PNG and path.stat().st_size > 5000


@pytest.fixture(scope="module")
def worker_sweep(tmp_path_factory):
    """multi_worker_mirrored over 1 and 2 workers, 64 examples a worker, the learning rate scaled with
    the global batch (trainer.lr_scaling=linear): run once, read by several tests."""
    sweep_dir = tmp_path_factory.mktemp("workers") / "sweep"
    out = sweep_cli(sweep_dir, "strategy=multi_worker_mirrored", "cluster.workers=1,2", *TINY,
                    "trainer.batch_size='${distrain.mul:64,${cluster.workers}}'", "trainer.lr_scaling=linear",
                    "trainer.reference_batch_size=64")
    return sweep_dir, out


@pytest.mark.slow
def test_a_sweep_ends_with_a_summary_table_and_a_scaling_plot(worker_sweep):
    sweep_dir, out = worker_sweep
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = read_csv(sweep_dir / "summary.csv")
    assert [(r["job"], r["cluster.workers"], r["status"]) for r in rows] == [("0", "1", "ok"), ("1", "2", "ok")]
    results = [json.loads((sweep_dir / r["run_dir"] / "results.json").read_text()) for r in rows]
    speedup = results[1]["examples_per_sec"] / results[0]["examples_per_sec"]
    assert float(rows[0]["speedup"]) == pytest.approx(1.0) and float(rows[0]["efficiency"]) == pytest.approx(1.0)
    assert float(rows[1]["speedup"]) == pytest.approx(speedup)
    assert float(rows[1]["efficiency"]) == pytest.approx(speedup / 2)  # 2 replicas against 1
    assert [r["replicas"] for r in rows] == ["1", "2"] and [r["per_replica_batch"] for r in rows] == ["64", "64"]
    # The learning rate grows with the global batch (Goyal et al.), and the first lines say so.
    rate = results[0]["learning_rate"]
    assert [(r["global_batch_size"], r["scaled_learning_rate"]) for r in results] == [(64, rate), (128, 2 * rate)]
    log = (sweep_dir / rows[1]["run_dir"] / "logs" / "worker-0.log").read_text()
    assert (f"learning rate {2 * rate:g} (trainer.learning_rate {rate:g} x 2: linear scaling, global batch 128 / "
            "reference 64)") in log
    assert float(rows[1]["test_accuracy"]) == pytest.approx(results[1]["test_accuracy"])
    # Control: a column the sweep did not vary is not a column of its own.
    assert "trainer.epochs" not in rows[0] and "cluster.workers" in rows[0]
    md = (sweep_dir / "summary.md").read_text()
    assert "| job | cluster.workers | status |" in md
    assert "weak scaling (per-replica batch 64 fixed" in md
    assert "| job | cluster.workers | status |" in out.stdout  # the same table on the terminal
    assert "job #1 (cluster.workers=2): ok - test accuracy" in out.stderr + out.stdout  # each job's closing line
    assert is_png(sweep_dir / "scaling.png")
    assert all(is_png(sweep_dir / r["run_dir"] / "curves.png") for r in rows)
    # Sweep jobs' lines carry the job number (TensorFlow's start-up lines stay in the task logs: below).
    assert "[#1 worker-0] " in out.stdout and "[#0] " in out.stdout
    assert "[#1 worker-1] " not in out.stdout  # the chief's progress only (test_a_quiet_task_shows_only_its_errors)
    # The resolved config goes to launcher.log, not to the terminal of every job.
    assert "cluster:\n  name: local" not in out.stdout + out.stderr
    assert "cluster:\n  name: local" in (sweep_dir / "0" / "launcher.log").read_text()
    # The sweep's process kept its fork server: job 1's tasks were forked from the one before it (a job that
    # starts a server logs it; test_jobs_whose_tensorflow_starts_otherwise_get_a_fork_server_each: the control).
    assert not (sweep_dir / rows[1]["run_dir"] / "logs" / "forkserver.log").exists()
    assert_nothing_left(sweep_dir)


@pytest.mark.slow
def test_jobs_whose_tensorflow_starts_otherwise_get_a_fork_server_each(tmp_path):
    """TensorFlow reads TF_ENABLE_ONEDNN_OPTS as it is imported: a job that sets it otherwise gets a server
    of its own, and its task runs the kernels it asked for; one that sets it alike shares (the control)."""
    sweep_dir = tmp_path / "sweep"
    out = sweep_cli(sweep_dir, "trainer.onednn=true,true,false", *TINY, process=True)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    results = [json.loads((sweep_dir / str(job) / "results.json").read_text()) for job in range(3)]
    assert [r["onednn"] for r in results] == [True, True, False]
    assert [(sweep_dir / str(job) / "logs" / "forkserver.log").exists() for job in range(3)] == [True, False, True]
    assert_nothing_left(sweep_dir)


@pytest.mark.slow
def test_summarize_rebuilds_the_summary_of_a_sweep_directory(worker_sweep, tmp_path):
    sweep_dir, _ = worker_sweep
    before = read_csv(sweep_dir / "summary.csv")
    for name in ("summary.csv", "summary.md", "scaling.png"):
        (sweep_dir / name).unlink()
    out = subprocess.run([DISTRAIN, "summarize", str(sweep_dir)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert read_csv(sweep_dir / "summary.csv") == before
    assert is_png(sweep_dir / "scaling.png") and "| job | cluster.workers |" in out.stdout
    bad = subprocess.run([DISTRAIN, "summarize", str(tmp_path / "nope")],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.startswith("error: ") and "Traceback" not in bad.stderr


@pytest.fixture(scope="module")
def device_sweep(tmp_path_factory):
    """Job 0 fails inside its training process (no such device; a TPU, which only TensorFlow looks for),
    job 1 trains: run once, read by the tests of failed rows and of TensorBoard's dashboard (on by
    default in sweeps)."""
    sweep_dir = tmp_path_factory.mktemp("devices") / "sweep"
    return sweep_dir, sweep_cli(sweep_dir, "strategy=one_device", "strategy.device=/tpu:0,/cpu:0", *TINY)


@pytest.mark.slow
def test_a_failed_first_job_is_a_failed_row_and_the_others_still_run(device_sweep):
    sweep_dir, out = device_sweep
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    assert "Traceback" not in out.stdout + out.stderr
    rows = read_csv(sweep_dir / "summary.csv")
    assert [(r["strategy.device"], r["status"], r["exit_status"]) for r in rows] == [
        ("/tpu:0", "failed", "2"), ("/cpu:0", "ok", "0")]
    assert rows[0]["error"].startswith("error: device /tpu:0 is not on this machine")  # the line naming the cause
    assert "error: device /tpu:0 is not on this machine" in rows[0]["log_tail"]  # the end of its log
    assert float(rows[1]["test_accuracy"]) > 0
    md = (sweep_dir / "summary.md").read_text()
    assert "## Job 0: failed (exit status 2)" in md and "device /tpu:0 is not on this machine" in md
    assert "job 0: failed: device /tpu:0 is not on this machine" in out.stdout
    assert is_png(sweep_dir / "scaling.png")  # accuracy against the swept value, from the ok job
    assert_nothing_left(sweep_dir)


@pytest.mark.slow
def test_a_sweep_is_one_experiment_of_tensorboards_hparams_dashboard(device_sweep):
    """A real TensorBoard server on 127.0.0.1, asked over HTTP what its HParams dashboard shows."""
    sweep_dir, out = device_sweep
    assert f"tensorboard --logdir {sweep_dir}" in out.stdout  # how to open it, said at the end
    screenshots = load_script("dashboard_screenshot")
    with open(sweep_dir.parent / "tensorboard.log", "w") as log:
        port = portpicker.pick_unused_port()
        server = screenshots.serve(sweep_dir, port, log)
        try:
            deadline = time.monotonic() + 60  # (a server may answer before it has read every event file)
            while True:
                experiment = ask(port, "experiment", {"experimentName": ""})
                groups = ask(port, "session_groups", {
                    "experimentName": "", "startIndex": 0, "sliceSize": 10, "colParams": [],
                    "allowedStatuses": ["STATUS_UNKNOWN", "STATUS_SUCCESS", "STATUS_FAILURE", "STATUS_RUNNING"]})
                if len(groups.get("sessionGroups", [])) >= 2 or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
        finally:
            screenshots.stop(server)
    hparams = {h["name"]: h for h in experiment["hparamInfos"]}
    assert hparams["strategy.device"]["domainDiscrete"] == ["/cpu:0", "/tpu:0"]
    assert hparams["strategy.device"]["differs"] and not hparams["strategy"].get("differs")  # (control)
    assert {"workers", "ps", "replicas", "global_batch", "model", "data", "precision"} <= set(hparams)
    metrics = [m["name"]["tag"] for m in experiment["metricInfos"]]
    assert {"test_accuracy", "test_loss", "examples_per_sec", "steps_per_sec", "train_seconds"} <= set(metrics)
    sessions = {g["name"]: g for g in groups["sessionGroups"]}
    assert sorted(sessions) == ["job 0", "job 1"]
    failed, ok = sessions["job 0"], sessions["job 1"]
    assert (failed["hparams"]["strategy.device"], ok["hparams"]["strategy.device"]) == ("/tpu:0", "/cpu:0")
    assert [s["status"] for s in failed["sessions"]] == ["STATUS_FAILURE"]
    assert [s["status"] for s in ok["sessions"]] == ["STATUS_SUCCESS"]
    accuracy = json.loads((sweep_dir / "1" / "results.json").read_text())["test_accuracy"]
    values = {m["name"]["tag"]: m["value"] for m in ok["metricValues"]}
    assert values["test_accuracy"] == pytest.approx(accuracy) and values["examples_per_sec"] > 0
    assert "test_accuracy" not in {m["name"]["tag"] for m in failed["metricValues"]}  # it measured nothing
    assert_nothing_left(sweep_dir.parent)  # the server too


@pytest.mark.slow
@pytest.mark.skipif(not shutil.which("chromium"), reason="no Chromium here: scripts/dashboard_screenshot.py "
                    "--install installs Debian's chromium package")
def test_a_browser_shows_the_hparams_dashboard(device_sweep, tmp_path):
    sweep_dir, _ = device_sweep
    shot = tmp_path / "hparams.png"
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "dashboard_screenshot.py"), str(sweep_dir), str(shot)],
                         capture_output=True, text=True, timeout=RUN_TIMEOUT)
    assert out.returncode == 0, out.stderr[-3000:]
    assert looks_like_tensorboard(shot)
    blank = tmp_path / "blank.png"  # the control: a page that is not TensorBoard's fails the check
    load_script("dashboard_screenshot").screenshot(shutil.which("chromium"), "about:blank", blank)
    assert not looks_like_tensorboard(blank)
    assert_nothing_left(sweep_dir.parent)


def looks_like_tensorboard(png: Path) -> bool:
    """A page as TensorBoard draws it: its orange bar across the top, and a page below it that is not
    blank (text and lines in many shades)."""
    from matplotlib import image

    pixels = image.imread(png)[..., :3]
    bar, page = pixels[5:50], pixels[60:]
    orange = abs(bar - [0.96, 0.49, 0.0]).max(axis=-1) < 0.06  # TensorBoard's header, #f57c00
    shades = len({tuple(p) for p in (page[::4, ::4] * 255).astype(int).reshape(-1, 3)})
    return orange.mean() > 0.5 and (page < 0.5).any(axis=-1).mean() > 0.002 and shades > 20


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def ask(port: int, what: str, request: dict) -> dict:
    """The HParams plugin's answer, as TensorBoard's page asks for it."""
    call = urllib.request.Request(f"http://127.0.0.1:{port}/data/plugin/hparams/{what}",
                                  data=json.dumps(request).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(call, timeout=60) as answer:
        return json.loads(answer.read())


@pytest.mark.slow
def test_joblib_runs_jobs_side_by_side_and_summarises_them(tmp_path):
    sweep_dir = tmp_path / "sweep"
    out = sweep_cli(sweep_dir, "hydra/launcher=joblib", "hydra.launcher.n_jobs=2",
                    "strategy=multi_worker_mirrored", "cluster.workers=1", "cluster.pin_workers=true",
                    "cluster.threads_per_worker=1", "trainer.learning_rate=0.001,0.002", *TINY,
                    process=True)  # (joblib's worker processes)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = read_csv(sweep_dir / "summary.csv")
    assert [(r["trainer.learning_rate"], r["status"]) for r in rows] == [("0.001", "ok"), ("0.002", "ok")]
    assert "[#0] " in out.stdout and "[#1] " in out.stdout  # two clusters' worker-0s told apart
    pinned = [json.loads((sweep_dir / r["run_dir"] / "cluster.json").read_text())["tasks"][0]["cores"]
              for r in rows]
    if "workers share cores" not in out.stdout + out.stderr:  # where both ran at once with a core each
        assert pinned[0] != pinned[1], pinned
    assert is_png(sweep_dir / "scaling.png")
    assert_nothing_left(sweep_dir)


@pytest.mark.slow
def test_optuna_search_on_tfrecord_shards_gets_each_trials_test_accuracy(tmp_path):
    """The shards written from an array source by `distrain write-tfrecords`, as a user moves to files."""
    from distrain.data import write_tfrecords

    shards = tmp_path / "shards"  # (the command's own code, in this process: TensorFlow is imported here already)
    assert write_tfrecords.main(["data=synthetic", "data.train_examples=512", "data.test_examples=128", f"out={shards}",
                           "shards=3"], lambda overrides: make_cfg(*overrides)) == 0
    assert sorted(p.name for p in shards.iterdir()) == \
        [f"test-0000{i}-of-00003.tfrecord" for i in range(3)] + [f"train-0000{i}-of-00003.tfrecord" for i in range(3)] \
        + ["write-tfrecords.log"]
    sweep_dir = tmp_path / "sweep"
    out = sweep_cli(sweep_dir, "hparams_search=optuna", "hydra.sweeper.n_trials=2",
                    *(o for o in TINY if not o.startswith("data")), "data=tfrecord",
                    f"data.train_files={shards}/train-*", f"data.test_files={shards}/test-*", "logger=mlflow",
                    "data.validation_split=0")  # (files hold out no validation: the objective is the test's, said)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert all(json.loads((sweep_dir / str(n) / "results.json").read_text())["data_source"] == "tfrecord"
               for n in (0, 1))
    accuracies = [json.loads((sweep_dir / str(n) / "results.json").read_text())["test_accuracy"] for n in (0, 1)]
    best = yaml.safe_load((sweep_dir / "optimization_results.yaml").read_text())
    assert best["best_value"] == pytest.approx(max(accuracies))
    assert yaml.safe_load((sweep_dir / "multirun.yaml").read_text())["hydra"]["sweeper"]["n_trials"] == 2  # (as grids)
    rows = read_csv(sweep_dir / "summary.csv")
    assert len(rows) == 2 and {"trainer.learning_rate", "trainer.batch_size"} <= set(rows[0])
    assert "Optuna: best value" in (sweep_dir / "summary.md").read_text()
    # logger=mlflow (its default store, beside the runs): the search a parent run, each trial nested in it.
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path}/outputs/mlflow.db")
    parent = client.get_run(json.loads((sweep_dir / "mlflow.json").read_text()).popitem()[1]["run_id"])
    trials = client.search_runs([parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    assert parent.data.metrics["best_value"] == pytest.approx(best["best_value"])
    assert parent.data.params["search.trainer.batch_size"] == "choice(64, 128, 256)"
    assert sorted(r.data.metrics["test_accuracy"] for r in trials) == pytest.approx(sorted(accuracies))
    assert_nothing_left(sweep_dir)


@pytest.mark.slow
def quiet_end(out: str) -> bool:
    """A sweep's output ends with its own closing line, and holds no traceback or Python warning (such as
    joblib's resource tracker warns of when its workers are killed)."""
    return not re.search(r"Traceback|Warning: |warnings\.warn", out) and out.splitlines()[-1].startswith(
        "interrupted by SIGINT: every job stopped")


def test_ctrl_c_stops_a_parallel_sweep_and_records_the_interrupted_jobs(tmp_path):
    """Ctrl-C reaches every job: the two running (jobs 0 and 1) stop their tasks at a step, the two
    queued (2 and 3) never start, the sweep's process waits for them (joblib would kill its workers
    mid-stop) and writes the summary; nothing but the sweep's own lines on the terminal."""
    sweep_dir = tmp_path / "sweep"
    code, out = ctrl_c(sweep_dir, ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "strategy=multi_worker_mirrored",
                                   "cluster.workers=1,2", "trainer.seed=1,2", "data=synthetic", "model=mlp",
                                   "trainer.epochs=1000", "trainer.verbose=2", "trainer.save_model=false"],
                       [sweep_dir / "0" / "logs" / "worker-0.log", sweep_dir / "1" / "logs" / "worker-0.log"])
    assert code == 130 and quiet_end(out), out[-3000:]
    for job in ("0", "1"):  # each training task stopped at a step, as SIGTERM asks, not killed mid-stop
        assert re.search(rf"^\[#{job}\] interrupted \(Ctrl-C\) at global step \d+: nothing saved \(trainer.save_model="
                         rf"false\); go on with trainer.resume=true hydra.run.dir=\S+/{job}$", out, re.M), out[-3000:]
        assert json.loads((sweep_dir / job / "cluster.json").read_text())["status"] == "interrupted"
    for job in ("2", "3"):  # queued: they never started a task
        assert not (sweep_dir / job / "logs").exists()
        assert json.loads((sweep_dir / job / "status.json").read_text())["error"] == \
            "not started: the sweep was interrupted by SIGINT"
    with open(sweep_dir / "summary.csv") as f:
        assert [row["status"] for row in csv.DictReader(f)] == ["interrupted"] * 4
    # Control: the check sees what joblib's killed workers left on the terminal before.
    assert not quiet_end(out + "/x/resource_tracker.py:468: UserWarning: resource_tracker: /loky-1-a: "
                               "FileNotFoundError(2)\n  warnings.warn('resource_tracker: %s: %r' % (name, e))")
    time.sleep(1)
    assert_nothing_left(sweep_dir)


def test_ctrl_c_stops_a_submitit_local_sweep_without_a_traceback(tmp_path):
    """submitit's local launcher: a controller process per job, which would print a traceback on Ctrl-C.
    (One task a job: the jobs' clusters stopping at a step, the joblib sweep above.)"""
    sweep_dir = tmp_path / "sweep"
    code, out = ctrl_c(sweep_dir, ["hydra/launcher=submitit_local", "trainer.seed=1,2", "data=synthetic", "model=mlp",
                                   "trainer.epochs=1000", "trainer.verbose=2", "trainer.save_model=false"],
                       [sweep_dir / "0" / "logs" / "train.log", sweep_dir / "1" / "logs" / "train.log"])
    assert code == 130 and quiet_end(out), out[-3000:]
    with open(sweep_dir / "summary.csv") as f:
        assert [row["status"] for row in csv.DictReader(f)] == ["interrupted"] * 2
    time.sleep(1)
    assert_nothing_left(sweep_dir)


# Pieces, without TensorFlow.

def _job(sweep_dir: Path, num: int, overrides: list, status=None, results=None):
    job_dir = sweep_dir / str(num)
    (job_dir / ".hydra").mkdir(parents=True)
    (job_dir / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    (job_dir / ".hydra" / "hydra.yaml").write_text(yaml.safe_dump({"hydra": {"job": {"num": num}}}))
    if status:
        (job_dir / "status.json").write_text(json.dumps(status))
    if results:
        (job_dir / "results.json").write_text(json.dumps(results))


def _results(strategy, replicas, batch, per_replica, speed):
    return {"strategy": strategy, "num_workers": replicas, "num_ps": 0, "num_replicas": replicas,
            "global_batch_size": batch, "per_replica_batch_size": per_replica, "examples_per_sec": speed,
            "steps_per_sec": speed / batch, "test_accuracy": 0.9, "test_loss": 0.3, "train_seconds": 5.0,
            "history": {"loss": [1.0, 0.5], "accuracy": [0.6, 0.8]}, "model": "cnn", "data": "synthetic"}


def test_partial_sweep_rows_and_weak_scaling(tmp_path):
    """An interrupted sweep: a job that never finished is an `incomplete` row; weak scaling is named."""
    ok = {"status": "ok", "exit_status": 0, "error": "", "log_tail": []}
    spent = {"time_split": {"input": 0.1, "compute": 0.6, "communication": 0.3}, "bound": "compute",
             "peak_rss_mib": {"worker-0": 410.5, "worker-1": 402.0}}
    _job(tmp_path, 0, ["cluster.workers=1", "x=1"], ok, _results("multi_worker_mirrored", 1, 128, 128, 1000.0))
    _job(tmp_path, 1, ["cluster.workers=2", "x=1"], ok, _results("multi_worker_mirrored", 2, 256, 128, 1800.0) | spent)
    _job(tmp_path, 2, ["cluster.workers=4", "x=1"])  # started, never finished
    rows, varying = sweep.collect(tmp_path)
    assert varying == ["cluster.workers"]
    assert [(r["job"], r["status"]) for r in rows] == [(0, "ok"), (1, "ok"), (2, "incomplete")]
    assert rows[1]["speedup"] == pytest.approx(1.8) and rows[1]["efficiency"] == pytest.approx(0.9)
    # Where each job's time went, and its largest task's peak memory (blank where a run did not say).
    assert [(r["communication"], r["bound"], r["peak_rss_mib"]) for r in rows[:2]] == [("", "", ""), (0.3, "compute",
                                                                                                      410.5)]
    assert sweep.scaling_notes(rows) == ["multi_worker_mirrored over 1/2 replicas: weak scaling (per-replica "
                                         "batch 128 fixed, work grows with the replicas)"]
    summary = sweep.summarize(tmp_path, out=open(os.devnull, "w"))
    assert summary.failed == [rows[2]] and is_png(tmp_path / "scaling.png")
    assert "| 0.10 | 0.60 | 0.30 | compute | 410 |" in (tmp_path / "summary.md").read_text()
    strong = [dict(r, global_batch=128, per_replica_batch=128 // r["replicas"]) for r in rows[:2]]
    assert sweep.scaling_notes(strong) == ["multi_worker_mirrored over 1/2 replicas: strong scaling (global batch "
                                           "128 fixed, split over the replicas)"]


def test_each_metric_a_run_measured_is_a_column_of_the_summary(tmp_path):
    """A regression sweep's test metrics (test_mae, test_rmse) beside its loss, in the summary and as
    columns of TensorBoard's HParams dashboard (the final training mae too); no accuracy to show."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.plugins.hparams import plugin_data_pb2

    ok = {"status": "ok", "exit_status": 0, "error": "", "log_tail": []}
    for num, rate in enumerate(("0.01", "0.02")):
        results = {k: v for k, v in _results("default", 1, 64, 64, 1000.0).items() if k != "test_accuracy"}
        _job(tmp_path, num, [f"trainer.learning_rate={rate}"], ok, results | {
            "test_mae": 0.25 + num, "test_rmse": 0.5 + num, "history": {"loss": [0.3], "mae": [0.2], "val_mae": [0.3]}})
        (tmp_path / str(num) / "config.yaml").write_text("trainer: {tensorboard: true}\n")
    sweep.summarize(tmp_path, out=open(os.devnull, "w"))
    rows = read_csv(tmp_path / "summary.csv")
    assert [(r["test_mae"], r["test_rmse"]) for r in rows] == [("0.25", "0.5"), ("1.25", "1.5")]
    header = (tmp_path / "summary.md").read_text().split("| job |")[1].splitlines()[0]
    assert "test_loss | test_mae | test_rmse |" in header and "test_accuracy" not in header
    [experiment] = [plugin_data_pb2.HParamsPluginData.FromString(value.metadata.plugin_data.content).experiment
                    for path in (tmp_path / dashboard.LOG_DIR).glob("events.*")
                    for event in EventFileLoader(str(path)).Load() for value in event.summary.value
                    if value.metadata.plugin_data.plugin_name == "hparams"]
    columns = [(m.name.group, m.name.tag) for m in experiment.metric_infos]
    assert columns[:3] == [("", "test_loss"), ("", "test_mae"), ("", "test_rmse")], columns
    assert ("train", "epoch_mae") in columns and ("", "test_accuracy") not in columns


def test_speedups_are_per_strategy_and_blank_without_a_scaling_dimension():
    rows = [{"status": "ok", **{k: v for k, v in zip(
        ("strategy", "replicas", "examples_per_sec", "global_batch", "per_replica_batch"), values)},
        "speedup": "", "efficiency": ""} for values in (
        ("mirrored", 1, 100.0, 64, 64), ("mirrored", 2, 150.0, 64, 32),
        ("default", 1, 120.0, 64, 64), ("default", 1, 90.0, 64, 64))]
    sweep.add_speedups(rows)
    assert [r["speedup"] for r in rows][:2] == [1.0, 1.5] and rows[1]["efficiency"] == 0.75
    assert rows[2]["speedup"] == rows[3]["speedup"] == ""  # replicas do not vary: nothing to scale against


def test_side_by_side_runs_pin_their_workers_to_different_cores(tmp_path):
    with cluster.CoreLocks(1, cores=[0, 1], lock_dir=tmp_path) as a, \
            cluster.CoreLocks(1, cores=[0, 1], lock_dir=tmp_path) as b:
        assert a.cores == [0] and b.cores == [1] and not a.shared and not b.shared
        with cluster.CoreLocks(1, cores=[0, 1], lock_dir=tmp_path) as c:  # none free: share, and say so
            assert c.cores == [0, 1] and "share" in c.shared
    with cluster.CoreLocks(2, cores=[0, 1], lock_dir=tmp_path) as d:  # released when the runs ended
        assert d.cores == [0, 1] and not d.shared


def test_tensorflow_startup_noise_goes_to_the_task_log_only(tmp_path, capfd):
    """What TensorFlow prints depends on the CPU (oneDNN's notice) and on CUDA: a task printing such
    lines stands in for it, so that this holds on every machine."""
    lines = ["oneDNN custom operations are on. You may see slightly different numerical results",
             "E0000 00:00:1 cuda_platform.cc:52] failed call to cuInit: INTERNAL: CUDA error",
             "Epoch 1/2 - 16 steps - 0.8s - loss: 2.2538 - accuracy: 0.1826"]
    task = supervisor.TaskProcess("worker-1", [sys.executable, "-c", f"print({chr(10).join(lines)!r})"])
    task.start(RunDir(tmp_path), prefix="[#1 worker-1] ")
    task.proc.wait(timeout=60)
    task.pump.join(timeout=10)
    shown = capfd.readouterr().out
    assert shown == f"[#1 worker-1] {lines[2]}\n"  # the terminal: the run's own line alone
    assert (tmp_path / "logs" / "worker-1.log").read_text() == "\n".join(lines) + "\n"  # the log: every line


def test_a_quiet_task_shows_only_its_errors(tmp_path, capfd):
    """A synchronous worker other than the chief: the same progress as the chief's, so only its
    errors reach the terminal (the test above is the control: a task that is not quiet shows its line)."""
    lines = ["Epoch 1/2 - 16 steps - 0.8s - loss: 2.2538 - accuracy: 0.1826", "error: worker 1 failed: fix it"]
    task = supervisor.TaskProcess("worker-1", [sys.executable, "-c", f"print({chr(10).join(lines)!r})"], quiet=True)
    task.start(RunDir(tmp_path), prefix="[worker-1] ")
    task.proc.wait(timeout=60)
    task.pump.join(timeout=10)
    shown = capfd.readouterr()
    assert shown.out == "" and shown.err == f"[worker-1] {lines[1]}\n"
    assert (tmp_path / "logs" / "worker-1.log").read_text() == "\n".join(lines) + "\n"


def test_tensorflow_startup_noise_is_recognised():
    assert task_log.is_noise(b"E0000 00:00:1 cuda_platform.cc:52] failed call to cuInit: INTERNAL: CUDA error")
    assert task_log.is_noise(b"WARNING: All log messages before absl::InitializeLog() is called are written")
    assert not task_log.is_noise(b"Epoch 1/2 - 16 steps - 0.8s - loss: 2.2538 - accuracy: 0.1826")
    # gRPC's retry of a lost task, whole or as the tail another thread's write cut off (seen in CI)
    assert task_log.is_noise(b'E0000 context.cc:911] Failed to remove function remotely due to failed to connect '
                                b'to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:42645: Failed to connect to '
                                b'remote host: Connection refused')
    assert task_log.is_noise(b".1:42475: Failed to connect to remote host: Connection refused")
    assert task_log.is_noise(b"E0000 coordination_service_agent.cc:332] Polled an error from coordination service "
                                b"(this can be an error from this or another task): UNAVAILABLE: The tasks have "
                                b"crashed. Check the task logs for an earlier error to debug further.")
    assert not task_log.is_noise(b"error: device /gpu:7 is not on this machine")


@pytest.mark.parametrize("line, prefixed, quiet, on_screen, where", [
    (b"Epoch 1/2 - loss: 2.2538", True, False, False, task_log.OUT),
    (b"Epoch 1/2 - loss: 2.2538", True, True, False, None),  # a quiet task's progress: its log only
    (b"error: worker 1 failed: fix it", True, True, False, task_log.ERR),  # ... but its error line
    (b"I0000 oneDNN custom operations are on.", True, False, False, None),  # noise: the log only
    (b"I0000 oneDNN custom operations are on.", False, False, False, None),
    (b"12/16 [===>..]\r16/16 [=====]", False, False, False, task_log.OUT),  # a bar, redrawn
    (b"12/16 [===>..]\rerror: the disk is full", False, False, True, task_log.ERR),  # an error after a bar
])
def test_a_task_output_line_goes_where_its_kind_says(line, prefixed, quiet, on_screen, where):
    assert task_log.route(line, prefixed, quiet, on_screen) == where
    assert task_log.last_state(b"1/2 [=>.]\r2/2 [==]\r") == b"2/2 [==]\n"


def test_jobs_killed_before_they_record_their_end_are_marked_interrupted(tmp_path):
    """joblib kills its workers on Ctrl-C, maybe before a job records how it ended: the job's status.json
    says "running" from its start, and the sweep marks such jobs (and their clusters) interrupted."""
    _job(tmp_path, 0, ["cluster.workers=1"], status={"status": "ok", "exit_status": 0},
         results=_results("multi_worker_mirrored", 1, 64, 64, 100.0))
    _job(tmp_path, 1, ["cluster.workers=2"], status={"status": "running", "exit_status": None, "job": 1})
    (tmp_path / "1" / "cluster.json").write_text(json.dumps({"status": "running", "tasks": []}))
    assert sweep.collect(tmp_path)[0][1]["status"] == "incomplete"  # until then: never finished
    sweep.mark_interrupted(tmp_path, "interrupted by SIGINT")
    assert json.loads((tmp_path / "0" / "status.json").read_text())["status"] == "ok"  # the control: left alone
    assert json.loads((tmp_path / "1" / "status.json").read_text()) == {
        "status": "interrupted", "exit_status": 130, "error": "interrupted by SIGINT", "job": 1}
    assert json.loads((tmp_path / "1" / "cluster.json").read_text())["status"] == "interrupted"
    assert [r["status"] for r in sweep.collect(tmp_path)[0]] == ["ok", "interrupted"]


def test_summarize_of_one_run_says_it_is_no_sweep_and_writes_nothing(tmp_path, capsys):
    _job(tmp_path, 0, ["trainer.seed=1"], status={"status": "ok", "exit_status": 0},
         results=_results("default", 1, 64, 64, 100.0))
    (tmp_path / "0" / "config.yaml").write_text("trainer: {}\n")  # (what makes it a run's directory)
    assert sweep.main([str(tmp_path / "0")]) == 2
    assert capsys.readouterr().err == f"error: {tmp_path / '0'} is a run's directory, not a sweep's: give the sweep " \
        f"directory a multirun made (multirun/DATE/TIME); its figures are in {tmp_path / '0' / 'results.json'}\n"
    assert not (tmp_path / "0" / "summary.csv").exists()
    assert sweep.main([str(tmp_path)]) == 0 and (tmp_path / "summary.csv").exists()  # control: its sweep's


def test_each_job_is_a_session_and_the_sweep_one_experiment(tmp_path):
    """The dashboard's records, read back as TensorBoard reads them: a session per job (a failed one
    too, with what its config says), the speed-ups as metrics, and the sweep's columns written once."""
    ok = {"status": "ok", "exit_status": 0, "error": "", "log_tail": []}
    _job(tmp_path, 0, ["cluster.workers=1"], ok, _results("multi_worker_mirrored", 1, 64, 64, 1000.0))
    _job(tmp_path, 1, ["cluster.workers=2"], ok, _results("multi_worker_mirrored", 2, 64, 32, 1500.0))
    _job(tmp_path, 2, ["cluster.workers=4"], {"status": "failed", "exit_status": 1, "error": "lost", "log_tail": []})
    for num, workers in enumerate((1, 2, 4)):
        (tmp_path / str(num) / "config.yaml").write_text(yaml.safe_dump({
            "strategy": {"name": "multi_worker_mirrored"}, "cluster": {"name": "local", "workers": workers, "ps": 0},
            "trainer": {"tensorboard": True, "batch_size": 64}, "model": {"name": "cnn"}, "data": {"name": "mnist"}}))
    sweep.summarize(tmp_path, out=open(os.devnull, "w"))
    (experiment,) = tensorboard_values(tmp_path / "tensorboard")["_hparams_/experiment"]
    columns = {h.name: h for h in experiment.hparam_infos}
    assert list(columns["cluster.workers"].domain_discrete.values) and columns["cluster.workers"].differs
    assert [v.number_value for v in columns["cluster.workers"].domain_discrete.values] == [1, 2, 4]
    assert not columns["strategy"].differs  # the control: one value
    sessions = [tensorboard_values(tmp_path / str(n) / "tensorboard") for n in range(3)]
    starts = [s["_hparams_/session_start_info"][0] for s in sessions]
    assert [s.group_name for s in starts] == ["job 0", "job 1", "job 2"]
    assert [s.hparams["cluster.workers"].number_value for s in starts] == [1, 2, 4]
    assert starts[2].hparams["workers"].number_value == 4 and starts[2].hparams["data"].string_value == "mnist"
    assert "replicas" not in starts[2].hparams  # a failed run's facts are its config's, not measured ones
    assert [s["_hparams_/session_end_info"][0].status for s in sessions] == [1, 1, 2]  # success, success, failure
    assert sessions[1]["speedup"] == [pytest.approx(1.5)] and sessions[1]["efficiency"] == [pytest.approx(0.75)]
    assert "test_accuracy" not in sessions[2]
    # A sweep without TensorBoard logs (trainer.tensorboard=false) gets none.
    (tmp_path / "2" / "config.yaml").write_text("trainer:\n  tensorboard: false\n")
    for num in (0, 1):
        (tmp_path / str(num) / "config.yaml").unlink()
    shutil.rmtree(tmp_path / "tensorboard")
    sweep.summarize(tmp_path, out=open(os.devnull, "w"))
    assert not (tmp_path / "tensorboard").exists()


@pytest.mark.parametrize("given, taken", [("2", 2), ("0.001", 0.001), ("true", True), ("/cpu:0", "/cpu:0"),
                                          (3, 3), ("[1,2]", "[1,2]")])
def test_hyperparameters_take_tensorboards_types(given, taken):
    assert dashboard.typed(given) == taken and type(dashboard.typed(given)) is type(taken)


def test_a_run_s_curves_draw_the_test_loss_and_the_test_metric(tmp_path, monkeypatch):
    from distrain.report import plots

    results = {"history": {"loss": [2.3, 1.1], "accuracy": [0.4, 0.7]}, "test_accuracy": 0.93, "test_loss": 0.25,
               "strategy": "mirrored", "model": "cnn", "data": "mnist", "num_replicas": 2, "global_batch_size": 256}
    drawn = []
    monkeypatch.setattr(plots, "save", lambda fig, path: drawn.append(
        [[t.get_text() for t in ax.get_legend().get_texts()] for ax in fig.axes]))
    plots.curves(results, tmp_path / "curves.png")
    plots.curves({k: v for k, v in results.items() if k != "test_loss"}, tmp_path / "curves.png")  # the control
    assert drawn == [[["training", "test: 0.25"], ["training", "test: 93.00%"]], [["training"], ["training",
                                                                                                 "test: 93.00%"]]]


def test_a_run_s_curves_are_the_picture_matplotlib_lays_out_and_draw_once(tmp_path, monkeypatch):
    """curves.png is pixel for pixel the figure laid out by tight_layout and saved as matplotlib's
    defaults save it, with one draw instead of two (control: other margins give another picture)."""
    import matplotlib.figure
    from PIL import Image, ImageChops

    from distrain.report import plots

    results = {"history": {"loss": [2.3, 1.1, 0.6], "accuracy": [0.4, 0.7, 0.9], "time_input": [0.1] * 3},
               "test_accuracy": 0.93, "strategy": "mirrored", "model": "cnn", "data": "mnist", "num_replicas": 2,
               "global_batch_size": 256}
    draws, draw = [], matplotlib.figure.Figure.draw
    monkeypatch.setattr(matplotlib.figure.Figure, "draw", lambda *a, **k: draws.append(1) or draw(*a, **k))
    plots.curves(results, tmp_path / "curves.png")
    assert len(draws) == 1
    monkeypatch.setattr(plots, "save", lambda fig, path: (fig.tight_layout(), fig.savefig(path, dpi=100)))
    plots.curves(results, tmp_path / "matplotlib.png")
    monkeypatch.setattr(plots, "save", lambda fig, path: (fig.subplots_adjust(left=0.1), fig.savefig(path, dpi=100)))
    plots.curves(results, tmp_path / "other.png")
    picture = lambda name: Image.open(tmp_path / name).convert("RGB")
    assert ImageChops.difference(picture("curves.png"), picture("matplotlib.png")).getbbox() is None
    assert ImageChops.difference(picture("curves.png"), picture("other.png")).getbbox() is not None


@pytest.mark.parametrize("values, log", [(["0.0005", "0.001", "0.002", "0.004"], True), (["64", "96", "128"], False)])
def test_a_sweep_over_a_number_plots_against_its_values_as_ticks(monkeypatch, tmp_path, values, log):
    """scaling.png of a sweep over one number: the swept values, as written, are the ticks (matplotlib's own
    ran together for rates: 0.00100 0.00125 ...), on a log axis where they grow by factors."""
    from distrain.report import plots

    drawn = []
    monkeypatch.setattr(plots, "save", lambda fig, path: drawn.append(fig))
    rows = [{"key": v, "test_accuracy": 0.9, "examples_per_sec": 1000.0} for v in values]
    plots.by_value(rows, "key", tmp_path / "scaling.png")
    for ax in drawn[0].axes:
        assert [t.get_text() for t in ax.get_xticklabels()] == values
        assert ax.get_xscale() == ("log" if log else "linear")
