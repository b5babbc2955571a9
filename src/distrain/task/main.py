"""One task process: read the run's resolved config, play this task's part, report.

The launcher starts one per run, or one per cluster task with TF_CONFIG saying which task it is, and
evaluate and predict one per task of a cluster. Its role (`role`): under parameter servers, ps and
worker tasks serve and wait while the chief (coordinator) trains or computes; under multi-worker
mirrored, every worker trains (the chief, worker 0, reports) or computes its parts of an evaluate or
predict (the directory's job.json says which); a sidecar evaluator evaluates the chief's checkpoints.
"""
import os
import signal
import sys
from pathlib import Path

from omegaconf import OmegaConf

from distrain.common import cluster as cluster_lib
from distrain.common import placement
from distrain.common.errors import FINAL, PeerLost, fail, print_error
from distrain.common.lifetime import die_with_parent
from distrain.common.messages import DATA_SERVICE, RESTARTS_CLUSTER, SERVICE_TASK, say_ready
from distrain.common.rundir import RunDir
from distrain.common.stacks import answer_stack_requests
from distrain.common.topology import Topology
from distrain.report import results, timesplit
from distrain.task.context import RunContext
from distrain.task.failures import full_disk, lost_peer
from distrain.task.preemption import Preempted, Preemption

TRAIN, SERVE, EVALUATE_CHECKPOINTS, COMPUTE_PARTS = "train", "serve", "evaluate checkpoints", "compute parts"


def main(argv=None) -> int:
    die_with_parent()  # again here: nsenter's change of credentials may have cleared it
    answer_stack_requests()
    config_path = Path((argv or sys.argv[1:])[0])
    cfg = OmegaConf.load(config_path)
    run = RunDir(config_path.parent, cfg)
    job = run.read_job()  # evaluate's or predict's parts for this task to compute, else None (a training)
    if os.environ.get(SERVICE_TASK):  # a dispatcher or data worker of the run's tf.data service
        from distrain.task.data_service import serve_data, service_task

        return serve_data(service_task(), run, until_chief_gone=cfg.cluster.name == "slurm",
                          startup_timeout=cfg.cluster.get("startup_timeout", 0))
    try:
        context = RunContext.of(run, cfg, *_place_in_cluster(cfg))
        what = role(context, job)
        if what == EVALUATE_CHECKPOINTS:
            return run_evaluator(cfg, context)
        if context.task:
            cluster_lib.check_port_free(context.task)
        if what == SERVE:
            return serve(context, serves_until_chief_gone(cfg, job), cfg.cluster.startup_timeout)
        if what == COMPUTE_PARTS:
            from distrain.task.inference import compute_parts  # (TensorFlow: after the servers started theirs)

            compute_parts(cfg, context, job)
        else:
            say_results(train_here(cfg, context), cfg, context)
    except FINAL as exc:
        return fail(exc)
    except PeerLost as exc:
        say_peer_lost(exc, cfg, job)
        os._exit(1)  # not a normal exit: TensorFlow's shutdown would wait for the lost peer
    except Preempted as exc:
        say_preempted(exc, cfg, run)
        return 128 + signal.SIGTERM
    if context.task and context.topology.parameter_servers:  # the coordinator: all is written
        sys.stderr.flush()
        os._exit(0)  # TensorFlow's shutdown would remove its functions from every remote task (runners.KEPT)
    return 0


def role(context: RunContext, job: dict | None) -> str:
    """This task's part: a sidecar evaluator evaluates checkpoints; a ps or worker task under parameter
    servers serves the chief; any other trains, or computes its parts where there is a job (evaluate's,
    predict's)."""
    task = context.task
    if task and task.type == "evaluator":
        return EVALUATE_CHECKPOINTS
    if task and context.topology.parameter_servers and task.type in ("ps", "worker"):
        return SERVE
    return COMPUTE_PARTS if job is not None else TRAIN


def serves_until_chief_gone(cfg, job: dict | None) -> bool:
    """Whether a serving task ends once the chief, once up, is gone: in a Slurm job step (which ends only
    when every task has) and in evaluate's and predict's cluster spread over machines (each machine's
    command ends with its chief's). A training's servers elsewhere serve chiefs in turn until stopped; a
    local cluster's launcher stops its own."""
    return cfg.cluster.name == "slurm" or (job is not None and not Topology.of(cfg).local)


def say_results(found: dict, cfg, context: RunContext) -> None:
    """The chief's closing lines: the run's results, and what bound its speed."""
    if context.chief:
        print(results.summary_line(found), flush=True)
        if found.get("bound"):
            print(timesplit.verdict(found, cfg.data), flush=True)


def _place_in_cluster(cfg) -> tuple:
    """(cluster spec, this task) from TF_CONFIG, read here alone; () for a process alone."""
    if not Topology.of(cfg).clustered:
        return ()
    return placement.from_tf_config(os.environ.get("TF_CONFIG"), cfg.strategy.name)


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
    if context.task or os.environ.get(DATA_SERVICE):  # (a lone trainer beside its data service: up too)
        say_ready(context.task or cluster_lib.Task("train", 0, "this machine"))
    Preemption.watch(strategy if context.topology.clustered and context.topology.synchronous else None)
    try:
        found, _ = train(cfg, context.run.path, strategy, context)
        if context.chief:
            context.run.write_results(found)
        return found
    except Exception as exc:  # noqa: BLE001 - a lost peer, unreadable data, a full disk are translated
        translated = lost_peer(exc, cfg) or unreadable_on_worker(exc, cfg.data) or bad_data(exc) or \
            full_disk(exc, context.run, clean=context.chief)
        if translated is None:
            raise
        raise translated from exc


def say_peer_lost(exc: PeerLost, cfg, job: dict | None) -> None:
    """The line of a lost peer: where a local cluster's launcher sees it too, what the launcher does."""
    watched = os.environ.get(RESTARTS_CLUSTER)  # a local cluster's launcher sees a task that died
    if watched == "1":
        goes_on = "which goes on with the parts not written" if job else "from its latest checkpoint"
        print(f"{exc}: the launcher restarts the cluster, {goes_on}", flush=True)
    elif watched == "0" and not exc.hung:  # its line names the task and why: one line for one event
        print(f"{exc}: the launcher ends the {'command' if job else 'run'}", flush=True)
    elif job:
        print_error(f"{exc}: the same command again computes only the parts not written")
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
    why = cluster_lib.until_gone(context.cluster["chief"][0], startup_timeout, "the chief")
    if why:
        print_error(why)
        os._exit(1)
    print(f"task {task.type}:{task.index}: the chief is gone, so this task ends", flush=True)
    os._exit(0)  # the server has no way to stop; nothing here to save

