"""cluster=slurm on a real Slurm: scripts/slurm-local.sh brings up a one-node Slurm on this machine
(installing slurm-wlm and munge if missing). Where that cannot be done (not root, no apt-get), the
tests skip and say why. Each test is bounded in time and checks that no process it caused is left.
"""
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from helpers import RUN_TIMEOUT, TRAIN_PY, assert_nothing_left, here

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "slurm-local.sh"
QUICK = ["model=mlp", "data=synthetic", "data.train_examples=2048", "data.test_examples=256", "trainer.epochs=2",
         "trainer.batch_size=64", "trainer.verbose=2"]

pytestmark = [pytest.mark.slurm, pytest.mark.slow]  # every test starts a Slurm and runs on it


@pytest.fixture(scope="module", autouse=True)
def slurm():
    """A running Slurm: the one there is, else one started here and stopped after these tests."""
    running = bool(shutil.which("sinfo")) and subprocess.run(["sinfo"], capture_output=True).returncode == 0
    if not running:
        up = subprocess.run(["bash", str(SCRIPT), "up"], capture_output=True, text=True, timeout=300)
        if up.returncode != 0:
            pytest.skip(f"no Slurm here: {up.stderr.strip() or up.stdout.strip()}")
    yield
    if not running:
        subprocess.run(["bash", str(SCRIPT), "down"], capture_output=True, timeout=60)
        left = [d for d in ("slurmd", "slurmctld", "munged") if subprocess.run(["pgrep", "-x", d]).returncode == 0]
        assert not left, f"Slurm daemons left running: {left}"


def srun(tmp_path, ntasks: int, *args, timeout=RUN_TIMEOUT):
    """srun -n NTASKS python train.py ARGS, from tmp_path (so outputs/ goes there)."""
    return subprocess.run(["srun", "-n", str(ntasks), "--wait=60", sys.executable, str(TRAIN_PY), *args],
                          capture_output=True, text=True, timeout=timeout, cwd=tmp_path,
                          env={k: v for k, v in os.environ.items() if not k.startswith("SLURM_")})


def run_dir_of(tmp_path) -> Path:
    (run_dir,) = (tmp_path / "outputs" / "slurm").iterdir()  # one step: outputs/slurm/JOB.STEP, shared
    return run_dir


def test_too_few_slurm_tasks_for_the_strategy_is_one_line(tmp_path):
    out = srun(tmp_path, 2, "strategy=parameter_server", "cluster=slurm", "cluster.ps=1", *QUICK, timeout=120)
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert out.returncode != 0 and len(errors) == 2, out.stderr[-3000:]  # one line from each task
    assert "needs at least 3 Slurm tasks (a chief, 1 ps, a worker); this step has 2" in errors[0]
    assert "Traceback" not in out.stdout + out.stderr
    assert_nothing_left(tmp_path)


def test_the_parameter_server_sbatch_example_learns_and_its_step_ends(tmp_path):
    """As a user submits it, from the repository with its environment active (the venv's python). Its
    multi_worker_mirrored sibling differs only in the strategy (the requeued job below)."""
    strategy = "parameter_server"
    run_dir = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
    job = subprocess.run(["sbatch", "--parsable", f"--output={tmp_path}/slurm-%j.out",
                          str(SCRIPT.parent / "slurm" / f"{strategy}.sbatch"), f"hydra.run.dir={run_dir}", *QUICK],
                         capture_output=True, text=True, timeout=60, cwd=TRAIN_PY.parent, env=env, check=True)
    job_id = job.stdout.strip().split(";")[0]
    deadline = time.monotonic() + RUN_TIMEOUT  # (sbatch --wait polls ever more slowly: 30 s late)
    try:
        while subprocess.run(["squeue", "-h", "-j", job_id], capture_output=True, text=True).stdout.strip():
            assert time.monotonic() < deadline, f"job {job_id} still running"
            time.sleep(0.5)
    finally:
        subprocess.run(["scancel", job_id], timeout=30)  # a no-op once it is done
    state = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True).stdout
    (log,) = tmp_path.glob("slurm-*.out")
    assert "JobState=COMPLETED" in state and "ExitCode=0:0" in state, state + log.read_text()[-3000:]
    results = json.loads((run_dir / "results.json").read_text())
    loss = results["history"]["loss"]
    assert results["strategy"] == strategy and loss[-1] < loss[0], loss  # it learned (async: no accuracy bound)
    assert (results["num_workers"], results["num_ps"]) == (2,
                                                           1) and all(n > 0 for n in results["worker_steps"].values())
    assert sorted(p.name for p in (run_dir / "logs").glob("*.log")) == [
        "chief-0.log", "ps-0.log", "worker-0.log", "worker-1.log"]
    assert log.read_text().count("the chief is gone, so this task ends") == 3  # the ps and workers end with it
    assert "trainer.resume=auto: no checkpoint in" in log.read_text()  # a requeue would go on from one
    assert_nothing_left(tmp_path)


def test_a_sweep_over_worker_counts_asks_slurm_for_each_jobs_tasks(tmp_path):
    """-m hydra/launcher=slurm: Hydra's submitit launcher, one Slurm job per point, sized to it."""
    sweep = tmp_path / "sweep"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    out = subprocess.run([sys.executable, str(TRAIN_PY), "-m", "hydra/launcher=slurm", f"hydra.sweep.dir={sweep}",
                          "strategy=multi_worker_mirrored", "cluster=slurm", "cluster.workers=1,2", *QUICK],
                         capture_output=True, text=True, timeout=2 * RUN_TIMEOUT, cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    for num, workers in ((0, 1), (1, 2)):
        results = json.loads((sweep / str(num) / "results.json").read_text())
        assert results["num_workers"] == workers and results["test_accuracy"] > 0.5
        assert len(list((sweep / str(num) / "logs").glob("worker-*.log"))) == workers
    assert "(2 Slurm task(s))" in out.stdout + out.stderr
    assert (sweep / "summary.csv").read_text().count(",ok,") == 2
    assert_nothing_left(tmp_path)


def test_a_requeued_job_goes_on_from_its_checkpoint(tmp_path):
    """The multi_worker_mirrored sbatch example, on 2 Slurm tasks; scontrol requeue (as preemption does):
    srun passes SIGTERM on, the workers checkpoint the step they agree on, and the job, started again
    under the same job id, resumes there (trainer.resume=auto)."""
    run_dir = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
    job_id = subprocess.run(["sbatch", "--parsable", f"--output={tmp_path}/slurm-%j.out",
                             str(SCRIPT.parent / "slurm" / "multi_worker_mirrored.sbatch"), f"hydra.run.dir={run_dir}",
                             *QUICK[1:-3], "data.train_examples=4096", "trainer.epochs=4", "trainer.verbose=2",
                             # 32 slower steps an epoch: requeued early
                             "model=cnn", "trainer.checkpoint_every_steps=8"],
                            capture_output=True, text=True, timeout=60, cwd=TRAIN_PY.parent, env=env,
                            check=True).stdout.strip().split(";")[0]
    try:
        deadline = time.monotonic() + RUN_TIMEOUT
        while not (run_dir / "checkpoints" / "checkpoint").exists():
            assert time.monotonic() < deadline, "no checkpoint"
            time.sleep(0.2)
        subprocess.run(["scontrol", "requeue", job_id], check=True, timeout=30)
        while "JobState=PENDING" not in subprocess.run(["scontrol", "show", "job", job_id], capture_output=True,
                                                        text=True).stdout:
            assert time.monotonic() < deadline, "not requeued"
            time.sleep(0.2)
        # Slurm holds a requeued job for a while before it may start again; a test need not wait for that.
        subprocess.run(["scontrol", "update", f"jobid={job_id}", "StartTime=now"], check=True, timeout=30)
        while subprocess.run(["squeue", "-h", "-j", job_id], capture_output=True, text=True).stdout.strip():
            assert time.monotonic() < deadline, f"job {job_id} still running"
            time.sleep(0.5)
    finally:
        subprocess.run(["scancel", job_id], timeout=30)  # a no-op once it is done
    state = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True).stdout
    assert "JobState=COMPLETED" in state and "Restarts=1" in state, state
    results = json.loads((run_dir / "results.json").read_text())
    assert results["restarts"] == 1 and 0 < results["resumed_from_step"] < 4 * 32
    assert len(results["history"]["loss"]) == 4 and results["test_accuracy"] > 0.5
    assert results["num_workers"] == 2
    assert sorted(p.name for p in (run_dir / "logs").glob("*.log")) == ["worker-0.log", "worker-1.log"]
    assert_nothing_left(tmp_path)


def test_evaluate_and_predict_run_on_the_slurm_tasks_as_in_one_process(tmp_path):
    """A run's `distrain predict` on 2 Slurm tasks (multi_worker_mirrored: each writes its parts under the
    run directory, which the node shares, and the first merges them) gives one process's outputs, each
    once in order; `distrain evaluate` on 3 (parameter_server) one process's figures."""
    distrain = str(Path(sys.executable).parent / "distrain")
    run = tmp_path / "run"

    def command(*args, tasks=None):
        """On Slurm's tasks by srun; without tasks, in this process (the one-process references)."""
        if not tasks:
            code, out, err = here(tmp_path, list(args))
            assert code == 0, out[-3000:] + err[-3000:]
            return out + err
        done = subprocess.run(["srun", "-n", str(tasks), "--wait=60", distrain, *args],
                              capture_output=True, text=True, timeout=RUN_TIMEOUT, cwd=tmp_path,
                              env={k: v for k, v in os.environ.items() if not k.startswith("SLURM_")})
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return done.stdout + done.stderr
    command(f"hydra.run.dir={run}", *QUICK)
    command("predict", str(run), "out=one.npz")
    said = command("predict", str(run), "strategy=multi_worker_mirrored", "cluster=slurm", "part_size=64",
                   "out=two.npz", tasks=2)
    assert "worker-1: its parts of the 256 examples are written; the command of worker-0 merges them" in said
    with np.load(tmp_path / "one.npz") as one, np.load(tmp_path / "two.npz") as two:
        assert list(two["index"]) == list(range(256))
        np.testing.assert_allclose(two["predictions"], one["predictions"], rtol=1e-5, atol=1e-6)
        assert not np.allclose(two["predictions"], one["predictions"][::-1], rtol=1e-5, atol=1e-6)  # (order counts)
    command("evaluate", str(run), "name=one")
    said = command("evaluate", str(run), "strategy=parameter_server", "cluster=slurm", "cluster.ps=1", "name=ps",
                   tasks=3)
    assert said.count("served chief-0, whose command wrote the outputs of the 256 examples") == 2, said
    one, ps = (json.loads((run / "evaluations" / f"{name}.json").read_text()) for name in ("one", "ps"))
    assert ps["workers"] == 1 and ps["strategy"] == "parameter_server" and ps["examples"] == 256
    for key in ("loss", "accuracy"):
        assert abs(ps[key] - one[key]) < 1e-5, (key, ps, one)
    assert not list((run / "evaluations").glob("*/parts-*"))
    assert_nothing_left(tmp_path)


def test_a_run_resumes_on_the_slurm_tasks_it_has(tmp_path):
    """A multi_worker_mirrored run on 2 Slurm tasks for an epoch goes on, from its checkpoint, on the 1 task
    of another job step (as a job started again on fewer nodes would), the global batch kept."""
    run_dir = tmp_path / "run"
    args = ["strategy=multi_worker_mirrored", "cluster=slurm", f"hydra.run.dir={run_dir}",
            "trainer.mixed_precision=false", *(a for a in QUICK if not a.startswith("trainer.epochs="))]
    first = srun(tmp_path, 2, *args, "trainer.epochs=1")
    assert first.returncode == 0, first.stderr[-3000:]
    then = srun(tmp_path, 1, *args, "trainer.epochs=2", "trainer.resume=true")
    assert then.returncode == 0, then.stderr[-3000:]
    assert ("resumed at step 32 on 1 worker, 1 replica; its checkpoint was made on 2 workers, 2 replicas: the global "
            "batch 64 kept (64 per replica)") in then.stdout + then.stderr
    results = json.loads((run_dir / "results.json").read_text())
    assert results["membership"] == [{"from_step": 0, "workers": 2, "replicas": 2},
                                     {"from_step": 32, "workers": 1, "replicas": 1}]
    assert results["global_steps"] == 64 and len(results["history"]["loss"]) == 2
    assert_nothing_left(tmp_path)


def test_a_slurm_step_s_last_ranks_run_the_tf_data_service_and_end_with_the_chief(tmp_path):
    """srun -n 4 with data.service.workers=1: 2 workers, then a dispatcher and a data worker, which end once
    the chief is gone (a job step ends only when every task has)."""
    out = srun(tmp_path, 4, "strategy=multi_worker_mirrored", "cluster=slurm", "data.service.workers=1", *QUICK)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    run_dir = run_dir_of(tmp_path)
    results = json.loads((run_dir / "results.json").read_text())
    assert results["num_workers"] == 2 and results["data_service"]["address"].startswith("grpc://")
    assert sorted(p.name for p in (run_dir / "logs").glob("*.log")) == [
        "data_worker-0.log", "dispatcher-0.log", "worker-0.log", "worker-1.log"]
    assert out.stdout.count("the chief is gone, so this task ends") == 2, out.stdout[-3000:]
    assert_nothing_left(tmp_path)


def test_an_optuna_study_on_slurm_prunes_its_trials_two_at_a_time(tmp_path):
    """-m hparams_search=optuna hydra/launcher=slurm: each trial a Slurm job, two at a time; a pruner that
    stops every trial below 0.99 at its first epoch stops each there (the job's launcher follows its epochs
    on the node and tells the study, which lives in the sweep directory)."""
    sweep = tmp_path / "sweep"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    out = subprocess.run([sys.executable, str(TRAIN_PY), "-m", "hparams_search=optuna", "hydra/launcher=slurm",
                          f"hydra.sweep.dir={sweep}", "hydra.sweeper.n_trials=2", "hydra.sweeper.n_jobs=2",
                          "hydra.sweeper.pruner={_target_: optuna.pruners.ThresholdPruner, lower: 0.99}",
                          "model=mlp", "data.source=bundled", "trainer.epochs=4"],  # (no digit reaches 0.99 then)
                         capture_output=True, text=True, timeout=2 * RUN_TIMEOUT, cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    said = out.stdout + out.stderr
    assert "trial 0: pruned at epoch 1 (val_accuracy" in said and "trial 1: pruned at epoch 1 (val_accuracy" in said
    assert "No trial completed" in said, said[-3000:]
    for num in (0, 1):
        status = json.loads((sweep / str(num) / "status.json").read_text())
        assert status["status"] == "pruned" and status["exit_status"] == 0
        assert "Epoch 2/" not in (sweep / str(num) / "logs" / "train.log").read_text()  # stopped at epoch 1's end
    assert_nothing_left(tmp_path)
