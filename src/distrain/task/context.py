"""Where this process stands in the run, built once in the task process and passed down: its run
directory, the run's topology, its task in the cluster (from TF_CONFIG, which nothing below reads
again) and whether it is the chief, the task that writes checkpoints, the SavedModel and results.json.

The Topology is the shape of the run, decided once (the launcher's from the config, a task's from its
cluster too): every module asks it whether the run is synchronous or under parameter servers, on this
machine or several, and how many workers train, instead of comparing strategy names or types."""
from dataclasses import dataclass, field

from distrain.common.cluster import Task
from distrain.common.rundir import RunDir
from distrain.config.schema import CLUSTER_STRATEGIES, PS

LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")


@dataclass(frozen=True)
class Topology:
    parameter_servers: bool = False  # asynchronous: a coordinator schedules steps on workers; else synchronous
    clustered: bool = False  # tasks of a cluster (the cluster group's), else one process
    local: bool = True  # every task on this machine (one disk: a task may read what the launcher wrote)
    workers: int | None = 1  # the tasks that train (None: only TF_CONFIG will tell, on a cluster elsewhere)
    ps: int = 0  # parameter-server tasks

    @classmethod
    def of(cls, cfg, spec: dict | None = None) -> "Topology":
        """The run's topology: from the cluster `spec` a task has ({} for a process alone), or (None) from
        the config, as the launcher knows it."""
        parameter_servers, clustered = cfg.strategy.name == PS, cfg.strategy.name in CLUSTER_STRATEGIES
        if spec is not None:
            trainers = spec.get("worker", []) + ([] if parameter_servers else spec.get("chief", []))
            hosts = [address.rpartition(":")[0] for tasks in spec.values() for address in tasks]
            return cls(parameter_servers, bool(spec), all(host in LOOPBACK for host in hosts), len(trainers) or 1,
                       len(spec.get("ps", [])))
        if not clustered:
            return cls()
        if cfg.cluster.name == "local":
            return cls(parameter_servers, True, True, cfg.cluster.workers, cfg.cluster.ps if parameter_servers else 0)
        return cls(parameter_servers, True, False, cfg.cluster.get("workers"), cfg.cluster.get("ps") or 0)

    @property
    def synchronous(self) -> bool:
        return not self.parameter_servers


@dataclass
class RunContext:
    run: RunDir
    topology: Topology = field(default_factory=Topology)
    task: Task | None = None  # None: one process, no cluster
    cluster: dict = field(default_factory=dict)  # the cluster spec, {job: [addresses]}; {} without one
    chief: bool = True  # as the strategy says (know_strategy)
    replicas: int = 1  # replicas in sync, as the strategy counts them (know_strategy)
    _resolver: object = field(default=None, repr=False)

    @classmethod
    def of(cls, run: RunDir, cfg, cluster: dict | None = None, task: Task | None = None) -> "RunContext":
        """This process's context in the run of `cfg`, in the cluster (and as the task) TF_CONFIG gives."""
        return cls(run, Topology.of(cfg, cluster or {}), task, cluster or {})

    def resolver(self):
        """TensorFlow's cluster resolver for this task (its strategy's, its server's), made once."""
        if self._resolver is None:
            import tensorflow as tf

            self._resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
                tf.train.ClusterSpec(self.cluster), task_type=self.task.type, task_id=self.task.index,
                rpc_layer="grpc", num_accelerators=_local_accelerators())
        return self._resolver

    def know_strategy(self, strategy) -> "RunContext":
        """The replicas, and the chief, as the strategy knows it: the task that checkpoints under multi_worker_mirrored
        (worker 0 where there is no chief task); the coordinator, which alone trains, under parameter
        servers; the one process otherwise. Returns this context."""
        self.chief = self.topology.parameter_servers or bool(strategy.extended.should_checkpoint)
        self.replicas = strategy.num_replicas_in_sync
        return self


def _local_accelerators() -> dict:
    """The GPUs of this machine, as a cluster resolver counts them for its strategy."""
    import tensorflow as tf

    gpus = len(tf.config.list_physical_devices("GPU"))
    return {"GPU": gpus} if gpus else {}
