"""What a sweep answers: one row per job in summary.csv and summary.md (and on the terminal), and a
scaling plot, built after any Hydra launcher by a callback, or again by `distrain summarize DIR`.

A job's row comes from its run directory: Hydra's `.hydra/overrides.yaml` (what it was asked to run),
status.json (how it ended) and results.json (what it measured). No TensorFlow here.
"""
import csv
import io
import signal
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from hydra.experimental.callback import Callback
from omegaconf import OmegaConf

from distrain.common.errors import print_error
from distrain.common.messages import ERROR
from distrain.common.rundir import STATUS, RunDir
from distrain.common.storage import record, write_atomic
from distrain.config import overrides
from distrain.report.results import logs_for_tensorboard, test_numbers, validation_numbers

MEASURES = [  # summary column <- results.json key
    ("strategy", "strategy"), ("model", "model"), ("params", "model_params"), ("workers", "num_workers"),
    ("ps", "num_ps"), ("replicas", "num_replicas"), ("resized", None),
    ("global_batch", "global_batch_size"), ("per_replica_batch", "per_replica_batch_size"),
    ("examples_per_sec", "examples_per_sec"), ("steps_per_sec", "steps_per_sec"),
    ("speedup", None), ("efficiency", None),
    ("test_accuracy", "test_accuracy"), ("test_loss", "test_loss"), ("train_seconds", "train_seconds"),
    ("input", None), ("compute", None), ("communication", None), ("bound", "bound"), ("peak_rss_mib", None),
]
FORMATS = {"examples_per_sec": "{:,.0f}", "steps_per_sec": "{:.1f}", "speedup": "{:.2f}", "efficiency": "{:.2f}",
           "test_accuracy": "{:.4f}", "test_loss": "{:.4f}", "train_seconds": "{:.1f}", "input": "{:.2f}",
           "compute": "{:.2f}", "communication": "{:.2f}", "peak_rss_mib": "{:,.0f}"}


@dataclass
class Job:
    """Where a run stands in a sweep: its number, and its overrides of the keys the sweep varies
    (e.g. ["cluster.workers=2"]). sweep_dir: for a job in a process of its own, where the jobs tell each
    other that the sweep was interrupted (sweep.SweepSummary). trial: the job's trial of an Optuna
    search (trial.Trial), which its launcher reports each epoch to and its pruner may stop."""
    num: int
    overrides: list = field(default_factory=list)
    sweep_dir: Path | None = None
    trial: object = None

    def stopped_by(self) -> int | None:
        """The signal that interrupted the sweep, as one of its jobs said, or None."""
        return stopped_by(self.sweep_dir) if self.sweep_dir else None

    def say_stopped(self, signum: int) -> None:
        if self.sweep_dir:
            say_stopped(self.sweep_dir, signum)

    @property
    def swept(self) -> str:
        return " ".join(self.overrides)

    @property
    def values(self) -> dict:
        """The swept values, {key: value}."""
        return dict(map(overrides.split, self.overrides))

    def __str__(self) -> str:
        return f"#{self.num}" + (f" ({self.swept})" if self.swept else "")


STOPPED = ".interrupted"  # in a sweep's directory: the signal that interrupted it, as its jobs say


def stopped_by(sweep_dir: Path) -> int | None:
    """The signal that interrupted the sweep in sweep_dir (its STOPPED file), or None."""
    try:
        return int((Path(sweep_dir) / STOPPED).read_text())
    except (OSError, ValueError):
        return None


def say_stopped(sweep_dir: Path, signum: int) -> None:
    """A job of the sweep was interrupted: the jobs not started yet, and those still running, stop too."""
    if stopped_by(sweep_dir) is None:
        record(write_atomic, Path(sweep_dir) / STOPPED, str(int(signum)))


def runs_jobs_apart(launcher_config) -> bool:
    """Whether this Hydra launcher runs the jobs in processes of their own on this machine, which share
    the terminal (and so Ctrl-C) with the sweep's process: joblib's, and submitit's local one."""
    target = str(launcher_config.get("_target_", ""))
    return target.endswith(("JoblibLauncher", "submitit_launcher.LocalLauncher"))


class SweepSummary(Callback):
    """Hydra callback (conf/config.yaml): when a multirun ends, summarise it; exit non-zero if a job failed,
    128 + the signal if the sweep was interrupted.

    Where the jobs run in processes of their own (joblib, submitit_local), Ctrl-C is the jobs' business:
    each stops its tasks (a checkpoint at the step under way), is recorded as interrupted and says so
    (STOPPED), and the jobs not started yet do not start. This process, and the launcher's own (joblib's
    workers between jobs, submitit's job controllers), ignore it: joblib would kill its workers mid-stop,
    and the controllers would print tracebacks. Then the summary is written as for any sweep."""
    sweep_dir = None  # of the multirun under way in this process: cli.main marks its jobs if interrupted

    def on_multirun_start(self, config, **kwargs) -> None:
        SweepSummary.sweep_dir = Path(config.hydra.sweep.dir)
        (SweepSummary.sweep_dir / STOPPED).unlink(missing_ok=True)  # a rerun sweep's, from its last run
        if runs_jobs_apart(config.hydra.launcher):  # (the processes the launcher starts inherit it)
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        _tracked_sweep(config)  # (before any job: each finds its parent in the sweep directory)

    def on_multirun_end(self, config, **kwargs) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        try:
            summary = summarize(sweep_dir)
        except OSError as exc:  # (Hydra would only warn of it)
            print_error(f"the sweep's summary cannot be written ({exc.strerror}: {exc.filename}): "
                        f"free space, then `distrain summarize {config.hydra.sweep.dir}`")
            sys.exit(1)
        if tracked := _tracked_sweep(config):
            tracked.finish()
        signum = stopped_by(sweep_dir)
        if signum:
            print(f"interrupted by {signal.Signals(signum).name}: every job stopped, each recorded (rerun the "
                  "same command with trainer.resume=auto to finish the sweep)", file=sys.stderr, flush=True)
            sys.exit(128 + signum)
        if summary is not None and summary.failed:
            sys.exit(1)  # after the summary is written: the sweep as a whole did not succeed


def _tracked_sweep(config):
    """logger=mlflow: the sweep's parent run (tracking.py), made at its start and found again at its end
    (the callback keeps nothing: Hydra's launchers copy it to their processes); else None."""
    if "mlflow" not in (config.get("logger") or {}):
        return None
    from distrain.common.errors import ConfigError
    from distrain.report import tracking

    plain = {k: OmegaConf.to_container(config[k], resolve=True) for k in ("logger", "data", "model")}
    try:
        params = config.hydra.sweeper.get("params")  # (an Optuna search's space)
        hydra = {"overrides": {"task": list(config.hydra.overrides.task)},
                 "sweeper": {"params": OmegaConf.to_container(params) if params else {}}}
        return tracking.start_sweep({**plain, "hydra": hydra}, Path(config.hydra.sweep.dir))
    except ConfigError as exc:
        print_error(exc)
        sys.exit(2)


class Summary:
    def __init__(self, sweep_dir: Path, rows: list, varying: list):
        self.sweep_dir, self.rows, self.varying = sweep_dir, rows, varying
        self.failed = [r for r in rows if r["status"] not in ("ok", "pruned")]  # (pruned: an Optuna search's)
        self.pruned = [r for r in rows if r["status"] == "pruned"]
        self.notes = scaling_notes(rows)


def summarize(sweep_dir: Path, out=None) -> Summary | None:
    """Write summary.csv, summary.md and scaling.png into sweep_dir and print the table (to out, else
    to sys.stdout as it is then)."""
    out = out or sys.stdout
    rows, varying = collect(sweep_dir)
    if not rows:
        print_error(f"no jobs found in {sweep_dir} (no run directory with .hydra/overrides.yaml or "
                    f"{STATUS}): give the directory a multirun made (multirun/DATE/TIME)")
        return None
    summary = Summary(sweep_dir, rows, varying)
    measured = [name for name, _ in MEASURES if name not in varying]  # (a swept `strategy` is a column once)
    metrics = list(dict.fromkeys(k for r in rows for k in r["metrics"] if k not in measured))  # test_mae, ...
    at = measured.index("test_loss") + 1
    columns = ["job", *varying, "status", "exit_status", *measured[:at], *metrics, *measured[at:], "run_dir", "error"]
    _write_csv(sweep_dir / "summary.csv", rows, columns)
    # The tables leave out columns no job has a value in (the CSV keeps every column).
    table = markdown(rows, [c for c in columns if any(r.get(c) not in ("", None) for r in rows)])
    text = [f"# Sweep {sweep_dir}", "", *summary.notes, "", table]
    optuna = _load_yaml(sweep_dir / "optimization_results.yaml")
    if optuna:
        text += ["", f"Optuna: best value {optuna.get('best_value')} with {optuna.get('best_params')} "
                     "(optimization_results.yaml)"]
    for row in summary.failed:
        text += ["", f"## Job {row['job']}: {row['status']}" + (f" (exit status {row['exit_status']})"
                                                               if row["exit_status"] not in ("", None) else ""),
                 "", row["error"] or "(no error line)", "", "```", *row["log_tail"], "```"]
    write_atomic(sweep_dir / "summary.md", "\n".join(text) + "\n")
    picture = plot(summary, sweep_dir / "scaling.png")
    sessions = log_dashboard(summary)
    pruned = f", {len(summary.pruned)} pruned" if summary.pruned else ""
    print("\n".join([f"Sweep summary ({len(rows)} job(s), {len(summary.failed)} not ok{pruned}): {sweep_dir}",
                     *summary.notes, table]), file=out)
    for row in summary.failed:
        said = (row["error"] or "").removeprefix(ERROR).strip()
        print(f"job {row['job']}: {row['status']}: {said or 'see ' + row['run_dir']}", file=out)
    print(f"written: summary.csv, summary.md{', ' + picture.name if picture else ''}", file=out, flush=True)
    if sessions:
        print(f"TensorBoard's HParams dashboard ({sessions} job(s)): tensorboard --logdir {sweep_dir}", file=out,
              flush=True)
    return summary


def log_dashboard(summary: Summary) -> int:
    """Where the jobs log for TensorBoard (trainer.tensorboard): each job's session again (a job killed
    before it wrote one, the speed-ups), and the sweep's experiment, the dashboard's columns. Sessions."""
    jobs = [(run, run.read_config(), row) for row in summary.rows
            for run in [RunDir(summary.sweep_dir / row["run_dir"])]]
    if not any(logs_for_tensorboard(config) for _, config, _ in jobs):
        return 0
    from distrain.report import dashboard  # (TensorBoard's protocol buffers: only for a sweep that logs for it)

    sessions = [dashboard.log_session(run, config or {}, {k: row[k] for k in summary.varying if row[k] != ""}, row)
                for run, config, row in jobs]
    dashboard.log_experiment(summary.sweep_dir, sessions)
    return len(sessions)


def mark_interrupted(sweep_dir: Path | None, why: str) -> None:
    """After Ctrl-C: a job still "running" in its status.json (its process was killed before it could
    say how it ended, as joblib kills its workers) was interrupted; so was its cluster."""
    for path in sweep_dir.glob(f"*/{STATUS}") if sweep_dir else ():
        RunDir(path.parent).mark_interrupted(why)


def collect(sweep_dir: Path) -> tuple[list, list]:
    """(rows, varying override keys): a row per job directory, in job order."""
    dirs = {p.parent.parent for p in sweep_dir.glob("**/.hydra/overrides.yaml")}
    dirs |= {p.parent for p in sweep_dir.glob(f"**/{STATUS}")}
    rows = sorted((_job_row(d, sweep_dir) for d in dirs),
                  key=lambda r: (r["job"] is None, r["job"] or 0, r["run_dir"]))
    keys = list(dict.fromkeys(k for r in rows for k in r["overrides"]))
    searched = {k for r in rows for k in r["searched"]}  # a preset's or Optuna's params, even if alike
    varying = [k for k in keys if k in searched or len({r["overrides"].get(k) for r in rows}) > 1]
    for row in rows:
        row.update({k: row["overrides"].get(k, "") for k in varying})
    add_speedups(rows)
    return rows, varying


def _job_row(job_dir: Path, sweep_dir: Path) -> dict:
    hydra_dir = job_dir / ".hydra"
    given = _load_yaml(hydra_dir / "overrides.yaml") or []
    hydra_cfg = (_load_yaml(hydra_dir / "hydra.yaml") or {}).get("hydra") or {}
    num = (hydra_cfg.get("job") or {}).get("num")
    if num is None:
        num = int(job_dir.name) if job_dir.name.isdigit() else None
    run = RunDir(job_dir)
    status, results = run.read_status(), run.read_results() or {}
    state = status.get("status")
    if state in (None, "running"):  # the job never finished (killed, or still running)
        state = "ok" if results else "incomplete"
    row = {"job": num, "overrides": dict(overrides.split(o) for o in given),
           "searched": list((hydra_cfg.get("sweeper") or {}).get("params") or {}),
           "status": state,
           "exit_status": status.get("exit_status", ""), "error": status.get("error", ""),
           "log_tail": status.get("log_tail", []), "run_dir": str(job_dir.relative_to(sweep_dir))}
    for name, key in MEASURES:
        row[name] = results.get(key, "") if key else ""
    row.update(results.get("time_split") or {})  # input, compute, communication: shares of the time
    peaks = results.get("peak_rss_mib") or {}
    row["peak_rss_mib"] = max(peaks.values()) if peaks else ""  # the largest task's
    sizes = results.get("membership") or []  # (a run resumed at other sizes: its workers from each step)
    row["resized"] = " ".join(f"{m['workers']}@{m['from_step']}" for m in sizes) if len(sizes) > 1 else ""
    rows = None if results.get("history") else run.read_metrics()  # (a pruned trial's: no results)
    row["metrics"] = {**test_numbers(results), **validation_numbers(results, rows)}
    row.update(row["metrics"])  # the test value of each metric the run measured, and its last validation's
    return row


def _load_yaml(path: Path):
    try:
        return yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return None


def add_speedups(rows: list) -> None:
    """Speed-up and efficiency against the sweep's smallest configuration of the same strategy, for
    the strategies whose replicas the sweep varies (left blank for the others)."""
    for runs in scaling_strategies(rows).values():
        base = min(runs, key=lambda r: r["replicas"])  # the first job of the fewest replicas
        for row in runs:
            row["speedup"] = row["examples_per_sec"] / base["examples_per_sec"]
            row["efficiency"] = row["speedup"] / (row["replicas"] / base["replicas"])


def scaling_strategies(rows: list) -> dict:
    """strategy -> its ok rows, for the strategies whose replicas vary across the sweep."""
    by_strategy = defaultdict(list)
    for row in rows:
        if row["status"] == "ok" and row["examples_per_sec"]:
            by_strategy[row["strategy"]].append(row)
    return {s: r for s, r in by_strategy.items() if len({x["replicas"] for x in r}) > 1}


def scaling_notes(rows: list) -> list:
    """One line per scaling strategy: weak (per-replica batch fixed) or strong (global batch fixed);
    one line for the whole sweep where only a mix of strategies varies the replicas."""
    scaling = scaling_strategies(rows)
    ok = [r for r in rows if r["status"] == "ok" and r["examples_per_sec"]]
    if not scaling and len({r["replicas"] for r in ok}) > 1:
        scaling = {"across strategies": ok}
    return [f"{name} over {'/'.join(str(n) for n in sorted({r['replicas'] for r in runs}))} replicas: "
            f"{_scaling_kind(runs)}" for name, runs in scaling.items()]


def _scaling_kind(runs: list) -> str:
    per_replica = {r["per_replica_batch"] for r in runs}
    global_batch = {r["global_batch"] for r in runs}
    if len(per_replica) == 1:
        return f"weak scaling (per-replica batch {per_replica.pop()} fixed, work grows with the replicas)"
    if len(global_batch) == 1:
        return f"strong scaling (global batch {global_batch.pop()} fixed, split over the replicas)"
    return "neither weak nor strong scaling (batch sizes vary otherwise): compare with care"


def plot(summary: Summary, path: Path) -> Path | None:
    """scaling.png: throughput and efficiency against replicas where they vary, else test accuracy and
    throughput against the (first) swept value."""
    ok = [r for r in summary.rows if r["status"] == "ok" and r["test_accuracy"] != ""]
    if not ok:
        return None
    from distrain.report import plots  # matplotlib: only once there is something to draw

    scaling = scaling_strategies(ok)
    if scaling:
        return plots.scaling([r for runs in scaling.values() for r in runs], path, "; ".join(summary.notes))
    swept = [k for k in summary.varying if len({r[k] for r in ok}) > 1] or ["job"]
    return plots.by_value(ok, swept[0], path, series_keys=swept[1:])


def markdown(rows: list, columns: list) -> str:
    def cell(row, column):
        value = row.get(column, "")
        if value in ("", None):
            return ""
        if column in FORMATS:
            return FORMATS[column].format(value)
        return f"{value:.4g}" if column.startswith(("test_", "val_")) and isinstance(value, float) else \
            str(value).replace("|", "\\|")

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r, c) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def _write_csv(path: Path, rows: list, columns: list) -> None:
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=[*columns, "log_tail"], extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        writer.writerow({**row, "log_tail": "\n".join(row["log_tail"])})
    write_atomic(path, text.getvalue())


def swept(hydra_config) -> list:
    """This job's overrides of the keys its sweep varies, e.g. ["cluster.workers=2"] (all of its overrides
    where that cannot be told): the sweeper's params, and the sweep overrides the basic sweeper saved."""
    keys = set((hydra_config.sweeper.get("params") or {}).keys())
    sweep_dir = Path(hydra_config.sweep.dir)
    master = ((_load_yaml(sweep_dir / "multirun.yaml") or {}).get("hydra") or {}).get("overrides", {}).get("task")
    keys |= overrides.swept_keys(master or [])
    mine = list(hydra_config.overrides.task)
    return [o for o in mine if overrides.split(o)[0] in keys] or mine


def main(argv: list) -> int:
    """`distrain summarize DIR`: (re)build the summary of a sweep directory, finished or not."""
    if len(argv) != 1 or argv[0] in ("-h", "--help"):
        print("usage: distrain summarize SWEEP_DIR   (e.g. multirun/2026-01-01/12-00-00)", file=sys.stderr)
        return 2
    sweep_dir = Path(argv[0])
    if not sweep_dir.is_dir():
        print_error(f"{sweep_dir} is not a directory: give the sweep directory a multirun made "
                    "(multirun/DATE/TIME)")
        return 2
    run = RunDir(sweep_dir)
    if run.config.exists():  # (a run's own directory: there is no sweep to sum up)
        told = f"its figures are in {run.results}" if run.results.exists() else f"how it ended is in {run.status}"
        print_error(f"{sweep_dir} is a run's directory, not a sweep's: give the sweep directory a multirun made "
                    f"(multirun/DATE/TIME); {told}")
        return 2
    summary = summarize(sweep_dir)
    if summary is None:
        return 2
    return 0
