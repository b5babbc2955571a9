"""The Optuna search (hparams_search=optuna, hydra_plugins/distrain_optuna_sweeper): trials tuned on
validation, started as slots free, pruned from inside their runs under every strategy, its bad input
refused before any trial, and what the study tells (summary, storage, plots)."""
import csv
import json
import os
import re
import threading
import time

import pytest
import yaml
from hydra.core.utils import JobReturn, JobStatus
from omegaconf import OmegaConf, open_dict

from distrain.common.errors import ConfigError

from helpers import assert_nothing_left, make_cfg, sweep_cli

TINY = ["model=mlp", "data=synthetic", "data.train_examples=512", "data.test_examples=128", "trainer.batch_size=64"]
PNG = b"\x89PNG\r\n\x1a\n"


def read_csv(path) -> list:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


class ScoreLauncher:
    """A launcher whose jobs score their overrides at once (no runs): the sweeper alone under test.
    hold: {trial number: an event its job waits for}; events: ("start" or "end", job number), in order."""

    def __init__(self, hold=None):
        self.jobs, self.events, self.hold = [], [], hold or {}

    def launch(self, overrides, initial_job_idx):
        self.jobs += [(initial_job_idx + i, dict(o.split("=", 1) for o in job)) for i, job in enumerate(overrides)]
        returns = []
        for number, job in enumerate(overrides, start=initial_job_idx):
            self.events.append(("start", number))
            if number in self.hold:
                self.hold[number].wait(timeout=10)
            values = dict(o.split("=", 1) for o in job)
            ret = JobReturn(status=JobStatus.COMPLETED)
            # job 1 "fails" as a job that returns no number does (cli.JobFailed)
            ret.return_value = None if number == 1 else -abs(float(values["lr"]) - 0.003)
            returns.append(ret)
            self.events.append(("end", number))
        return returns


def sweeper_of(sweep_dir, *overrides, launcher=None, **keys):
    """The project's sweeper over the real config (hparams_search=optuna's, with `overrides`), its keys
    as the preset's but for `keys`, launching on `launcher` (a ScoreLauncher by default)."""
    from hydra_plugins.distrain_optuna_sweeper.optuna_sweeper import OptunaSweeper

    preset = {"sampler": OmegaConf.create({"_target_": "optuna.samplers.TPESampler", "seed": 42}),
              "direction": "maximize", "study_name": "s", "n_trials": 3, "n_jobs": 1, "max_failure_rate": 1.0,
              "params": {"lr": "tag(log, interval(0.0003, 0.01))", "trainer.batch_size": "choice(32, 64)",
                         "trainer.epochs": "range(1, 4)"}}
    sweeper = OptunaSweeper(**{**preset, **keys})
    sweep_dir.mkdir(exist_ok=True)
    sweeper.config = make_cfg("hparams_search=optuna", *overrides)
    with open_dict(sweeper.config):
        sweeper.config.hydra = {"sweep": {"dir": str(sweep_dir)}}
    sweeper.launcher = launcher or ScoreLauncher()
    return sweeper


def optuna_sweep(sweep_dir, storage, n_trials, n_jobs=2):
    sweeper = sweeper_of(sweep_dir, storage=storage, n_trials=n_trials, n_jobs=n_jobs)
    sweeper.sweep(["model=mlp"])
    return sorted(sweeper.launcher.jobs)


def study_of(sweep_dir, name="distrain"):
    import optuna

    from distrain.report.trial import study_storage

    return optuna.load_study(study_name=name, storage=study_storage(None, sweep_dir))


def test_an_optuna_study_kept_in_a_database_goes_on_where_it_stopped(tmp_path):
    """hydra.sweeper.storage=sqlite:///...: a second sweep goes on to its n_trials, numbered on, asks for
    values it has not tried, and its best is the study's; a job that returns no number is a failed
    trial, and the search goes on."""
    import optuna

    storage = f"sqlite:///{tmp_path}/optuna.db"
    first = optuna_sweep(tmp_path / "a", storage, 3)
    second = optuna_sweep(tmp_path / "b", storage, 5)
    assert [n for n, _ in first] == [0, 1, 2] and [n for n, _ in second] == [3, 4]
    assert all(set(v) == {"lr", "trainer.batch_size", "trainer.epochs", "model"} for _, v in first + second)
    assert {v["trainer.epochs"] for _, v in first + second} <= {"1", "2", "3"}  # range(1, 4) stops before 4
    tried = [v["lr"] for _, v in first + second]
    assert len(set(tried)) == 5, tried  # control below: a fresh study with the same seed asks the same again
    assert [v["lr"] for _, v in optuna_sweep(tmp_path / "c", None, 3)] == tried[:3]
    assert (tmp_path / "c" / "optuna.journal").exists()  # (no storage given: a journal file in the sweep directory)
    study = optuna.load_study(study_name="s", storage=storage)
    states = [t.state.name for t in study.trials]
    assert states == ["COMPLETE", "FAIL", "COMPLETE", "COMPLETE", "COMPLETE"]
    best = yaml.safe_load((tmp_path / "b" / "optimization_results.yaml").read_text())
    assert best["best_value"] == pytest.approx(study.best_value) and best["best_params"] == study.best_params


class InterruptedLauncher(ScoreLauncher):
    """Ctrl-C during job 2: the job is recorded interrupted (cli.JobFailed), the sweep told to stop."""

    def launch(self, overrides, initial_job_idx):
        from distrain.cli import JobFailed
        from distrain.report import sweep

        if initial_job_idx != 2:
            return super().launch(overrides, initial_job_idx)
        self.jobs.append((2, dict(o.split("=", 1) for o in overrides[0])))
        sweep.say_stopped(self.sweep_dir, 2)
        ret = JobReturn(status=JobStatus.COMPLETED)
        ret.return_value = JobFailed("job #2 was interrupted")
        return [ret]


def test_an_interrupted_study_goes_on_with_the_same_command(tmp_path):
    """Ctrl-C during trial 2 of 5: the trials that ended are kept, trial 2 stays to be gone on with; the
    same command again runs trial 2 again as job 2 (trainer.resume=auto: from its checkpoint), then
    trials 3 and 4: five in all, none counted twice."""
    from distrain.report import sweep

    launcher = InterruptedLauncher()
    launcher.sweep_dir = tmp_path / "s"
    first = sweeper_of(tmp_path / "s", launcher=launcher, n_trials=5)
    first.sweep([])
    assert [n for n, _ in launcher.jobs] == [0, 1, 2]
    (tmp_path / "s" / sweep.STOPPED).unlink()  # (as the next sweep's start does: SweepSummary)
    again = sweeper_of(tmp_path / "s", n_trials=5)
    again.sweep([])
    assert [n for n, _ in again.launcher.jobs] == [2, 3, 4]
    assert again.launcher.jobs[0][1]["trainer.resume"] == "auto" and \
        again.launcher.jobs[0][1]["lr"] == launcher.jobs[2][1]["lr"]
    states = [t.state.name for t in study_of(tmp_path / "s", "s").trials]
    assert states == ["COMPLETE", "FAIL", "COMPLETE", "COMPLETE", "COMPLETE"]  # (job 1 fails: ScoreLauncher's)
    third = sweeper_of(tmp_path / "s", n_trials=5)  # the control: a study that holds its trials asks no more
    third.sweep([])
    assert third.launcher.jobs == []


def test_a_trial_starts_as_soon_as_a_slot_frees(tmp_path):
    """n_jobs=2: while trial 0 runs, trial 1 ends and trial 2 starts in its slot (trial 0's job waits for
    that, up to 10 s: asked in batches of 2, trial 2 would wait for trial 0 instead); each job's number
    is its trial's."""
    go_on = threading.Event()
    launcher = ScoreLauncher(hold={0: go_on})
    watcher = threading.Thread(target=lambda: (wait_for(lambda: ("start", 2) in launcher.events), go_on.set()),
                               daemon=True)
    watcher.start()
    sweeper = sweeper_of(tmp_path / "s", launcher=launcher, n_trials=4, n_jobs=2)
    sweeper.sweep([])
    assert launcher.events.index(("start", 2)) < launcher.events.index(("end", 0)), launcher.events
    study = study_of(tmp_path / "s", "s")
    for number, values in launcher.jobs:
        assert study.trials[number].params["lr"] == pytest.approx(float(values["lr"]))


def wait_for(condition, seconds=10.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


def test_trials_at_once_and_their_share_of_the_cores(monkeypatch):
    """One place decides how many trials run at once and the cores each takes, for the sweeper and for
    each trial's launcher alike."""
    import os

    from distrain.report.trial import at_once, share

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    joblib = {"_target_": "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher", "n_jobs": -1}
    assert at_once(None, joblib) == 8 and at_once(None, {**joblib, "n_jobs": -2}) == 7 and at_once(3, joblib) == 3
    assert at_once(None, {"_target_": "hydra._internal.core_plugins.basic_launcher.BasicLauncher"}) == 1
    assert share(2, joblib, True) == 4 and share(3, joblib, True) == 2  # (2 cores left over: shared by none)
    assert share(2, joblib, False) == 0 and share(1, joblib, True) == 0  # the controls: not split, one at once
    assert share(9, joblib, True) == 0  # fewer cores than trials: all shared
    slurm = {"_target_": "hydra_plugins.distrain_slurm_launcher.slurm_sweep_launcher.SlurmSweepLauncher"}
    assert share(2, slurm, True) == 0  # each trial on machines of its own


PRUNER = {"_target_": "optuna.pruners.MedianPruner", "n_startup_trials": 2, "n_warmup_steps": 1}


@pytest.mark.parametrize("overrides, keys, said", [
    ([], {"pruner": {"_target_": "optuna.pruners.MedianPrunr"}}, "hydra.sweeper.pruner=optuna.pruners.MedianPrunr"),
    ([], {"pruner": {"_target_": "optuna.pruners.MedianPruner", "n_startup_trial": 2}},
     "set hydra.sweeper.pruner.n_startup_trials=2 instead"),
    ([], {"pruner": "median"}, "is not a node with a _target_"),
    (["trainer.objective=test_accuracy"], {"pruner": PRUNER}, "measured once, at the run's end"),
    (["trainer.validate_every=0"], {}, "which only validation reads: set trainer.validate_every=1"),  # (validate's)
    (["trainer.validate_every=0", "data.validation_split=0"], {},
     "only validation gives: set trainer.validate_every=1"),
    (["trainer.objective=val_acc"], {}, "trainer.objective=val_acc is not a figure of a run"),
    ([], {"n_jobs": 0}, "hydra.sweeper.n_jobs=0"),
    ([], {"direction": "up"}, "hydra.sweeper.direction=up"),
    ([], {"storage": "/proc/none/optuna.journal"}, "hydra.sweeper.storage=/proc/none/optuna.journal cannot be opened"),
    ([], {"storage": "sqlite:////proc/none/optuna.db"}, "cannot be opened"),
    ([], {"n_trial": 3}, "hydra.sweeper.n_trial is not a key of the Optuna sweeper (it has sampler, "),
    ([], {"custom_search_space": "nowhere.space"}, "hydra.sweeper.custom_search_space=nowhere.space cannot be"),
])
def test_a_search_it_cannot_run_is_refused_before_any_trial(tmp_path, overrides, keys, said):
    sweeper = sweeper_of(tmp_path / "s", *overrides, **{k: OmegaConf.create(v) if isinstance(v, dict) else v
                                                        for k, v in keys.items()})
    with pytest.raises(ConfigError, match=said.replace("(", r"\(").replace(".", r"\.")):
        sweeper.sweep([])
    assert sweeper.launcher.jobs == []
    sweeper_of(tmp_path / "control", *overrides[:0]).sweep([])  # the control: the preset's search runs


def test_several_trials_at_once_need_a_launcher_that_runs_them(tmp_path):
    from hydra._internal.core_plugins.basic_launcher import BasicLauncher

    with pytest.raises(ConfigError, match="Hydra's basic launcher runs one job at a time"):
        sweeper_of(tmp_path / "s", launcher=BasicLauncher(), n_jobs=2).sweep([])


def test_the_objective_is_validation_and_a_test_figure_says_it_leaks(tmp_path, caplog):
    """hparams_search=optuna tunes on a validation split; a test figure may be the objective, with one
    warning (the control: the preset's own objective gives none)."""
    cfg = make_cfg("hparams_search=optuna")
    assert (cfg.trainer.objective, cfg.trainer.validate_every, cfg.data.validation_split) == ("val_accuracy", 1, 0.1)
    sweeper_of(tmp_path / "a").sweep([])
    assert "leak" not in caplog.text and "overstate" not in caplog.text
    sweeper_of(tmp_path / "b", "trainer.objective=test_accuracy").sweep([])
    warned = [r.getMessage() for r in caplog.records if "overstate" in r.getMessage()]
    assert len(warned) == 1 and "trainer.objective=val_accuracy" in warned[0]


def test_custom_search_space_suggests_more_of_each_trial(tmp_path, monkeypatch):
    import sys
    import types

    module = types.ModuleType("my_space")
    module.space = lambda cfg, trial: trial.suggest_int("trainer.epochs", 2, 3) and None
    monkeypatch.setitem(sys.modules, "my_space", module)
    sweeper = sweeper_of(tmp_path / "s", custom_search_space="my_space.space", params={"lr": "interval(0.001, 0.01)"})
    sweeper.sweep([])
    assert all(values["trainer.epochs"] in ("2", "3") for _, values in sweeper.launcher.jobs)


def test_a_bad_pruner_on_the_command_line_is_one_line_and_no_job(tmp_path):
    sweep_dir = tmp_path / "sweep"
    out = sweep_cli(sweep_dir, "hparams_search=optuna", *TINY,
                    "hydra.sweeper.pruner={_target_: optuna.pruners.MedianPruner, n_startup_trial: 2}")
    assert out.returncode == 2, out.stderr
    said = ("error: hydra.sweeper.pruner.n_startup_trial is not an argument of optuna.pruners.MedianPruner (it "
            "takes interval_steps, n_min_trials, n_startup_trials, n_warmup_steps): set "
            "hydra.sweeper.pruner.n_startup_trials=2 instead")
    assert out.stderr.strip().splitlines() == [said], out.stderr
    assert not (sweep_dir / "0").exists() and "Traceback" not in out.stdout + out.stderr


@pytest.mark.slow
def test_a_pruned_study_under_joblib_keeps_its_slots_busy_and_tells_it_all(tmp_path):
    """The study of the issue: 8 trials of 4 epochs (MLP, bundled digits, seeded TPE, MedianPruner with 2
    start-up trials and 1 warm-up epoch), 2 at once under joblib. Pruned trials stop at the epoch they
    were pruned (fewer epochs in their run directories than the complete ones), the summary and the
    study agree, Optuna's plots are drawn, no process is left."""
    sweep_dir = tmp_path / "sweep"
    out = sweep_cli(sweep_dir, "hparams_search=optuna", "model=mlp", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2",
                    "hydra.sweeper.pruner={_target_: optuna.pruners.MedianPruner, n_startup_trials: 2, "
                    "n_warmup_steps: 1}", timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    study = study_of(sweep_dir)
    states = {t.number: t.state.name for t in study.trials}
    rows = {int(r["job"]): r for r in read_csv(sweep_dir / "summary.csv")}
    assert sorted(states) == sorted(rows) == list(range(8))
    # Measured on a Xeon (bfloat16), 5 runs of this study: 1 to 3 of the 8 trials pruned, which depends on
    # which trials have ended when each is judged; one of them (0.914 after 2 epochs, against 0.93-0.94 of
    # the start-up trials) in every run.
    pruned = [n for n, state in states.items() if state == "PRUNED"]
    assert pruned and set(states.values()) <= {"COMPLETE", "PRUNED"}, states
    for number, state in states.items():
        epochs = len((sweep_dir / str(number) / "metrics.csv").read_text().splitlines()) - 1
        assert rows[number]["status"] == {"COMPLETE": "ok", "PRUNED": "pruned"}[state]
        if state == "PRUNED":  # stopped at the epoch it was pruned at: the chief waits for each verdict
            at = max(study.trials[number].intermediate_values) + 1
            assert epochs == at < 4 and rows[number]["error"].startswith(f"pruned at epoch {at} (val_accuracy ")
        else:
            assert epochs == 4 and float(rows[number]["val_accuracy"]) == pytest.approx(study.trials[number].value)
    # A slot frees, and the next trial starts in it while the other slot's trial still runs (in batches of
    # 2, no trial would start before both of the batch before it ended).
    trials = sorted(study.trials, key=lambda t: t.number)
    assert any(later.datetime_start < earlier.datetime_complete for later in trials
               for earlier in trials[:later.number - later.number % 2]), [(t.datetime_start, t.datetime_complete)
                                                                            for t in trials]
    best = yaml.safe_load((sweep_dir / "optimization_results.yaml").read_text())
    assert best["best_trial"] == study.best_trial.number and best["best_value"] == pytest.approx(study.best_value)
    assert best["best_run_dir"] == str(sweep_dir / str(study.best_trial.number))
    for name in ("optuna_history.png", "optuna_intermediate_values.png", "optuna_importances.png"):
        assert (sweep_dir / name).read_bytes()[:8] == PNG
    assert f"8 job(s), 0 not ok, {len(pruned)} pruned" in out.stdout
    # Each of the 2 trials at once pinned to its half of the cores (on one core: both share it, said once).
    shares = [re.search(r"trial \d+: cores \[([\d, ]+)\]", (sweep_dir / str(n) / "launcher.log").read_text())
              for n in range(8)]
    if len(os.sched_getaffinity(0)) >= 2:
        assert all(shares) and len({m.group(1) for m in shares}) == 2, shares
    else:
        assert not any(shares) and "fewer cores than trials" in out.stdout + out.stderr
    assert_nothing_left(sweep_dir)


@pytest.mark.slow
@pytest.mark.parametrize("cluster", [["strategy=multi_worker_mirrored", "cluster.workers=2", "logger=mlflow"],
                                     ["strategy=parameter_server", "cluster.ps=1", "cluster.workers=2"]])
def test_a_clusters_trial_is_pruned_and_every_task_stops(tmp_path, cluster):
    """A pruner that prunes every trial at its first epoch (ThresholdPruner: below 2.0, which no accuracy
    reaches): the cluster's tasks stop there, the trial is PRUNED, the job ok, nothing left running;
    logger=mlflow: its MLflow run KILLED, tagged with the epoch."""
    sweep_dir = tmp_path / "sweep"
    out = sweep_cli(sweep_dir, "hparams_search=optuna", *TINY, "trainer.epochs=3", "hydra.sweeper.n_trials=1",
                    *cluster, "hydra.sweeper.pruner={_target_: optuna.pruners.ThresholdPruner, lower: 2.0}",
                    timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert [t.state.name for t in study_of(sweep_dir).trials] == ["PRUNED"]
    status = json.loads((sweep_dir / "0" / "status.json").read_text())
    assert status["status"] == "pruned" and status["error"].startswith("pruned at epoch 1 ")
    assert len((sweep_dir / "0" / "metrics.csv").read_text().splitlines()) == 2  # its header, epoch 1
    if "logger=mlflow" in cluster:
        from mlflow.tracking import MlflowClient

        tracked = json.loads((sweep_dir / "0" / "mlflow.json").read_text()).popitem()[1]
        found = MlflowClient(f"sqlite:///{tmp_path}/outputs/mlflow.db").get_run(tracked["run_id"])
        assert found.info.status == "KILLED" and found.data.tags["pruned"] == status["error"]
    assert_nothing_left(sweep_dir)


HELD = """import os, time
import tf_keras


class Held(tf_keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        deadline = time.monotonic() + 120
        while not os.path.exists({released!r}) and time.monotonic() < deadline:
            time.sleep(0.05)
"""


@pytest.mark.slow
def test_ctrl_c_keeps_the_study_and_the_same_command_finishes_it(tmp_path):
    """Ctrl-C while trials 0 and 1 train (2 at once under joblib): both are left to go on with, no other
    trial is asked; the same command again (trainer.resume=auto, as a rerun sweep takes) runs them first,
    as the same trials and jobs, then trials 2 and 3: four in the study, each once."""
    import subprocess
    import sys

    from helpers import TRAIN_PY, ctrl_c

    sweep_dir, released = tmp_path / "sweep", tmp_path / "released"
    # (Each trial's training held at its start until the Ctrl-C is sent, however far apart the two start.)
    (tmp_path / "held.py").write_text(HELD.format(released=str(released)))
    args = ["hparams_search=optuna", "model=mlp", "data=synthetic", "data.train_examples=1024",
            "data.test_examples=256", "trainer.epochs=1", "hydra.sweeper.n_trials=4", "hydra/launcher=joblib",
            "hydra.launcher.n_jobs=2", "+callbacks.held={_target_: held.Held}"]
    code, out = ctrl_c(sweep_dir, args, [sweep_dir / job / "logs" / "train.log" for job in ("0", "1")],
                       ready="steps per epoch", then=released.touch)
    assert code == 130, out[-3000:]
    first = study_of(sweep_dir).trials
    assert [(t.number, t.state.name, t.user_attrs.get("interrupted")) for t in first] == \
        [(0, "RUNNING", True), (1, "RUNNING", True)], out[-3000:]
    again = subprocess.run([sys.executable, str(TRAIN_PY), f"hydra.sweep.dir={sweep_dir}", *args,
                            "trainer.resume=auto"], capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    trials = study_of(sweep_dir).trials
    assert [(t.number, t.state.name) for t in trials] == [(n, "COMPLETE") for n in range(4)]
    assert [t.params for t in trials[:2]] == [t.params for t in first]
    assert [row["status"] for row in read_csv(sweep_dir / "summary.csv")] == ["ok"] * 4
    assert_nothing_left(sweep_dir)
