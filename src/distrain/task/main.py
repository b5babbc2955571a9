"""One task process: read the run's resolved config, play this task's part, report.

The launcher starts one per run, or one per cluster task with TF_CONFIG saying which task it is:
under parameter servers, ps and worker tasks serve and wait while the chief (coordinator) trains;
under multi-worker mirrored, every worker trains and the chief (worker 0) reports.
"""
import os
import re
import signal
import sys
import time
from pathlib import Path

from omegaconf import OmegaConf

from distrain.common import cluster as cluster_lib
from distrain.common import storage
from distrain.common.errors import FINAL, ConfigError, PeerLost, fail, print_error
from distrain.common.lifetime import die_with_parent
from distrain.common.messages import RESTARTS_CLUSTER, say_ready
from distrain.common.rundir import RunDir
from distrain.common.stacks import answer_stack_requests
from distrain.common.topology import Topology
from distrain.report import results as report
from distrain.report import timesplit
from distrain.task.context import RunContext
from distrain.task.preemption import Preempted, Preemption


def main(argv=None) -> int:
    die_with_parent()  # again here: nsenter's change of credentials may have cleared it
    answer_stack_requests()
    config_path = Path((argv or sys.argv[1:])[0])
    cfg = OmegaConf.load(config_path)
    run = RunDir(config_path.parent, cfg)
    try:
        context = RunContext.of(run, cfg, *_place_in_cluster(cfg))
        task = context.task
        if task and task.type == "evaluator":
            return run_evaluator(cfg, context)
        if task:
            cluster_lib.check_port_free(task)
            if context.topology.parameter_servers and task.type in ("ps", "worker"):
                return serve(context, cfg.cluster.name == "slurm", cfg.cluster.startup_timeout)
        results = train_here(cfg, context)
    except FINAL as exc:
        return fail(exc)
    except PeerLost as exc:
        say_peer_lost(exc, cfg)
        os._exit(1)  # not a normal exit: TensorFlow's shutdown would wait for the lost peer
    except Preempted as exc:
        say_preempted(exc, cfg, run)
        return 128 + signal.SIGTERM
    if context.chief:
        print(report.summary_line(results), flush=True)
        if results.get("bound"):
            print(timesplit.verdict(results, cfg.data), flush=True)
    if context.task and context.topology.parameter_servers:  # the coordinator: all is written
        sys.stderr.flush()
        os._exit(0)  # TensorFlow's shutdown would remove its functions from every remote task (runners.KEPT)
    return 0


def _place_in_cluster(cfg) -> tuple:
    """(cluster spec, this task) from TF_CONFIG, read here alone; () for a process alone."""
    if not Topology.of(cfg).clustered:
        return ()
    return cluster_lib.from_tf_config(os.environ.get("TF_CONFIG"), cfg.strategy.name)


def train_here(cfg, context: RunContext) -> dict:
    """The training of this process (one process, a synchronous worker, or the parameter servers'
    coordinator): its results, written by the chief. Errors that have a line of their own are raised
    as one (FINAL, PeerLost)."""
    # TensorFlow starts here: while the ps and worker tasks start theirs, not after.
    from distrain.config.targets import check_arguments
    from distrain.task.input_pipeline import bad_data
    from distrain.task.setup import strategy_of
    from distrain.task.training import train
    from distrain.task.worker_idx import unreadable_on_worker

    one_line_records()
    check_arguments(cfg)  # each _target_ given only what it takes: before any device, peer or data
    if context.task and context.topology.parameter_servers:  # the coordinator: up once its ps and workers are
        cluster_lib.wait_for_peers(cluster_lib.peers(context.cluster, context.task))
    strategy = strategy_of(cfg, context, cfg.cluster.peer_timeout if context.task else None)
    context.know_strategy(strategy)
    if context.task:
        say_ready(context.task)
    Preemption.watch(strategy if context.topology.clustered and context.topology.synchronous else None)
    try:
        results, _ = train(cfg, context.run.path, strategy, context)
        if context.chief:
            context.run.write_results(results)
        return results
    except Exception as exc:  # noqa: BLE001 - a lost peer, unreadable data, a full disk are translated
        translated = lost_peer(exc, cfg) or unreadable_on_worker(exc, cfg.data) or bad_data(exc) or \
            full_disk(exc, context.run, clean=context.chief)
        if translated is None:
            raise
        raise translated from exc


def say_peer_lost(exc: PeerLost, cfg) -> None:
    """The line of a lost peer: where a local cluster's launcher sees it too, what the launcher does."""
    watched = os.environ.get(RESTARTS_CLUSTER)  # a local cluster's launcher sees a task that died
    if watched == "1":
        print(f"{exc}: the launcher restarts the cluster from its latest checkpoint", flush=True)
    elif watched == "0" and not exc.hung:  # its line names the task and why: one line for one event
        print(f"{exc}: the launcher ends the run", flush=True)
    else:
        kept = "its latest checkpoint is kept" if cfg.trainer.save_model else "nothing saved (trainer.save_model=false)"
        print_error(f"{exc}; {kept}: go on with trainer.resume=true")


def say_preempted(exc: Preempted, cfg, run: RunDir) -> None:
    saved = "checkpoint saved" if cfg.trainer.save_model else "nothing saved (trainer.save_model=false)"
    bar = "\n" if cfg.trainer.verbose == 1 and exc.mid_epoch else ""  # the progress bar's line ends first
    # The launcher records why it stops its tasks before it sends them SIGTERM (Ctrl-C: SIGINT, to it).
    status = run.read_status()
    if status.get("status") == "restarting":  # (a cluster that grows back: the launcher said why)
        print(f"{bar}stopped at global step {exc}: {saved}, from which the launcher restarts the cluster", flush=True)
        return
    why = "interrupted (Ctrl-C)" if "SIGINT" in status.get("error", "") else "stopped by SIGTERM"
    print(f"{bar}{why} at global step {exc}: {saved}; go on with trainer.resume=true hydra.run.dir={run.path}",
          flush=True)


def lost_peer(exc: Exception, cfg, during: str = "mid-training") -> PeerLost | None:
    """A TensorFlow error that says a peer died or stopped answering (a collective aborted, a
    parameter server gone), as PeerLost (`during`: what the cluster was doing); None for any other error."""
    import tensorflow as tf

    if isinstance(exc, PeerLost):
        return exc
    if not isinstance(exc, tf.errors.OpError):
        return None
    text = exc.message
    hung = re.search(r"unhealthy \(stopped sending heartbeats\):\s*(\S+)", text)
    if hung:
        task = re.sub(r"/job:(\w+)/replica:\d+/task:(\d+)", r"\1 \2", hung.group(1))
        return PeerLost(f"{task} stopped answering for {cfg.cluster.peer_timeout:g} s (cluster.peer_timeout) "
                        f"{during}", hung=True)
    if isinstance(exc, (tf.errors.UnavailableError, tf.errors.AbortedError)) or "Collective ops is aborted" in text:
        cause = re.search(r"aborted by: ([^\n]+)", text) or re.search(r"([^\n]*(?:unavailable|failed to connect|"
                                                                       r"reset|closed)[^\n]*)", text, re.I)
        why = f" ({cause.group(1).strip()[:160]})" if cause else ""
        return PeerLost(f"a task of the cluster was lost {during}{why}")
    if isinstance(exc, tf.errors.InternalError) and "from remote target /job:" in text:  # another task failed
        # the step inside TensorFlow (seen once, in a restarted cluster: a request that arrived corrupt)
        cause = re.search(r"\}\}\s*([^\n|]+)", text)
        why = cause.group(1).strip()[:160] if cause else type(exc).__name__
        return PeerLost(f"a task of the cluster failed {during} ({why})")
    return None


def full_disk(exc: Exception, run: RunDir, clean: bool = False) -> ConfigError | None:
    """A full disk, as one line saying what was kept; else None. clean: this task writes the run
    directory (the chief), and removes the files the full disk cut short."""
    if clean and storage.is_full(exc):
        storage.remove_partial(run.path, run.checkpoints)
    return storage.full_disk(exc, run.path, run.kept_checkpoints)


def run_evaluator(cfg, context: RunContext) -> int:
    """The evaluator task: no server, no strategy; it reads the chief's checkpoints as they appear."""
    from distrain.task.evaluator import evaluate_checkpoints

    say_ready(context.task)
    evaluations = evaluate_checkpoints(cfg, context)
    try:
        context.run.write_evaluation(evaluations)
    except OSError as exc:
        if (translated := full_disk(exc, context.run)) is None:
            raise
        raise translated from exc
    return 0


def one_line_records() -> None:
    """Each record of TensorFlow's Python logger once, on one line: a report of several lines (a function
    the coordinator retries, with its causes) is then noise or not as a whole, by its first words
    (task_log.is_noise, in the launcher), and stays whole in the task's log."""
    import logging

    import tensorflow as tf

    class OneLine(logging.Formatter):
        def __init__(self, formatter):
            super().__init__()
            self.formatter = formatter or logging.Formatter(logging.BASIC_FORMAT)

        def format(self, record):
            return self.formatter.format(record).replace("\n", " | ")

    logger = tf.get_logger()
    for handler in logger.handlers:  # (made by its first call)
        handler.setFormatter(OneLine(handler.formatter))
    if logger.handlers:  # not again through a handler the root logger gets later (each report was twice)
        logger.propagate = False


def serve(context: RunContext, until_chief_gone: bool = False, startup_timeout: float = 0) -> int:
    """A ps or worker task under parameter servers: a gRPC server that runs what the chief sends,
    until it is stopped; or, until_chief_gone (a Slurm job step, which ends only when every task has),
    until the chief, once up, is gone."""
    import tensorflow as tf

    task = context.task
    server = tf.distribute.Server(tf.train.ClusterSpec(context.cluster), job_name=task.type, task_index=task.index,
                                  protocol="grpc", start=True)
    say_ready(task)
    if not until_chief_gone:
        server.join()  # until the launcher (or the user) stops this task
        return 0
    chief = {"chief-0": context.cluster["chief"][0]}
    deadline = time.monotonic() + startup_timeout
    while silent := cluster_lib.unanswered(chief):
        if time.monotonic() > deadline:
            print_error(f"the chief never answered within {startup_timeout:g} s (cluster.startup_timeout; "
                        f"{silent['chief-0']}): read its log, or raise cluster.startup_timeout")
            os._exit(1)
        time.sleep(0.5)
    while not cluster_lib.unanswered(chief):
        time.sleep(2)
    print(f"task {task.type}:{task.index}: the chief is gone, so this task ends", flush=True)
    os._exit(0)  # the server has no way to stop; nothing here to save

