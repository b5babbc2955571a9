"""Pictures of a run (curves.png) and of a sweep (scaling.png), drawn with matplotlib off-screen."""
from collections import defaultdict
from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")  # no display needed
import matplotlib.pyplot as plt  # noqa: E402 - after matplotlib.use


def save(fig, path: Path, bbox_inches=None) -> Path:
    """The figure as a PNG at `path`, written whole (a reader never sees half a picture), then closed.
    bbox_inches="tight": cropped to every artist, a legend outside the axes too (Optuna's plots)."""
    tmp = path.with_name(path.stem + ".tmp.png")
    fig.tight_layout()
    fig.set_layout_engine(None)  # laid out: else savefig lays it out again, in a draw of its own
    try:
        fig.savefig(tmp, dpi=100, bbox_inches=bbox_inches)
        tmp.replace(path)  # a reader never sees half a picture
    finally:
        plt.close(fig)
        tmp.unlink(missing_ok=True)
    return path


def curves(results: dict, path: Path) -> Path:
    """The training loss and the first metric (accuracy by default) per epoch, each with its test value."""
    history = results["history"]
    epochs = range(1, len(history["loss"]) + 1)
    metric = next((name for name in history if name != "loss" and not name.startswith(("time_", "val_"))), "loss")
    fig, (loss, other) = plt.subplots(1, 2, figsize=(10, 4))
    loss.plot(epochs, history["loss"], marker="o", label="training")
    if isinstance(results.get("test_loss"), (int, float)):
        loss.axhline(results["test_loss"], color="tab:green", linestyle="--", label=f"test: {results['test_loss']:.4g}")
    loss.set(title="loss", xlabel="epoch", ylabel="loss")
    loss.legend()
    other.plot(epochs, history[metric], marker="o", label="training")
    test = results.get(f"test_{metric}")
    if isinstance(test, (int, float)):
        other.axhline(test, color="tab:green", linestyle="--",
                      label=f"test: {test:.2%}" if metric == "accuracy" else f"test: {test:.4g}")
    other.set(title=metric, xlabel="epoch", ylabel=metric)
    other.legend()
    for ax in (loss, other):
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    fig.suptitle(f"{results['strategy']}, {results['model']} on {results['data']}: "
                 f"{results['num_replicas']} replica(s), global batch {results['global_batch_size']}")
    return save(fig, path)


def scaling(rows: list, path: Path, note: str = "") -> Path:
    """Throughput against replicas with the ideal linear line, efficiency, and where the time goes (the
    shares of input, compute and communication: what efficiency is lost to); a line per strategy."""
    fig, (speed, efficiency, split) = plt.subplots(1, 3, figsize=(16, 4.5))
    by_strategy = defaultdict(list)
    for row in rows:
        by_strategy[row["strategy"]].append(row)
    for strategy, points in by_strategy.items():
        points.sort(key=lambda r: r["replicas"])
        x = [r["replicas"] for r in points]
        line, = speed.plot(x, [r["examples_per_sec"] for r in points], marker="o", label=strategy)
        base = min(points, key=lambda r: r["replicas"])
        speed.plot(x, [base["examples_per_sec"] * n / base["replicas"] for n in x], linestyle=":",
                   color=line.get_color(), label=f"{strategy}, ideal (linear)")
        efficiency.plot(x, [r["efficiency"] for r in points], marker="o", color=line.get_color(), label=strategy)
    _time_split(split, by_strategy)
    speed.set(title="throughput", xlabel="replicas (workers)", ylabel="examples/s")
    efficiency.axhline(1.0, color="grey", linestyle=":")
    efficiency.set(title="scaling efficiency (speed-up / replica ratio)", xlabel="replicas (workers)",
                   ylabel="efficiency", ylim=(0, max(1.1, *(r["efficiency"] for r in rows)) * 1.05))
    for ax in (speed, efficiency, split):
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
        ax.set_xticks(sorted({r["replicas"] for r in rows}))
    if note:
        fig.suptitle(note, fontsize="medium")
    return save(fig, path)


def _time_split(ax, by_strategy: dict) -> None:
    """Stacked bars of each run's time split, grouped by replicas, a bar per strategy."""
    width = 0.8 / max(1, len(by_strategy))
    colors = {"input": "tab:orange", "compute": "tab:blue", "communication": "tab:red"}
    for i, (strategy, points) in enumerate(by_strategy.items()):
        x = [r["replicas"] - 0.4 + width * (i + 0.5) for r in points]
        bottom = [0.0] * len(points)
        for part, color in colors.items():
            shares = [_number(r.get(part)) or 0.0 for r in points]
            ax.bar(x, shares, width * 0.9, bottom=bottom, color=color, label=part if i == 0 else None,
                   edgecolor="white")
            bottom = [b + v for b, v in zip(bottom, shares)]
        for xi in x:
            ax.annotate(strategy[:12], (xi, 1.01), ha="center", fontsize="x-small", rotation=90, va="bottom")
    ax.set(title="where the training time goes", xlabel="replicas (workers)", ylabel="share of the time",
           ylim=(0, 1.35))


def by_value(rows: list, key: str, path: Path, series_keys=()) -> Path:
    """Test accuracy and throughput against one swept value, a line (or, for named choices such as
    strategies, a set of bars) per combination of the other swept values."""
    fig, (accuracy, speed) = plt.subplots(1, 2, figsize=(11, 4.5))
    groups = defaultdict(list)
    for row in rows:
        groups[", ".join(f"{k}={row[k]}" for k in series_keys)].append(row)
    numeric = all(_number(r[key]) is not None for r in rows)
    labels = list(dict.fromkeys(str(r[key]) for r in rows))  # in the sweep's order
    width = 0.8 / len(groups)
    for i, (name, points) in enumerate(groups.items()):
        for ax, measure in ((accuracy, "test_accuracy"), (speed, "examples_per_sec")):
            if numeric:
                points.sort(key=lambda r: _number(r[key]))
                ax.plot([_number(r[key]) for r in points], [r[measure] for r in points], marker="o",
                        label=name or None)
            else:
                ax.bar([labels.index(str(r[key])) + (i - (len(groups) - 1) / 2) * width for r in points],
                       [r[measure] for r in points], width, label=name or None)
    values = [_number(v) for v in labels] if numeric else []
    for ax, title, ylabel in ((accuracy, "test accuracy", "accuracy"), (speed, "throughput", "examples/s")):
        ax.set(title=title, xlabel=key, ylabel=ylabel)
        ax.grid(alpha=0.3)
        if not numeric:
            ax.set_xticks(range(len(labels)), labels, rotation=20)
        else:  # the swept values as ticks, as written; a log axis where they grow by factors (learning rates)
            if min(values) > 0 and max(values) / min(values) >= 4:
                ax.set_xscale("log")
            ax.set_xticks(values, labels, rotation=30 if sum(map(len, labels)) > 40 else 0)
            ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        if groups.keys() != {""}:
            ax.legend(fontsize="small")
    return save(fig, path)


def _number(value):
    try:
        return float(value)
    except (TypeError, ValueError):
        return None
