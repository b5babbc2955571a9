"""What the tests share: the real config composed as train.py composes it, runs of train.py in a
process of its own or in this one, and the checks that a run left nothing behind."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

import distrain  # noqa: F401  (sets TF_USE_LEGACY_KERAS before any TensorFlow import)
from distrain import cli
from distrain.data import write_idx  # noqa: F401  (for the tests)

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "src" / "distrain" / "conf"
TRAIN_PY = ROOT / "train.py"
# Subprocess runs must finish well inside this; a hang fails the test instead of the suite.
RUN_TIMEOUT = 240


def record_file(path: Path, features: dict) -> Path:
    """A TFRecord file of one tf.train.Example with these features (bad data of the tests' making)."""
    import tensorflow as tf

    with tf.io.TFRecordWriter(str(path)) as writer:
        writer.write(tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString())
    return path


def make_cfg(*overrides):
    """The real config, composed as `python train.py OVERRIDES` would compose it."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=list(overrides))


def small(*overrides):
    """A quick in-process run: synthetic data, one epoch, nothing saved, silent."""
    return make_cfg("data=synthetic", "data.train_examples=1024", "data.test_examples=256",
                    "trainer.epochs=1", "trainer.batch_size=64", "trainer.verbose=0",
                    "trainer.save_model=false", *overrides)


def run_cli(run_dir: Path, *args, timeout=RUN_TIMEOUT, env_extra=None, **kwargs):
    """`python train.py ARGS` with its run directory at run_dir; never the network, never the user's cache."""
    env = {**os.environ, "KERAS_HOME": str(run_dir.parent / "keras_home"), "HYDRA_FULL_ERROR": "0",
           **(env_extra or {})}
    return subprocess.run([sys.executable, str(TRAIN_PY), f"hydra.run.dir={run_dir}", *args],
                          capture_output=True, text=True, timeout=timeout, env=env, cwd=run_dir.parent,
                          **kwargs)


def in_process(tmp_path, monkeypatch, capfd, args, env_extra=None):
    """`python train.py ARGS` in this process: what main() prints, and its exit status. For bad input
    that fails before any task starts, this checks what a process of its own would, in a tenth of the
    time (no interpreter and imports to start)."""
    monkeypatch.chdir(tmp_path)
    # Hydra's logging set-up would replace this test's capture of the output (pytest's handlers): not here.
    monkeypatch.setattr(sys, "argv", ["train.py", "hydra/job_logging=none", "hydra/hydra_logging=none", *args])
    monkeypatch.setattr(sys, "path", list(sys.path))  # main() adds the working directory
    # (main() sets HYDRA_FULL_ERROR and DISTRAIN_STARTED in os.environ: set here, they are undone after.)
    for name, value in {"HYDRA_FULL_ERROR": "0", "DISTRAIN_STARTED": str(time.time()),
                        "KERAS_HOME": str(tmp_path / "keras_home"), **(env_extra or {})}.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as exited:
        cli.main()
    out = capfd.readouterr()
    return exited.value.code, out.out, out.err


# Multi-process runs: start, wait, stop, and check that nothing is left behind.

def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def task_pids(run_dir):
    return [t["pid"] for t in json.loads((run_dir / "cluster.json").read_text())["tasks"]]


def task_state(run_dir, name: str) -> dict:
    """One task of a local cluster as cluster.json describes it now (its pid, state, restarts)."""
    return next(t for t in json.loads((run_dir / "cluster.json").read_text())["tasks"] if t["name"] == name)


def kill_task(run_dir, name: str, sig=9) -> None:
    """Send `sig` (SIGKILL) to one task of a local cluster, found in cluster.json."""
    os.kill(task_state(run_dir, name)["pid"], sig)


def untimed(restarts: list) -> list:
    """The launcher's record of restarts (results.json, cluster.json), each checked to have its time."""
    assert all(isinstance(r.pop("time"), float) for r in restarts), restarts
    return restarts


def assert_nothing_left(run_dir):
    """No process whose command line names run_dir (a run, a sweep, a test's tmp_path), nor any task
    cluster.json lists, is still running."""
    found = subprocess.run(["pgrep", "-f", str(run_dir)], capture_output=True, text=True).stdout.split()
    assert found == [], f"processes left behind: {found}"
    if (run_dir / "cluster.json").exists():
        assert not [pid for pid in task_pids(run_dir) if alive(pid)]


def start(run_dir, *args, env=None):
    return subprocess.Popen([sys.executable, str(TRAIN_PY), f"hydra.run.dir={run_dir}", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            cwd=run_dir.parent)


def wait_until(predicate, proc, what, timeout=RUN_TIMEOUT, interval=0.2):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert proc.poll() is None, f"exited ({proc.returncode}) before {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(interval)


def finish(proc, timeout=RUN_TIMEOUT):
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return out


def check_evaluations(run_dir, out: str, last: str, epoch: int):
    """The sidecar evaluator evaluated the chief's checkpoints, in order, up to the run's last (`last`, at
    the end of epoch `epoch`), which it evaluated as the run's own test did; then it stopped."""
    evaluations = json.loads((run_dir / "evaluation.json").read_text())["evaluations"]
    assert evaluations[-1]["checkpoint"] == last
    assert [e["epoch"] for e in evaluations] == sorted({e["epoch"] for e in evaluations})
    final = json.loads((run_dir / "results.json").read_text())
    assert evaluations[-1]["accuracy"] == pytest.approx(final["test_accuracy"], abs=1e-6)
    assert f"[evaluator-0] evaluator: epoch {epoch} ({last})" in out


def tensorboard_values(log_dir: Path) -> dict:
    """{tag: [value, ...]} of the event files in log_dir (not below it), read as TensorBoard reads them:
    scalars as numbers, the hparams plugin's records as what they hold (Experiment, SessionStartInfo,
    SessionEndInfo)."""
    from tensorboard.compat.proto import event_pb2
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import PyRecordReader_New
    from tensorboard.plugins.hparams import metadata
    from tensorboard.util import tensor_util

    parse = {metadata.EXPERIMENT_TAG: metadata.parse_experiment_plugin_data,
             metadata.SESSION_START_INFO_TAG: metadata.parse_session_start_info_plugin_data,
             metadata.SESSION_END_INFO_TAG: metadata.parse_session_end_info_plugin_data}
    found = {}
    for path in sorted(Path(log_dir).glob("events.out.tfevents.*")):
        reader = PyRecordReader_New(str(path))
        while True:
            try:
                reader.GetNext()
            except Exception:  # noqa: BLE001 - the end of the file
                break
            for value in event_pb2.Event.FromString(reader.record()).summary.value:
                found.setdefault(value.tag, []).append(
                    parse[value.tag](value.metadata.plugin_data.content) if value.tag in parse
                    else tensor_util.make_ndarray(value.tensor).item())
    return found
