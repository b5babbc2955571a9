"""What the tests share: the real config composed as train.py composes it, runs of train.py in a
process of its own or in this one, and the checks that a run left nothing behind."""
import contextlib
import io
import json
import logging
import logging.config
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import portpicker
import pytest
from hydra import compose, initialize_config_dir

import distrain  # noqa: F401  (sets TF_USE_LEGACY_KERAS before any TensorFlow import)
from distrain import cli
from distrain.data.arrays import write_idx  # noqa: F401  (for the tests)

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


def run_cli(run_dir: Path, *args, timeout=RUN_TIMEOUT, env_extra=None, process=False, **kwargs):
    """`python train.py hydra.run.dir=RUN_DIR ARGS` from run_dir's parent; never the network, never the
    user's cache. Its exit status and output, as a CompletedProcess. By default the launcher runs in this
    process, its tasks forked from this process's fork server as a sweep's later jobs are (about 4 s of
    CPU less a run: no interpreter, Hydra and TensorFlow to start); process=True: a process of its own,
    where what is under test is that process (its start-up, its environment, its exit)."""
    return _train(run_dir.parent, [f"hydra.run.dir={run_dir}", *args], timeout, env_extra, process, **kwargs)


def sweep_cli(sweep_dir: Path, *args, timeout=RUN_TIMEOUT, env_extra=None, process=False, **kwargs):
    """`python train.py -m hydra.sweep.dir=SWEEP_DIR ARGS`, as run_cli runs a run."""
    return _train(sweep_dir.parent, ["-m", f"hydra.sweep.dir={sweep_dir}", *args], timeout, env_extra, process,
                  **kwargs)


def _train(cwd: Path, argv: list, timeout: float, env_extra, process: bool, **kwargs):
    env = {"KERAS_HOME": str(cwd / "keras_home"), "HYDRA_FULL_ERROR": "0", **(env_extra or {})}
    if process:
        return subprocess.run([sys.executable, str(TRAIN_PY), *argv], capture_output=True, text=True,
                              timeout=timeout, env={**os.environ, **env}, cwd=cwd, **kwargs)
    return subprocess.CompletedProcess(["train.py", *argv], *here(cwd, argv, env, timeout))


class Overdue(Exception):
    """A command run in this process took longer than its time."""


def here(cwd: Path, argv: list, env: dict | None = None, timeout: float = RUN_TIMEOUT) -> tuple[int, str, str]:
    """`distrain ARGV` in this process as from a shell in cwd with env added: its exit status and what
    it printed (stdout, stderr), within timeout seconds (else Overdue, its tasks stopped as on an error)."""
    def overdue(*_):
        raise Overdue(f"distrain {' '.join(argv)} took longer than {timeout} s")

    said = []
    try:
        with pytest.MonkeyPatch.context() as m, printed(said):
            for name, value in (env or {}).items():
                m.setenv(name, value)
            previous = signal.signal(signal.SIGALRM, overdue)
            signal.setitimer(signal.ITIMER_REAL, timeout)
            try:
                with as_a_user(m, cwd, argv):
                    cli.main()
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, previous)
    except Overdue as exc:
        raise Overdue(f"{exc}; the end of what it printed:\n{said[0][-2000:]}\n{said[1][-2000:]}") from None
    return code, *said


@contextlib.contextmanager
def printed(said: list):
    """What this process writes to stdout and stderr meanwhile, by Python or at the file descriptors (the
    tasks' lines the launcher passes on, logging's handlers): added to `said` as [out, err] as it ends."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        sys.stdout.flush()
        sys.stderr.flush()
        saved = [os.dup(1), os.dup(2)], (sys.stdout, sys.stderr)
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        sys.stdout, sys.stderr = (io.TextIOWrapper(open(fd, "wb", closefd=False), line_buffering=True)
                                  for fd in (1, 2))
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            sys.stdout, sys.stderr = saved[1]
            for fd, kept in zip((1, 2), saved[0]):
                os.dup2(kept, fd)
                os.close(kept)
            for file in (out, err):
                file.seek(0)
                said.append(file.read().decode(errors="replace"))


@contextlib.contextmanager
def as_a_user(monkeypatch, cwd: Path, argv: list):
    """`distrain ARGV` in this process as from a shell in cwd: sys.argv, the directory, the environment
    main() sets, and the logging Hydra configures for the run, each as it was after."""
    root, loggers = logging.getLogger(), dict(logging.Logger.manager.loggerDict)
    saved = (root.level, list(root.handlers), {name: (lg.level, list(lg.handlers), lg.propagate, lg.disabled)
                                               for name, lg in loggers.items() if isinstance(lg, logging.Logger)})
    with monkeypatch.context() as m:
        # Hydra's logging set-up closes every handler there is (logging.config's way): in a process of the
        # user's, none; in this one, pytest's and absl's (the latter closing pytest's capture of stderr).
        # Those stay open here; the run's own are closed after it.
        m.setattr(logging.config, "_clearExistingHandlers", logging._handlers.clear)
        m.chdir(cwd)
        m.setattr(sys, "argv", ["distrain", *argv])
        m.setattr(sys, "path", list(sys.path))
        # (main() sets these in os.environ: set here, they are undone after, as a process of its own would.)
        m.setenv("HYDRA_FULL_ERROR", os.environ.get("HYDRA_FULL_ERROR", "0"))
        m.setenv("DISTRAIN_STARTED", str(time.time()))
        try:
            yield
        finally:
            before = {id(h) for h in saved[1]} | {id(h) for _, hs, _, _ in saved[2].values() for h in hs}
            for lg in [root, *logging.Logger.manager.loggerDict.values()]:
                for handler in getattr(lg, "handlers", []):
                    if id(handler) not in before:
                        handler.close()
            root.setLevel(saved[0])
            root.handlers[:] = saved[1]
            for name, lg in list(logging.Logger.manager.loggerDict.items()):
                if isinstance(lg, logging.Logger):  # (one the run made: as a new logger is)
                    level, handlers, propagate, disabled = saved[2].get(name, (logging.NOTSET, [], True, False))
                    lg.level, lg.handlers[:], lg.propagate, lg.disabled = level, handlers, propagate, disabled


def in_process(tmp_path: Path, args: list, env_extra=None) -> tuple[int, str, str]:
    """`python train.py ARGS` in this process from tmp_path, Hydra's logging off: its exit status and what
    it printed. For bad input that fails before any task starts, this checks what a process of its own
    would, in a tenth of the time (no interpreter and imports to start)."""
    done = _train(tmp_path, ["hydra/job_logging=none", "hydra/hydra_logging=none", *args], RUN_TIMEOUT, env_extra,
                  process=False)
    return done.returncode, done.stdout, done.stderr


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


class _Running:
    """A run in this process, as wait_until asks of a launcher's Popen: poll() is None until it ends."""
    returncode = None

    def poll(self):
        return self.returncode


def while_running(run_dir: Path, *args, chaos, timeout=RUN_TIMEOUT) -> tuple[int, str]:
    """run_cli's run (its launcher in this process, its tasks forked from this process's fork server: no
    TensorFlow to import for a server of its own), while chaos(run) does to its tasks what the test does
    (during). Its exit status and what it printed (stdout, then stderr)."""
    done = during(chaos, lambda: run_cli(run_dir, *args, timeout=timeout))
    return done.returncode, done.stdout + done.stderr


def during(chaos, command):
    """command() (a distrain command in this process: run_cli, here) while chaos(run) does to its tasks what
    the test does, in a thread (run: what wait_until takes for a Popen). What command() returned; what
    chaos raised is raised once the command has ended. chaos may signal the launcher as a shell or a
    scheduler does (to_the_launcher); a test of the launcher's own process starts it apart (start)."""
    run, failed, stray = _Running(), [], []

    def act():
        try:
            chaos(run)
        except BaseException as exc:  # noqa: BLE001 - raised in the test's thread, below
            failed.append(exc)

    # While the run goes on, SIGINT and SIGTERM are the launcher's (supervisor.run_tasks); before and after
    # it, one sent to the launcher would stop this process: it is recorded instead, and fails the test.
    previous = {s: signal.signal(s, lambda signum, _: stray.append(signum)) for s in (signal.SIGINT, signal.SIGTERM)}
    thread = threading.Thread(target=act, daemon=True)
    thread.start()
    try:
        done = command()
    finally:
        run.returncode = -1  # (the chaos's waits end: the command has)
        thread.join(timeout=30)
        for s, handler in previous.items():
            signal.signal(s, handler)
    if failed:
        raise failed[0]
    assert not stray, f"signal {stray} sent to the launcher while no run went on"
    return done


def to_the_launcher(sig: int, run) -> None:
    """Ctrl-C (SIGINT) or a scheduler's SIGTERM to the launcher of the command `during` runs, while it runs."""
    if run.poll() is None:
        os.kill(os.getpid(), sig)


def kill_in_epoch_2(log: Path, run_dir: Path, victim: str):
    """The chaos (while_running) that SIGKILLs one task of a local cluster once `log` shows epoch 2; its
    `killed` is then when (time.monotonic())."""
    def chaos(run):
        wait_until(lambda: log.exists() and "Epoch 2/" in log.read_text(), run, "epoch 2")
        kill_task(run_dir, victim)
        chaos.killed = time.monotonic()
    return chaos


def ctrl_c_servers(servers: list) -> None:
    """Tasks that serve until stopped (ps and workers, a data service's): each still serving, then Ctrl-C in
    its terminal, which ends it with 130."""
    for server in servers:
        assert server.poll() is None
        server.send_signal(signal.SIGINT)
        assert server.wait(timeout=30) == 130


def reap(procs: list) -> None:
    """Whatever of these processes still runs (a test that failed), killed; each waited for."""
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


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
    log = run_dir / "logs" / "evaluator-0.log"
    assert (run_dir / "evaluation.json").exists(), (  # (seen once in 10 beside a CPU hog: its log says why)
        [line for line in out.splitlines() if line.startswith("[evaluator")], log.exists() and log.read_text()[-3000:])
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


class MlflowServer:
    """`mlflow server` on 127.0.0.1 with its SQLite store and artifacts under `root`; stop() and start()
    again keep them."""

    def __init__(self, root: Path):
        self.root, self.port, self.proc = root, portpicker.pick_unused_port(), None
        self.uri = f"http://127.0.0.1:{self.port}"

    def start(self) -> "MlflowServer":
        mlflow = str(Path(sys.executable).parent / "mlflow")
        self.proc = subprocess.Popen(
            [mlflow, "server", "--backend-store-uri", f"sqlite:///{self.root}/mlflow.db", "--artifacts-destination",
             str(self.root / "artifacts"), "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1"],
            stdout=open(self.root / "server.log", "ab"), stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})  # (no job runner processes)
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"{self.uri}/health", timeout=2)
                return self
            except OSError:
                assert self.proc.poll() is None and time.monotonic() < deadline, (self.root / "server.log").read_text()
                time.sleep(0.25)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()

    def client(self):
        from mlflow.tracking import MlflowClient

        return MlflowClient(self.uri)


def ctrl_c(sweep_dir, args: list, logs: list, ready: str = "Epoch 1/", then=None) -> tuple[int, str]:
    """A sweep started as a user does, Ctrl-C'd once every log in `logs` shows `ready` (training), `then()`
    called: its exit status and output. Bounded in time; a sweep that does not end is killed and fails the test."""
    proc = subprocess.Popen([sys.executable, str(TRAIN_PY), "-m", f"hydra.sweep.dir={sweep_dir}", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=sweep_dir.parent,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + RUN_TIMEOUT
        while not all(p.exists() and ready in p.read_text() for p in logs):
            assert proc.poll() is None and time.monotonic() < deadline, "the jobs never got going"
            time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        if then:
            then()
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    return proc.returncode, out
