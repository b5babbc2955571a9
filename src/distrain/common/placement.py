"""Where this process's task is in a cluster spread over machines: TF_CONFIG (as Kubeflow, Vertex AI or
Ray set it), the classic flags (cluster=manual), or the variables srun sets (cluster=slurm, one process
per Slurm task, roles by rank), each checked into a cluster spec (cluster.check_spec) and this task.
No TensorFlow here: the launcher and the tasks both use it.
"""
import json
import os
import subprocess

from distrain.common.cluster import Task, check_spec, check_task
from distrain.common.errors import ConfigError
from distrain.common.topology import PS


def this_task(cluster, strategy: str, service: int = 0) -> tuple[dict, Task]:
    """The cluster and this process's task in it, on a cluster spread over machines (cluster.name); on
    Slurm, with `service` data workers of a tf.data service and their dispatcher."""
    if cluster.name == "slurm":
        return from_slurm(cluster, strategy, service=service)
    if cluster.name == "manual":
        return from_manual(cluster, strategy)
    return from_tf_config(os.environ.get("TF_CONFIG"), strategy)


def from_tf_config(text, strategy: str) -> tuple[dict, Task]:
    """The cluster and this task from a TF_CONFIG value (as Kubeflow, Vertex AI or Ray set it)."""
    if not text:
        raise ConfigError("cluster=tf_config needs the TF_CONFIG environment variable: "
                          "set it to {\"cluster\": {...}, \"task\": {\"type\": ..., \"index\": ...}}")
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"TF_CONFIG is not valid JSON ({exc}): fix the environment variable") from None
    if not isinstance(parsed, dict) or not isinstance(parsed.get("task"), dict) or "cluster" not in parsed:
        raise ConfigError("TF_CONFIG needs a \"cluster\" and a \"task\" ({\"type\": ..., \"index\": ...}): "
                          "fix the environment variable")
    spec = check_spec(parsed["cluster"], strategy)
    return spec, check_task(spec, parsed["task"].get("type"), parsed["task"].get("index", 0))


def from_manual(cluster, strategy: str) -> tuple[dict, Task]:
    """The classic flags: worker_hosts, ps_hosts (and chief_host), task_type, task_index."""
    spec = {"worker": list(cluster.worker_hosts or [])}
    if cluster.ps_hosts:
        spec["ps"] = list(cluster.ps_hosts)
    if cluster.chief_host:
        spec["chief"] = [cluster.chief_host]
    if cluster.get("dispatcher_host"):
        spec["dispatcher"] = [cluster.dispatcher_host]
    if cluster.get("data_worker_hosts"):
        spec["data_worker"] = list(cluster.data_worker_hosts)
    spec = check_spec(spec, strategy)
    if cluster.task_type is None:
        raise ConfigError("cluster=manual needs this task's role: set cluster.task_type=worker|ps|chief "
                          "and cluster.task_index=N")
    return spec, check_task(spec, cluster.task_type, cluster.task_index)


def from_slurm(cluster, strategy: str, env=os.environ, service: int = 0) -> tuple[dict, Task]:
    """The cluster and this task from the variables srun sets, one process per Slurm task. Ranks are
    laid on the nodes in order (Slurm's default block distribution); a task's port is
    cluster.port_base + 100 x (job id mod 200) + its place on its node. Roles go by rank: multi_worker_mirrored, all
    workers; parameter_server, the chief, then cluster.ps ps tasks, then the workers; an evaluator, then a
    tf.data service's dispatcher and `service` data workers (data.service.workers) last."""
    if "SLURM_PROCID" not in env or "SLURM_STEP_NODELIST" not in env:
        raise ConfigError("cluster=slurm runs as the tasks of a Slurm job step: start it with srun, e.g. "
                          "srun -n 2 python train.py strategy=multi_worker_mirrored cluster=slurm")
    rank, ntasks = int(env["SLURM_PROCID"]), int(env.get("SLURM_STEP_NUM_TASKS") or env["SLURM_NTASKS"])
    nodes = slurm_hostnames(env["SLURM_STEP_NODELIST"])
    base = cluster.port_base + 100 * (int(env.get("SLURM_JOB_ID", 0)) % 200)  # jobs sharing a node: other ports
    addresses = [f"{node}:{base + i}"
                 for node, n in zip(nodes, slurm_counts(env["SLURM_STEP_TASKS_PER_NODE"])) for i in range(n)]
    mine = f"{env.get('SLURMD_NODENAME', nodes[0])}:{base + int(env.get('SLURM_LOCALID', 0))}"
    if len(addresses) != ntasks or addresses[rank] != mine:
        raise ConfigError(f"Slurm placed task {rank} as {mine}, not in rank order on the nodes: run srun with "
                          "the default block distribution (srun -m block)")
    evaluators = 1 if cluster.evaluator else 0
    served = ["dispatcher"] + ["data_worker"] * service if service else []
    need = slurm_tasks(cluster, strategy, service)
    if cluster.workers and ntasks != need:
        raise ConfigError(f"cluster.workers={cluster.workers} makes {need} Slurm tasks with the others, but this "
                          f"step has {ntasks}: srun -n {need}, or drop cluster.workers to use every task")
    if strategy == PS:
        if cluster.ps < 1 or ntasks < need:
            roles = f"a chief, {max(cluster.ps, 1)} ps, a worker" + (", an evaluator" if evaluators else "") + \
                (f", a dispatcher, {service} data worker(s)" if service else "")
            raise ConfigError(f"strategy=parameter_server with cluster.ps={cluster.ps} needs at least {need} Slurm "
                              f"tasks ({roles}); this step has {ntasks}: set cluster.ps=1 or more, and srun -n "
                              f"{need} or more")
        roles = ["chief"] + ["ps"] * cluster.ps + ["worker"] * (ntasks - 1 - cluster.ps - evaluators - len(served))
    else:
        if cluster.ps:
            raise ConfigError(f"strategy={strategy} takes no ps tasks: drop cluster.ps={cluster.ps} "
                              "or use strategy=parameter_server")
        if ntasks < need:
            besides = " and ".join((["an evaluator (cluster.evaluator=true)"] if evaluators else []) +
                                   ([f"{len(served)} tasks of the tf.data service"] if served else []))
            raise ConfigError(f"a worker and {besides} make {need} Slurm tasks; this step has {ntasks}: srun -n "
                              f"{need} or more")
        roles = ["worker"] * (ntasks - evaluators - len(served))
    roles += ["evaluator"] * evaluators + served
    spec = {}
    for role, address in zip(roles, addresses):
        spec.setdefault(role, []).append(address)
    spec = check_spec(spec, strategy)
    return spec, Task(roles[rank], roles[:rank].count(roles[rank]), addresses[rank])


def slurm_gpus(env=os.environ) -> dict:
    """This Slurm task's share of its node's GPUs, as CUDA_VISIBLE_DEVICES: Slurm gives every task of a
    node all of the node's GPUs (--gres=gpu:N) unless asked per task (--gpus-per-task, which sets
    CUDA_VISIBLE_DEVICES itself), and two TensorFlow tasks on one GPU would fight over its memory.
    Empty when Slurm gave no GPUs, or gave them per task already."""
    gpus = [g for g in (env.get("SLURM_STEP_GPUS") or env.get("SLURM_JOB_GPUS") or "").split(",") if g]
    if not gpus or env.get("SLURM_GPUS_PER_TASK"):
        return {}
    nodes = slurm_hostnames(env["SLURM_STEP_NODELIST"])
    here = dict(zip(nodes, slurm_counts(env["SLURM_STEP_TASKS_PER_NODE"])))[env.get("SLURMD_NODENAME", nodes[0])]
    local, share = int(env.get("SLURM_LOCALID", 0)), max(1, len(gpus) // here)
    mine = gpus[local * share:(local + 1) * share] if len(gpus) >= here else [gpus[local % len(gpus)]]
    return {"CUDA_VISIBLE_DEVICES": ",".join(mine)}


def slurm_tasks(cluster, strategy: str, service: int = 0) -> int:
    """The Slurm tasks a run of cluster=slurm takes, given cluster.workers (else the fewest it can) and the
    data workers of its tf.data service (with their dispatcher)."""
    workers = cluster.workers or 1
    chief_and_ps = 1 + max(cluster.ps, 1) if strategy == PS else 0
    return chief_and_ps + workers + (1 if cluster.evaluator else 0) + (service + 1 if service else 0)


def slurm_hostnames(nodelist: str) -> list[str]:
    """Slurm's compressed node list (node[01-03],gpu7) as host names, by Slurm's own scontrol."""
    if "[" not in nodelist:
        return nodelist.split(",")
    try:
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True,
                             timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise ConfigError(f"cannot expand Slurm's node list {nodelist!r} ({exc}): run on a node with "
                          "scontrol") from None
    return out.split()


def slurm_counts(tasks_per_node: str) -> list[int]:
    """SLURM_STEP_TASKS_PER_NODE, e.g. '2(x3),1', as one count per node: [2, 2, 2, 1]."""
    counts = []
    for part in tasks_per_node.split(","):
        count, _, times = part.partition("(x")
        counts += [int(count)] * int(times.rstrip(")") or 1)
    return counts
