"""The task processes of a cluster, started and supervised (supervisor.run_tasks) by one runner for a
training run and for a clustered evaluate or predict alike (their command line and how a restart goes on
differ): every task on this machine (`run_local`, cluster=local: the private network, the fork server,
free ports, pinned cores, cluster.json, restarts of a task or of the whole cluster), or this machine's
one task of a cluster spread over machines (`run_this_task`). A training's tf.data service
(data.service.workers) is tasks of its cluster: a dispatcher and data workers beside the trainers, or
beside the one training process of a strategy without a cluster.

Runs in the launcher's process (or evaluate's and predict's command); imports no TensorFlow.
"""
import logging
import shutil

import portpicker

from distrain.common import cluster as cluster_lib
from distrain.common import placement
from distrain.common.errors import ConfigError, fail, print_error
from distrain.common.messages import DATA_SERVICE, RESTARTS_CLUSTER, error_line
from distrain.common.rundir import RunDir
from distrain.common.topology import Topology
from distrain.config import schema
from distrain.launcher import forkserver
from distrain.launcher.restarts import Restarts
from distrain.launcher.supervisor import Outcome, TaskProcess, run_tasks

log = logging.getLogger("distrain")


def network(cfg) -> cluster_lib.PrivateNetwork:
    """This process's private network for its local clusters (kept for its next run)."""
    return cluster_lib.PrivateNetwork.shared(enabled=cfg.cluster.isolate is not False)


def start_ahead(cfg, run: RunDir) -> None:
    """The network and the fork server, started before the cluster is (TensorFlow imports there while this
    process does other work): where the cluster may run on this machine at all."""
    net = network(cfg)
    if net.available or cfg.cluster.isolate is not True:
        forkserver.shared(run.log("forkserver"), net.wrap)


def run_local(cfg, run: RunDir, argv: list, job=None, *, independent_workers: bool = False, evaluator: bool = False,
              restarted=None, share: set | None = None, stop=None) -> Outcome:
    """Every task of the cluster as a process on this machine, inside a private network if possible; the
    logs and cluster.json in `run`.

    An essential task that dies restarts the whole cluster (every synchronous worker needs every other;
    the ps tasks hold the only copy of the variables); a parameter-server worker, any worker where
    `independent_workers` (evaluate's and predict's: each computes parts of its own), and the data
    service's tasks are restarted alone; a lone training process (a strategy without a cluster) never.
    Up to cluster.max_restarts restarts in all. `restarted(cfg, restarts)`: the config the restarted
    cluster runs (a training resumes from its latest checkpoint), written where its tasks read it; a
    ConfigError it raises ends the run. `evaluator`: with the sidecar evaluator (cluster.evaluator).
    `share`: a trial's cores, which its workers split (cluster_tasks); `stop`: run_tasks'."""
    c, strategy = cfg.cluster, cfg.strategy.name
    per_worker = int(cluster_lib.thread_caps("worker", c.workers, c.threads_per_worker,
                                             len(share) if share else None)["TF_NUM_INTRAOP_THREADS"])
    topology = Topology.of(cfg)
    synchronous = topology.synchronous and topology.clustered and not independent_workers
    restarts = Restarts(c.max_restarts, c.restart_window, workers=c.workers if synchronous else 0,
                        min_workers=c.get("min_workers"), batch=schema.update_batch(cfg.trainer),
                        whole=topology.clustered)  # (a lone trainer is never restarted; its data service is)
    if schema.service_workers(cfg.data) and not independent_workers:  # a dispatcher's journal is its run's alone
        shutil.rmtree(run.data_service, ignore_errors=True)
    peaks, cpu = {}, {}
    net = network(cfg)
    with cluster_lib.CoreLocks(c.workers * per_worker if c.pin_workers and not share else 0) as cores:
        if (refused := _not_isolated(c, net)) is not None:
            return refused
        if cores.shared:
            log.warning("cluster.pin_workers: %s", cores.shared)
        where = "private network namespace" if net.available else f"host network, not isolated ({net.reason})"
        # Started only now, so that a run refused above imports nothing; kept for this process's next run.
        forks = forkserver.shared(run.log("forkserver"), net.wrap)
        while True:
            spec, tasks = cluster_tasks(cfg, argv, net, cores.cores, per_worker, forks, independent_workers,
                                        evaluator, share)
            for task in tasks:  # after a restart of the cluster, each task's log goes on
                task.restarts = restarts.per_task[task.name]
                # A task that loses a peer says so as news, not as an error, when the launcher restarts the cluster.
                task.env[RESTARTS_CLUSTER] = str(int(restarts.may_restart_cluster() or restarts.may_shrink()))
            log.info("local cluster (%s): %s", where, ", ".join(f"{t.name}={t.task.address}" for t in tasks if t.task))

            def write_cluster_json(status: str, spec=spec, tasks=tasks):  # (this attempt's)
                run.write_cluster({"strategy": strategy, "network": where, "status": status, "cluster": spec,
                                   "restarts": restarts.done, "tasks": [t.describe() for t in tasks if t.proc]})

            outcome = run_tasks(tasks, run, startup_timeout=c.startup_timeout, on_change=write_cluster_json,
                                job=job, restarts=restarts, stop=stop)
            # (each task's peak over the cluster's restarts too)
            peaks = outcome.peak_rss_mib = {name: max(peak, peaks.get(name, 0.0))
                                            for name, peak in outcome.peak_rss_mib.items()}
            cpu = outcome.cpu_seconds = {name: round(outcome.cpu_seconds.get(name, 0.0) + cpu.get(name, 0.0), 1)
                                         for name in {**cpu, **outcome.cpu_seconds}}  # (its CPU, summed)
            if not outcome.restart:
                _record_restarts(run, restarts)
                return outcome
            try:
                cfg = restarted(cfg, restarts) if restarted else cfg
            except ConfigError as exc:  # (a full disk)
                return Outcome(fail(exc), "failed", error_line(exc))


def _not_isolated(c, net) -> Outcome | None:
    """Without a private network: the run refused where cluster.isolate=true, else a warning (None)."""
    if net.available:
        return None
    if c.isolate is True:
        error = (f"cluster.isolate=true but no private network is possible here ({net.reason}): "
                 "set cluster.isolate=auto to run without one")
        print_error(error)
        return Outcome(2, "failed", error_line(error))
    log.warning("the cluster's servers are NOT isolated (%s): TensorFlow listens on every interface, "
                "so anyone who can reach this machine can reach them; use a trusted network", net.reason)
    return None


def cluster_tasks(cfg, argv: list, net, cores: list, per_worker: int, forks, independent_workers: bool = False,
                  evaluator: bool = False, share: set | None = None) -> tuple[dict, list]:
    """The cluster spec (ports picked free) and a TaskProcess for each of its tasks; each worker pinned
    to its own per_worker of `cores` (cluster.pin_workers), or of `share` (a trial's, where every task
    stays)."""
    c, topology = cfg.cluster, Topology.of(cfg)
    pin, cores = bool(share) or c.pin_workers, sorted(share) if share else cores
    spec = cluster_lib.local_spec(cfg.strategy.name, c.workers, c.ps) if topology.clustered else {}
    served = service_spec(cfg) if not independent_workers else {}
    whole = {**spec, **served}  # (TensorFlow's tasks and the data service's: each task's environment says its part)
    tasks = []
    if not topology.clustered and served:  # one training process, beside its data service
        caps = cluster_lib.thread_caps("worker", 1, cores=len(share)) if share else {}
        tasks.append(TaskProcess("train", net.wrap(argv), {**caps, DATA_SERVICE: served["dispatcher"][0]},
                                 cores=share, forks=forks))
    for task_type, addresses in spec.items():
        for index, address in enumerate(addresses):
            task = cluster_lib.Task(task_type, index, address)
            # The chief coordinates parameter servers and needs few threads; workers share the cores.
            env = {**cluster_lib.task_env(whole, task),
                   **cluster_lib.thread_caps(task_type, c.workers, per_worker if pin else c.threads_per_worker)}
            serves = topology.parameter_servers and task_type != "chief"
            pinned = cluster_lib.worker_cores(index, per_worker, cores) if pin and task_type == "worker" else \
                set(cores) if share else None
            alone = task_type == "worker" and (serves or independent_workers)
            tasks.append(TaskProcess(task.name, net.wrap(argv), env, main=not serves, alone=alone,
                                     quiet=topology.synchronous and index > 0, task=task, cores=pinned,
                                     peer_timeout=coordinator_timeout(cfg, task_type),
                                     stall_after=0 if serves else c.peer_timeout / 2, forks=forks))
    if evaluator:  # known to itself but not to the training tasks: strategies need not wait for it
        task = cluster_lib.Task("evaluator", 0, f"127.0.0.1:{portpicker.pick_unused_port()}")
        env = {**cluster_lib.task_env({**spec, "evaluator": [task.address]}, task),
               **cluster_lib.thread_caps("evaluator", c.workers)}
        tasks.append(TaskProcess(task.name, net.wrap(argv), env, essential=False, task=task, forks=forks))
    for task_type, addresses in served.items():  # each restarted alone, on its own address, as the trainers go on
        for index, address in enumerate(addresses):
            task = cluster_lib.Task(task_type, index, address)
            tasks.append(TaskProcess(task.name, net.wrap(argv), cluster_lib.task_env(whole, task),
                                     main=False, alone=True, task=task, forks=forks))
    return whole, tasks


def service_spec(cfg) -> dict:
    """The tf.data service's tasks on this machine (data.service.workers, else none): a dispatcher, which
    keeps its journal in the run directory, and the data workers, ports picked free."""
    workers = schema.service_workers(cfg.data)
    if not workers:
        return {}
    return {"dispatcher": [f"127.0.0.1:{portpicker.pick_unused_port()}"],
            "data_worker": [f"127.0.0.1:{portpicker.pick_unused_port()}" for _ in range(workers)]}


def run_this_task(cfg, run: RunDir, argv: list, spec: dict, task: cluster_lib.Task, job=None) -> Outcome:
    """This machine's task of a cluster spread over machines (slurm, tf_config, manual: the same command
    started on each), as TF_CONFIG places it; not restarted here (its orchestrator, or the same command
    again, starts it anew)."""
    log.info("this process is task %s:%d of %s", task.type, task.index, spec)
    env = {**cluster_lib.task_env(spec, task), **(placement.slurm_gpus() if cfg.cluster.name == "slurm" else {})}
    served = task.type in cluster_lib.SERVICE_TYPES  # (a dispatcher or data worker: no training step to watch)
    return run_tasks([TaskProcess(task.name, argv, env, task=task, cluster=spec,
                                  peer_timeout=coordinator_timeout(cfg, task.type),
                                  stall_after=0 if served else cfg.cluster.peer_timeout / 2)], run,
                     startup_timeout=cfg.cluster.startup_timeout, job=job, probe_peers=True)


def coordinator_timeout(cfg, task_type: str) -> float:
    """The parameter-server chief keeps a heartbeat, which must not stop for cluster.peer_timeout."""
    return cfg.cluster.peer_timeout if Topology.of(cfg).parameter_servers and task_type == "chief" else 0


def _record_restarts(run: RunDir, restarts: Restarts) -> None:
    """The launcher's restarts, added to the chief's results.json (a training's), with the workers that left
    the run (parameter servers) and so the number there were at its end."""
    results = run.read_results()
    if results is not None and restarts.done:
        gone = restarts.gone()
        run.add_to_results({"task_restarts": restarts.done, "workers_left_the_run": gone,
                            "final_num_workers": results["num_workers"] - len(gone)})
