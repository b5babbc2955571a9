"""Multi-worker scaling, measured side by side in one run (never in timed tests: machines are noisy).

    python benchmarks/scaling.py [--rounds 3] [--epochs 4] [--batch 128] [--examples 16384] [--out scaling.json]

Every configuration is `python train.py ...` in fresh processes, each worker pinned to one core,
the same per-worker batch. Each round runs all four back to back and gives its own ratios, so drift
on a shared machine hits both sides of a ratio alike; the median over the rounds is reported, with
the range. Throughput leaves out the first epoch (tracing, warm-up).
  sync:  multi_worker_mirrored, 2 workers vs 1: efficiency = examples/s(2) / (2 x examples/s(1))
  async: parameter_server (1 ps), 2 workers vs 1: speed-up = steps/s(2) / steps/s(1)
"""
import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

TRAIN = Path(__file__).resolve().parents[1] / "train.py"


def configs(batch: int) -> dict:
    sync = ["strategy=multi_worker_mirrored"]
    async_ = ["strategy=parameter_server", "cluster.ps=1", "strategy.steps_per_schedule=20"]
    return {
        "sync, 1 worker": sync + ["cluster.workers=1", f"trainer.batch_size={batch}"],
        "sync, 2 workers": sync + ["cluster.workers=2", f"trainer.batch_size={2 * batch}"],  # global batch
        "async, 1 worker": async_ + ["cluster.workers=1", f"trainer.batch_size={batch}"],
        "async, 2 workers": async_ + ["cluster.workers=2", f"trainer.batch_size={batch}"],  # per step
    }


def run(args: list, epochs: int, examples: int, workdir: Path) -> dict:
    run_dir = Path(tempfile.mkdtemp(dir=workdir))
    common = ["data=synthetic", f"data.train_examples={examples}", "data.test_examples=256", f"trainer.epochs={epochs}",
              "trainer.verbose=0", "trainer.save_model=false", "cluster.threads_per_worker=1",
              "cluster.pin_workers=true"]
    out = subprocess.run([sys.executable, str(TRAIN), f"hydra.run.dir={run_dir}", *common, *args],
                         capture_output=True, text=True, timeout=900)
    if out.returncode:
        sys.exit(f"benchmark run failed ({' '.join(args)}):\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    return json.loads((run_dir / "results.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch", type=int, default=128, help="per-worker batch")
    parser.add_argument("--examples", type=int, default=16384, help="training examples per epoch")
    parser.add_argument("--out", type=Path, help="also write the measurements here as JSON")
    opts = parser.parse_args()

    samples = {name: [] for name in configs(opts.batch)}
    with tempfile.TemporaryDirectory() as workdir:
        for round_ in range(opts.rounds):
            for name, args in configs(opts.batch).items():
                r = run(args, opts.epochs, opts.examples, Path(workdir))
                samples[name].append({"examples_per_sec": r["examples_per_sec"], "steps_per_sec": r["steps_per_sec"]})
                print(f"round {round_ + 1}/{opts.rounds}  {name:<17} {r['examples_per_sec']:8.0f} examples/s "
                      f"{r['steps_per_sec']:7.1f} steps/s", flush=True)

    def ratios(config: str, key: str, factor: int) -> list:  # per round: 2 workers / (factor x 1 worker)
        return [two[key] / (factor * one[key]) for one, two in
                zip(samples[f"{config}, 1 worker"], samples[f"{config}, 2 workers"])]

    sync_eff = ratios("sync", "examples_per_sec", 2)
    async_up = ratios("async", "steps_per_sec", 1)
    median = {name: {k: statistics.median(s[k] for s in runs) for k in runs[0]} for name, runs in samples.items()}
    print(f"\n{'configuration':<18} {'examples/s':>11} {'steps/s':>9}   (median of {opts.rounds} rounds, "
          f"per-worker batch {opts.batch}, one core per worker)")
    for name, m in median.items():
        print(f"{name:<18} {m['examples_per_sec']:>11.0f} {m['steps_per_sec']:>9.1f}")
    print(f"\nsync  efficiency, 2 workers vs 2 x 1 worker: {statistics.median(sync_eff):.2f}  "
          f"(rounds {min(sync_eff):.2f}-{max(sync_eff):.2f}; target >= 0.85)")
    print(f"async speed-up,   2 workers vs 1 worker:     {statistics.median(async_up):.2f}x "
          f"(rounds {min(async_up):.2f}-{max(async_up):.2f}; target >= 1.6)")
    if opts.out:
        opts.out.write_text(json.dumps({"median": median, "samples": samples, "sync_efficiency": sync_eff,
                                        "async_speedup": async_up, "batch": opts.batch,
                                        "examples": opts.examples}, indent=2) + "\n")


if __name__ == "__main__":
    main()
