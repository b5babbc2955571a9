"""Gradient accumulation against the plain step at the same batch, on a local multi_worker_mirrored
cluster (2 workers) where the all-reduce weighs: examples/s, the communication share of the time split,
and all-reduces per 1,000 examples (one per update: 1,000 / (K x batch)). Rounds alternate the order.

    python benchmarks/accumulate.py [--rounds 3] [--steps 4] [train.py overrides...]

Prints one JSON line: the median ratio of examples/s (accumulated / plain) with its range, each run's
figures.
"""
import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARGS = ["strategy=multi_worker_mirrored", "cluster.workers=2", "model=mlp", "data.source=bundled",
        "trainer.batch_size=64", "trainer.epochs=4", "trainer.verbose=0", "trainer.save_model=false"]


def run(overrides: list) -> dict:
    with tempfile.TemporaryDirectory(prefix="accumulate-") as tmp:
        run_dir = Path(tmp) / "run"
        done = subprocess.run([sys.executable, str(ROOT / "train.py"), f"hydra.run.dir={run_dir}", *ARGS, *overrides],
                              capture_output=True, text=True, cwd=tmp)
        if done.returncode:
            raise RuntimeError(done.stderr[-2000:])
        r = json.loads((run_dir / "results.json").read_text())
    return {"examples_per_sec": r["examples_per_sec"], "communication": (r["time_split"] or {}).get("communication"),
            "allreduces_per_1000_examples": round(1000 / r["global_batch_size"], 2),
            "test_accuracy": r["test_accuracy"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=4)
    opts, overrides = parser.parse_known_args()
    accumulated = [*overrides, f"trainer.accumulate_steps={opts.steps}"]
    rounds = []
    for n in range(opts.rounds):
        pair = [("plain", overrides), ("accumulated", accumulated)]
        found = dict((name, run(args)) for name, args in (pair if n % 2 == 0 else pair[::-1]))
        rounds.append({**found, "ratio": round(found["accumulated"]["examples_per_sec"] /
                                               found["plain"]["examples_per_sec"], 3)})
    ratios = [r["ratio"] for r in rounds]
    print(json.dumps({"ratio": statistics.median(ratios), "range": [min(ratios), max(ratios)], "rounds": rounds}))


if __name__ == "__main__":
    main()
