"""What a run leaves behind for people and tools: results.json, status.json and the closing lines."""
import json
import os
from pathlib import Path

RESULTS = "results.json"
STATUS = "status.json"


def write_text(path: Path, text: str) -> Path:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")  # several tasks may write the same file
    tmp.write_text(text)
    os.replace(tmp, path)  # readers (sweep summaries, tests, a resume) never see half a file
    return path


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


def write_status(run_dir: Path, status: str, code: int, error: str = "", log_tail=(), job=None) -> Path:
    """How the run ended: ok, failed or interrupted, its exit status, and for a failure its error line
    and the end of the failing task's log (what a sweep summary shows for a failed job)."""
    content = {"status": status, "exit_status": code, "error": error, "log_tail": list(log_tail)}
    if job is not None:
        content.update(job=job.num, swept=job.swept)
    return write_json(Path(run_dir) / STATUS, content)


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
