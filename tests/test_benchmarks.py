"""Every script a user is told to run (benchmarks/, scripts/) is run here, at its smallest, so that a moved
module or a renamed key fails a test, not a reader.

The benchmarks measure by training many times; here their sections run their own code whole (every
command composed, every figure computed, every row written) with each `python train.py ...` they start
answered by `fake_train`: the command's config composed and checked as train.py checks it (a key the
product no longer has fails), and a results.json of made-up figures written where the run would write
it. What the benchmarks run in their own process (the tf.data pipeline section, the arrays they write,
the CPU's reading) and the scripts that train without train.py (ceiling.py, plain_keras.py) run for real.
"""
import importlib.util
import itertools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from distrain.common.errors import ConfigError
from distrain.config.validate import validate

from helpers import ROOT, make_cfg

BENCHMARKS = ROOT / "benchmarks"
SCRIPTS = sorted(BENCHMARKS.glob("*.py")) + sorted((ROOT / "scripts").glob("*.py"))
TOOLS = ("write-tfrecords", "predict", "evaluate")  # train.py's commands other than a run


def load(name: str):
    """A benchmark script as a module (its main() not run)."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(BENCHMARKS))  # (suite_ratio imports suite_cpu beside it)
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCHMARKS))
    return module


class Commands:
    """What the fake runs were asked: every train.py argument list, checked."""

    def __init__(self):
        self.runs, self.tools, self.checked = [], [], {}

    def check(self, overrides: list):
        key = tuple(overrides)
        if key not in self.checked:  # (a configuration runs once per round)
            self.checked[key] = validate(make_cfg(*overrides))
        return self.checked[key]

    def train(self, argv: list) -> str:
        """The output of `python train.py ARGS`, faked: the config checked, results.json written."""
        args = [str(a) for a in argv[2:]]
        if args[:1] in (["--help"], ["--cfg"]):
            return ""
        if args and args[0] in TOOLS:
            options = ("out", "shards", "encoding")
            self.tools.append(args)
            overrides = [a for a in args[1:] if "=" in a and a.split("=", 1)[0] not in options]
            self.check(overrides)
            return "Predicted 10 examples of x (y) in 0.1 s, 1,234 examples/s: written to z\n"
        if uri := next((a.split("=", 1)[1] for a in args if a.startswith("logger.mlflow.tracking_uri=")), None):
            from distrain.report import mlflow_store

            mlflow_store.answers(uri)  # (a server's that does not answer: its one line, exit 2, as the product)
        if args[:1] == ["-m"]:  # a sweep: each job's config checked
            swept = [a for a in args[1:] if not a.startswith("hydra.")]
            for values in itertools.product(*(a.split("=", 1)[1].split(",") for a in swept)):
                self.check([f"{a.split('=', 1)[0]}={v}" for a, v in zip(swept, values)])
            return ""
        run_dir = Path(next(a.split("=", 1)[1] for a in args if a.startswith("hydra.run.dir=")))
        overrides = [a for a in args if not a.startswith("hydra.")]
        self.runs.append(overrides)
        cfg = self.check(overrides)
        run_dir.mkdir(parents=True, exist_ok=True)
        epochs = cfg.trainer.epochs
        results = {"examples_per_sec": 1000.0, "steps_per_sec": 10.0, "test_accuracy": 0.99, "train_seconds": 1.5,
                   "seconds_to_first_step": 3.0, "epoch_seconds": [1.0] * epochs, "precision_policy": "float32",
                   "onednn": True, "steps_per_execution": cfg.trainer.steps_per_execution,
                   "time_split": {"input": 0.1, "compute": 0.9, "communication": 0.0},
                   "input_examples_per_sec": 5000.0, "global_batch_size": cfg.trainer.batch_size,
                   "input_cpu_per_example": 2e-5, "input_cpu_share": 0.2}
        (run_dir / "results.json").write_text(json.dumps(results))
        if cfg.strategy.name in ("multi_worker_mirrored", "parameter_server"):
            names = [f"worker-{i}" for i in range(cfg.cluster.workers)]
            if cfg.strategy.name == "parameter_server":
                names += ["chief-0"] + [f"ps-{i}" for i in range(cfg.cluster.ps)]
            tasks = [{"name": n, "type": n.split("-")[0], "pid": os.getpid(), "seconds_to_ready": 2.0,
                      "state": "running"} for n in names]
            (run_dir / "cluster.json").write_text(json.dumps({"tasks": tasks}))
        return ""


class FakePopen:
    """subprocess.Popen for a benchmark's commands: train.py faked (Commands.train), the benchmark's other
    programs answered with a line of their made-up figures. Running until polled once (watchers read it)."""

    def __init__(self, commands: Commands, argv, **_):
        self.argv, self.returncode, self.pid, self.polled = [str(a) for a in argv], 0, os.getppid(), False
        program = Path(self.argv[1]).name if len(self.argv) > 1 else ""
        self.err = ""
        if program == "train.py":
            try:
                self.out = commands.train(self.argv)
            except ConfigError as exc:  # (bad input: one line, exit 2)
                self.out, self.err, self.returncode = "", f"error: {exc}\n", 2
        elif program == "scaling.py":
            self.out = run_main(load("scaling"), commands, self.argv[2:])
        else:  # plain_keras.py, ceiling.py, plain Keras's predict (-c)
            self.out = json.dumps({"examples_per_sec": 900.0, "test_accuracy": 0.98, "epoch_seconds": [1.0]}) + "\n"
        self.stdout = iter(self.out.splitlines(keepends=True))

    def poll(self):
        if not self.polled:
            self.polled = True
            return None
        return self.returncode

    def communicate(self, timeout=None):
        return self.out, None

    def wait(self, timeout=None):
        return self.returncode


def run_main(module, commands: Commands, argv: list) -> str:
    """A benchmark's main(argv) with its subprocesses faked: what it printed."""
    import contextlib
    import io

    saved = sys.argv
    sys.argv = [module.__file__, *argv]
    def ran(argv, **_):
        proc = FakePopen(commands, argv)
        return subprocess.CompletedProcess(argv, proc.returncode, proc.out, proc.err)

    module.subprocess = type("FakeSubprocess", (), {
        "Popen": staticmethod(lambda argv, **kw: FakePopen(commands, argv, **kw)),
        "run": staticmethod(ran),
        "PIPE": subprocess.PIPE, "STDOUT": subprocess.STDOUT})
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            module.main()
    finally:
        sys.argv = saved
    return out.getvalue()


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_script_answers_help(script):
    """Its imports (a moved module fails here) and its usage."""
    if script.name == "suite_cpu.py":  # (its arguments are pytest's: its run is below)
        pytest.skip("suite_cpu.py passes its arguments to pytest: run below")
    out = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120,
                         cwd=ROOT)
    assert out.returncode == 0 and "usage:" in out.stdout, out.stderr[-2000:]


@pytest.mark.slow
def test_every_section_of_the_benchmark_suite_runs_its_code(tmp_path, monkeypatch):
    """benchmarks/run.py --rounds 1 --epochs 2, every section, its runs faked: each gives its rows, and every
    train.py command it gives is a config the product takes. The sections that need Debian's Fashion-MNIST
    run against a stand-in of its files (their commands checked, nothing read), the others without it."""
    run = load("run")
    commands = Commands()

    class Bench(run.Bench):
        def _run(self, argv, timeout=1200, watch=None, cores=None, env=None):
            proc = FakePopen(commands, argv)
            if watch:
                watch(proc)
            return proc.communicate()[0], 0.5

    stand_in = tmp_path / "fashion-mnist"
    stand_in.mkdir()
    (stand_in / "train-images-idx3-ubyte.gz").write_bytes(b"")
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "keras_home"))
    monkeypatch.setattr(sys, "argv", ["run.py", "--rounds", "1", "--epochs", "2", "--out", str(tmp_path / "out"),
                                      "--only", "startup"])
    monkeypatch.setattr(run, "Bench", Bench)
    run.main()  # its own code: the machine's line, the table written
    assert "| startup | `python train.py --help` seconds |" in (tmp_path / "out" / "benchmarks.md").read_text()
    monkeypatch.setattr(run.tempfile, "tempdir", str(tmp_path))  # (the Bench's work directory: the test's)
    bench = Bench(run.argparse.Namespace(rounds=1, epochs=2, cores=os.sched_getaffinity(0)))
    for section in run.SECTIONS:
        monkeypatch.setattr(run, "FASHION", stand_in if section in ("ps_data", "decode") else tmp_path / "none")
        before = len(bench.rows)
        getattr(run, section)(bench)
        rows = bench.rows[before:]
        assert rows and not any(str(r["shown"]).startswith("not measured (no") for r in rows
                                if section in ("ps_data", "decode")), (section, rows)
    assert len(commands.runs) > 40 and any("strategy=parameter_server" in r for r in commands.runs)
    assert {t[0] for t in commands.tools} == {"write-tfrecords", "predict"}


def test_a_key_the_product_no_longer_has_fails_the_fake_run(tmp_path):
    """The control: a train.py command with a key the config does not have is refused, as the real one is."""
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException, match="trainer.epoch"):  # (as Hydra refuses it for train.py)
        Commands().train(["python", "train.py", f"hydra.run.dir={tmp_path}", "trainer.epoch=3"])


@pytest.mark.slow
@pytest.mark.parametrize("name, argv", [
    ("accumulate", ["--rounds", "1", "--steps", "2"]),
    ("tracking", ["--rounds", "1", "--jobs", "2"]),
])
def test_a_benchmark_of_train_py_runs_its_code(name, argv):
    """Its commands checked and its figures computed from faked runs; one JSON line printed."""
    commands = Commands()
    found = json.loads(run_main(load(name), commands, argv).strip().splitlines()[-1])
    assert "range" in found or {"default_seconds_ratio", "mlp_2_epochs_seconds_ratio", "sweep_seconds_added_per_job",
                                "unreachable_seconds"} <= set(found), found
    assert commands.runs


def test_the_scaling_benchmark_runs_its_code(tmp_path):
    commands = Commands()
    out = run_main(load("scaling"), commands, ["--rounds", "1", "--epochs", "2", "--out", str(tmp_path / "s.json")])
    assert "sync efficiency / ceiling" in out and json.loads((tmp_path / "s.json").read_text())["ratios"]
    assert len(commands.runs) == 6  # 5 configurations, one of them 2 runs at once


def test_the_elastic_benchmarks_cluster_is_a_config_the_product_takes():
    """(Its rounds kill and wait for real tasks: elasticity itself is test_resume's and test_supervisor's.)"""
    elastic = load("elastic")
    cfg = validate(make_cfg(*elastic.ARGS))
    assert (cfg.cluster.workers, cfg.cluster.min_workers) == (2, 1)


@pytest.mark.slow
def test_the_compute_ceiling_and_plain_keras_measure_for_real():
    """ceiling.py builds the run's own model and input through the task's set-up; plain_keras.py trains."""
    ceiling = subprocess.run([sys.executable, str(BENCHMARKS / "ceiling.py"), "--rounds", "1", "--seconds", "0.2",
                              "model=mlp", "trainer.mixed_precision=false"], capture_output=True, text=True,
                             timeout=240, cwd=ROOT)
    assert ceiling.returncode == 0, ceiling.stderr[-3000:]
    found = json.loads(ceiling.stdout.strip().splitlines()[-1])
    assert found["examples_per_sec"] > 0 and found["precision_policy"] == "float32"
    plain = subprocess.run([sys.executable, str(BENCHMARKS / "plain_keras.py"), "--epochs", "1"],
                           capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert plain.returncode == 0, plain.stderr[-3000:]
    assert 0 <= json.loads(plain.stdout.strip().splitlines()[-1])["test_accuracy"] <= 1


@pytest.mark.slow
def test_the_suites_own_measures_run_on_one_test(tmp_path):
    """suite_cpu.py on one test's module, and suite_ratio.py of this checkout against itself (as root,
    with a cgroup it can make; it says why not otherwise)."""
    one = ["tests/test_layout.py", "-k", "finds_a_launcher_module", "-n", "0"]  # (no workers to start: the cheapest)
    cpu = subprocess.run([sys.executable, str(BENCHMARKS / "suite_cpu.py"), *one], capture_output=True, text=True,
                         timeout=240, cwd=ROOT)
    assert cpu.returncode == 0 and "CPU-s by module" in cpu.stdout and "tests/test_layout.py" in cpu.stdout, \
        cpu.stdout[-2000:] + cpu.stderr[-2000:]
    copy = tmp_path / "other"
    shutil.copytree(ROOT / "tests", copy / "tests")
    shutil.copytree(ROOT / "src", copy / "src")
    ratio = subprocess.run([sys.executable, str(BENCHMARKS / "suite_ratio.py"), str(copy), "--", *one],
                           capture_output=True, text=True, timeout=240, cwd=ROOT,
                           env={**os.environ, "TMPDIR": str(tmp_path)})  # (its logs, kept, go with the test's)
    if ratio.returncode == 2 and ("needs root" in ratio.stderr or "cgroup" in ratio.stderr):
        pytest.skip(ratio.stderr.strip())
    assert ratio.returncode == 0 and "in CPU-s" in ratio.stdout, ratio.stdout[-2000:] + ratio.stderr[-2000:]


@pytest.mark.slow
def test_the_study_benchmark_runs_both_studies():
    """benchmarks/study.py at its smallest: two trials of two epochs, pruned and not, for real."""
    done = subprocess.run([sys.executable, str(BENCHMARKS / "study.py"), "--trials", "2", "--epochs", "2",
                           "data=synthetic", "data.train_examples=1024", "data.test_examples=64"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["unpruned"]["trials"] == found["pruned"]["trials"] == 2 and found["unpruned"]["epochs"] == 4
    assert 0 < found["epochs_ratio"] <= 1 and "MedianPruner" in found["pruner"]
