"""A sweep's job as a trial of the Optuna search (hparams_search=optuna, whose sweeper is
hydra_plugins/distrain_optuna_sweeper): where the study is kept, and, in the job's launcher (the chief's,
as MLflow's tracker: no task needs Optuna), each epoch's objective reported to the trial as metrics.csv
gains it, and the study's pruner asked whether the trial goes on. A pruned trial's run stops as a
preempted one does (supervisor.py): its tasks checkpoint and exit.

Runs in the sweeper's process and in each job's launcher. Costs: Optuna's import (0.2 s) in a job's
launcher; a look at metrics.csv's time 20 times a second, and a read and a write of the study per epoch.
"""
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from distrain.common import storage
from distrain.common.rundir import RunDir

log = logging.getLogger("distrain")

JOURNAL = "optuna.journal"  # the study's storage in the sweep directory, where none is given
STUDY = "distrain"  # the study's name, where none is given
FOLLOW_SECONDS = 0.05  # (a look at metrics.csv: a stat, or a read of a few rows)
ANY_EPOCH = 2 ** 31  # a verdict that lets every epoch go on
SWEEPER = "hydra_plugins.distrain_optuna_sweeper.optuna_sweeper.OptunaSweeper"


def study_storage(given, sweep_dir):
    """The study's storage: hydra.sweeper.storage, a database URL (sqlite:///optuna.db) or a journal
    file's path; null: a journal file in the sweep directory. A journal file is Optuna's storage for
    several processes on one machine's files (file locks, no server), which the sweeper and its jobs'
    launchers all open."""
    import optuna
    from optuna.storages.journal import JournalFileBackend

    if given and "://" in str(given):
        return str(given)
    path = Path(str(given)) if given else Path(sweep_dir) / JOURNAL
    path.parent.mkdir(parents=True, exist_ok=True)
    return optuna.storages.JournalStorage(JournalFileBackend(str(path.absolute())))


def at_once(n_jobs, launcher) -> int:
    """Trials run at once: hydra.sweeper.n_jobs, else joblib's hydra.launcher.n_jobs (-1: as many as
    cores, -2 all but one, as joblib counts), else 1. (The sweeper makes joblib's follow its own.)"""
    given = n_jobs if n_jobs is not None else (launcher or {}).get("n_jobs", 1)
    if isinstance(given, int) and given < 0 and "n_jobs" in (launcher or {}):
        given = max(1, len(os.sched_getaffinity(0)) + 1 + given)
    return given


def share(n_jobs, launcher, split: bool) -> int:
    """The cores each of the trials run at once on this machine takes (joblib's, submitit_local's jobs:
    sweep.runs_jobs_apart), its tasks pinned there and TensorFlow's threads sized to them; 0: all of
    them, shared (one trial at once, split off, or fewer cores than trials)."""
    from distrain.report.sweep import runs_jobs_apart

    slots = at_once(n_jobs, launcher)
    if not split or slots < 2 or not runs_jobs_apart(launcher or {}):
        return 0
    return len(os.sched_getaffinity(0)) // slots


def where(given, sweep_dir) -> str:
    """The storage in words, for the study's first line and the advice to go on with it."""
    return str(given) if given else str(Path(sweep_dir) / JOURNAL)


@dataclass
class Pruned:
    """What a pruned trial's job returns to the sweeper (a job returns, never raises: cli.JobFailed)."""
    epoch: int
    why: str

    def __str__(self) -> str:
        return self.why


class Trial:
    """The Optuna trial a job of the search runs, as its launcher reports to it: the study's `storage`
    and `study_name`, the trial's `number` (the job's: the sweeper launches trial N as job N), and the
    `pruner` node (None: epochs are reported, for the study's plots, and nothing is pruned)."""

    def __init__(self, storage_given, sweep_dir, study_name: str, number: int, pruner=None, cores: int = 0):
        self.storage_given, self.sweep_dir, self.study_name = storage_given, sweep_dir, study_name
        self.number, self.pruner, self.cores = number, pruner, cores  # cores: its share (0: all, shared)
        self.pruned: str | None = None  # why the pruner stopped it, once it has
        self.pruned_at = 0
        self._stop, self._thread, self._trial, self._reported, self._judged, self._seen = \
            threading.Event(), None, None, 0, 0, None
        self.verdicts: Path | None = None

    @classmethod
    def of(cls, hydra_cfg) -> "Trial | None":
        """The trial of this job (Hydra's config of a job), where the search is the project's Optuna search."""
        sweeper = hydra_cfg.sweeper
        if sweeper.get("_target_") != SWEEPER:
            return None
        return cls(sweeper.get("storage"), hydra_cfg.sweep.dir, sweeper.get("study_name") or STUDY, hydra_cfg.job.num,
                   sweeper.get("pruner"), share(sweeper.get("n_jobs"), hydra_cfg.launcher, sweeper.get("split_cores")))

    def _open(self):
        import optuna
        from hydra.utils import instantiate

        pruner = instantiate(self.pruner) if self.pruner else optuna.pruners.NopPruner()
        found = optuna.storages.get_storage(study_storage(self.storage_given, self.sweep_dir))
        study = optuna.load_study(study_name=self.study_name, storage=found, pruner=pruner)
        trial_id = found.get_trial_id_from_study_id_trial_number(found.get_study_id_from_name(self.study_name),
                                                                 self.number)
        self._reported = max(found.get_trial(trial_id).intermediate_values, default=-1) + 1  # (a restarted job's)
        return optuna.trial.Trial(study, trial_id)

    def follow(self, run: RunDir, objective: str, verdicts: Path | None = None) -> None:
        """Report each epoch's `objective` (a figure of metrics.csv's rows) as the run's chief writes it,
        in a thread, until finish(); after each, ask the pruner, and write the last epoch let go on in
        `verdicts`, which the chief waits for (a pruned one it is not told: it is stopped)."""
        self.verdicts = verdicts

        def loop():
            try:
                self._trial = self._open()
                while not self._stop.wait(FOLLOW_SECONDS) and not self.pruned:
                    self.look(run, objective)
            except Exception as exc:  # noqa: BLE001 - the study's storage failing never fails the training
                log.warning("optuna: trial %d cannot report to its study (%s): it runs to its end", self.number, exc)
                if self.verdicts:  # (every epoch let go on: the chief waits no more)
                    storage.write_atomic(self.verdicts, str(ANY_EPOCH))
        self._thread = threading.Thread(target=loop, name="optuna", daemon=True)
        self._thread.start()

    def look(self, run: RunDir, objective: str, prune: bool = True) -> None:
        try:
            changed = run.metrics.stat().st_mtime_ns
        except FileNotFoundError:
            return
        rows = (run.read_metrics() or []) if changed != self._seen else []
        self._seen = changed
        if not rows or rows[-1]["epoch"] <= self._judged:
            return
        for row in rows:
            value = row.get(objective)
            if row["epoch"] <= self._reported or value is None:
                continue
            self._trial.report(float(value), row["epoch"] - 1)  # (the step: the epoch from 0, as Optuna's Keras)
            self._reported = row["epoch"]
            if prune and self.pruner and self._trial.should_prune():
                self.pruned_at = row["epoch"]
                self.pruned = f"pruned at epoch {row['epoch']} ({objective} {float(value):.4g})"
                log.info("trial %d: %s: its tasks checkpoint and stop", self.number, self.pruned)
                return
        self._judged = rows[-1]["epoch"]
        if self.verdicts:
            storage.write_atomic(self.verdicts, str(self._judged))

    def finish(self, run: RunDir, objective: str) -> None:
        """After the run: the epochs not reported yet (a run shorter than one look), not pruned."""
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=30)
        if self._trial is not None and not self.pruned:
            try:
                self.look(run, objective, prune=False)
            except Exception as exc:  # noqa: BLE001 - as in follow()
                log.warning("optuna: trial %d cannot report to its study (%s)", self.number, exc)
