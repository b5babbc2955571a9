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
CONF = ROOT / "conf"
TRAIN_PY = ROOT / "train.py"
# Subprocess runs must finish well inside this; a hang fails the test instead of the suite.
RUN_TIMEOUT = 240


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


def kill_task(run_dir, name: str, sig=9) -> None:
    """Send `sig` (SIGKILL) to one task of a local cluster, found in cluster.json."""
    task = next(t for t in json.loads((run_dir / "cluster.json").read_text())["tasks"] if t["name"] == name)
    os.kill(task["pid"], sig)


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



@pytest.fixture(scope="session", autouse=True)
def two_virtual_cpus():
    """Split this process's CPU into 2 logical devices before TensorFlow's runtime starts, once."""
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    tf.config.threading.set_inter_op_parallelism_threads(2)


@pytest.fixture(autouse=True)
def fresh_collective_keys():
    """In-process tests build several MirroredStrategy objects in one process (the product builds one
    per process); TensorFlow's own tests give each its own collective key range the same way."""
    import tensorflow as tf

    tf.distribute.MirroredStrategy._collective_key_base += 10_000


# The test modules, longest first (seconds under `make test`, 2 pytest-xdist workers, on the slower
# kind of machine). `make test` runs whole modules in either worker (--dist loadscope, so a module's
# shared runs and test_slurm's one Slurm stay in one worker) and hands a worker the next module as it
# nears the end of its last: longest first, both workers end about together.
LONGEST_FIRST = ["test_multiworker",  # 309 s
                 "test_resume",  # 226 s
                 "test_slurm",  # 160 s
                 "test_sweep",  # 122 s
                 "test_bad_input",  # 95 s
                 "test_own_model",  # 70 s
                 "test_training",  # 63 s
                 "test_cli"]  # 62 s; the others take seconds


def pytest_collection_modifyitems(items):
    def rank(item):
        module = item.path.stem
        return LONGEST_FIRST.index(module) if module in LONGEST_FIRST else len(LONGEST_FIRST)
    items.sort(key=rank)  # stable: the tests of a module keep their order
