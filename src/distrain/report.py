"""What a run leaves behind for people and tools: results.json and the closing summary line."""
import json
import os
from pathlib import Path

RESULTS = "results.json"


def write_json(path: Path, content: dict) -> Path:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(content, indent=2) + "\n")
    os.replace(tmp, path)  # readers (sweep summaries, tests) never see half a file
    return path


def write_results(run_dir: Path, results: dict) -> Path:
    return write_json(Path(run_dir) / RESULTS, results)


def summary_line(r: dict) -> str:
    return (f"Test accuracy {r['test_accuracy']:.2%}, loss {r['test_loss']:.4f} | "
            f"{r['train_seconds']:.1f} s training, {r['examples_per_sec']:,.0f} examples/s | "
            f"{r['num_replicas']} replica(s), {r['num_workers']} worker(s), {r['num_ps']} ps | "
            f"strategy={r['strategy']} model={r['model']} data={r['data']}({r['data_source']})")
