"""`python train.py` as a user runs it: a launcher process, a training child, results on disk."""
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from distrain.common import cpu
from distrain.common.errors import print_error

from helpers import ROOT, RUN_TIMEOUT, TRAIN_PY, Overdue, assert_nothing_left, here, run_cli


def test_help_is_instant_and_lists_the_groups(tmp_path):
    start = time.perf_counter()
    out = run_cli(tmp_path / "run", "--help", timeout=60, process=True)
    assert out.returncode == 0
    assert ("strategy: central_storage, default, mirrored, multi_worker_mirrored, one_device, "
            "parameter_server") in out.stdout
    assert "cluster: local, manual, slurm, tf_config" in out.stdout
    assert time.perf_counter() - start < 15  # no TensorFlow import (about 1 s when warm)
    assert "tensorflow" not in subprocess.run(
        [sys.executable, "-c", "import sys, distrain.cli; print(sorted(sys.modules))"],
        capture_output=True, text=True, check=True).stdout


@pytest.mark.slow
def test_write_tfrecords_takes_the_flags_a_run_takes(tmp_path):
    """--help answers with exit 0; a config directory of the user's composes as a run's does; bad input is
    one line, exit 2 (the control: a key its data option lacks)."""
    def command(*args):
        return subprocess.run([sys.executable, str(TRAIN_PY), "write-tfrecords", *args], capture_output=True,
                              text=True, timeout=60, cwd=tmp_path, env={**os.environ, "HYDRA_FULL_ERROR": "0"})

    shown = command("--help")
    assert shown.returncode == 0 and shown.stdout.startswith("usage: distrain write-tfrecords"), shown.stderr
    (tmp_path / "conf" / "data").mkdir(parents=True)
    (tmp_path / "conf" / "data" / "tiny.yaml").write_text("defaults: [synthetic]\ntrain_examples: 64\n")
    (tmp_path / "conf" / "data" / "typo.yaml").write_text("defaults: [synthetic]\ntrain_exampels: 64\n")
    bad = command("--config-dir", "conf", "data=typo", f"out={tmp_path / 'out'}")
    assert bad.returncode == 2 and bad.stderr.count("error:") == 1 and "train_exampels" in bad.stderr, bad.stderr
    assert "Traceback" not in bad.stderr and not (tmp_path / "out").exists()
    missing = command("data=synthetic")
    assert missing.returncode == 2 and missing.stderr.startswith("error: write-tfrecords needs out=DIR"), missing.stderr
    unwritable = command("data=synthetic", "out=/proc/shards")  # (found before any data is read: no disk filled)
    assert unwritable.returncode == 2 and unwritable.stderr.startswith(
        "error: out=/proc/shards: /proc cannot be written ("), unwritable.stderr
    written = command("--config-dir", "conf", "data=tiny", "data.test_examples=16", f"out={tmp_path / 'out'}",
                      "shards=2")
    assert written.returncode == 0 and "train: 64 examples in 2 file(s)" in written.stdout, written.stderr[-2000:]
    # TensorFlow's start-up lines (oneDNN, CUDA probes) go to a log, as a run's go to logs/; this command's own
    # lines still reach the terminal (the bad input's line above, the control).
    assert not written.stderr.strip() and (tmp_path / "out" / "write-tfrecords.log").is_file(), written.stderr


@pytest.mark.slow
def test_a_run_in_the_tests_process_is_bounded_in_time(tmp_path):
    """The harness's own bound (helpers.here): a run in this process past its time is stopped, its
    tasks with it, and the test fails saying so."""
    started = time.monotonic()
    with pytest.raises(Overdue, match="took longer than 2 s; the end of what it printed"):
        run_cli(tmp_path / "run", "data=synthetic", "trainer.epochs=1000", "trainer.verbose=2", timeout=2)
    assert time.monotonic() - started < 2 + 30  # (the tasks' stop is bounded: supervisor.STOP_GRACE_SECONDS)
    assert json.loads((tmp_path / "run" / "status.json").read_text())["status"] != "ok"
    assert_nothing_left(tmp_path)


def test_cfg_job_prints_a_valid_config_and_runs_nothing(tmp_path):
    """The control of the catalogue's --cfg cases: checked like a run, a valid config is printed as is."""
    out = run_cli(tmp_path / "run", "strategy=mirrored", "--cfg", "job", "trainer.epochs=3", timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "name: mirrored" in out.stdout and "epochs: 3" in out.stdout and not out.stderr.strip()
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_a_preset_that_makes_a_sweep_is_one_whatever_the_command_line_says_of_the_mode(tmp_path):
    """Hydra's composition that reads hydra.mode is skipped where no option the command can select sets it
    (cli._mode_from_presets_only); a preset of the package's and one of the user's (its group named in
    another's defaults list, read as text) still make their command a sweep. Control: a plain run is one."""
    from distrain import cli

    conf = tmp_path / "conf"
    (conf / "study").mkdir(parents=True)
    (conf / "study" / "lrs.yaml").write_text("# @package _global_\nhydra:\n  mode: MULTIRUN\n  sweeper:\n"
                                             "    params:\n      trainer.learning_rate: 0.1,0.2\n")
    (conf / "bundle").mkdir()
    (conf / "bundle" / "both.yaml").write_text("# @package _global_\ndefaults:\n  - /study: lrs\n")
    (conf / "model").mkdir()
    (conf / "model" / "tiny.yaml").write_text("defaults:\n  - mlp\n")
    assert cli.groups_setting_mode([cli.CONFIG_DIR]) == {"experiment", "hparams_search"}
    found = cli.groups_setting_mode([cli.CONFIG_DIR, conf])  # (a word "study" elsewhere: a doubt, counted)
    assert {"experiment", "hparams_search", "study", "bundle"} <= found and "model" not in found, found
    (tmp_path / "own").mkdir()
    (tmp_path / "own" / "config.yaml").write_text("defaults:\n  - _self_\n")  # a primary config: anything goes
    assert cli.groups_setting_mode([cli.CONFIG_DIR, tmp_path / "own"]) is None
    for n, chosen in enumerate(["experiment=strategies", "+bundle=both"]):  # (refused in each job: quick)
        code, out, err = here(tmp_path, ["--config-dir", "conf", chosen, "trainer.epochs=0",
                                         f"hydra.sweep.dir=sweep{n}", f"hydra.run.dir=run{n}"])
        assert code == 1 and "Sweep summary (" in out and (tmp_path / f"sweep{n}" / "summary.csv").exists(), out[-2000:]
    code, out, err = here(tmp_path, ["--config-dir", "conf", "model=tiny", "trainer.epochs=0", "hydra.run.dir=r"])
    assert code == 2 and "Sweep summary" not in out and err.startswith("error: trainer.epochs=0"), (out, err)


def test_default_run_on_the_bundled_data_meets_the_quality_bar(tmp_path, monkeypatch):
    """`python train.py` with no choices (download off so the test never needs the network). It leaves
    nothing in the temporary directory."""
    run_dir, temporary = tmp_path / "run", tmp_path / "tmp"
    temporary.mkdir()
    out = run_cli(run_dir, "data.download_timeout=0", env_extra={"TMPDIR": str(temporary)}, process=True)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert list(temporary.iterdir()) == []
    # The control: TensorFlow's autograph leaves a file there for each function it converts, until the
    # interpreter's shutdown (which a task's quick exit skips: the launcher's scratch directory takes them).
    import tempfile

    import tensorflow as tf

    monkeypatch.setattr(tempfile, "tempdir", str(temporary))
    tf.function(lambda x: x + 1 if x > 0 else x - 1)(tf.constant(1))
    assert [p.name for p in temporary.iterdir() if p.name.startswith("__autograph_generated_file")]
    results = json.loads((run_dir / "results.json").read_text())
    assert results["strategy"] == "default" and results["model"] == "cnn"
    assert results["data_source"] == "bundled" and results["train_examples"] == 8000
    assert results["test_accuracy"] >= 0.975, results["test_accuracy"]
    assert "data: mnist from source bundled" in out.stdout  # the one line saying which source and why
    # oneDNN by default on any x86 CPU without a GPU, where TensorFlow's own default is off on some
    # (test_multiworker: off as asked; test_devices: the choice on other machines).
    value, why = cpu.onednn_choice("auto")
    on = {"1": True, "true": True, "0": False, "false": False}.get(value,
                                                                   bool(cpu.flags() & set(cpu.ONEDNN_DEFAULT_ON)))
    assert results["onednn"] is on and f"cpu kernels: {'oneDNN' if on else 'Eigen, oneDNN off'} ({why})" in out.stdout
    assert "trainer:\n  epochs: 12" in out.stdout  # the resolved config at start
    last = out.stdout.splitlines()[-3:]  # the results, what bound the run, and each task's peak memory
    assert "Epoch 12/12" in out.stdout and "Test accuracy" in last[0], last
    assert re.fullmatch(r"compute-bound: the steps take \d+% of the training time \(they compute [\d,]+ examples/s; "
                        r"the input pipeline alone delivers [\d,]+\)", last[1]), last
    assert re.search(r"peak resident memory: train [\d,]+ MiB$", last[2]), last
    log = (run_dir / "logs" / "train.log").read_text()
    assert "Test accuracy" in log and "\r" not in log  # progress bars collapsed to their last state
    assert (run_dir / "saved_model" / "saved_model.pb").exists()
    kept = sorted(p.name for p in (run_dir / "checkpoints").glob("ckpt-*.index"))
    # One per epoch, numbered by global step (62 an epoch), the last 3 kept.
    assert kept == ["ckpt-620.index", "ckpt-682.index", "ckpt-744.index"]
    assert (run_dir / "config.yaml").read_text().count("source: bundled") == 1


def _children_of(run_dir):
    found = subprocess.run(["pgrep", "-f", str(run_dir / "config.yaml")], capture_output=True, text=True)
    return [int(p) for p in found.stdout.split()]


@pytest.mark.slow
def test_ctrl_c_stops_the_training_process(tmp_path):
    """(SIGTERM: test_resume, which checks the checkpoint it leaves too.)"""
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, str(TRAIN_PY), f"hydra.run.dir={run_dir}", "data=synthetic",
         "data.train_examples=512", "trainer.epochs=100000", "trainer.verbose=2", "trainer.save_model=false"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path)
    try:
        deadline = time.monotonic() + RUN_TIMEOUT
        log = run_dir / "logs" / "train.log"
        while not (log.exists() and "Epoch 2/" in log.read_text()):
            assert proc.poll() is None and time.monotonic() < deadline, "training never got going"
            time.sleep(0.5)
        children = _children_of(run_dir)
        assert children, "no training process found"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 130
        time.sleep(0.5)
        assert _children_of(run_dir) == []
        said = log.read_text()  # what the user did, and how to go on: not the SIGTERM the launcher sent
        assert re.search(rf"^interrupted \(Ctrl-C\) at global step \d+: nothing saved \(trainer.save_model=false\); go "
                         rf"on with trainer.resume=true hydra.run.dir={re.escape(str(run_dir))}$", said, re.M), said
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in _children_of(run_dir):
            os.kill(pid, signal.SIGKILL)


class InterruptedStream(io.StringIO):
    """stderr where another thread's line (TensorFlow logging a failed call) lands right after the
    first write: the timing that once joined a task's error line to a log line."""
    def write(self, text):
        written = super().write(text)
        if not getattr(self, "interrupted", False):
            self.interrupted = True
            super().write("ERROR:tensorflow: a call failed\n")
        return written


@pytest.mark.parametrize("say, whole", [
    (print_error, True),
    (lambda message: print(f"error: {message}", file=sys.stderr, flush=True), False),  # the control
], ids=["print_error", "print"])
def test_an_error_line_stays_whole_whatever_another_thread_writes(monkeypatch, say, whole):
    stream = InterruptedStream()
    monkeypatch.setattr(sys, "stderr", stream)
    say("bad data: fix it")
    assert ("error: bad data: fix it\n" in stream.getvalue().splitlines(keepends=True)) is whole


@pytest.mark.slow
def test_the_wheel_runs_from_any_directory(tmp_path):
    """`pip wheel` of a copy of the checkout, installed (not editable) into a fresh virtual environment
    that takes its dependencies from this one: `distrain` runs in a project directory with no checkout
    in sight, from the package's own configs and digits, and with the project's own presets."""
    checkout = tmp_path / "checkout"
    shutil.copytree(ROOT / "src", checkout / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, checkout / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    # (None of this sees the checkout's src/ on a PYTHONPATH: pip would take the package there for installed.)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    built = subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path / "dist"),
                            str(checkout)], capture_output=True, text=True, timeout=300, env=env)
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("distrain-*.whl")
    inside = set(zipfile.ZipFile(wheel).namelist())
    assert {"distrain/conf/config.yaml", "distrain/conf/hydra/launcher/slurm.yaml", "distrain/data/mnist-10k.npz",
            "hydra_plugins/distrain_slurm_launcher/slurm_sweep_launcher.py"} <= inside, inside
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    (site,) = (venv / "lib").glob("python3*/site-packages")
    here = next(p for p in map(Path, sys.path) if p.name == "site-packages" and (p / "tensorflow").is_dir())
    (site / "dependencies.pth").write_text(f"import site; site.addsitedir({str(here)!r})\n")
    subprocess.run([*pip, "--python", str(venv / "bin" / "python"), "install", "--no-deps", str(wheel)], check=True,
                   timeout=300, env=env)
    project = tmp_path / "project"
    (project / "conf" / "experiment").mkdir(parents=True)
    (project / "conf" / "experiment" / "quick.yaml").write_text(
        "# @package _global_\ndefaults:\n  - override /model: mlp\ntrainer:\n  epochs: 1\n  verbose: 2\n"
        "  save_model: false\n")
    (project / "conf" / "experiment" / "typo.yaml").write_text("# @package _global_\ntrainer:\n  epochz: 1\n")

    def distrain(*args):
        return subprocess.run([str(venv / "bin" / "distrain"), *args], cwd=project, env={**env,
                                                                                         "HYDRA_FULL_ERROR": "0"},
                              capture_output=True, text=True, timeout=RUN_TIMEOUT)

    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import distrain; print(distrain.__file__)"],
                           cwd=project, env=env, capture_output=True, text=True, timeout=60)
    assert where.stdout.strip() == str(site / "distrain" / "__init__.py"), where  # the wheel's, not the checkout's
    shown = distrain("--config-dir", "conf", "--help")
    assert "  experiment: quick (yours), scaling_async" in shown.stdout, shown.stdout[-2000:] + shown.stderr
    out = distrain("--config-dir", "conf", "experiment=quick", "hydra.run.dir=run")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    results = json.loads((project / "run" / "results.json").read_text())
    assert (results["data_source"], results["model"], results["epochs"]) == ("bundled", "mlp", 1)
    assert results["test_accuracy"] > 0.8
    bad = distrain("--config-dir", "conf", "experiment=typo", "hydra.run.dir=bad")
    assert bad.returncode == 2 and bad.stderr.splitlines() == [
        f"error: in {project / 'conf' / 'experiment' / 'typo.yaml'}: trainer.epochz is not a key of trainer: "
        "set e.g. trainer.epochs=12"], bad.stderr
    assert_nothing_left(project)


COUNTED_TASK = '''"""A task that says how the garbage collector stands as it starts, and what autograph converted in it
(its own cache's misses), the user's model too."""
import tensorflow as tf
import tf_keras as keras
from tensorflow.python.autograph.pyct import transpiler

made = []
convert = transpiler.GenericTranspiler.transform_function  # (called on a miss of autograph's cache)


def counted(self, function, context):
    made.append(function.__qualname__)
    return convert(self, function, context)


class Mine(keras.Model):
    def __init__(self, num_classes):
        super().__init__()
        self.flat, self.out = keras.layers.Flatten(), keras.layers.Dense(num_classes)

    def call(self, x):
        return self.out(self.flat(x))


def mine(input_shape, num_classes, **_):  # (and the cnn preset's other keys)
    return Mine(num_classes)


def main(argv):
    import gc

    from distrain.task import main as task

    print(f"collector: {gc.isenabled()}, {gc.get_stats()[2]['collections']} full collections, "
          f"{gc.get_freeze_count()} objects frozen", flush=True)
    transpiler.GenericTranspiler.transform_function = counted
    code = task.main(argv)
    print("converted:", ",".join(made), flush=True)
    return code
'''


def test_a_forked_task_repeats_none_of_its_fork_servers_work(tmp_path, monkeypatch):
    """Autograph's conversions that every task makes (Keras's evaluate, the training step's, the
    SavedModel's) are made once in the fork server: a task forked from it makes none of them again. The
    control: the user's own model's call is converted in the task, and counted. The server imported
    TensorFlow with the garbage collector paused (process.kept_for_good): no full collection, and what it
    imported is frozen; the task collects its own garbage. The control: a process of the default collector
    that makes 300,000 lasting objects counts full collections, and none with kept_for_good."""
    from omegaconf import OmegaConf

    from distrain.launcher.forkserver import ForkServer

    from helpers import small

    (tmp_path / "counted.py").write_text(COUNTED_TASK)
    monkeypatch.chdir(tmp_path)  # (the task imports its module and the model from its directory)
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # (autograph's files, as a run's scratch directory holds them)
    run = tmp_path / "run"
    run.mkdir()
    OmegaConf.save(small("model._target_=counted.mine", "trainer.save_model=true", "trainer.steps_per_epoch=2"),
                   run / "config.yaml")
    with ForkServer("counted", tmp_path / "forkserver.log") as forks:
        child = forks.spawn([sys.executable, "-m", "counted", str(run / "config.yaml")], dict(os.environ), None)
        out = child.stdout.read().decode()
        assert child.wait(timeout=RUN_TIMEOUT) == 0, out[-3000:]
    enabled, collections, frozen = re.search(r"^collector: (\w+), (\d+) full collections, (\d+) objects frozen$",
                                             out, re.M).groups()
    assert (enabled, collections) == ("True", "0") and int(frozen) > 100_000, (enabled, collections, frozen)
    made = ("import contextlib, gc, sys\nfrom distrain.common.lifetime import kept_for_good\n"
            "with kept_for_good() if sys.argv[1] == 'kept' else contextlib.nullcontext():\n"
            "    made = [[i] for i in range(300_000)]\nprint(gc.get_stats()[2]['collections'])")
    counts = [subprocess.run([sys.executable, "-c", made, how], capture_output=True, text=True, check=True).stdout
              for how in ("default", "kept")]
    assert int(counts[0]) > 0 and int(counts[1]) == 0, counts  # the control (not here: conftest's thresholds)
    converted = re.search(r"^converted: (.*)$", out, re.M).group(1).split(",")
    assert "Mine.call" in converted, converted  # the control: a conversion in the task is counted
    ahead = ["forward_pass", "growth", "Model.make_test_function.<locals>.test_function", "Float32.call",
             "Float32Metric.update_state", "Float32Metric.result", "trace_model_call.<locals>._wrapped_model",
             "canonicalize_signatures.<locals>.signature_wrapper"]
    assert not set(ahead) & set(converted), converted
    # Autograph's files: the task's own conversion's (the run's scratch directory holds them), none of the server's.
    written = [path.read_text() for path in tmp_path.glob("__autograph_generated_file*.py")]
    assert any("def tf__call(" in text for text in written), len(written)
    assert not [text for text in written if "def tf__growth(" in text or "def tf__test_function(" in text]
    assert (run / "saved_model" / "saved_model.pb").exists()


def test_a_file_a_command_cannot_write_is_named_not_the_run_directory(tmp_path, monkeypatch):
    """What evaluate, predict and write-tfrecords could not write after their checks (a disk that turned
    read-only) is named as theirs; a run's own is the run directory's (the bad-input catalogue)."""
    import errno

    from distrain import cli

    def cannot(*_, **__):
        raise OSError(errno.EROFS, "Read-only file system", "/data/p.npz")
    monkeypatch.setattr(cli, "_tool", cannot)
    code, _, err = here(tmp_path, ["predict", "outputs/x", "out=/data/p.npz"], {"HYDRA_FULL_ERROR": "0"})
    assert code == 2 and err == "error: /data/p.npz cannot be written (Read-only file system): check that you can " \
                                "write there\n"


def test_output_read_only_in_part_ends_quietly(tmp_path):
    """`distrain --help | head -1`: once the reader has gone, the command ends with 141 (as a shell's
    SIGPIPE does) and says nothing; a broken pipe is no run directory that cannot be written."""
    proc = subprocess.Popen([sys.executable, str(TRAIN_PY), "--help"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=tmp_path)
    proc.stdout.close()  # the reader gone before the first line is written
    assert proc.wait(timeout=60) == 141 and proc.stderr.read() == b""
    proc.stderr.close()
    done = subprocess.run([sys.executable, str(TRAIN_PY), "--help"], capture_output=True, cwd=tmp_path, timeout=60)
    assert done.returncode == 0 and done.stdout.startswith(b"distrain:")  # the control: read whole
