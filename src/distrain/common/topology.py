"""The Topology: the shape of a run, decided once (the launcher's from the config, a task's from its
cluster too). Every module asks it whether the run is synchronous or under parameter servers, on this
machine or several, and how many workers train, instead of comparing strategy names or types; and the
strategies' names themselves (the config's strategy group takes them from here). Both sides use it: no
TensorFlow."""
from dataclasses import dataclass
from enum import StrEnum


class StrategyName(StrEnum):  # the strategy group's options; compare names with these, not with strings
    default = "default"
    one_device = "one_device"
    mirrored = "mirrored"
    central_storage = "central_storage"
    multi_worker_mirrored = "multi_worker_mirrored"
    parameter_server = "parameter_server"


MWMS, PS = StrategyName.multi_worker_mirrored, StrategyName.parameter_server
CLUSTER_STRATEGIES = (MWMS, PS)  # the strategies whose tasks come from the cluster group
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
