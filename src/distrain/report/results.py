"""What a run tells people and tools: the content of results.json (rundir.py writes it) and the closing lines."""
import os

from distrain.common.messages import STARTED
from distrain.config import schema
from distrain.report import timesplit


def logs_for_tensorboard(config: dict | None) -> bool:
    """Whether the run of this config (its config.yaml's values) logs for TensorBoard (trainer.tensorboard):
    its session for the HParams dashboard (dashboard.py) is written then."""
    return ((config or {}).get("trainer") or {}).get("tensorboard") is True


def results(cfg, data, progress, test: list, facts: dict) -> dict:
    """results.json: what ran (the config in brief, and `facts`: the strategy's replicas and workers, the
    model's size, the precision and kernels), how fast (over the epochs after the first) and how well.
    data: training.Data; progress: checkpoints.Progress; test: Keras evaluate's {"loss": ..., each metric: ...}
    on the test split."""
    t, f, history, seconds = cfg.trainer, facts, progress.history, progress.epoch_seconds
    batch = schema.update_batch(t)  # the examples of an update (trainer.accumulate_steps batches)
    found = {"strategy": cfg.strategy.name, "num_replicas": f["num_replicas"], "num_workers": f["num_workers"],
             "num_ps": f["num_ps"], "devices": f["devices"], "model": schema.label(cfg.model),
             "model_params": f["model_params"], "input_shape": list(data.shape), "num_classes": data.classes,
             "model_outputs": f["model_outputs"], "optimizer": schema.label(cfg.optimizer),
             "learning_rate": t.learning_rate,
             "schedule": schema.label(cfg.schedule), "lr_scaling": t.lr_scaling,
             "scaled_learning_rate": t.learning_rate * schema.lr_factor(t),
             "epochs": t.epochs, "steps_per_epoch": data.steps, "global_batch_size": batch,
             "accumulate_steps": t.get("accumulate_steps", 1),
             "per_replica_batch_size": f["per_replica_batch_size"], "steps_per_execution": f["steps_per_execution"],
             "precision_policy": f["precision_policy"], "onednn": f["onednn"], "jit_compile": t.jit_compile,
             "data": schema.label(cfg.data), "data_source": cfg.data.source, "train_examples": data.train_examples,
             "test_examples": data.test_examples, "train_seconds": sum(seconds),
             "seconds_to_first_step": f["seconds_to_first_step"], "epoch_seconds": seconds,
             "examples_per_sec": throughput(data.steps * batch, seconds),
             "steps_per_sec": throughput(data.steps, seconds), "global_steps": f["global_steps"],
             "resumed_from_step": progress.resumed_from_step, "restarts": progress.restarts,
             "test_loss": float(test["loss"]), "final_train_loss": history["loss"][-1],
             "history": history, "seed": t.seed}
    split = timesplit.overall(history, seconds)
    alone = f.get("input_examples_per_sec")
    rates = {"input_examples_per_sec": round(alone, 1) if alone else None,
             "steps_examples_per_sec": timesplit.steps_rate(history, data.steps * batch)}
    found |= {"time_split": split, "bound": timesplit.bound(split, *rates.values()), **rates,
              "input_cpu_share": timesplit.cpu_share(f.get("input_cpu_per_example"), progress.epoch_cpu_seconds,
                                                     data.steps * batch / f["num_workers"], f["num_ps"])}
    found |= {f"test_{name}": _number(value) for name, value in test.items() if name != "loss"}
    if len(progress.membership) > 1:  # resumed at another size: each size, from the global step it began
        found["membership"] = progress.membership
    if progress.stopped_early:  # a callback's decision: the run is ok, with fewer epochs
        found["stopped_early"] = progress.stopped_early
    if getattr(data, "class_names", None):  # an image folder's: what each output means
        found["class_names"] = data.class_names
    return {**found, **facts}  # and the facts not named above: tensorflow_version, worker_steps


def epoch_rows(history: dict, epoch_seconds: list, examples_per_epoch: int, epochs: int, validate_every: int) -> list:
    """A row per epoch trained ({"epoch": 1, "loss": ..., each metric, val_* where the epoch validated,
    time_input, time_compute, time_communication, "epoch_examples_per_sec": ...}): metrics.csv's, and what
    a tracker logs per epoch, alike from a running task's progress and from a finished run's results.json.
    The val_* values are one per validated epoch: every validate_every-th and the last of `epochs`; None in
    the others."""
    trained = len(history.get("loss", []))
    validated = [e for e in range(trained) if validate_every and ((e + 1) % validate_every == 0 or e + 1 == epochs)]
    names = [name for name in history if name != "time_steps_seconds"]  # (the bound's, not a figure per epoch)
    rows = [{"epoch": e + 1, **dict.fromkeys(names)} for e in range(trained)]  # (None: not validated that epoch)
    for name in names:
        for e, value in zip(validated if name.startswith("val_") else range(trained), history[name]):
            rows[e][name] = value
    for row, seconds in zip(rows, epoch_seconds):
        row["epoch_examples_per_sec"] = round(examples_per_epoch / seconds, 1) if seconds else None
    return rows


def throughput(examples_per_epoch: int, epoch_seconds: list[float]) -> float:
    """Examples per second over the epochs after the first (all of them when there is only one)."""
    timed = timesplit.steady(epoch_seconds)
    return examples_per_epoch * len(timed) / sum(timed)


def seconds_since_start(moment: float | None) -> float | None:
    """Seconds from the command's start (cli.py notes it in protocol.STARTED for every task) to a moment."""
    started = os.environ.get(STARTED)
    return round(moment - float(started), 3) if moment and started else None


def _number(value) -> float:
    """A metric's result: a number, or (per class) the mean of its numbers."""
    import numpy as np

    return float(np.mean(value))


def headline(r: dict) -> str:
    """The test result that says most: accuracy where the run measured it, else its first metric, else
    its loss ("test accuracy 98.15%", "test mae 0.1234")."""
    if "test_accuracy" in r:
        return f"test accuracy {r['test_accuracy']:.2%}"
    first = next((k for k in r if k.startswith("test_") and k not in ("test_loss", "test_examples")), "test_loss")
    return f"test {first.removeprefix('test_')} {r[first]:.4g}"


def figure(results: dict, name: str) -> float | None:
    """A number of results.json, or the last value of a figure of each epoch (val_accuracy: the last
    validation's); None where the run has neither."""
    value = results[name] if name in results else ((results.get("history") or {}).get(name) or [None])[-1]
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def test_numbers(results: dict) -> dict:
    """The test loss and each metric's test value of a run's results ({"test_loss": ..., "test_mae": ...})."""
    return {k: v for k, v in results.items() if k.startswith("test_") and isinstance(v, float)}


def validation_numbers(results: dict, rows: list | None) -> dict:
    """The last validation's loss and metrics ({"val_loss": ..., "val_accuracy": ...}): of the run's
    history, or of metrics.csv's rows where it has no results (a pruned trial, stopped before its end)."""
    history = results.get("history") or {}
    if not history and rows:
        history = {k: [row[k] for row in rows if row.get(k) is not None] for k in rows[-1] if k.startswith("val_")}
    return {k: v[-1] for k, v in history.items() if k.startswith("val_") and v}


def summary_line(r: dict) -> str:
    head = headline(r)
    return (f"{head[0].upper()}{head[1:]}, loss {r['test_loss']:.4f} | "
            f"{r['train_seconds']:.1f} s training, {r['examples_per_sec']:,.0f} examples/s | "
            f"{r['num_replicas']} replica(s), {r['num_workers']} worker(s), {r['num_ps']} ps | "
            f"strategy={r['strategy']} model={r['model']} data={r['data']}({r['data_source']})"
            + (f" | {r['stopped_early']}" if r.get("stopped_early") else ""))


def memory_line(peaks: dict) -> str:
    """Each task's peak resident memory ("chief-0 812 MiB, worker-0 790 MiB")."""
    return ", ".join(f"{name} {mib:,.0f} MiB" for name, mib in peaks.items())


def cpu_line(seconds: dict) -> str:
    """Each task's CPU time ("worker-0 31.2 s, data_worker-0 6.0 s")."""
    return ", ".join(f"{name} {s:,.1f} s" for name, s in seconds.items())


def short_line(r: dict) -> str:
    return (f"{headline(r)}, {r['examples_per_sec']:,.0f} examples/s, "
            f"{r['train_seconds']:.1f} s training")
