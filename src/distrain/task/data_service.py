"""The tf.data service (data.service): its servers, as tasks of a run, and the trainers' side of it.

A run with `data.service.workers=N` on a local cluster has a dispatcher and N data workers besides its
trainers (launcher/cluster_tasks.py starts them; SERVICE_TASK tells each which it is). The trainers
register the training split's input pipeline with the dispatcher once per process (`Served`), and read
its batches from the data workers, which run the pipeline: the decoding, shuffling and batching leave
the trainers' cores. Each data worker is restarted alone, and the dispatcher from its journal in the run
directory (fault-tolerant mode), while the trainers go on.

Runs in a task process (TensorFlow imported): a service task's whole life, or a trainer's input.
"""
import hashlib
import json
import os

import tensorflow as tf
from omegaconf import OmegaConf

from distrain.common.errors import ConfigError, print_error
from distrain.common.messages import DATA_SERVICE, SERVICE_TASK, say_ready
from distrain.common.rundir import RunDir

SERVICE = tf.data.experimental.service
SHARDING = {"dynamic": SERVICE.ShardingPolicy.DYNAMIC, "off": SERVICE.ShardingPolicy.OFF}


def service_task() -> dict | None:
    """This process's part in the run's data service ({"type", "index", "address", "dispatcher"}), else None."""
    said = os.environ.get(SERVICE_TASK)
    return json.loads(said) if said else None


def serve_data(task: dict, run: RunDir, until_chief_gone: bool = False, startup_timeout: float = 0) -> int:
    """A dispatcher or a data worker, until the launcher stops it; or, until_chief_gone (a Slurm job step,
    which ends only when every task has), until the cluster's chief, once up, is gone. The dispatcher
    keeps its journal in the run directory, so that a restarted one knows the jobs under way; a data
    worker registers with it."""
    from distrain.common.cluster import Task, parse_address, until_gone

    _, port = parse_address(task["address"], f"{task['type']} address")
    if task["type"] == "dispatcher":
        run.data_service.mkdir(parents=True, exist_ok=True)
        server = SERVICE.DispatchServer(SERVICE.DispatcherConfig(
            port=port, work_dir=str(run.data_service), fault_tolerant_mode=True))
    else:
        server = SERVICE.WorkerServer(SERVICE.WorkerConfig(
            dispatcher_address=task["dispatcher"], worker_address=task["address"], port=port))
    say_ready(Task(task["type"], task["index"], task["address"]))
    if not until_chief_gone or not task.get("chief"):
        server.join()
        return 0
    why = until_gone(task["chief"], startup_timeout, "the chief")
    if why:
        print_error(why)
    else:
        print(f"task {task['type']}:{task['index']}: the chief is gone, so this task ends", flush=True)
    os._exit(1 if why else 0)  # (a server has no way to stop; nothing here to save)


def address(data) -> str | None:
    """The dispatcher the trainers read from: data.service.address, else the one the run started."""
    given = data.service.get("address") if data.get("service") else None
    where = given or os.environ.get(DATA_SERVICE)
    return None if not where else where if where.startswith("grpc://") else f"grpc://{where}"


class Served:
    """The training split's pipeline, registered with the dispatcher at `where` (one dataset per run and
    starting step: a resumed run, or a restarted cluster, starts a job of its own), read in batches of
    `batch` by each input pipeline: under `dynamic` sharding every trainer reads from one job, which
    hands each split of the data to one data worker a pass; under `off` each trainer (sync) or each
    iterator (parameter-server workers) has a job of its own, a full pass each."""

    def __init__(self, dataset: tf.data.Dataset, where: str, sharding: str, run: RunDir, start_step: int,
                 batch: int, timeout: float):
        self.where, self.sharding, self.batch = where, sharding, batch
        _wait_for(where, timeout)
        run_id = hashlib.sha1(str(run.path.resolve()).encode()).hexdigest()[:12]
        name = self.job = f"distrain-{run_id}-" + (f"step{start_step}" if start_step >= 0 else "probe")
        self.dataset_id = SERVICE.register_dataset(where, dataset, dataset_id=name, compression=None)
        self.element_spec = dataset.element_spec

    @classmethod
    def of(cls, source, cfg, where: str, run: RunDir, start_step: int, pipelines: int) -> "Served":
        """The training split of `source` (input_pipeline's ArraySource, FileSource), registered for
        `pipelines` input pipelines (0: parameter-server workers, a batch per worker's step): shuffled,
        repeated, in batches of one pipeline's, never skipped (a resumed run's stream is a new one)."""
        sharding, batch = cfg.data.service.sharding, cfg.trainer.batch_size
        if pipelines and batch % pipelines:  # (a cluster resumed at another size)
            raise ConfigError(f"the tf.data service sends each of the {pipelines} workers the same batch, which "
                              f"trainer.batch_size={batch} does not divide into: set a global batch that "
                              f"{pipelines} divides, or drop data.service")
        if sharding == "off":  # each data worker its own order (a seed would give every one the same passes)
            cfg = OmegaConf.merge(OmegaConf.to_container(cfg), {"trainer": {"seed": None}})
        batch //= max(pipelines, 1)
        return cls(source.served(batch, cfg), where, sharding, run, start_step, batch, cfg.cluster.startup_timeout)

    def read(self, trainer: int | None) -> tf.data.Dataset:
        """The batches of the pipeline of `trainer` (a synchronous one's index; None: a parameter-server
        worker's, or a read of its own, whose job is its iterator's)."""
        if self.sharding == "dynamic":
            job = self.job
        else:
            job = None if trainer is None else f"{self.job}-trainer{trainer}"
        return SERVICE.from_dataset_id(SHARDING[self.sharding], self.where, self.dataset_id, self.element_spec,
                                       job_name=job)


def _wait_for(where: str, timeout: float) -> None:
    """Until the dispatcher at `where` answers (TensorFlow would wait for it without end); a ConfigError
    naming it after `timeout` seconds (cluster.startup_timeout)."""
    from distrain.common.cluster import first_answer

    if silent := first_answer(where.removeprefix("grpc://"), timeout, interval=0.2):
        raise ConfigError(f"the tf.data service's dispatcher {where} did not answer within {timeout:g} s "
                          f"(cluster.startup_timeout; {silent}): start it, or fix data.service.address")
