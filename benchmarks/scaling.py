"""Multi-worker scaling, measured side by side in one run (never in timed tests: machines are noisy).

    python benchmarks/scaling.py [--rounds 3] [--epochs 4] [--batch 128] [--examples 16384] [--out scaling.json]

Every configuration is `python train.py ...` in fresh processes, each worker pinned to one core,
the same per-worker batch. Each round runs every configuration back to back and gives its own
ratios, so drift on a shared machine hits both sides of a ratio alike; the median over the rounds is
reported, with the range. Throughput leaves out the first epoch (tracing, warm-up).
  sync:    multi_worker_mirrored, 2 workers vs 1: efficiency = examples/s(2) / (2 x examples/s(1))
  async:   parameter_server (1 ps), 2 workers vs 1: speed-up = steps/s(2) / steps/s(1)
  ceiling: two independent 1-worker runs at once, one per core: what this machine gives two busy
           cores, with no communication at all (sync efficiency cannot exceed it)
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

TRAIN = Path(__file__).resolve().parents[1] / "train.py"


def configs(batch: int) -> dict:
    """name -> the runs that make it, started together: (train.py arguments, core or None)."""
    sync = ["strategy=multi_worker_mirrored"]
    async_ = ["strategy=parameter_server", "cluster.ps=1", "trainer.steps_per_execution=20"]
    one = sync + ["cluster.workers=1", f"trainer.batch_size={batch}"]
    return {
        "sync, 1 worker": [(one, None)],
        "sync, 2 workers": [(sync + ["cluster.workers=2", f"trainer.batch_size={2 * batch}"], None)],  # global
        "2 x 1 worker": [(one, 0), (one, 1)],  # the ceiling: independent runs, one per core
        "async, 1 worker": [(async_ + ["cluster.workers=1", f"trainer.batch_size={batch}"], None)],
        "async, 2 workers": [(async_ + ["cluster.workers=2", f"trainer.batch_size={batch}"], None)],  # per step
    }


def measure(runs: list, epochs: int, examples: int, workdir: Path) -> dict:
    """Starts the runs together, waits for them; their examples/s and steps/s added up."""
    common = ["data=synthetic", f"data.train_examples={examples}", "data.test_examples=256", f"trainer.epochs={epochs}",
              "trainer.verbose=0", "trainer.save_model=false", "cluster.threads_per_worker=1",
              "cluster.pin_workers=true"]
    started = []
    for args, core in runs:
        run_dir = Path(tempfile.mkdtemp(dir=workdir))
        pin = (lambda c=core: os.sched_setaffinity(0, {c})) if core is not None else None
        proc = subprocess.Popen([sys.executable, str(TRAIN), f"hydra.run.dir={run_dir}", *common, *args],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=pin)
        started.append((proc, run_dir, args))
    total = {"examples_per_sec": 0.0, "steps_per_sec": 0.0}
    for proc, run_dir, args in started:
        out, _ = proc.communicate(timeout=900)
        if proc.returncode:
            sys.exit(f"benchmark run failed ({' '.join(args)}):\n{out[-4000:]}")
        results = json.loads((run_dir / "results.json").read_text())
        for key in total:
            total[key] += results[key]
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch", type=int, default=128, help="per-worker batch")
    parser.add_argument("--examples", type=int, default=16384, help="training examples per epoch")
    parser.add_argument("--out", type=Path, help="also write the measurements here as JSON")
    opts = parser.parse_args()
    if len(os.sched_getaffinity(0)) < 2:
        sys.exit("the scaling benchmark needs 2 cores (one per worker)")

    samples = {name: [] for name in configs(opts.batch)}
    with tempfile.TemporaryDirectory() as workdir:
        for round_ in range(opts.rounds):
            for name, runs in configs(opts.batch).items():
                m = measure(runs, opts.epochs, opts.examples, Path(workdir))
                samples[name].append(m)
                print(f"round {round_ + 1}/{opts.rounds}  {name:<17} {m['examples_per_sec']:8.0f} examples/s "
                      f"{m['steps_per_sec']:7.1f} steps/s", flush=True)

    def ratios(two: str, one: str, key: str, factor: int) -> list:  # per round: two / (factor x one)
        return [b[key] / (factor * a[key]) for a, b in zip(samples[one], samples[two])]

    found = {
        "sync efficiency, 2 workers vs 2 x 1 worker": (ratios("sync, 2 workers", "sync, 1 worker",
                                                              "examples_per_sec", 2), "target >= 0.85"),
        "ceiling, 2 independent runs vs 2 x 1 alone": (ratios("2 x 1 worker", "sync, 1 worker",
                                                              "examples_per_sec", 2), "the machine's own limit"),
        "async speed-up, 2 workers vs 1 worker": (ratios("async, 2 workers", "async, 1 worker",
                                                         "steps_per_sec", 1), "target >= 1.6"),
    }
    efficiency, ceiling = found["sync efficiency, 2 workers vs 2 x 1 worker"][0], found[
        "ceiling, 2 independent runs vs 2 x 1 alone"][0]
    found["sync efficiency / ceiling"] = ([e / c for e, c in zip(efficiency, ceiling)],
                                          "machine noise cancels; 1.0 = all the machine gives")
    median = {name: {k: statistics.median(s[k] for s in runs) for k in runs[0]} for name, runs in samples.items()}
    print(f"\n{'configuration':<18} {'examples/s':>11} {'steps/s':>9}   (median of {opts.rounds} rounds, "
          f"per-worker batch {opts.batch}, one core per worker)")
    for name, m in median.items():
        print(f"{name:<18} {m['examples_per_sec']:>11.0f} {m['steps_per_sec']:>9.1f}")
    print()
    for name, (values, note) in found.items():
        print(f"{name:<44} {statistics.median(values):.2f}  (rounds {min(values):.2f}-{max(values):.2f}; {note})")
    if opts.out:
        opts.out.write_text(json.dumps({"median": median, "samples": samples, "batch": opts.batch,
                                        "examples": opts.examples,
                                        "ratios": {name: values for name, (values, _) in found.items()}},
                                       indent=2) + "\n")


if __name__ == "__main__":
    main()
