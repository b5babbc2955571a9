"""Resume: a run stopped at any step goes on from its latest checkpoint, and for synchronous
strategies ends with the same weights as a run that was never stopped (model=mlp, SGD: no dropout).

Multi-process tests are bounded in time and check that no process they caused is left behind.
"""
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from distrain.common.errors import ConfigError
from distrain.task import runners
from distrain.task.training import train

from helpers import (
    assert_nothing_left,
    here,
    in_process,
    kill_in_epoch_2,
    kill_task,
    run_cli,
    small,
    task_state,
    to_the_launcher,
    untimed,
    wait_until,
    while_running,
)

pytestmark = pytest.mark.slow  # every test trains, most in processes of their own

SGD_MLP = ["model=mlp", "optimizer=sgd", "trainer.learning_rate=0.1", "trainer.checkpoint_every_steps=5"]


def weights(checkpoint_path) -> dict:
    reader = tf.train.load_checkpoint(str(checkpoint_path))
    return {n: reader.get_tensor(n) for n in reader.get_variable_to_shape_map() if n.startswith("model/")}


def max_difference(a: dict, b: dict) -> float:
    assert a.keys() == b.keys() and a
    return max(float(np.abs(a[n] - b[n]).max()) for n in a)


class Crash(Exception):
    pass


def crash_after(monkeypatch, steps: int) -> None:
    """The training loop raises Crash at the first segment that would take it past `steps` steps."""
    run, done = runners.SyncEpochs.run, {"steps": 0}

    def crashing(self, calls, **kwargs):
        done["steps"] += sum(calls)
        if done["steps"] > steps:
            raise Crash()
        return run(self, calls, **kwargs)

    monkeypatch.setattr(runners.SyncEpochs, "run", crashing)


def test_a_run_stopped_mid_epoch_resumes_to_the_same_weights(tmp_path, monkeypatch):
    """In-process, the loop every single-process strategy shares, on 2 replicas (mirrored over this
    process's 2 virtual CPUs), with a learning rate that changes every step (warm-up, then cosine decay):
    the optimizer's step count, checkpointed with it, drives the schedule. (Killed for real, with
    SIGKILL: a cluster below; a sweep's job, test_storage; by SIGTERM, below.)"""
    config = ["strategy=mirrored", "strategy.cpu_virtual_devices=2", "trainer.save_model=true", "trainer.epochs=3",
              *SGD_MLP, "schedule=cosine", "schedule.warmup_steps=10"]  # 1024 // 64 = 16 steps an epoch
    uninterrupted, whole = train(small(*config), tmp_path / "whole")

    crash_after(monkeypatch, 23)  # the 4th segment of epoch 2 never runs
    with pytest.raises(Crash):
        train(small(*config), tmp_path / "stopped")
    monkeypatch.undo()
    latest = tf.train.latest_checkpoint(str(tmp_path / "stopped" / "checkpoints"))
    assert latest.endswith("ckpt-20")  # mid-epoch 2: 16 + 4 steps (checkpoints every 5 global steps)

    results, resumed = train(small(*config, "trainer.resume=true"), tmp_path / "stopped")
    assert results["resumed_from_step"] == 20 and results["restarts"] == 1 and results["global_steps"] == 48
    for a, b in zip(whole.get_weights(), resumed.get_weights()):
        np.testing.assert_allclose(b, a, atol=1e-6, rtol=0)
    assert len(results["history"]["loss"]) == 3  # the history covers the whole run
    np.testing.assert_allclose(results["history"]["loss"], uninterrupted["history"]["loss"], rtol=1e-5)
    # Control: the comparison can fail; a run with another seed ends elsewhere.
    _, other = train(small(*config, "trainer.seed=7"), tmp_path / "other")
    assert max(np.abs(a - b).max() for a, b in zip(whole.get_weights(), other.get_weights())) > 1e-3


def test_a_run_accumulating_batches_resumes_at_an_update_as_if_never_stopped(tmp_path, monkeypatch):
    """trainer.accumulate_steps=2, stopped mid-epoch: its checkpoints are at updates (the batches of one
    are summed inside one call), so the resumed run's weights are those of the run never stopped."""
    config = ["trainer.save_model=true", "trainer.epochs=2", *SGD_MLP, "trainer.batch_size=32",
              "trainer.accumulate_steps=2", "trainer.mixed_precision=false"]  # 16 updates an epoch
    whole_results, whole = train(small(*config), tmp_path / "whole")
    crash_after(monkeypatch, 23)
    with pytest.raises(Crash):
        train(small(*config), tmp_path / "stopped")
    monkeypatch.undo()
    results, resumed = train(small(*config, "trainer.resume=true"), tmp_path / "stopped")
    assert results["resumed_from_step"] == 20 and results["global_steps"] == whole_results["global_steps"] == 32
    for a, b in zip(whole.get_weights(), resumed.get_weights()):
        np.testing.assert_allclose(b, a, atol=1e-6, rtol=0)
    np.testing.assert_allclose(results["history"]["loss"], whole_results["history"]["loss"], rtol=1e-5)


def test_a_run_resumed_on_other_replicas_ends_as_one_never_resized(tmp_path, monkeypatch, capsys):
    """Mirrored over 2 replicas stopped mid-epoch 2, resumed on 1 (and 1 resumed on 2), with a learning
    rate that changes every step: the global batch is cut alike for any replica count, so the weights
    and the losses are those of the run never stopped (the control: test above, another seed)."""
    config = ["strategy=mirrored", "strategy.cpu_virtual_devices=2", "trainer.save_model=true", "trainer.epochs=3",
              *SGD_MLP, "schedule=cosine", "schedule.warmup_steps=10",
              "trainer.mixed_precision=false"]  # exact comparisons are made in float32
    uninterrupted, whole = train(small(*config), tmp_path / "whole")
    two, one = "strategy.devices=[/cpu:0,/cpu:1]", "strategy.devices=[/cpu:0]"
    for first, then in ((two, one), (one, two)):
        run_dir = tmp_path / f"{first[-3]}-to-{then[-3]}"
        crash_after(monkeypatch, 23)
        with pytest.raises(Crash):
            train(small(*config, first), run_dir)
        monkeypatch.undo()
        capsys.readouterr()
        results, resumed = train(small(*config, then, "trainer.resume=true", "trainer.verbose=2"), run_dir)
        replicas = (2, 1) if first == two else (1, 2)
        assert results["membership"] == [{"from_step": 0, "workers": 1, "replicas": replicas[0]},
                                         {"from_step": 20, "workers": 1, "replicas": replicas[1]}]
        said = capsys.readouterr().out
        assert (f"resumed at step 20 on 1 worker, {replicas[1]} replica" in said and
                f"its checkpoint was made on 1 worker, {replicas[0]} replica" in said and
                f"the global batch 64 kept ({64 // replicas[1]} per replica)" in said), said
        for a, b in zip(whole.get_weights(), resumed.get_weights()):
            np.testing.assert_allclose(b, a, atol=1e-5, rtol=0)
        np.testing.assert_allclose(results["history"]["loss"], uninterrupted["history"]["loss"], atol=1e-5, rtol=0)
        assert abs(results["test_loss"] - uninterrupted["test_loss"]) < 1e-5
        assert abs(results["test_accuracy"] - uninterrupted["test_accuracy"]) < 1e-5
    # Control: the comparison can fail; a run with another seed ends elsewhere.
    other, _ = train(small(*config, "trainer.seed=7"), tmp_path / "other")
    assert abs(other["test_loss"] - uninterrupted["test_loss"]) > 1e-3


def test_a_batch_that_does_not_divide_over_the_replicas_left_is_split_unevenly_and_kept(tmp_path, monkeypatch,
                                                                                         capsys):
    """A global batch of 63 on 1 replica, resumed on 2: 32 and 31 examples each, the loss averaged over
    the 63, so the run ends as the one never resized (a new run of 63 on 2 replicas is refused: the
    bad-input catalogue)."""
    config = ["strategy=mirrored", "strategy.cpu_virtual_devices=2", "trainer.save_model=true", "trainer.epochs=2",
              *SGD_MLP, "trainer.batch_size=63", "trainer.mixed_precision=false"]  # 16 steps an epoch
    whole_results, whole = train(small(*config, "strategy.devices=[/cpu:0]"), tmp_path / "whole")
    crash_after(monkeypatch, 23)
    with pytest.raises(Crash):
        train(small(*config, "strategy.devices=[/cpu:0]"), tmp_path / "run")
    monkeypatch.undo()
    capsys.readouterr()
    results, resumed = train(small(*config, "strategy.devices=[/cpu:0,/cpu:1]", "trainer.resume=true",
                                   "trainer.verbose=2"), tmp_path / "run")
    assert ("the global batch 63 kept, split unevenly over the 2 replicas (32 or 31 each" in capsys.readouterr().out)
    assert results["resumed_from_step"] == 20 and results["num_replicas"] == 2
    for a, b in zip(whole.get_weights(), resumed.get_weights()):
        np.testing.assert_allclose(b, a, atol=1e-5, rtol=0)
    np.testing.assert_allclose(results["history"]["loss"], whole_results["history"]["loss"], atol=1e-5, rtol=0)
    _, other = train(small(*config, "strategy.devices=[/cpu:0]", "trainer.seed=7"), tmp_path / "other")
    assert max(np.abs(a - b).max() for a, b in zip(whole.get_weights(), other.get_weights())) > 1e-3  # (control)


def test_a_one_process_task_killed_by_hand_says_how_to_go_on_and_that_command_resumes(tmp_path):
    """kill -9 of a one-process run's task: one error line, naming the signal and the command that goes on
    (the task could say nothing, and the terminal showed only its progress). That command, word for word,
    ends the run. (Killed before its first checkpoint, and other signals: test_supervisor.)"""
    run_dir = tmp_path / "run"

    def chaos(run):
        wait_until(lambda: (run_dir / "checkpoints" / "checkpoint").exists(), run, "a checkpoint", interval=0.05)
        found = subprocess.run(["pgrep", "-f", f"{run_dir}/config.yaml"], capture_output=True, text=True)
        (pid,) = found.stdout.split()  # (the task's: its command line names its config)
        os.kill(int(pid), signal.SIGKILL)
    code, out = while_running(run_dir, "data=synthetic", "data.train_examples=2048", "data.test_examples=256",
                              "trainer.epochs=20", "trainer.batch_size=64", "trainer.verbose=2", *SGD_MLP, chaos=chaos)
    errors = [line for line in out.splitlines() if "error:" in line]
    assert code == 1 and errors == [  # (a failed run: the signal is in its line)
        "error: task train was killed by SIGKILL (signal 9): go on from its latest checkpoint with trainer.resume=true "
        f"hydra.run.dir={run_dir}"], out[-3000:]
    assert json.loads((run_dir / "status.json").read_text())["error"] == errors[0].removeprefix("error: ")
    code, said, _ = here(tmp_path, errors[0].split(" with ")[-1].split())
    results = json.loads((run_dir / "results.json").read_text())
    assert code == 0 and results["resumed_from_step"] > 0 and len(results["history"]["loss"]) == 20, said[-3000:]
    assert_nothing_left(tmp_path)


def test_a_truncated_newest_checkpoint_falls_back_to_the_one_before(tmp_path, monkeypatch, capfd):
    """A full disk or a crash that cut the newest checkpoint short: the run goes on from the newest intact
    one, saying so, and ends as an uninterrupted run does (resume is exact from any checkpoint)."""
    config = ["trainer.save_model=true", "trainer.epochs=3", *SGD_MLP]  # 1024 // 64 = 16 steps an epoch
    _, whole = train(small(*config), tmp_path / "whole")
    crash_after(monkeypatch, 23)
    with pytest.raises(Crash):
        train(small(*config), tmp_path / "stopped")
    monkeypatch.undo()
    checkpoints = tmp_path / "stopped" / "checkpoints"
    for data_file in checkpoints.glob("ckpt-20.data-*"):
        data_file.write_bytes(data_file.read_bytes()[:100])
    # The control: the newest checkpoint alone can no longer be read.
    with pytest.raises(Exception):  # noqa: B017 - whichever error TensorFlow raises for a cut data file
        weights(checkpoints / "ckpt-20")
    capfd.readouterr()
    results, resumed = train(small(*config, "trainer.resume=true"), tmp_path / "stopped")
    said = capfd.readouterr().out
    assert "warning: skipped unreadable checkpoint(s) ckpt-20 (" in said and "resuming from ckpt-16" in said
    assert results["resumed_from_step"] == 16 and results["global_steps"] == 48
    for a, b in zip(whole.get_weights(), resumed.get_weights()):
        np.testing.assert_allclose(b, a, atol=1e-6, rtol=0)


def test_keep_checkpoints_keeps_the_newest_ones(tmp_path):
    """(3 by default: test_cli's default run.)"""
    train(small("trainer.save_model=true", "trainer.keep_checkpoints=2", *SGD_MLP), tmp_path)  # 16 steps, every 5
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("*.index")) == ["ckpt-15.index", "ckpt-16.index"]


def test_a_cnn_run_stopped_mid_epoch_resumes_soundly(tmp_path, monkeypatch):
    """Dropout draws new masks after a resume, so not bit for bit: from the checkpoint, to a sound end."""
    config = ["trainer.save_model=true", "trainer.epochs=3", "model=cnn", "trainer.checkpoint_every_steps=5"]
    crash_after(monkeypatch, 23)
    with pytest.raises(Crash):
        train(small(*config), tmp_path)
    monkeypatch.undo()
    results, _ = train(small(*config, "trainer.resume=true"), tmp_path)
    assert results["resumed_from_step"] == 20 and results["global_steps"] == 48
    assert len(results["history"]["loss"]) == 3 and results["history"]["loss"][2] < results["history"]["loss"][0]
    assert results["test_accuracy"] > 0.5  # synthetic data: chance is 0.1


def _kill_after_a_mid_epoch_checkpoint(run_dir: Path, steps_per_epoch: int, victim: str):
    """What SIGKILLs one task of a local cluster once a checkpoint inside an epoch exists (while_running)."""
    def mid_epoch():
        latest = tf.train.latest_checkpoint(str(run_dir / "checkpoints")) or "ckpt-0"
        return int(latest.rsplit("-", 1)[1]) % steps_per_epoch != 0

    def chaos(run):
        wait_until(mid_epoch, run, "a mid-epoch checkpoint", interval=0.02)
        kill_task(run_dir, victim)
    return chaos


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The run directory of `python train.py ARGS` never stopped, run once per ARGS for the module."""
    runs = {}

    def run(args: list) -> Path:
        if tuple(args) not in runs:
            run_dir = tmp_path_factory.mktemp("whole") / "run"
            out = run_cli(run_dir, *args)
            assert out.returncode == 0, out.stdout[-3000:]
            runs[tuple(args)] = run_dir
        return runs[tuple(args)]
    return run


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> list:
    """The same synthetic examples as data=synthetic data.train_examples=2048 data.test_examples=256, in
    TFRecord shards (4 and 1): the overrides that train on them."""
    from distrain.data import arrays, write_tfrecords

    out = tmp_path_factory.mktemp("shards")
    (x, y), (x_test, y_test) = arrays.synthetic(2048, 256, seed=42)
    write_tfrecords.write(x[..., None], y, out, "train", 4)
    write_tfrecords.write(x_test[..., None], y_test, out, "test", 1)
    return ["data=tfrecord", f"data.train_files={out}/train-*", f"data.test_files={out}/test-*", "data.num_classes=10"]


# Killed for real (the loop of the single-process strategies is stopped in-process above). A worker
# that fails a run with cluster.max_restarts=0 leaves what a failure leaves anywhere (test_multiworker),
# and a multi_worker_mirrored cluster resumed through the launcher's resumed() is test_slurm's requeue.
def test_sigkill_mid_epoch_then_resume_gives_the_uninterrupted_weights(tmp_path, uninterrupted, shards):
    """A multi_worker_mirrored worker SIGKILLed mid-epoch: the launcher restarts the cluster by itself, from
    the latest checkpoint; TFRecord files, each worker reading its own."""
    args = ["strategy=multi_worker_mirrored", "cluster.workers=2", *shards, "trainer.batch_size=64", "trainer.epochs=2",
            "trainer.verbose=2", *SGD_MLP[:-1], "trainer.checkpoint_every_steps=10"]  # 32 steps an epoch, 64 in all
    whole_dir = uninterrupted(args)
    run_dir = tmp_path / "stopped"
    code, out = while_running(run_dir, *args, "cluster.max_restarts=3",
                              chaos=_kill_after_a_mid_epoch_checkpoint(run_dir, 32, "worker-1"))
    assert code == 0, out[-3000:]
    assert "task worker-1 was killed by SIGKILL (signal 9): restarting the cluster from its latest checkpoint" in out
    assert "[worker-0] error:" not in out  # worker 0 lost its peer: news, since the launcher acts on it
    cluster = json.loads((run_dir / "cluster.json").read_text())
    assert untimed(cluster["restarts"]) == [{"task": "worker-1", "exit_status": -9, "budget": "the cluster",
                                             "restarted": "the cluster from its latest checkpoint"}]
    results = json.loads((run_dir / "results.json").read_text())
    assert results["num_replicas"] == 2 and results["per_replica_batch_size"] == 32
    assert 0 < results["resumed_from_step"] < 64 and results["restarts"] == 1
    assert f"resumed from global step {results['resumed_from_step']}" in out
    assert max_difference(weights(whole_dir / "checkpoints" / "ckpt-64"),
                          weights(run_dir / "checkpoints" / "ckpt-64")) <= 1e-6
    whole = json.loads((whole_dir / "results.json").read_text())
    assert len(results["history"]["loss"]) == 2
    np.testing.assert_allclose(results["history"]["loss"], whole["history"]["loss"], rtol=1e-5)
    assert_nothing_left(tmp_path)


# A synchronous cluster on in-memory data, in float32: resized, it ends as the run never resized.
ELASTIC = ["strategy=multi_worker_mirrored", "data=synthetic", "data.train_examples=2048", "data.test_examples=256",
           "trainer.batch_size=64", "trainer.verbose=2", "trainer.mixed_precision=false", *SGD_MLP]  # 32 steps an epoch


def ends_as(run_dir: Path, whole_dir: Path, sizes: list, last: int = 64) -> None:
    """The run in run_dir trained at `sizes` (results.json's membership) and ends at global step `last`
    as whole_dir's (1e-5)."""
    results, whole = (json.loads((d / "results.json").read_text()) for d in (run_dir, whole_dir))
    assert results["membership"] == sizes and results["num_workers"] == sizes[-1]["workers"]
    np.testing.assert_allclose(results["history"]["loss"], whole["history"]["loss"], atol=1e-5, rtol=0)
    assert abs(results["test_loss"] - whole["test_loss"]) < 1e-5
    end = weights(whole_dir / "checkpoints" / f"ckpt-{last}")
    assert max_difference(end, weights(run_dir / "checkpoints" / f"ckpt-{last}")) <= 1e-5
    # Control: the comparison can fail; the checkpoint a few steps before ends elsewhere.
    before = max(int(p.stem.split("-")[1]) for p in (whole_dir / "checkpoints").glob("ckpt-*.index")
                 if p.stem != f"ckpt-{last}")
    assert max_difference(end, weights(whole_dir / "checkpoints" / f"ckpt-{before}")) > 1e-5


def test_a_worker_lost_for_good_leaves_the_others_to_go_on_from_the_checkpoint(tmp_path, uninterrupted):
    """cluster.min_workers=1 cluster.max_restarts=0, worker-1 SIGKILLed mid-epoch: the launcher restarts
    the cluster with worker-0 alone from the latest checkpoint, which ends rc 0 as the run never
    resized; with cluster.min_workers=2 (the control) the same kill ends the run in one line."""
    whole_dir = uninterrupted([*ELASTIC, "cluster.workers=2", "trainer.epochs=2"])
    for least in (1, 2):
        run_dir = tmp_path / f"least-{least}"
        code, out = while_running(run_dir, *ELASTIC, "cluster.workers=2", "trainer.epochs=2",
                                  f"cluster.min_workers={least}", "cluster.max_restarts=0",
                                  chaos=_kill_after_a_mid_epoch_checkpoint(run_dir, 32, "worker-1"))
        if least == 2:
            errors = [line for line in out.splitlines() if line.startswith("error:")]
            assert code != 0 and len(errors) == 1, out[-3000:]
            assert "task worker-1 was killed by SIGKILL (signal 9)" in errors[0], out[-3000:]
            break
        assert code == 0, out[-3000:]
        cluster = json.loads((run_dir / "cluster.json").read_text())
        (lost,) = untimed(cluster["restarts"])
        step = lost["from_step"]
        assert 0 < step < 64 and lost["task"] == "worker-1" and lost["workers"] == 1
        assert (f"worker-1 lost for good at step {lost['lost_at_step']}: going on with 1 of 2 workers from step "
                f"{step}, global batch 64 kept (64 per worker)") in out
        assert "[worker-0] error:" not in out  # (its lost peer is news: the launcher goes on)
        ends_as(run_dir, whole_dir, [{"from_step": 0, "workers": 2, "replicas": 2},
                                     {"from_step": step, "workers": 1, "replicas": 1}])
    assert_nothing_left(tmp_path)


def test_three_workers_losing_one_for_good_end_as_one_device(tmp_path):
    """3 workers, global batch 96, cluster.min_workers=1 cluster.max_restarts=0, worker-2 SIGKILLed mid-epoch:
    the cluster goes on with 2 (48 each) and ends with the weights of one device trained on batch 96
    (synchronous training equals one device: 1e-5)."""
    args = [*ELASTIC, "trainer.batch_size=96", "trainer.epochs=2"]  # 21 steps an epoch
    run_dir = tmp_path / "run"
    code, out = while_running(run_dir, *args, "cluster.workers=3", "cluster.min_workers=1", "cluster.max_restarts=0",
                              chaos=_kill_after_a_mid_epoch_checkpoint(run_dir, 21, "worker-2"))
    assert code == 0, out[-3000:]
    assert "going on with 2 of 3 workers from step" in out and "global batch 96 kept (48 per worker)" in out
    sizes = json.loads((run_dir / "results.json").read_text())["membership"]
    assert [(m["workers"], m["replicas"]) for m in sizes] == [(3, 3), (2, 2)] and 0 < sizes[1]["from_step"] < 42
    _, single = train(small(*[a for a in args if not a.startswith(("strategy=", "trainer.verbose"))],
                            "data.train_examples=2048"), tmp_path / "single")
    reader = tf.train.load_checkpoint(str(run_dir / "checkpoints" / "ckpt-42"))
    names = sorted(n for n in reader.get_variable_to_shape_map() if n.startswith("model/"))
    trained = {tuple(reader.get_tensor(n).shape): reader.get_tensor(n) for n in names}
    for w in single.get_weights():
        np.testing.assert_allclose(trained[w.shape], w, atol=1e-5, rtol=0)
    assert max(np.abs(trained[w.shape] - w).max() for w in keras_initial(single)) > 1e-3  # (control: training moved)
    assert_nothing_left(tmp_path)


def keras_initial(model) -> list:
    import tf_keras as keras

    return keras.models.clone_model(model).get_weights()


def test_a_cluster_that_shrank_grows_back_once_its_restart_budget_renews(tmp_path):
    """cluster.max_restarts=1 within cluster.restart_window=3: worker-1 SIGKILLed restarts the cluster;
    SIGKILLed again at once, it is lost for good (the cluster goes on with worker-0); once the first restart
    is 3 s old the budget renews and the cluster grows back to 2 workers from a checkpoint of the step it
    is at. (Each resize resumes as the tests above show exact.)"""
    args = [*ELASTIC, "cluster.workers=2", "trainer.epochs=20"]
    run_dir = tmp_path / "run"

    def chaos(run):
        _kill_after_a_mid_epoch_checkpoint(run_dir, 32, "worker-1")(run)
        first = task_state(run_dir, "worker-1")["pid"]

        def again():
            tasks = json.loads((run_dir / "cluster.json").read_text())["tasks"]
            return any(t["name"] == "worker-1" and t["pid"] not in (None, first) for t in tasks)
        wait_until(again, run, "worker-1 started again", interval=0.02)
        kill_task(run_dir, "worker-1")
    code, out = while_running(run_dir, *args, "cluster.min_workers=1", "cluster.max_restarts=1",
                              "cluster.restart_window=3", chaos=chaos)
    assert code == 0, out[-3000:]
    restarted, shrank, grew = untimed(json.loads((run_dir / "cluster.json").read_text())["restarts"])
    assert restarted["restarted"] == "the cluster from its latest checkpoint" and shrank["workers"] == 1
    assert grew == {"task": None, "exit_status": None, "restarted": "the cluster with 2 worker(s)",
                    "budget": "cluster.min_workers", "workers": 2}
    assert "growing back from 1 to 2 of 2 workers from a checkpoint of the step it is at" in out
    assert "checkpoint saved, from which the launcher restarts the cluster" in out
    sizes = json.loads((run_dir / "results.json").read_text())["membership"]
    assert [m["workers"] for m in sizes] == [2, 1, 2] and 0 < sizes[1]["from_step"] < sizes[2]["from_step"] < 640
    results = json.loads((run_dir / "results.json").read_text())
    assert results["global_steps"] == 640 and len(results["history"]["loss"]) == 20 and results["num_workers"] == 2
    assert_nothing_left(tmp_path)


def files_of(run_dir: Path) -> dict:
    """Every file of a directory, by its bytes' digest."""
    return {str(p.relative_to(run_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(run_dir.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("setup, args, message", [
    ("no checkpoint", ["trainer.resume=true"], "holds no checkpoint to resume from"),
    ("ok", ["trainer.resume=true", "model=cnn"], "model=cnn contradicts the run being resumed, which has 'mlp'"),
    ("ok", ["trainer.resume=true", "trainer.learning_rate=0.01"],  # (the issue's, verbatim)
     "trainer.learning_rate=0.01 contradicts the run being resumed, which has 0.002"),
    ("ok", [], "holds a run already, which ended ok"),
    ("corrupt", ["trainer.resume=true"], "cannot be resumed"),
    ("trained", ["trainer.resume=true", "trainer.epochs=1"],  # (it would end as it is, untrained)
     "trainer.epochs=1, but the run being resumed has trained 2 epoch(s) already: set trainer.epochs=2 or more to go "
     "on with it"),
])
def test_bad_resumes_are_one_line_and_leave_the_run_as_it_was(tmp_path, uninterrupted, setup, args, message):
    """(A directory with no run in it: the bad-input catalogue.) Each refusal that names a run's directory
    leaves every file of it byte for byte, .hydra/ and status.json included, and says no second line: the
    launcher's refusals (found before any task starts: checked in this process) and the task's (a corrupt
    checkpoint, fewer epochs than it trained: the task starts, refuses, and what it changed is put back).
    The control: a resume that trains does change the files."""
    run_dir = tmp_path / "run"
    shutil.copytree(uninterrupted(["data=synthetic", "data.train_examples=256", "data.test_examples=64",
                                   "trainer.epochs=2", "trainer.batch_size=64", "trainer.verbose=2", "model=mlp"]),
                    run_dir)
    if setup == "no checkpoint":
        shutil.rmtree(run_dir / "checkpoints")
    if setup == "corrupt":
        for data_file in (run_dir / "checkpoints").glob("ckpt-*.data-*"):
            data_file.write_bytes(data_file.read_bytes()[:100])  # truncated, as a full disk leaves it
    before = files_of(run_dir)
    if setup in ("corrupt", "trained"):  # (found in the task)
        out = run_cli(run_dir, *args)
        code, text = out.returncode, out.stdout + out.stderr
    else:
        code, stdout, stderr = in_process(tmp_path, [f"hydra.run.dir={run_dir}", *args])
        text = stdout + stderr
    assert code == 2, text[-2000:]
    assert message in text and "Traceback" not in text
    assert sum(line.startswith("error:") for line in text.splitlines()) == 1 and "the run failed" not in text
    assert files_of(run_dir) == before, text[-2000:]
    if setup == "trained":  # the control: the same run resumed to train on changes it
        assert run_cli(run_dir, "trainer.resume=true", "trainer.epochs=3").returncode == 0
        assert files_of(run_dir) != before


def test_only_a_refusal_puts_the_run_back():
    """A failure of another kind (a task lost, exit 1) or a refusal after a new checkpoint keeps what the
    command wrote; bad input (exit 2) before any new checkpoint puts back what it found."""
    import tempfile

    from distrain.common.rundir import RunDir
    from distrain.launcher.launch import Before
    from distrain.launcher.supervisor import Outcome

    run = RunDir(Path(tempfile.mkdtemp()))
    run.write_status("ok", 0)
    (run.logs).mkdir()
    run.log("train").write_text("epoch 1\n")
    found = run.snapshot()
    for outcome, restored in ((Outcome(1, "failed"), False), (Outcome(0), False), (Outcome(2, "failed"), True)):
        run.write_status("failed", 2)
        with open(run.log("train"), "a") as log:
            log.write("error: no\n")
        (run.path / "new.json").write_text("{}")
        assert Before(found, None).refused(outcome, run) == restored
        assert (run.read_status()["status"] == "ok") == restored and (run.path / "new.json").exists() != restored
        assert (run.log("train").read_text() == "epoch 1\n") == restored
    assert not Before(found, "ckpt-4").refused(Outcome(2, "failed"), run)  # (a checkpoint since: it trained)
    assert not Before(None, None).refused(Outcome(2, "failed"), run)  # (no run was there)


def test_resume_auto_starts_a_new_run_then_goes_on_from_its_checkpoint(tmp_path):
    """What a task restarted by its orchestrator (a Kubernetes pod) runs, every time, with one command."""
    base = ["data=synthetic", "data.train_examples=256", "data.test_examples=64", "trainer.batch_size=64",
            "trainer.verbose=2", "model=mlp", "trainer.resume=auto", f"trainer.checkpoint_dir={tmp_path / 'shared'}"]
    first = run_cli(tmp_path / "run", *base, "trainer.epochs=1")
    assert first.returncode == 0, first.stdout[-2000:]
    assert "trainer.resume=auto: no checkpoint in" in first.stdout + first.stderr
    assert json.loads((tmp_path / "run" / "results.json").read_text())["resumed_from_step"] is None
    # Restarted, in a run directory of its own (no config.yaml there), as a pod is: the shared checkpoints
    # are resumed. (The same directory again, as a requeued Slurm job: test_slurm.)
    again = run_cli(tmp_path / "other", *base, "trainer.epochs=2")
    assert again.returncode == 0, again.stdout[-2000:]
    results = json.loads((tmp_path / "other" / "results.json").read_text())
    assert results["resumed_from_step"] == 4 and results["global_steps"] == 8 and results["restarts"] == 1
    assert len(results["history"]["loss"]) == 2


def test_an_incompatible_checkpoint_is_refused(tmp_path):
    train(small("trainer.save_model=true", "model=mlp"), tmp_path)
    with pytest.raises(ConfigError, match="cannot be resumed"):
        train(small("trainer.resume=true", "model=cnn"), tmp_path)  # another model's variables


def test_a_dead_parameter_server_restarts_the_cluster_from_its_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    code, out = while_running(run_dir, "strategy=parameter_server", "cluster.workers=1", "cluster.ps=1",
                              "data=synthetic", "data.train_examples=2048", "trainer.epochs=4", "trainer.batch_size=32",
                              "trainer.verbose=2", "model=mlp",
                              chaos=kill_in_epoch_2(run_dir / "logs" / "chief-0.log", run_dir, "ps-0"))
    assert code == 0, out[-3000:]
    assert "task ps-0 was killed by SIGKILL (signal 9): restarting the cluster from its latest checkpoint" in out
    results = json.loads((run_dir / "results.json").read_text())
    assert results["restarts"] == 1 and results["resumed_from_step"] >= 64  # at least epoch 1's (64 steps each)
    assert untimed(results["task_restarts"]) == [{"task": "ps-0", "exit_status": -9, "budget": "the cluster",
                                                  "restarted": "the cluster from its latest checkpoint"}]
    loss = results["history"]["loss"]
    assert len(loss) == 4 and loss[-1] < loss[0], loss  # it learned on (asynchronous steps: no accuracy bound)
    assert "--- restart 1 ---" in (run_dir / "logs" / "ps-0.log").read_text()  # the log goes on
    assert_nothing_left(tmp_path)


def test_with_no_restarts_left_a_death_ends_the_run_with_one_line(tmp_path):
    """A synchronous cluster cannot go on without a worker: with no restart left (cluster.max_restarts=0),
    a loss ends it, and the closing line says which task, how, the budget and the key that goes on without
    it; exit status 1. (A budget spent by earlier restarts, in its words: test_supervisor; a cluster
    restarted after a loss: the SIGKILL above.)"""
    run_dir = tmp_path / "run"
    log = run_dir / "logs" / "worker-0.log"
    chaos = kill_in_epoch_2(log, run_dir, "worker-1")
    code, out = while_running(run_dir, "strategy=multi_worker_mirrored", "cluster.workers=2", "data=synthetic",
                              "data.train_examples=1024", "data.test_examples=256", "trainer.epochs=50",
                              "trainer.batch_size=32", "trainer.verbose=2", "cluster.max_restarts=0",
                              *SGD_MLP, chaos=chaos)  # 32 steps an epoch
    assert code == 1, out[-3000:]  # (a failed run's status, as a shell reads it: the signal is in the line)
    cause = ("task worker-1 was killed by SIGKILL (signal 9), and cluster.max_restarts=0 allows no restart; "
             "cluster.min_workers=1 would go on without it")
    assert f"error: {cause}; the end of its log ({log.parent}/worker-1.log):" in out
    # The launcher's closing line, the last a user reads, names it too (not the task's own status, -9).
    launchers = [line for line in out.splitlines() if "][distrain][" in line]
    assert launchers[-1].endswith(f"[ERROR] - the run failed: {cause} (exit status 1); logs in {log.parent}"), \
        out[-3000:]
    assert len([line for line in out.splitlines() if re.match(r"(\[[^]]*\] )?error:", line)]) == 1, out[-3000:]
    # (the launcher's alone: worker 0's own news of its lost peer is no second error line)
    assert json.loads((run_dir / "status.json").read_text())["status"] == "failed"
    assert_nothing_left(tmp_path)


def test_a_ps_task_lost_past_the_budget_ends_the_run_with_one_line(tmp_path):
    """Under parameter servers too: a ps task holds the only copy of its variables, so with no cluster
    restart left its loss ends the run; one error line on the terminal, no TensorFlow error lines."""
    run_dir = tmp_path / "run"
    chaos = kill_in_epoch_2(run_dir / "logs" / "chief-0.log", run_dir, "ps-0")
    code, out = while_running(run_dir, "strategy=parameter_server", "cluster.workers=1", "cluster.ps=1",
                              "data=synthetic", "data.train_examples=1024", "data.test_examples=256",
                              "trainer.epochs=50", "trainer.batch_size=32", "trainer.verbose=2",  # 32 steps an epoch
                              "cluster.max_restarts=0", *SGD_MLP, chaos=chaos)
    assert code == 1, out[-3000:]  # (a failed run's; the signal is in its line)
    said = (f"error: task ps-0 was killed by SIGKILL (signal 9), and cluster.max_restarts=0 allows no restart; the end "
            f"of its log ({run_dir / 'logs' / 'ps-0.log'}):")
    assert said in out
    # The coordinator's reports of the functions it retries, and TensorFlow's of the functions it cannot
    # register (which of them depends on the timing), stay in its log: after its epochs, at most its own line.
    training = out.partition("steps per epoch")[2].splitlines()[1:]
    assert [line for line in training if line.startswith("[chief-0] ") and "Epoch" not in line and
            not line.startswith("[chief-0] a task of the cluster was lost mid-training (")] == [], out[-3000:]
    assert [line for line in out.splitlines() if re.match(r"(\[[^]]*\] )?error:", line)] == [  # one line for one
        # event: the launcher's
        said], out[-3000:]
    assert "Traceback" not in out and "ERROR:tensorflow" not in out
    assert json.loads((run_dir / "status.json").read_text())["status"] == "failed"
    assert_nothing_left(tmp_path)


@pytest.mark.parametrize("strategy, log_name", [("default", "train"), ("parameter_server", "chief-0"),
                                               ("multi_worker_mirrored", "worker-0")])
def test_sigterm_checkpoints_the_step_it_stopped_at(tmp_path, strategy, log_name):
    """The newest checkpoint is the step it stopped at, which a resume goes on from (from a newest
    checkpoint inside an epoch: the resumes above, and by hand after a full disk, test_storage). SIGTERM
    goes to the launcher, as a scheduler sends it (a launcher of its own process: test_slurm's requeue)."""
    run_dir = tmp_path / "run"
    log = run_dir / "logs" / f"{log_name}.log"
    sent = {}

    def chaos(run):
        wait_until(lambda: log.exists() and "Epoch 2/20" in log.read_text(), run, "epoch 2", interval=0.1)
        sent["at"] = time.monotonic()
        to_the_launcher(signal.SIGTERM, run)
    code, out = while_running(run_dir, f"strategy={strategy}", "cluster.workers=2", "data=synthetic",
                              "data.train_examples=8192", "trainer.epochs=20", "trainer.verbose=2",
                              "trainer.checkpoint_every_steps=1000", *SGD_MLP[:-1], chaos=chaos)
    stopped_in = time.monotonic() - sent["at"]
    assert code == 143, out[-3000:]
    assert stopped_in < 15  # every process gone well within the grace period
    step = int(re.search(r"stopped by SIGTERM at global step (\d+): checkpoint saved", out).group(1))
    # 8192 // 128 = 64 steps an epoch; stopped after epoch 2, before the first periodic checkpoint (1000 of 1280).
    assert 128 <= step < 1000 and tf.train.latest_checkpoint(str(run_dir / "checkpoints")).endswith(f"ckpt-{step}")
    assert_nothing_left(tmp_path)
