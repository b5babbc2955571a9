"""Launches a run: checks its config, settles its data, and starts its task processes (supervisor.py
watches them): one training process, or every task of a local cluster, or this machine's task of a
real one. Restarts a local cluster from its latest checkpoint when the supervisor says so.

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
from pathlib import Path

import portpicker
from omegaconf import OmegaConf

from distrain.common import cluster as cluster_lib
from distrain.common import cpu, storage
from distrain.common.errors import ConfigError, fail, print_error
from distrain.common.messages import RESTARTS_CLUSTER, SCRATCH, STARTED, error_line
from distrain.common.rundir import RunDir
from distrain.common.topology import Topology
from distrain.config import schema
from distrain.config.validate import check_objective, check_same_run, resumed, validate
from distrain.data import arrays as data
from distrain.launcher import forkserver
from distrain.launcher.restarts import Restarts
from distrain.launcher.supervisor import Outcome, TaskProcess, run_tasks
from distrain.report import results as report
from distrain.report import tracking
from distrain.report.sweep import Job, split_override

log = logging.getLogger("distrain")


def launch(cfg, run_dir: Path, job: Job | None = None, overrides=()) -> int:
    """Check the config, settle the data source, record the config, run the task(s). Exit status.

    `job` is set when the run is one job of a sweep: its lines carry the job number, and the resolved
    config goes to launcher.log only. `overrides` (this command's) matter to a resumed run."""
    run = RunDir(run_dir)
    if cfg.trainer.resume == "auto" and run.ended() == "ok":
        return _keep(cfg, run, job, overrides)
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
        spec, task = cluster_lib.this_task(cfg.cluster, cfg.strategy.name) if not topology.local else (None, None)
        run = RunDir(run_dir, cfg)
        _write_config(cfg, run, found)
        config = OmegaConf.to_container(cfg, resolve=True)
        tracked = _tracked(config, run, job, spec, task)
    except ConfigError as exc:
        return _finish(Outcome(fail(exc), "failed", error_line(exc)), run, config, job)
    log.info("data: %s from source %s (%s)", schema.label(cfg.data), cfg.data.source, found.how if found else why)
    (logging.getLogger("distrain.config") if job else log).info(
        "config (also in %s):\n%s", run.config, OmegaConf.to_yaml(cfg, resolve=True))
    argv = [sys.executable, "-m", "distrain.task", str(run.config)]

    with environment(cpu.onednn_env(cfg.trainer.onednn)), scratch_dir():  # (read by TensorFlow as each task starts)
        if not topology.clustered:  # (forked from this process's server: the next run starts sooner)
            forks = forkserver.shared(run.log("forkserver"))
            outcome = run_tasks([TaskProcess("train", argv, forks=forks)], run, job=job)
        elif topology.local:
            outcome = run_local_cluster(cfg, run, argv, job)
        else:  # One task of a cluster spread over machines: this process plays the part TF_CONFIG gives it.
            log.info("this process is task %s:%d of %s", task.type, task.index, spec)
            env = {**cluster_lib.task_env(spec, task),
                   **(cluster_lib.slurm_gpus() if cfg.cluster.name == "slurm" else {})}
            outcome = run_tasks([TaskProcess(task.name, argv, env, task=task, cluster=spec,
                                             peer_timeout=coordinator_timeout(cfg, task.type),
                                             stall_after=cfg.cluster.peer_timeout / 2)], run,
                                startup_timeout=cfg.cluster.startup_timeout, job=job, probe_peers=True)
    return _finish(outcome, run, config, job, overrides, tracked)


def _tracked(config: dict, run: RunDir, job: Job | None, spec: dict | None, task):
    """The run's MLflow run (logger=mlflow), logged by the launcher of its chief alone; else None."""
    if not tracking.wanted(config) or (task is not None and task.name != cluster_lib.chief_of(spec)):
        return None
    return tracking.start(config, run, job)


def _settled(cfg, run_dir: Path, job: Job | None, overrides) -> tuple:
    """(The config checked, a resume's taken from its run, with its data source settled; the data files
    found where they are on this machine, else None; why this source)."""
    cfg = validate(cfg)
    if job:
        check_objective(cfg)
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
    source, why = data.resolve_source(cfg.data)
    cfg = OmegaConf.merge(cfg, {"data": {"source": source}})
    # (a ps task elsewhere needs no data; a task elsewhere scans its files itself)
    reads = schema.labels_read(cfg.loss, cfg.data)
    found = data.check_files(cfg.data, cfg.trainer.seed, reads) if Topology.of(cfg).local else None
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


def run_local_cluster(cfg, run: RunDir, argv: list, job: Job | None = None) -> Outcome:
    """Every task of the cluster as a process on this machine, inside a private network if possible.

    An essential task that dies restarts the whole cluster, which resumes from its latest checkpoint
    (every synchronous worker needs every other; the ps tasks hold the only copy of the variables); a
    parameter-server worker is restarted alone. Up to cluster.max_restarts restarts in all."""
    c, strategy = cfg.cluster, cfg.strategy.name
    per_worker = int(cluster_lib.thread_caps("worker", c.workers, c.threads_per_worker)["TF_NUM_INTRAOP_THREADS"])
    synchronous = Topology.of(cfg).synchronous
    restarts = Restarts(c.max_restarts, c.restart_window, workers=c.workers if synchronous else 0,
                        min_workers=c.get("min_workers"), batch=schema.update_batch(cfg.trainer))
    peaks = {}
    net = cluster_lib.PrivateNetwork.shared(enabled=c.isolate is not False)  # (kept for this process's next run)
    with cluster_lib.CoreLocks(c.workers * per_worker if c.pin_workers else 0) as cores:
        if not net.available:
            if c.isolate is True:
                error = (f"cluster.isolate=true but no private network is possible here ({net.reason}): "
                         "set cluster.isolate=auto to run without one")
                print_error(error)
                return Outcome(2, "failed", error_line(error))
            log.warning("the cluster's servers are NOT isolated (%s): TensorFlow listens on every interface, "
                        "so anyone who can reach this machine can reach them; use a trusted network",
                        net.reason)
        if cores.shared:
            log.warning("cluster.pin_workers: %s", cores.shared)
        network = "private network namespace" if net.available else f"host network, not isolated ({net.reason})"
        # Started only now, so that a run refused above imports nothing; kept for this process's next run.
        forks = forkserver.shared(run.log("forkserver"), net.wrap)
        while True:
            spec, tasks = _cluster_tasks(cfg, argv, net, cores.cores, per_worker, forks)
            for task in tasks:  # after a restart of the cluster, each task's log goes on
                task.restarts = restarts.per_task[task.name]
                # A task that loses a peer says so as news, not as an error, when the launcher restarts the cluster.
                task.env[RESTARTS_CLUSTER] = str(int(restarts.may_restart_cluster() or restarts.may_shrink()))
            log.info("local cluster (%s): %s", network, ", ".join(f"{t.name}={t.task.address}" for t in tasks))

            def write_cluster_json(status: str, spec=spec, tasks=tasks):  # (this attempt's)
                state = {"strategy": strategy, "network": network, "status": status, "cluster": spec,
                         "restarts": restarts.done, "tasks": [t.describe() for t in tasks if t.proc]}
                run.write_cluster(state)

            outcome = run_tasks(tasks, run, startup_timeout=c.startup_timeout, on_change=write_cluster_json,
                                job=job, restarts=restarts)
            # (each task's peak over the cluster's restarts too)
            peaks = outcome.peak_rss_mib = {name: max(peak, peaks.get(name, 0.0))
                                            for name, peak in outcome.peak_rss_mib.items()}
            if not outcome.restart:
                _record_restarts(run, restarts)
                return outcome
            try:
                cfg = _resuming(cfg, run, restarts.workers)
            except ConfigError as exc:  # (a full disk)
                return Outcome(fail(exc), "failed", error_line(exc))


def _cluster_tasks(cfg, argv: list, net, cores: list, per_worker: int, forks) -> tuple[dict, list]:
    """The cluster spec (ports picked free) and a TaskProcess for each of its tasks."""
    c, topology = cfg.cluster, Topology.of(cfg)
    spec = cluster_lib.local_spec(cfg.strategy.name, c.workers, c.ps)
    tasks = []
    for task_type, addresses in spec.items():
        for index, address in enumerate(addresses):
            task = cluster_lib.Task(task_type, index, address)
            # The chief coordinates parameter servers and needs few threads; workers share the cores.
            env = {**cluster_lib.task_env(spec, task),
                   **cluster_lib.thread_caps(task_type, c.workers, c.threads_per_worker)}
            serves = topology.parameter_servers and task_type != "chief"
            pinned = cluster_lib.worker_cores(index, per_worker, cores) \
                if c.pin_workers and task_type == "worker" else None
            tasks.append(TaskProcess(task.name, net.wrap(argv), env, main=not serves,
                                     alone=serves and task_type == "worker", quiet=topology.synchronous and index > 0,
                                     task=task, cores=pinned, peer_timeout=coordinator_timeout(cfg, task_type),
                                     stall_after=0 if serves else c.peer_timeout / 2, forks=forks))
    if c.evaluator:  # known to itself but not to the training tasks: strategies need not wait for it
        evaluator = cluster_lib.Task("evaluator", 0, f"127.0.0.1:{portpicker.pick_unused_port()}")
        env = {**cluster_lib.task_env({**spec, "evaluator": [evaluator.address]}, evaluator),
               **cluster_lib.thread_caps("evaluator", c.workers)}
        tasks.append(TaskProcess(evaluator.name, net.wrap(argv), env, essential=False, task=evaluator, forks=forks))
    return spec, tasks


def coordinator_timeout(cfg, task_type: str) -> float:
    """The parameter-server chief keeps a heartbeat, which must not stop for cluster.peer_timeout."""
    return cfg.cluster.peer_timeout if Topology.of(cfg).parameter_servers and task_type == "chief" else 0


def _keep(cfg, run: RunDir, job: Job | None, overrides) -> int:
    """trainer.resume=auto where the run ended ok: nothing to do (a rerun sweep's finished job), but to
    say so; nothing is written there. The same run only: another's is refused in one line."""
    try:
        check_same_run(cfg, OmegaConf.load(run.config), run.config, list(overrides))
    except ConfigError as exc:
        return fail(exc)
    results = run.read_results()
    log.info("%s: kept (ok%s)%s", f"job {job}" if job else f"the run in {run}",
             f" - {report.short_line(results)}" if results else "",
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


def _record_restarts(run: RunDir, restarts: Restarts) -> None:
    """The launcher's restarts, added to the chief's results.json, with the workers that left the run
    (parameter servers) and so the number there were at its end."""
    results = run.read_results()
    if results is not None and restarts.done:
        gone = restarts.gone()
        run.add_to_results({"task_restarts": restarts.done, "workers_left_the_run": gone,
                            "final_num_workers": results["num_workers"] - len(gone)})


def _finish(outcome: Outcome, run: RunDir, config: dict | None, job: Job | None, overrides=(), tracked=None) -> int:
    """Record how the run ended in status.json (run_tasks wrote it already, before stopping the tasks;
    not so a run refused before it started) and as a TensorBoard session, draw a finished run's
    curves.png, say it in one line. config: the config.yaml written (None: the run was refused);
    `overrides`: a single run's, its hyperparameters in TensorBoard."""
    run.write_status(outcome.status, outcome.code, outcome.error, outcome.log_tail, job)
    if report.logs_for_tensorboard(config):
        # (TensorBoard's protocol buffers, 0.1 s: only for a run that logs for it)
        from distrain.report import dashboard

        swept = job.values if job else dict(split_override(o) for o in overrides if not o.startswith(("hydra", "~")))
        storage.record(dashboard.log_session, run, config, swept)
    results = run.read_results() if outcome.status == "ok" else None
    if results and outcome.peak_rss_mib:  # (the tasks' peaks: known here once they have ended)
        results["peak_rss_mib"] = outcome.peak_rss_mib
        run.add_to_results({"peak_rss_mib": outcome.peak_rss_mib})
    if outcome.peak_rss_mib and not job:
        log.info("peak resident memory: %s", report.memory_line(outcome.peak_rss_mib))
    if results:
        try:
            from distrain.report import plots  # matplotlib: only once there is something to draw
            plots.curves(results, run / "curves.png")
        except Exception as exc:  # noqa: BLE001 - a plot that fails must not fail a finished run
            log.warning("curves.png not drawn: %s", exc)
    if tracked:  # (after results.json's last facts and curves.png)
        tracked.finish()
    if job:
        if outcome.status == "ok":
            log.info("job %s: ok%s", job, f" - {report.short_line(results)}" if results else "")
        else:
            log.error("job %s: %s (exit status %d)%s", job, outcome.status, outcome.code,
                      f" - {outcome.error}" if outcome.error else "")
    elif outcome.code and run.logs.exists():  # (a run refused before it started said why already)
        log.error("the run %s with exit status %d; logs in %s",
                  "was interrupted" if outcome.status == "interrupted" else "failed", outcome.code, run.logs)
    return outcome.code
