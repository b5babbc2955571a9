"""Launches a run: checks its config, settles its data, and starts its task processes (supervisor.py
watches them): one training process, or the cluster's (cluster_tasks.py: every task of a local cluster,
or this machine's task of a real one). A local cluster that restarts resumes from its latest checkpoint.

The launcher never imports TensorFlow: logical devices and started servers cannot be undone inside
a process, so each run (and, on a cluster, each task) gets a fresh one.
"""
import contextlib
import logging
import os
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf

from distrain.common import cluster as cluster_lib
from distrain.common import cpu, placement, storage
from distrain.common.errors import ConfigError, fail
from distrain.common.messages import SCRATCH, STARTED, VERDICT, error_line
from distrain.common.rundir import RunDir
from distrain.common.topology import Topology
from distrain.config import schema
from distrain.config.overrides import split
from distrain.config.validate import check_objective, check_same_run, resumed, validate
from distrain.data import arrays
from distrain.launcher import callbacks, cluster_tasks, forkserver
from distrain.launcher.supervisor import Outcome, TaskProcess, run_tasks
from distrain.report import tracking
from distrain.report.results import cpu_line, logs_for_tensorboard, memory_line, short_line
from distrain.report.sweep import Job

log = logging.getLogger("distrain")


def launch(cfg, run_dir: Path, job: Job | None = None, overrides=()) -> int:
    """Check the config, settle the data source, record the config, run the task(s). Exit status.

    `job` is set when the run is one job of a sweep: its lines carry the job number, and the resolved
    config goes to launcher.log only. `overrides` (this command's) matter to a resumed run."""
    run = RunDir(run_dir)
    if cfg.trainer.resume == "auto" and run.ended() == "ok":
        return _keep(cfg, run, job, overrides)
    before = Before(callbacks.found_before(run), run.latest_checkpoint())  # a run's here: a refusal leaves it so
    signum = job.stopped_by() if job else None
    if signum:  # the sweep was interrupted before this job started: it does not
        run.write_status("interrupted", 128 + signum, f"not started: the sweep was interrupted by "
                         f"{signal.Signals(signum).name}", job=job)
        return 128 + signum
    if job:  # a job's start-up is timed from its own start (results.json: seconds_to_first_step)
        os.environ[STARTED] = str(time.time())
        # Before anything can interrupt it: a sweep's process that is killed before it records how its
        # job ended (joblib's workers, on Ctrl-C) leaves this, which the sweep then marks interrupted.
        run.write_status("running", None, job=job)
    config = None  # the config.yaml written, as plain values
    try:
        cfg, found, why = _settled(cfg, run_dir, job, overrides)
        topology = Topology.of(cfg)
        spec, task = placement.this_task(cfg.cluster, cfg.strategy.name, schema.service_workers(cfg.data)) \
            if not topology.local else (None, None)
        run = RunDir(run_dir, cfg)
        _write_config(cfg, run, found)
        config = OmegaConf.to_container(cfg, resolve=True)
        tracked = _tracked(config, run, job, spec, task)
    except ConfigError as exc:
        return _finish(Outcome(fail(exc), "failed", error_line(exc)), run, config, job, before=before)
    log.info("data: %s from source %s (%s)", schema.label(cfg.data), cfg.data.source, found.how if found else why)
    (logging.getLogger("distrain.config") if job else log).info(
        "config (also in %s):\n%s", run.config, OmegaConf.to_yaml(cfg, resolve=True))
    argv = [sys.executable, "-m", "distrain.task", str(run.config)]

    # (read by TensorFlow as each task starts; the trial's, by the chief at each epoch's end)
    with environment(cpu.onednn_env(cfg.trainer.onednn)), scratch_dir() as scratch, \
            environment(_followed(job, run, cfg, spec, task, Path(scratch))), _share(job, spec) as cores:
        if not topology.clustered and not schema.service_workers(cfg.data):
            # (forked from this process's server: the next run starts sooner)
            forks = forkserver.shared(run.log("forkserver"))
            outcome = run_tasks([TaskProcess("train", argv, cluster_lib.thread_caps("worker", 1, cores=len(cores))
                                             if cores else {}, cores=cores, forks=forks)], run, job=job,
                                stop=_stop(job, tracked))
        elif topology.local:  # (and a lone trainer beside its data service)
            outcome = cluster_tasks.run_local(cfg, run, argv, job, evaluator=cfg.cluster.evaluator, share=cores,
                                              restarted=lambda cfg, restarts: _resuming(cfg, run, restarts.workers),
                                              stop=_stop(job, tracked))
        else:  # One task of a cluster spread over machines: this process plays the part TF_CONFIG gives it.
            outcome = cluster_tasks.run_this_task(cfg, run, argv, spec, task, job)
    return _finish(outcome, run, config, job, overrides, tracked, before)


@dataclass
class Before:
    """The run a command found in its directory: its files (RunDir.snapshot; None: no run there) and its
    latest checkpoint."""
    files: dict | None
    checkpoint: str | None

    def refused(self, outcome: Outcome, run: RunDir) -> bool:
        """The command was refused there (bad input, said in its one line, by the launcher or by a task
        before it trained a step): what it changed is put back, as snapshot() found it."""
        if self.files is None or outcome.status != "failed" or outcome.code != 2 or \
                run.latest_checkpoint() != self.checkpoint:
            return False
        run.restore(self.files)
        return True


def _tracked(config: dict, run: RunDir, job: Job | None, spec: dict | None, task):
    """The run's MLflow run (logger=mlflow), logged by the launcher of its chief alone; else None."""
    if not tracking.wanted(config) or (task is not None and task.name != cluster_lib.chief_of(spec)):
        return None
    return tracking.start(config, run, job)


def _stop(job: Job | None, tracked):
    """How the run ends before its tasks do (supervisor.run_tasks asks at each look): its MLflow store
    cannot be used (bad input, said in one line), or the Optuna search's pruner stopped its trial (its
    tasks stop as on preemption); else None."""
    def stop() -> Outcome | None:
        if tracked and tracked.refused:
            return Outcome(tracked.say_refused(), "failed", error_line(tracked.refused))
        why = job.trial.pruned if job and job.trial else None
        return Outcome(0, "pruned", why) if why else None
    return stop


def _followed(job: Job | None, run: RunDir, cfg, spec, task, scratch: Path) -> dict:
    """An Optuna search's trial (trial.py) hears of each epoch the run's chief ends, from its launcher;
    with a pruner, every training task waits for each epoch's verdict (VERDICT: the file the launcher
    writes it in). A cluster across machines, whose tasks cannot read that file: reported, not pruned."""
    if not (job and job.trial) or (spec and task.name != cluster_lib.chief_of(spec)):
        return {}
    if spec and job.trial.pruner:
        log.warning("trial %d: its tasks run on several machines, which cannot wait for a pruner's verdict: its "
                    "epochs are reported to the study, and it is not pruned", job.num)
        job.trial.pruner = None
    verdicts = scratch / "verdict" if job.trial.pruner else None
    job.trial.follow(run, cfg.trainer.objective, verdicts)
    return {VERDICT: str(verdicts)} if verdicts else {}


@contextlib.contextmanager
def _share(job: Job | None, spec):
    """The cores of this machine a trial run beside others takes (trial.share: its tasks pinned there,
    TensorFlow's threads sized to them), locked from the other trials' for the run; else None: all."""
    wanted = job.trial.cores if job and job.trial and not spec else 0
    with cluster_lib.CoreLocks(wanted) as locked:
        if wanted:
            log.info("trial %d: cores %s, its share of this machine's %d%s", job.num, locked.cores,
                     len(locked.all), f" ({locked.shared})" if locked.shared else "")
        yield set(locked.cores) if wanted else None


def _settled(cfg, run_dir: Path, job: Job | None, overrides) -> tuple:
    """(The config checked, a resume's taken from its run, with its data source settled; the data files
    found where they are on this machine, else None; why this source)."""
    cfg = validate(cfg)
    if job:
        check_objective(cfg, per_epoch=bool(job.trial and job.trial.pruner))
    if job and job.trial and not {"csv", "mlflow"} & set(cfg.logger):  # its epochs, which the trial reports
        cfg = OmegaConf.merge(cfg, {"logger": {"csv": {}}})
    if cfg.trainer.resume:
        auto = cfg.trainer.resume == "auto"
        cfg = validate(resumed(cfg, run_dir, list(overrides)))
        if cfg.trainer.resume:
            log.info("resuming the run in %s", run_dir)
        elif auto:
            log.info("trainer.resume=auto: no checkpoint in %s yet, so the run starts from the beginning",
                     RunDir(run_dir, cfg).checkpoints)
    if "tensorboard" not in cfg.logger:  # (logger=mlflow alone, say)
        cfg = OmegaConf.merge(cfg, {"trainer": {"tensorboard": False}})
    elif cfg.trainer.tensorboard == "auto":  # a sweep's dashboard; a single run's only if asked for
        cfg = OmegaConf.merge(cfg, {"trainer": {"tensorboard": job is not None}})
    why = arrays.settle_source(cfg)
    # (a ps task elsewhere needs no data; a task elsewhere scans its files itself)
    reads = schema.labels_read(cfg.loss, cfg.data)
    found = arrays.check_files(cfg.data, cfg.trainer.seed, reads) if Topology.of(cfg).local else None
    return cfg, found, why


@contextlib.contextmanager
def environment(values: dict):
    """These variables in os.environ, which every task (and the fork server) inherits, for one run;
    as they were after it (the next job of a sweep may choose otherwise)."""
    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextlib.contextmanager
def scratch_dir():
    """A directory for the tasks' temporary files (process.scratch(), and TMPDIR: TensorFlow's autograph
    leaves a file there for each function it converts, which a task's quick exit does not remove),
    removed when the run ends, even if a task was killed. (This process's tempfile keeps its own
    directory: it read TMPDIR before, for this one.)"""
    with tempfile.TemporaryDirectory(prefix="distrain-scratch-") as path, environment({SCRATCH: path, "TMPDIR": path}):
        yield path


def _keep(cfg, run: RunDir, job: Job | None, overrides) -> int:
    """trainer.resume=auto where the run ended ok: nothing to do (a rerun sweep's finished job), but to
    say so; nothing is written there. The same run only: another's is refused in one line."""
    try:
        check_same_run(cfg, OmegaConf.load(run.config), run.config, list(overrides))
    except ConfigError as exc:
        return fail(exc)
    results = run.read_results()
    log.info("%s: kept (ok%s)%s", f"job {job}" if job else f"the run in {run}",
             f" - {short_line(results)}" if results else "",
             "" if job else "; trainer.resume=true with more trainer.epochs trains it further")
    return 0


def _write_config(cfg, run: RunDir, found=None) -> None:
    """The resolved config, which every task reads (written whole, though every task of a real cluster
    writes it), and what was found of data in files (files.FileData), which the tasks stream without
    scanning the files again; a full disk is a ConfigError saying so."""
    try:
        run.write_config(OmegaConf.to_yaml(cfg, resolve=True))
        if found:
            run.write_data(found.to_json())
    except OSError as exc:
        if (full := storage.full_disk(exc, run.path, run.kept_checkpoints)) is None:
            raise
        raise full from exc


def _resuming(cfg, run: RunDir, workers: int):
    """The config for a restarted cluster: resume from the latest checkpoint if there is one, with
    `workers` (fewer, where one was lost for good: cluster.min_workers)."""
    if workers and workers != cfg.cluster.workers:
        cfg = OmegaConf.merge(cfg, {"cluster": {"workers": workers}})
    if not run.has_checkpoint():
        log.warning("no checkpoint yet in %s: the cluster starts from the beginning", run.checkpoints)
    else:
        cfg = OmegaConf.merge(cfg, {"trainer": {"resume": True}})
    _write_config(cfg, run)  # what the restarted tasks read
    return cfg


def _finish(outcome: Outcome, run: RunDir, config: dict | None, job: Job | None, overrides=(), tracked=None,
            before: Before | None = None) -> int:
    """Record how the run ended in status.json (run_tasks wrote it already, before stopping the tasks;
    not so a run refused before it started) and as a TensorBoard session, draw a finished run's
    curves.png, say it in one line. config: the config.yaml written (None: the run was refused, and
    said why); `before`: a run already in the directory, which a refused command leaves as it was;
    `overrides`: a single run's, its hyperparameters in TensorBoard."""
    if tracked:  # (made beside the tasks: nothing of it is written after this)
        tracked.wait()
    if before and before.refused(outcome, run):
        if tracked and tracked.tracked:
            tracked.tracked.put_back()
        return outcome.code  # (its one line said why)
    run.write_status(outcome.status, outcome.code, outcome.error, outcome.log_tail, job)
    if logs_for_tensorboard(config):
        # (TensorBoard's protocol buffers, 0.1 s: only for a run that logs for it)
        from distrain.report import dashboard

        swept = job.values if job else dict(split(o) for o in overrides if not o.startswith(("hydra", "~")))
        storage.record(dashboard.log_session, run, config, swept)
    results = run.read_results() if outcome.status == "ok" else None
    # (the tasks' peaks and CPU time: known here once they have ended)
    ended = {k: v for k, v in (("peak_rss_mib", outcome.peak_rss_mib), ("task_cpu_seconds", outcome.cpu_seconds)) if v}
    if results and ended:
        results |= ended
        run.add_to_results(ended)
    if outcome.peak_rss_mib and not job:
        log.info("peak resident memory: %s", memory_line(outcome.peak_rss_mib))
    if any(name.startswith(cluster_lib.SERVICE_TYPES) for name in outcome.cpu_seconds) and not job:
        log.info("CPU time: %s", cpu_line(outcome.cpu_seconds))  # (what the data service took, beside the trainers)
    if results:
        try:
            from distrain.report import plots  # matplotlib: only once there is something to draw
            plots.curves(results, run / "curves.png")
        except Exception as exc:  # noqa: BLE001 - a plot that fails must not fail a finished run
            log.warning("curves.png not drawn: %s", exc)
    if job and job.trial and config:
        job.trial.finish(run, config["trainer"]["objective"])
    if tracked:  # (after results.json's last facts and curves.png)
        tracked.finish()
        if tracked.refused and not outcome.code:  # (bad input found after the tasks ended: said, the run kept)
            return 2
    if job:
        if outcome.status in ("ok", "pruned"):
            log.info("job %s: %s%s", job, outcome.status, f" - {short_line(results)}" if results else
                     f" - {outcome.error}" if outcome.error else "")
        else:
            log.error("job %s: %s (exit status %d)%s", job, outcome.status, outcome.code,
                      f" - {outcome.error}" if outcome.error else "")
    elif outcome.code and config is not None and run.logs.exists():  # (one refused said why already)
        # The last line a user reads: what ended the run, where bad input's own line has not said it.
        cause = f": {outcome.error}" if outcome.status == "failed" and outcome.code != 2 and outcome.error else ""
        log.error("the run %s%s (exit status %d); logs in %s",
                  "was interrupted" if outcome.status == "interrupted" else "failed", cause, outcome.code, run.logs)
    return outcome.code
