"""How long a synchronous cluster stands still when it changes size: seconds from a lost worker to
training again, (1) restarted whole at its size, (2) lost for good and gone on with fewer workers
(cluster.min_workers), and (3) from the launcher's decision to grow back to training again at the
larger size. One run a round, on a local multi_worker_mirrored cluster of 2 workers:

    python benchmarks/elastic.py [--rounds 3] [train.py overrides...]

worker-1 is SIGKILLed after the first checkpoint inside an epoch (the cluster restarts: max_restarts=1),
then again as soon as it is started again (its budget spent: the cluster goes on with worker-0 alone);
once the first restart is cluster.restart_window (4 s) old, the cluster grows back. "Training again" is
the first checkpoint past the step the cluster resumed from (one every 5 steps): what a user would lose
or wait for. Prints one JSON line: the median of each over the rounds, and every round's.
"""
import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from distrain.common import storage  # noqa: E402

ARGS = ["strategy=multi_worker_mirrored", "cluster.workers=2", "cluster.min_workers=1", "cluster.max_restarts=1",
        "cluster.restart_window=4", "model=mlp", "data=synthetic", "data.train_examples=2048",
        "data.test_examples=256", "trainer.batch_size=64", "trainer.epochs=40", "trainer.verbose=2",
        "trainer.checkpoint_every_steps=5", "trainer.save_model=true"]


def step(run_dir: Path) -> int:
    return storage.checkpoint_step(storage.latest_checkpoint(run_dir / "checkpoints")) or 0


def worker_1(run_dir: Path) -> int | None:
    try:
        tasks = json.loads((run_dir / "cluster.json").read_text())["tasks"]
    except (OSError, ValueError):
        return None
    return next((t["pid"] for t in tasks if t["name"] == "worker-1" and t["state"] == "running"), None)


def until(predicate, what: str, timeout: float = 120.0, interval: float = 0.01):
    deadline = time.monotonic() + timeout
    while not (found := predicate()):
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(interval)
    return found


def one_round(overrides: list) -> dict:
    with tempfile.TemporaryDirectory(prefix="elastic-") as tmp:
        run_dir = Path(tmp) / "run"
        proc = subprocess.Popen([sys.executable, str(ROOT / "train.py"), f"hydra.run.dir={run_dir}", *ARGS, *overrides],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})  # (each line timed as it comes)
        lines = []  # (time, line)

        def read():
            for line in proc.stdout:
                lines.append((time.monotonic(), line))
        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            until(lambda: step(run_dir) % 32, "a checkpoint inside an epoch")
            first = until(lambda: worker_1(run_dir), "worker-1")
            killed, at = time.monotonic(), step(run_dir)
            os.kill(first, signal.SIGKILL)
            again = until(lambda: (pid := worker_1(run_dir)) not in (None, first) and pid, "worker-1 again")
            resumed = step(run_dir)
            until(lambda: step(run_dir) > resumed, "training again at 2 workers")
            restart = time.monotonic() - killed
            killed, at = time.monotonic(), step(run_dir)
            os.kill(again, signal.SIGKILL)
            until(lambda: any("lost for good" in line for _, line in lines), "the cluster shrinking")
            until(lambda: step(run_dir) > at, "training again at 1 worker", interval=0.005)
            shrink = time.monotonic() - killed
            grew = until(lambda: next((t for t, line in lines if "growing back" in line), None), "growing back")
            until(lambda: any(re.search(r"resumed at step \d+ on 2 workers", line) for _, line in lines),
                  "resumed at 2 workers")
            at = step(run_dir)
            until(lambda: step(run_dir) > at, "training again at 2 workers", interval=0.005)
            grow = time.monotonic() - grew
            code = proc.wait(timeout=300)
            reader.join(timeout=10)
            if code:
                raise RuntimeError(f"the run failed ({code}): {''.join(line for _, line in lines[-20:])}")
            sizes = [m["workers"] for m in json.loads((run_dir / "results.json").read_text())["membership"]]
            return {"restart_seconds": round(restart, 2), "shrink_seconds": round(shrink, 2),
                    "grow_seconds": round(grow, 2), "sizes": sizes}
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                proc.wait(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    opts, overrides = parser.parse_known_args()
    rounds = [one_round(overrides) for _ in range(opts.rounds)]
    medians = {k: statistics.median(r[k] for r in rounds) for k in ("restart_seconds", "shrink_seconds",
                                                                       "grow_seconds")}
    print(json.dumps({**medians, "rounds": rounds}))


if __name__ == "__main__":
    main()
