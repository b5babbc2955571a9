"""What logging to MLflow costs: logger=mlflow (the default SQLite store, the model logged) against
logger=tensorboard (the default), each a fresh command, rounds in alternating order, into one store (made by a
first run, as a user's first run makes it):

- the default run (`python train.py`) and a 2-epoch mlp run: the command's wall-clock seconds (MLflow's import,
  its run and the model's upload included) and the training's examples/s (the tasks never talk to MLflow, so
  this should not move), each a ratio mlflow / tensorboard;
- a sweep of --jobs jobs of the 2-epoch mlp (`-m`, one after another): the seconds MLflow adds a job;
- a server that does not answer (logger.mlflow.tracking_uri=http://127.0.0.1:1): the seconds to its one line.

    python benchmarks/tracking.py [--rounds 3] [--jobs 4] [train.py overrides for every run...]

Prints one JSON line: the median ratios and seconds with their ranges, and each run's figures.
"""
import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNS = {"default": [], "mlp_2_epochs": ["model=mlp", "trainer.epochs=2"]}
UNREACHABLE = "http://127.0.0.1:1"  # (port 1: nothing listens there)


def command(args: list, project: Path) -> tuple:
    """`python train.py ARGS` from `project` (every run of the benchmark: one MLflow store, outputs/mlflow.db,
    as a user's): its wall-clock seconds and how it ended."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, str(ROOT / "train.py"), *args, "trainer.verbose=0"],
                          capture_output=True, text=True, cwd=project)
    return time.perf_counter() - started, done


def run(overrides: list, project: Path) -> dict:
    with tempfile.TemporaryDirectory(prefix="run-", dir=project) as tmp:
        seconds, done = command([f"hydra.run.dir={tmp}/run", *overrides], project)
        if done.returncode:
            raise RuntimeError(done.stderr[-2000:])
        r = json.loads((Path(tmp) / "run" / "results.json").read_text())
    return {"seconds": round(seconds, 2), "examples_per_sec": round(r["examples_per_sec"], 1),
            "test_accuracy": r["test_accuracy"]}


def sweep(overrides: list, jobs: int, project: Path) -> float:
    """The seconds of a sweep of `jobs` jobs (learning rates)."""
    rates = ",".join(f"{0.001 * (n + 1):g}" for n in range(jobs))
    with tempfile.TemporaryDirectory(prefix="sweep-", dir=project) as tmp:
        seconds, done = command(["-m", f"hydra.sweep.dir={tmp}/sweep", *overrides, f"trainer.learning_rate={rates}"],
                                project)
    if done.returncode:
        raise RuntimeError(done.stderr[-2000:])
    return seconds


def unreachable(project: Path) -> float:
    seconds, done = command(["logger=mlflow", f"logger.mlflow.tracking_uri={UNREACHABLE}", "model=mlp"], project)
    if done.returncode != 2 or "cannot be reached" not in done.stderr:
        raise RuntimeError(f"a store that does not answer: exit status {done.returncode}\n{done.stderr[-2000:]}")
    return seconds


def spread(values: list) -> dict:
    return {"median": round(statistics.median(values), 3), "range": [round(min(values), 3), round(max(values), 3)]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=4, help="jobs of the sweep (0: no sweep)")
    opts, overrides = parser.parse_known_args()
    project = Path(tempfile.mkdtemp(prefix="tracking-"))
    try:
        run(["logger=mlflow", "model=mlp", "trainer.epochs=1"], project)  # (the store made, as a first run makes it)
        rounds, summary = [], {}
        for n in range(opts.rounds):
            order = ("tensorboard", "mlflow") if n % 2 == 0 else ("mlflow", "tensorboard")
            found = {name: {logger: run([*args, *overrides, f"logger={logger}"], project) for logger in order}
                     for name, args in RUNS.items()}
            if opts.jobs:
                found["sweep_seconds"] = {logger: round(sweep([*RUNS["mlp_2_epochs"], *overrides, f"logger={logger}"],
                                                              opts.jobs, project), 2) for logger in order}
            found["unreachable_seconds"] = round(unreachable(project), 2)
            rounds.append(found)
        for name in RUNS:
            for key in ("seconds", "examples_per_sec"):
                summary[f"{name}_{key}_ratio"] = spread([r[name]["mlflow"][key] / r[name]["tensorboard"][key]
                                                         for r in rounds])
        if opts.jobs:
            summary["sweep_seconds_added_per_job"] = spread(
                [(r["sweep_seconds"]["mlflow"] - r["sweep_seconds"]["tensorboard"]) / opts.jobs for r in rounds])
        summary["unreachable_seconds"] = spread([r["unreachable_seconds"] for r in rounds])
    finally:
        shutil.rmtree(project, ignore_errors=True)
    print(json.dumps({**summary, "jobs": opts.jobs, "rounds": rounds}))


if __name__ == "__main__":
    main()
