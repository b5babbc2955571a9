"""Where this process stands in the run, built once in the task process and passed down: its run
directory, the run's topology, its task in the cluster (from TF_CONFIG, which nothing below reads
again) and whether it is the chief, the task that writes checkpoints, the SavedModel and results.json.
The run's shape is its Topology (common/topology.py), which the launcher decides too."""
from dataclasses import dataclass, field

from distrain.common.cluster import Task
from distrain.common.rundir import RunDir
from distrain.common.topology import Topology


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
