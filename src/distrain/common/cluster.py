"""A cluster's tasks: its spec checked, each task's environment, a local cluster's ports, threads and
cores, and the private network it runs in (where a task of a cluster across machines comes from:
placement.py).

A cluster is TensorFlow's spec: {"chief": [...], "worker": ["host:port", ...], "ps": [...]}, with a tf.data
service's tasks beside them, and a task is (type, index) within it. Every task of TensorFlow's learns both
from TF_CONFIG, as on Kubernetes or Vertex AI. No TensorFlow here: the launcher and the tasks use it.
"""
import atexit
import fcntl
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import portpicker

from distrain.common.errors import ConfigError
from distrain.common.messages import DATA_SERVICE, SERVICE_TASK
from distrain.common.topology import MWMS, PS

# The tf.data service's tasks (data.service), which a spec may hold beside TensorFlow's own; never in a
# task's TF_CONFIG (TensorFlow's strategies take no other job), they learn their part from SERVICE_TASK.
SERVICE_TYPES = ("dispatcher", "data_worker")
TASK_TYPES = ("chief", "worker", "ps", "evaluator", *SERVICE_TYPES)


@dataclass(frozen=True)
class Task:
    """A task of the cluster, as TensorFlow means it: its job's name (chief, worker, ps, evaluator), its
    index in that job, and its address."""
    type: str
    index: int
    address: str

    @property
    def name(self) -> str:
        return f"{self.type}-{self.index}"


def chief_of(spec: dict) -> str:
    """The name of the cluster's chief: its chief task, else (multi_worker_mirrored) worker 0."""
    return "chief-0" if spec.get("chief") else "worker-0"


def rank(spec: dict, task: Task) -> int:
    """A training task's place among those that train: the chief first, then the workers."""
    return task.index + (0 if task.type == "chief" else len(spec.get("chief", [])))


def parse_address(address, what: str) -> tuple[str, int]:
    host, sep, port = str(address).rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"{what} {address!r} is not host:port: write e.g. 127.0.0.1:2222")
    return host, int(port)


def check_spec(spec: dict, strategy: str) -> dict:
    """Validate a cluster spec for a strategy; returns it. One ConfigError line per problem."""
    if not isinstance(spec, dict) or not spec.get("worker"):
        raise ConfigError("the cluster has no worker tasks: list at least one worker address")
    for task_type, addresses in spec.items():
        if task_type not in TASK_TYPES:
            raise ConfigError(f"unknown task type {task_type!r} in the cluster: use {', '.join(TASK_TYPES)}")
        if not isinstance(addresses, list):
            raise ConfigError(f"cluster entry {task_type!r} must be a list of host:port addresses")
        for address in addresses:
            parse_address(address, f"{task_type} address")
    if len(spec.get("chief", [])) > 1:
        raise ConfigError("a cluster has at most one chief: list one address under chief")
    if strategy == PS:
        if not spec.get("ps"):
            raise ConfigError("strategy=parameter_server needs at least one ps task: "
                              "set cluster.ps=1 (local) or list ps addresses")
        if not spec.get("chief"):
            raise ConfigError("strategy=parameter_server needs a chief task (the coordinator that trains): "
                              "add cluster.chief_host (manual) or a chief entry in TF_CONFIG")
    elif strategy == MWMS and spec.get("ps"):
        raise ConfigError("strategy=multi_worker_mirrored takes no ps tasks: "
                          "drop them or use strategy=parameter_server")
    check_service_spec(spec)
    all_addresses = [a for t in TASK_TYPES for a in spec.get(t, [])]
    duplicates = {a for a in all_addresses if all_addresses.count(a) > 1}
    if duplicates:
        raise ConfigError(f"address {sorted(duplicates)[0]} is given to two tasks: give each task its own port")
    return spec


def check_service_spec(spec: dict) -> None:
    """The tf.data service's tasks, where a spec lists them: one dispatcher, and data workers for it."""
    dispatchers, data_workers = spec.get("dispatcher", []), spec.get("data_worker", [])
    if (dispatchers or data_workers) and (len(dispatchers) != 1 or not data_workers):
        raise ConfigError(f"the cluster's tf.data service has {len(dispatchers)} dispatcher(s) and {len(data_workers)} "
                          "data_worker(s): list one dispatcher address and at least one data_worker address")


def check_task(spec: dict, task_type: str, index) -> Task:
    if task_type not in spec:
        raise ConfigError(f"task type {task_type!r} is not in the cluster (it has {', '.join(spec)}): "
                          "fix the task type or the cluster")
    count = len(spec[task_type])
    if isinstance(index, bool) or not isinstance(index, int):
        raise ConfigError(f"TF_CONFIG task index {index!r} must be an integer: write e.g. \"index\": 0")
    if not 0 <= index < count:
        raise ConfigError(f"task index {index!r} is outside the cluster: {task_type} has {count} task(s), "
                          f"so use an index from 0 to {count - 1}")
    return Task(task_type, index, spec[task_type][index])


def tf_config(spec: dict, task: Task) -> str:
    cluster = {t: addresses for t, addresses in spec.items() if t not in SERVICE_TYPES}
    return json.dumps({"cluster": cluster, "task": {"type": task.type, "index": task.index}})


def task_env(spec: dict, task: Task) -> dict:
    """What a task process needs to know: its place in the cluster, and that a lost peer is an
    error at once (GRPC_FAIL_FAST) rather than a wait that never ends; where the cluster has a tf.data
    service, where its dispatcher is (a trainer's), or which of its tasks this is."""
    dispatcher = (spec.get("dispatcher") or [None])[0]
    if task.type in SERVICE_TYPES:
        return {SERVICE_TASK: json.dumps({"type": task.type, "index": task.index, "address": task.address,
                                          "dispatcher": dispatcher, "chief": chief_address(spec)})}
    return {"TF_CONFIG": tf_config(spec, task), "GRPC_FAIL_FAST": "use_caller",
            **({DATA_SERVICE: dispatcher} if dispatcher else {})}


def chief_address(spec: dict) -> str | None:
    """The address of the cluster's chief (chief_of), if it has one."""
    name = chief_of(spec)
    task_type, _, index = name.rpartition("-")
    addresses = spec.get(task_type) or []
    return addresses[int(index)] if addresses else None


def first_answer(address: str, timeout: float, interval: float = 0.5) -> str:
    """Waits up to `timeout` seconds for the task at `address` to answer: "" once it does, else why it did
    not (as unanswered says)."""
    deadline = time.monotonic() + timeout
    while silent := unanswered({"it": address}):
        if time.monotonic() > deadline:
            return silent["it"]
        time.sleep(interval)
    return ""


def until_gone(address: str, startup_timeout: float, what: str) -> str:
    """Waits for the task at `address` (`what`: "the chief") to answer, then for it to be gone: "" then;
    else, after startup_timeout seconds without an answer, why (one line)."""
    if silent := first_answer(address, startup_timeout):
        return (f"{what} never answered within {startup_timeout:g} s (cluster.startup_timeout; {silent}): "
                "read its log, or raise cluster.startup_timeout")
    while not unanswered({what: address}):
        time.sleep(2)
    return ""


def local_spec(strategy: str, workers: int, ps: int, host: str = "127.0.0.1") -> dict:
    """A cluster on this machine, ports picked free. Parameter servers get a chief (the coordinator)."""
    counts = {"worker": workers}
    if strategy == PS:
        counts = {"chief": 1, "worker": workers, "ps": ps}
    spec = {t: [f"{host}:{portpicker.pick_unused_port()}" for _ in range(n)] for t, n in counts.items() if n}
    return check_spec(spec, strategy)


def check_port_free(task: Task) -> None:
    """A task's own port must be free before its server starts; TensorFlow would only say 'failed'."""
    _, port = parse_address(task.address, "address")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers do: TIME_WAIT is not "in use"
        try:
            s.bind(("", port))
        except OSError:
            raise ConfigError(f"port {port} of {task.type}:{task.index} ({task.address}) is already in use: "
                              "stop what holds it or give this task another port") from None


def peers(spec: dict, task: Task) -> dict:
    """The other tasks of the cluster: name -> address."""
    return {f"{t}-{i}": a for t, addresses in spec.items() for i, a in enumerate(addresses)
            if (t, i) != (task.type, task.index) and t not in ("evaluator", *SERVICE_TYPES)}  # (not TensorFlow's)


def unanswered(peers: dict, timeout: float = 1.0) -> dict:
    """The peers (name -> address) that do not accept a TCP connection, each with why."""
    silent = {}
    for name, address in peers.items():
        host, port = parse_address(address, "address")
        try:
            socket.create_connection((host, port), timeout=timeout).close()
        except socket.gaierror:
            silent[name] = f"{address}: host name does not resolve"
        except OSError as exc:
            silent[name] = f"{address}: {exc.strerror or 'no answer'}"
    return silent


def wait_for_peers(peers: dict, interval: float = 0.1) -> None:
    """Until every peer answers. Its caller is bounded by the launcher's cluster.startup_timeout, which
    then names the peers that never answered."""
    while unanswered(peers):
        time.sleep(interval)


def thread_caps(task_type: str, workers: int, per_worker: int | None = None, cores: int | None = None) -> dict:
    """TensorFlow thread-pool sizes so the tasks share the cores: workers split them (or take
    per_worker each), ps and chief tasks mostly wait. Never fewer than 2 inter-op threads: a worker
    with one can deadlock."""
    cores = cores or len(os.sched_getaffinity(0))
    intra = 1
    if task_type == "worker":
        intra = per_worker or max(1, cores // max(1, workers))
    return {"TF_NUM_INTRAOP_THREADS": str(intra), "TF_NUM_INTEROP_THREADS": str(max(2, intra))}


def worker_cores(index: int, per_worker: int, cores: list | None = None) -> set:
    """The cores worker `index` is pinned to: its own `per_worker` of them, wrapping around if too few."""
    cores = sorted(cores or os.sched_getaffinity(0))
    return {cores[(index * per_worker + i) % len(cores)] for i in range(per_worker)}


class CoreLocks:
    """The cores a run's pinned workers may have to themselves: one lock file per core, so that runs
    side by side (a sweep's parallel jobs) pin their workers to different cores. The operating system
    drops the locks when the launcher exits, however it exits.

    `cores` lists the cores taken (all of them, shared, when none is free); `shared` says why the
    workers must share cores, or is empty."""

    def __init__(self, wanted: int, cores=None, lock_dir: Path | None = None):
        self.wanted, self.all = wanted, sorted(cores or os.sched_getaffinity(0))
        self.lock_dir = lock_dir or Path(tempfile.gettempdir()) / "distrain-cores"
        self.cores, self.shared, self._files = [], "", []

    def __enter__(self):
        if not self.wanted:
            return self
        self.lock_dir.mkdir(exist_ok=True)
        for core in self.all:
            if len(self.cores) == self.wanted:
                break
            f = open(self.lock_dir / f"cpu{core}.lock", "w")
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # another run's workers are pinned there
                f.close()
                continue
            self._files.append(f)
            self.cores.append(core)
        if len(self.cores) < self.wanted:
            free = len(self.cores)
            self.cores = self.cores or self.all
            self.shared = (f"{self.wanted} worker core(s) wanted, {free} of {len(self.all)} free of other runs' "
                           f"pinned workers: the workers share cores {self.cores}")
        return self

    def __exit__(self, *exc):
        for f in self._files:
            f.close()  # closing drops the lock
        self._files = []


_NETWORKS: dict = {}  # PrivateNetwork.shared's, by whether isolation is on


class PrivateNetwork:
    """A network namespace of its own (loopback only) for a local cluster's tasks.

    TensorFlow's gRPC servers listen on every interface whatever the spec says, and anyone who reaches
    one can run code in it: inside the namespace, nothing outside this cluster can reach them.
    `available` is False (and `reason` says why) where the platform does not allow it.
    """

    def __init__(self, enabled: bool = True):
        self.enabled, self.available, self.reason, self._holder = enabled, False, "", None

    @classmethod
    def shared(cls, enabled: bool = True) -> "PrivateNetwork":
        """This process's network for its local clusters, made for the first, kept for the next until the
        process exits: the fork server its clusters' tasks come from lives in it (forkserver.shared)."""
        net = _NETWORKS.get(enabled)
        if net is None or (net._holder is not None and net._holder.poll() is not None):  # (a holder gone)
            net = _NETWORKS[enabled] = cls(enabled).__enter__()
            atexit.register(net.__exit__)
        return net

    def __enter__(self):
        unshare, nsenter = shutil.which("unshare"), shutil.which("nsenter")
        if not self.enabled:
            self.reason = "turned off by cluster.isolate=false"
            return self
        if not (sys.platform.startswith("linux") and unshare and nsenter):
            self.reason = "needs Linux with unshare and nsenter (util-linux)"
            return self
        self._user = os.geteuid() != 0  # without root, a user namespace grants the right to make one
        argv = [unshare, "--net", *(["--user", "--map-root-user"] if self._user else []), "--",
                sys.executable, "-m", "distrain.common.cluster", "hold-network"]
        self._holder = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True)
        line = self._holder.stdout.readline().strip()
        if line == "ready":
            self.available = True
        else:
            self.reason = (self._holder.stderr.read().strip().splitlines() or ["unshare failed"])[-1]
            self._holder.kill()
            self._holder.wait()
        return self

    def wrap(self, argv: list) -> list:
        """The command that runs argv inside the namespace (argv itself when there is none)."""
        if not self.available:
            return argv
        user = ["--user", "--preserve-credentials"] if self._user else []
        return ["nsenter", "--target", str(self._holder.pid), "--net", *user, "--", *argv]

    def __exit__(self, *exc):
        if self._holder and self._holder.poll() is None:
            self._holder.stdin.close()  # the holder exits when its stdin closes
            try:
                self._holder.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._holder.kill()
                self._holder.wait()


def _hold_network() -> None:
    """Inside a new network namespace: bring loopback up, say ready, live until stdin closes."""
    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        flags = struct.unpack("16sH", fcntl.ioctl(s, siocgifflags, struct.pack("16sH", b"lo", 0)))[1]
        fcntl.ioctl(s, siocsifflags, struct.pack("16sH", b"lo", flags | iff_up))
    print("ready", flush=True)
    sys.stdin.read()


if __name__ == "__main__" and sys.argv[1:] == ["hold-network"]:
    _hold_network()
