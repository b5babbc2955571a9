"""Nothing lost on storage faults and reruns: a full disk is one line and a run that goes on elsewhere,
a finished run's directory is never overwritten, a rerun sweep finishes only what is unfinished.
(A truncated newest checkpoint falling back to the one before: test_resume.)

Multi-process tests are bounded in time and check that no process they caused is left behind.
"""
import csv
import json
import os
import re
import shutil
import signal
import subprocess
import sys

import pytest
import yaml

from distrain.common import storage

from helpers import ROOT, TRAIN_PY, assert_nothing_left, finish, in_process, run_cli, sweep_cli, wait_until

# Files written in place, not through storage.write_atomic, and why that is safe.
WRITTEN_IN_PLACE = {"common/storage.py": "the atomic write itself",
                    "launcher/task_log.py": "task logs, appended to as they come",
                    "launcher/forkserver.py": "its log, appended to as it comes",
                    "common/lifetime.py": "the heartbeat: only its time",
                    "common/cluster.py": "core locks, which hold nothing",
                    "data/arrays.py": "a download to .part, then renamed",
                    "report/plots.py": "a picture to .tmp.png, then renamed",
                    "common/stacks.py": "a task's step and stacks in the scratch directory, read by the launcher alone",
                    "launcher/stalls.py": "the empty file a task's stacks are dumped into, in the scratch directory; "
                                          "the stacks, appended to the task's log"}

QUICK = ["model=mlp", "optimizer=sgd", "trainer.learning_rate=0.1", "data=synthetic", "data.train_examples=1024",
         "data.test_examples=256", "trainer.batch_size=64", "trainer.verbose=2"]  # 16 steps an epoch


PACKAGE = ROOT / "src" / "distrain"


def test_files_that_others_read_are_written_whole_or_not_at_all():
    """Every write in the code goes through storage.write_atomic (a temporary name, then a rename) but
    for the modules named above; and that write leaves no temporary file when it fails."""
    plain = re.compile(r"(?<!report)(?<!storage)\.write_(text|bytes)\(|open\([^)]*[\"'][wax]b?[\"']|savefig\(")
    found = {str(path.relative_to(PACKAGE)) for path in PACKAGE.glob("**/*.py")
             if any(plain.search(line) for line in path.read_text().splitlines())}
    assert found == set(WRITTEN_IN_PLACE), found ^ set(WRITTEN_IN_PLACE)
    assert plain.search("tmp.write_bytes(data)") and not plain.search("storage.write_atomic(path, x)")  # control
    with pytest.raises(OSError) as failed:
        storage.write_atomic(ROOT / "no such directory" / "x.json", "{}")
    assert failed.value.filename == str(ROOT / "no such directory" / "x.json")


@pytest.fixture
def small_disk(tmp_path):
    """A 2400 KiB filesystem at tmp_path/disk (tmpfs), unmounted after the test: room for three of the
    checkpoints below (623 KiB each), not for a fourth. Skipped where nothing can be mounted."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2400k", "tmpfs", str(disk)], capture_output=True,
                             text=True)
    if mounted.returncode != 0:
        pytest.skip(f"no small filesystem here: mount -t tmpfs failed ({mounted.stderr.strip()}); run as root")
    yield disk
    subprocess.run(["umount", "--lazy", str(disk)], capture_output=True)


def files(directory) -> dict:
    return {p.relative_to(directory): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def error_lines(text: str) -> list:
    return [line for line in text.splitlines() if "error:" in line]


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["default", "multi_worker_mirrored"])
def test_a_full_disk_is_one_line_and_the_run_goes_on_from_a_larger_one(tmp_path, small_disk, strategy):
    run_dir = small_disk / "run"
    out = run_cli(run_dir, f"strategy={strategy}", "cluster.workers=2", *QUICK, "trainer.epochs=4",
                  "trainer.checkpoint_every_steps=5")
    text = out.stdout + out.stderr
    assert out.returncode == 2, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    (error,) = error_lines(text)
    assert f"the disk holding {run_dir}" in error and f"is full (the filesystem at {small_disk})" in error, error
    latest = re.search(r"the latest complete checkpoint is (ckpt-(\d+)) \(in ", error)
    assert latest and "then go on with trainer.resume=true" in error, error
    # Nothing half-written is left; what was kept is what the line says.
    assert not [p for p in run_dir.rglob("*") if p.name.endswith(("_temp", ".tmp", ".tmp.png"))]
    assert storage.latest_checkpoint(run_dir / "checkpoints") == latest.group(1)
    assert json.loads((run_dir / "status.json").read_text())["status"] == "failed"
    assert_nothing_left(tmp_path)
    if strategy != "default":
        return  # a cluster resumed from its latest checkpoint: test_resume; here once, by hand
    # Moved to a larger disk, the run goes on from that checkpoint and ends.
    moved = tmp_path / "moved"
    shutil.copytree(run_dir, moved)
    again = run_cli(moved, "trainer.resume=true")
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    results = json.loads((moved / "results.json").read_text())
    assert results["resumed_from_step"] == int(latest.group(2)) and results["global_steps"] == 64
    assert_nothing_left(tmp_path)


@pytest.mark.slow
def test_a_run_into_a_finished_runs_directory_is_refused_and_changes_nothing(tmp_path):
    run_dir = tmp_path / "run"
    first = run_cli(run_dir, *QUICK, "trainer.epochs=1")
    assert first.returncode == 0, first.stdout[-3000:]
    before = files(run_dir)
    again = run_cli(run_dir, *QUICK, "trainer.epochs=2", "trainer.learning_rate=0.01", timeout=60)
    assert again.returncode == 2 and "Traceback" not in again.stdout + again.stderr, again.stderr[-3000:]
    assert error_lines(again.stderr) == [
        f"error: hydra.run.dir={run_dir} holds a run already, which ended ok at global step 16, test accuracy "
        f"{json.loads(before[next(p for p in before if p.name == 'results.json')])['test_accuracy']:.2%}: go on with "
        f"it with trainer.resume=true, set another hydra.run.dir, or remove {run_dir}"]
    assert files(run_dir) == before  # byte for byte, and nothing added
    # Control: with trainer.resume=auto the finished run is kept as it is (and said so), not run again.
    kept = run_cli(run_dir, *QUICK, "trainer.resume=auto", timeout=60)
    assert kept.returncode == 0 and f"the run in {run_dir}: kept (ok - test accuracy" in kept.stdout + kept.stderr
    after = files(run_dir)
    assert {p: after[p] for p in before if p.parts[0] not in (".hydra", "launcher.log")} == \
        {p: before[p] for p in before if p.parts[0] not in (".hydra", "launcher.log")}
    assert_nothing_left(tmp_path)


def multirun(sweep_dir, *args):
    tmp = sweep_dir.parent / "tmp"  # the scratch directory a killed launcher leaves: here, not in /tmp
    tmp.mkdir(exist_ok=True)
    return subprocess.Popen([sys.executable, str(TRAIN_PY), "-m", f"hydra.sweep.dir={sweep_dir}", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=sweep_dir.parent,
                            start_new_session=True, env={**os.environ, "TMPDIR": str(tmp)})


@pytest.mark.slow
def test_a_rerun_sweep_keeps_its_finished_jobs_and_resumes_the_killed_one(tmp_path):
    sweep_dir = tmp_path / "sweep"
    args = [*QUICK, "trainer.epochs=1,16", "trainer.checkpoint_every_steps=5"]  # job 1: 256 steps
    proc = multirun(sweep_dir, *args)
    log = sweep_dir / "1" / "logs" / "train.log"
    try:
        wait_until(lambda: log.exists() and "Epoch 2/16" in log.read_text(), proc, "job 1's epoch 2", interval=0.05)
        os.killpg(proc.pid, signal.SIGKILL)  # the sweep and its job's task, as a power cut would
    finally:
        finish(proc)
    assert json.loads((sweep_dir / "0" / "status.json").read_text())["status"] == "ok"
    assert not (sweep_dir / "1" / "results.json").exists()
    job0 = {p: b for p, b in files(sweep_dir / "0").items() if p.parts[0] not in (".hydra", "launcher.log")}
    # The same command again is refused: the sweep directory holds a sweep.
    refused = sweep_cli(sweep_dir, *args, timeout=60)
    assert refused.returncode == 2 and error_lines(refused.stderr) == [
        f"error: hydra.sweep.dir={sweep_dir} holds a sweep already (2 job(s): 1 ok, 1 running): rerun it with "
        f"trainer.resume=auto to finish what is unfinished, set another hydra.sweep.dir, or remove {sweep_dir}"]
    # With trainer.resume=auto: job 0 is kept as it is, job 1 goes on from its checkpoint.
    rerun = sweep_cli(sweep_dir, *args, "trainer.resume=auto")
    out = rerun.stdout + rerun.stderr
    assert rerun.returncode == 0, out[-3000:]
    assert "job #0 (trainer.epochs=1): kept (ok - test accuracy" in out
    assert {p: b for p, b in files(sweep_dir / "0").items() if p.parts[0] not in (".hydra", "launcher.log")} == job0
    results = json.loads((sweep_dir / "1" / "results.json").read_text())
    assert 0 < results["resumed_from_step"] < 256 and results["global_steps"] == 256 and results["restarts"] == 1
    with open(sweep_dir / "summary.csv", newline="") as f:
        assert [(r["job"], r["status"]) for r in csv.DictReader(f)] == [("0", "ok"), ("1", "ok")]
    assert_nothing_left(tmp_path)


@pytest.mark.parametrize("elsewhere", [True, False])
def test_a_refused_run_names_the_latest_checkpoint_where_the_run_keeps_them(tmp_path, elsewhere):
    """A run directory whose run kept its checkpoints in trainer.checkpoint_dir: the line refusing a new
    run there names its latest checkpoint, read where its config.yaml says (rundir.RunDir). Control: the
    same run keeping them in the run directory, which holds none, names none."""
    run_dir, checkpoints = tmp_path / "run", tmp_path / "elsewhere"
    checkpoints.mkdir()
    (checkpoints / "checkpoint").write_text('model_checkpoint_path: "ckpt-200"\nall_model_checkpoint_paths: '
                                            '"ckpt-200"\n')
    run_dir.mkdir()
    (run_dir / "status.json").write_text(json.dumps({"status": "interrupted", "exit_status": 130}))
    (run_dir / "config.yaml").write_text(yaml.safe_dump(
        {"trainer": {"checkpoint_dir": str(checkpoints) if elsewhere else None, "save_model": True}}))
    code, _, err = in_process(tmp_path, [f"hydra.run.dir={run_dir}"])
    latest = "; its latest checkpoint is ckpt-200" if elsewhere else ""
    assert code == 2 and err.splitlines() == [
        f"error: hydra.run.dir={run_dir} holds a run already, which was interrupted{latest}: go on with it with "
        f"trainer.resume=true, set another hydra.run.dir, or remove {run_dir}"], err
