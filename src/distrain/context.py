"""Where this process stands in the run, built once in the task process and passed down: its run
directory, its task in the cluster (from TF_CONFIG, which nothing below reads again) and whether it
is the chief, the task that writes checkpoints, the SavedModel and results.json."""
from dataclasses import dataclass, field

from .cluster import Task
from .rundir import RunDir


@dataclass
class RunContext:
    run: RunDir
    task: Task | None = None  # None: one process, no cluster
    cluster: dict = field(default_factory=dict)  # the cluster spec, {job: [addresses]}; {} without one
    chief: bool = True  # as the strategy says (know_strategy)
    _resolver: object = field(default=None, repr=False)

    @property
    def workers(self) -> int:
        """The tasks that train: workers, and a chief that trains with them (multi_worker_mirrored's)."""
        if not self.cluster:
            return 1
        if self.cluster.get("ps"):  # parameter servers: the chief coordinates, the workers train
            return len(self.cluster["worker"])
        return len(self.cluster.get("worker", [])) + len(self.cluster.get("chief", []))

    @property
    def ps(self) -> int:
        return len(self.cluster.get("ps", []))

    def resolver(self):
        """TensorFlow's cluster resolver for this task (its strategy's, its server's), made once."""
        if self._resolver is None:
            import tensorflow as tf

            self._resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
                tf.train.ClusterSpec(self.cluster), task_type=self.task.type, task_id=self.task.index,
                rpc_layer="grpc", num_accelerators=_local_accelerators())
        return self._resolver

    def know_strategy(self, strategy) -> "RunContext":
        """The chief, as the strategy knows it: the task that checkpoints under multi_worker_mirrored
        (worker 0 where there is no chief task); the coordinator, which alone trains, under parameter
        servers; the one process otherwise. Returns this context."""
        import tensorflow as tf

        self.chief = isinstance(strategy, tf.distribute.ParameterServerStrategy) or \
            bool(strategy.extended.should_checkpoint)
        return self


def _local_accelerators() -> dict:
    """The GPUs of this machine, as a cluster resolver counts them for its strategy."""
    import tensorflow as tf

    gpus = len(tf.config.list_physical_devices("GPU"))
    return {"GPU": gpus} if gpus else {}
