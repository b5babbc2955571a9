"""What a run leaves behind for people and tools: results.json, status.json and the closing lines."""
import json
import os
from pathlib import Path

from . import schema, storage
from .storage import write_text

RESULTS = "results.json"
STATUS = "status.json"


def write_json(path: Path, content: dict) -> Path:
    return write_text(path, json.dumps(content, indent=2) + "\n")


def read_json(path: Path) -> dict | None:
    """A JSON file, or None where it is missing or unreadable (a run that never finished)."""
    try:
        content = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return content if isinstance(content, dict) else None


def write_results(run_dir: Path, results: dict) -> Path:
    return write_json(Path(run_dir) / RESULTS, results)


def read_results(run_dir: Path) -> dict | None:
    return read_json(Path(run_dir) / RESULTS)


def write_status(run_dir: Path, status: str, code: int, error: str = "", log_tail=(), job=None) -> None:
    """How the run ended: ok, failed or interrupted, its exit status, and for a failure its error line
    and the end of the failing task's log (what a sweep summary shows for a failed job)."""
    content = {"status": status, "exit_status": code, "error": error, "log_tail": list(log_tail)}
    if job is not None:
        content.update(job=job.num, swept=job.swept)
    storage.record(write_json, Path(run_dir) / STATUS, content)  # (a full disk: said, not raised)


def ended(run_dir: Path) -> str | None:
    """How the run in run_dir ended, as its status.json says (ok, failed, interrupted; running if its
    launcher was killed), or None if it recorded none."""
    return (read_json(Path(run_dir) / STATUS) or {}).get("status")


def earlier_run(run_dir: Path) -> str | None:
    """The run in run_dir, in words ("ended ok at global step 744"), or None if none was started there."""
    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").exists():
        return None
    status, results = ended(run_dir), read_results(run_dir) or {}
    how = {"ok": "ended ok", "failed": "failed", "interrupted": "was interrupted", "restarting": "was restarting"}
    words = how.get(status, "was stopped before it recorded how it ended")
    if status == "ok" and "global_steps" in results:
        words += f" at global step {results['global_steps']}, test accuracy {results['test_accuracy']:.2%}"
    latest = storage.latest_checkpoint(run_dir / "checkpoints")
    return words + (f"; its latest checkpoint is {latest}" if latest and status != "ok" else "")


def results(cfg, data, progress, test: list, facts: dict) -> dict:
    """results.json: what ran (the config in brief, and `facts`: the strategy's replicas and workers, the
    model's size, the precision and kernels), how fast (over the epochs after the first) and how well.
    data: training.Data; progress: checkpoints.Progress; test: [loss, accuracy] on the test split."""
    t, f, history, seconds = cfg.trainer, facts, progress.history, progress.epoch_seconds
    found = {"strategy": cfg.strategy.name, "num_replicas": f["num_replicas"], "num_workers": f["num_workers"],
             "num_ps": f["num_ps"], "devices": f["devices"], "model": schema.label(cfg.model),
             "model_params": f["model_params"], "input_shape": list(data.shape), "num_classes": data.classes,
             "model_outputs": f["model_outputs"], "optimizer": cfg.optimizer, "learning_rate": t.learning_rate,
             "epochs": t.epochs, "global_batch_size": t.batch_size,
             "per_replica_batch_size": f["per_replica_batch_size"], "steps_per_execution": f["steps_per_execution"],
             "precision_policy": f["precision_policy"], "onednn": f["onednn"], "jit_compile": t.jit_compile,
             "data": schema.label(cfg.data), "data_source": cfg.data.source, "train_examples": len(data.y_train),
             "test_examples": len(data.y_test), "train_seconds": sum(seconds),
             "seconds_to_first_step": f["seconds_to_first_step"], "epoch_seconds": seconds,
             "examples_per_sec": throughput(data.steps * t.batch_size, seconds),
             "steps_per_sec": throughput(data.steps, seconds), "global_steps": f["global_steps"],
             "resumed_from_step": progress.resumed_from_step, "restarts": progress.restarts,
             "test_accuracy": float(test[1]), "test_loss": float(test[0]), "final_train_loss": history["loss"][-1],
             "history": history, "seed": t.seed}
    return {**found, **facts}  # and the facts not named above: tensorflow_version, worker_steps


def throughput(examples_per_epoch: int, epoch_seconds: list[float]) -> float:
    """Examples per second over the epochs after the first (all of them when there is only one)."""
    timed = epoch_seconds[1:] or epoch_seconds
    return examples_per_epoch * len(timed) / sum(timed)


def seconds_since_start(moment: float | None) -> float | None:
    """Seconds from the command's start (cli.py notes it in DISTRAIN_STARTED for every task) to a moment."""
    started = os.environ.get("DISTRAIN_STARTED")
    return round(moment - float(started), 3) if moment and started else None


def summary_line(r: dict) -> str:
    return (f"Test accuracy {r['test_accuracy']:.2%}, loss {r['test_loss']:.4f} | "
            f"{r['train_seconds']:.1f} s training, {r['examples_per_sec']:,.0f} examples/s | "
            f"{r['num_replicas']} replica(s), {r['num_workers']} worker(s), {r['num_ps']} ps | "
            f"strategy={r['strategy']} model={r['model']} data={r['data']}({r['data_source']})")


def short_line(r: dict) -> str:
    return (f"test accuracy {r['test_accuracy']:.2%}, {r['examples_per_sec']:,.0f} examples/s, "
            f"{r['train_seconds']:.1f} s training")
