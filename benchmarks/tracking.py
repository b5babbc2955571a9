"""What logging to MLflow costs the default run (`python train.py`): logger=mlflow (the default SQLite
store, the model logged) against logger=tensorboard (the default), each a fresh command, rounds in
alternating order, into one store (made by a first run, as a user's first run makes it). The command's
wall-clock seconds (MLflow's import, its run and the model's upload
included) and the training's examples/s (the tasks never talk to MLflow, so this should not move).

    python benchmarks/tracking.py [--rounds 3] [train.py overrides...]

Prints one JSON line: the median ratios (mlflow / tensorboard) with their ranges, and each run's figures.
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


def run(overrides: list, project: Path) -> dict:
    """One run from `project` (every run of the benchmark: one MLflow store, outputs/mlflow.db, as a user's)."""
    with tempfile.TemporaryDirectory(prefix="run-", dir=project) as tmp:
        run_dir = Path(tmp) / "run"
        started = time.perf_counter()
        done = subprocess.run([sys.executable, str(ROOT / "train.py"), f"hydra.run.dir={run_dir}",
                               "trainer.verbose=0", *overrides], capture_output=True, text=True, cwd=project)
        seconds = time.perf_counter() - started
        if done.returncode:
            raise RuntimeError(done.stderr[-2000:])
        r = json.loads((run_dir / "results.json").read_text())
    return {"seconds": round(seconds, 2), "examples_per_sec": round(r["examples_per_sec"], 1),
            "test_accuracy": r["test_accuracy"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    opts, overrides = parser.parse_known_args()
    rounds, project = [], Path(tempfile.mkdtemp(prefix="tracking-"))
    run(["logger=mlflow", "trainer.epochs=1"], project)  # (the store made once, as a user's first run makes it)
    for n in range(opts.rounds):
        pair = [("tensorboard", [*overrides, "logger=tensorboard"]), ("mlflow", [*overrides, "logger=mlflow"])]
        found = dict((name, run(args, project)) for name, args in (pair if n % 2 == 0 else pair[::-1]))
        rounds.append({**found, **{f"{k}_ratio": round(found["mlflow"][k] / found["tensorboard"][k], 3)
                                   for k in ("seconds", "examples_per_sec")}})
    summary = {}
    for key in ("seconds_ratio", "examples_per_sec_ratio"):
        values = [r[key] for r in rounds]
        summary[key] = {"median": statistics.median(values), "range": [min(values), max(values)]}
    shutil.rmtree(project, ignore_errors=True)
    print(json.dumps({**summary, "rounds": rounds}))


if __name__ == "__main__":
    main()
