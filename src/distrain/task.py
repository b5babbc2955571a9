"""One task process: read the run's resolved config, play this task's part, report.

The launcher starts one per run, or one per cluster task with TF_CONFIG saying which task it is:
under parameter servers, ps and worker tasks serve and wait while the chief (coordinator) trains;
under multi-worker mirrored, every worker trains and the chief (worker 0) reports.
"""
import os
import signal
import sys
from pathlib import Path

from omegaconf import OmegaConf

from . import cluster as cluster_lib
from . import report
from .config import CLUSTER_STRATEGIES, ConfigError
from .process import Preempted, Preemption, die_with_parent


def main(argv=None) -> int:
    die_with_parent()  # again here: nsenter's change of credentials may have cleared it
    config_path = Path((argv or sys.argv[1:])[0])
    cfg = OmegaConf.load(config_path)
    run_dir = config_path.parent
    try:
        task = None
        if cfg.strategy.name in CLUSTER_STRATEGIES:
            spec, task = cluster_lib.from_tf_config(os.environ.get("TF_CONFIG"), cfg.strategy.name)
            if task.type == "evaluator":
                return evaluate(cfg, run_dir, task)
            cluster_lib.check_port_free(task)
            if cfg.strategy.name == "parameter_server" and task.type in ("ps", "worker"):
                return serve(task)
            if cfg.strategy.name == "parameter_server":  # the coordinator: up once its ps and workers are
                cluster_lib.wait_for_peers(cluster_lib.peers(spec, task))
        from .strategy import configure_devices, is_chief, make_strategy  # TensorFlow starts here
        from .training import train

        configure_devices(cfg.strategy)
        strategy = make_strategy(cfg.strategy)
        if task:
            print(f"task {task.type}:{task.index} {cluster_lib.READY} {task.address} (pid {os.getpid()})",
                  flush=True)
        Preemption.watch(strategy if cfg.strategy.name == "multi_worker_mirrored" else None)
        results, _ = train(cfg, run_dir, strategy)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    except Preempted as exc:
        saved = "checkpoint saved" if cfg.trainer.save_model else "nothing saved (trainer.save_model=false)"
        print(f"stopped by SIGTERM at global step {exc}: {saved}; go on with trainer.resume=true", flush=True)
        return 128 + signal.SIGTERM
    if is_chief(strategy):
        report.write_results(run_dir, results)
        print(report.summary_line(results), flush=True)
    return 0


def evaluate(cfg, run_dir: Path, task) -> int:
    """The evaluator task: no server, no strategy; it reads the chief's checkpoints as they appear."""
    from .training import evaluate_checkpoints

    print(f"task {task.type}:{task.index} {cluster_lib.READY} {task.address} (pid {os.getpid()})", flush=True)
    report.write_json(run_dir / "evaluation.json", evaluate_checkpoints(cfg, run_dir))
    return 0


def serve(task) -> int:
    """A ps or worker task under parameter servers: a gRPC server that runs what the chief sends."""
    import tensorflow as tf

    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    server = tf.distribute.Server(resolver.cluster_spec(), job_name=task.type, task_index=task.index,
                                  protocol="grpc", start=True)
    print(f"task {task.type}:{task.index} {cluster_lib.READY} {task.address} (pid {os.getpid()})", flush=True)
    server.join()  # until the launcher (or the user) stops this task
    return 0


if __name__ == "__main__":
    sys.exit(main())
