"""What an Optuna study (hparams_search=optuna) gains from the sweeper's choices: the same seeded search of
learning rate (log-uniform) and batch size, each a fresh command, run two ways side by side.

    python benchmarks/study.py [--compare pruning|slots|cores] [--trials 12] [--epochs 4] [--pruner NODE]
                               [train.py overrides...]          (model=mlp unless an override names another)

  pruning   with and without hydra.sweeper.pruner (MedianPruner, 2 start-up trials, 1 warm-up epoch):
            the epochs trained, the wall-clock seconds, the best validation accuracy (goal: at most 0.6
            of the epochs, the best within 0.01)
  cores     2 trials at once under joblib, each pinned to its share of the cores (split_cores=true) or
            all sharing them: the sweep's examples/s (every trial's examples over the wall-clock time)
  slots     2 trials at once under joblib, pruned: the slots' idle share, as measured (a trial asked as
            a slot frees), against the share batches of 2 would idle on the same trials' durations

Prints one JSON line: the ratios (pruned / unpruned; split / shared) and each study's figures.
"""
import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
PRUNER = "{_target_: optuna.pruners.MedianPruner, n_startup_trials: 2, n_warmup_steps: 1}"
WAYS = {"pruning": {"unpruned": [], "pruned": ["hydra.sweeper.pruner={pruner}"]},
        "slots": {"unpruned": ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"],
                  "pruned": ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "hydra.sweeper.pruner={pruner}"]},
        "cores": {"shared": ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "hydra.sweeper.split_cores=false"],
                  "split": ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "hydra.sweeper.split_cores=true"]}}


def study(overrides: list, sweep_dir: Path) -> dict:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, str(ROOT / "train.py"), "hparams_search=optuna",
                           f"hydra.sweep.dir={sweep_dir}", "trainer.verbose=0", *overrides],
                          capture_output=True, text=True, cwd=sweep_dir.parent)
    seconds = time.perf_counter() - started
    if done.returncode:
        raise RuntimeError(done.stderr[-2000:])
    epochs = examples = 0
    for run in sweep_dir.glob("*/metrics.csv"):
        rows = len(run.read_text().splitlines()) - 1
        results = json.loads((run.parent / "results.json").read_text()) if (run.parent / "results.json").exists() \
            else None
        epochs += rows
        examples += rows * results["steps_per_epoch"] * results["global_batch_size"] if results else 0
    statuses = [json.loads(path.read_text())["status"] for path in sweep_dir.glob("*/status.json")]
    idle = idle_shares(sweep_dir) if "hydra.launcher.n_jobs=2" in overrides else {}
    best = yaml.safe_load((sweep_dir / "optimization_results.yaml").read_text())
    return {"seconds": round(seconds, 1), "epochs": epochs, "pruned": statuses.count("pruned"),
            "trials": len(statuses), "best_val_accuracy": round(best["best_value"], 4),
            "examples_per_sec": round(examples / seconds, 1), **idle}


def idle_shares(sweep_dir: Path) -> dict:
    """2 slots: the share of slot time no trial ran, from the study's own start and end times; and what
    batches of 2 (Hydra's sweeper: trials 0-1, then 2-3, ...) would idle on the same durations."""
    import optuna
    from optuna.storages.journal import JournalFileBackend

    storage = optuna.storages.JournalStorage(JournalFileBackend(str(sweep_dir / "optuna.journal")))
    trials = sorted(optuna.load_study(study_name="distrain", storage=storage).trials, key=lambda t: t.number)
    spans = [(t.datetime_start.timestamp(), t.datetime_complete.timestamp()) for t in trials]
    took = [end - start for start, end in spans]
    wall = max(end for _, end in spans) - min(start for start, _ in spans)
    pairs = [took[i:i + 2] for i in range(0, len(took), 2)]
    batches = sum(max(pair) for pair in pairs)
    return {"idle_share": round(1 - sum(took) / (2 * wall), 3),
            "idle_share_in_batches": round(1 - sum(took) / (2 * batches), 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compare", choices=sorted(WAYS), default="pruning")
    parser.add_argument("--trials", type=int, default=12)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--pruner", default=PRUNER, help="hydra.sweeper.pruner's node (default: %(default)s)")
    opts, overrides = parser.parse_known_args()
    overrides = ["model=mlp", f"hydra.sweeper.n_trials={opts.trials}", f"trainer.epochs={opts.epochs}", *overrides]
    where, found = Path(tempfile.mkdtemp(prefix="study-")), {}
    try:
        for name, extra in WAYS[opts.compare].items():
            found[name] = study([*overrides, *(o.format(pruner=opts.pruner) for o in extra)], where / name)
    finally:
        shutil.rmtree(where, ignore_errors=True)
    base, other = found.values()
    ratios = {f"{k}_ratio": round(other[k] / base[k], 3) for k in ("epochs", "seconds", "examples_per_sec")
              if base[k]}
    ratios["best_difference"] = round(other["best_val_accuracy"] - base["best_val_accuracy"], 4)
    print(json.dumps({"compare": opts.compare, **ratios, **({"pruner": opts.pruner} if opts.compare != "cores"
                                                              else {}), **found}))


if __name__ == "__main__":
    main()
