"""Cluster specs from every source, their one-line errors, the run's topology, and the private network (no
TensorFlow)."""
import json
import re
import socket
import subprocess
import sys
import time

import pytest

from distrain.common import cluster, placement
from distrain.common.errors import ConfigError
from distrain.common.topology import Topology
from distrain.config.validate import validate

from helpers import make_cfg

SPEC = {"chief": ["127.0.0.1:2220"], "worker": ["127.0.0.1:2221", "127.0.0.1:2222"], "ps": ["127.0.0.1:2223"]}


def test_tf_config_with_chief_workers_and_ps_is_accepted():
    text = json.dumps({"cluster": SPEC, "task": {"type": "worker", "index": 1}})
    spec, task = placement.from_tf_config(text, "parameter_server")
    assert spec == SPEC and task == cluster.Task("worker", 1, "127.0.0.1:2222")
    assert json.loads(cluster.tf_config(spec, task)) == json.loads(text)
    spec, task = placement.from_tf_config(json.dumps({"cluster": {**SPEC, "evaluator": ["127.0.0.1:2224"]},
                                                    "task": {"type": "evaluator", "index": 0}}),
                                        "parameter_server")
    assert task.name == "evaluator-0"


@pytest.mark.parametrize("text, message", [
    (None, "cluster=tf_config needs the TF_CONFIG environment variable"),
    ("{not json", "TF_CONFIG is not valid JSON"),
    (json.dumps({"cluster": SPEC}), "TF_CONFIG needs a \"cluster\" and a \"task\""),
    (json.dumps({"cluster": SPEC, "task": {"type": "worker", "index": 2}}),
     "task index 2 is outside the cluster: worker has 2 task(s), so use an index from 0 to 1"),
    (json.dumps({"cluster": SPEC, "task": {"type": "master", "index": 0}}), "task type 'master' is not in the cluster"),
    (json.dumps({"cluster": {**SPEC, "ps": ["nohost"]}, "task": {"type": "ps", "index": 0}}),
     "ps address 'nohost' is not host:port"),
    (json.dumps({"cluster": {**SPEC, "ps": ["h:99999"]}, "task": {"type": "ps", "index": 0}}), "is not host:port"),
    (json.dumps({"cluster": {"worker": SPEC["worker"]}, "task": {"type": "worker", "index": 0}}),
     "strategy=parameter_server needs at least one ps task"),
    (json.dumps({"cluster": {"worker": SPEC["worker"], "ps": SPEC["ps"]}, "task": {"type": "ps", "index": 0}}),
     "needs a chief task (the coordinator that trains)"),
    (json.dumps({"cluster": {**SPEC, "ps": SPEC["worker"][:1]}, "task": {"type": "ps", "index": 0}}),
     "address 127.0.0.1:2221 is given to two tasks"),
    (json.dumps({"cluster": {**SPEC, "master": ["h:1"]}, "task": {"type": "ps", "index": 0}}),
     "unknown task type 'master'"),
])
def test_bad_tf_config_is_one_clear_line(text, message):
    with pytest.raises(ConfigError) as err:
        placement.from_tf_config(text, "parameter_server")
    assert message in str(err.value) and "\n" not in str(err.value)


SERVED = {"worker": ["127.0.0.1:2221", "127.0.0.1:2222"], "dispatcher": ["127.0.0.1:2230"],
          "data_worker": ["127.0.0.1:2231", "127.0.0.1:2232"]}


def test_the_tf_data_service_s_tasks_are_the_cluster_s_but_never_in_tensorflow_s_spec():
    spec, task = placement.from_tf_config(json.dumps({"cluster": SERVED, "task": {"type": "worker", "index": 1}}),
                                        "multi_worker_mirrored")
    assert spec == SERVED and Topology.of(make_cfg("strategy=multi_worker_mirrored"), spec).workers == 2
    env = cluster.task_env(spec, task)  # a trainer: TensorFlow's cluster, and where the dispatcher is
    assert json.loads(env["TF_CONFIG"])["cluster"] == {"worker": SERVED["worker"]}
    assert env["DISTRAIN_DATA_SERVICE"] == "127.0.0.1:2230"
    as_data_worker = json.dumps({"cluster": SERVED, "task": {"type": "data_worker", "index": 1}})
    _, data_worker = placement.from_tf_config(as_data_worker, "multi_worker_mirrored")
    env = cluster.task_env(spec, data_worker)  # a data worker: no TF_CONFIG, its part in the service
    assert "TF_CONFIG" not in env and json.loads(env["DISTRAIN_SERVICE_TASK"]) == {
        "type": "data_worker", "index": 1, "address": "127.0.0.1:2232", "dispatcher": "127.0.0.1:2230",
        "chief": "127.0.0.1:2221"}
    assert "DISTRAIN_DATA_SERVICE" not in cluster.task_env({"worker": SERVED["worker"]}, task)  # (control: none)
    assert cluster.peers(spec, task) == {"worker-0": "127.0.0.1:2221"}  # (TensorFlow's peers alone)
    manual = make_cfg("strategy=multi_worker_mirrored", "cluster=manual", "cluster.worker_hosts=[127.0.0.1:2221,"
                      "127.0.0.1:2222]", "cluster.dispatcher_host=127.0.0.1:2230", "cluster.data_worker_hosts="
                      "[127.0.0.1:2231,127.0.0.1:2232]", "cluster.task_type=dispatcher")
    assert placement.from_manual(validate(manual).cluster, "multi_worker_mirrored") == \
        (SERVED, cluster.Task("dispatcher", 0, "127.0.0.1:2230"))
    for spec, says in (({**SERVED, "dispatcher": []}, "has 0 dispatcher(s) and 2 data_worker(s)"),
                       ({**SERVED, "data_worker": []}, "has 1 dispatcher(s) and 0 data_worker(s)"),
                       ({**SERVED, "dispatcher": ["a:1", "b:2"]}, "has 2 dispatcher(s)"),
                       ({**SERVED, "dispatcher": SERVED["worker"][:1]}, "is given to two tasks")):
        with pytest.raises(ConfigError, match=re.escape(says)):
            cluster.check_spec(spec, "multi_worker_mirrored")


def test_multi_worker_mirrored_takes_no_ps():
    with pytest.raises(ConfigError, match="takes no ps tasks"):
        cluster.check_spec(SPEC, "multi_worker_mirrored")
    assert cluster.check_spec({"worker": SPEC["worker"]}, "multi_worker_mirrored")


def test_manual_flags_build_the_same_cluster():
    cfg = make_cfg("strategy=parameter_server", "cluster=manual",
                   "cluster.worker_hosts=[127.0.0.1:2221,127.0.0.1:2222]",
                   "cluster.ps_hosts=[127.0.0.1:2223]", "cluster.chief_host=127.0.0.1:2220",
                   "cluster.task_type=ps", "cluster.task_index=0")
    validate(cfg)
    spec, task = placement.from_manual(cfg.cluster, "parameter_server")
    assert spec == SPEC and task.address == "127.0.0.1:2223"
    with pytest.raises(ConfigError, match="task index 5 is outside the cluster"):
        placement.from_manual(make_cfg("cluster=manual", "cluster.worker_hosts=[h:1]", "cluster.task_type=worker",
                                     "cluster.task_index=5").cluster, "multi_worker_mirrored")
    with pytest.raises(ConfigError, match="needs this task's role"):
        placement.from_manual(make_cfg("cluster=manual", "cluster.worker_hosts=[h:1]").cluster, "multi_worker_mirrored")
    with pytest.raises(ConfigError, match="no worker tasks"):
        placement.from_manual(make_cfg("cluster=manual").cluster, "multi_worker_mirrored")


def slurm_env(rank: int, node: str, local: int, tasks=5, nodes="n1,n2", per_node="3,2") -> dict:
    """What srun sets for one task: here 5 tasks, 3 on n1 and 2 on n2, in rank order (block)."""
    return {"SLURM_PROCID": str(rank), "SLURM_STEP_NUM_TASKS": str(tasks), "SLURM_STEP_NODELIST": nodes,
            "SLURM_STEP_TASKS_PER_NODE": per_node, "SLURMD_NODENAME": node, "SLURM_LOCALID": str(local)}


def test_slurm_ranks_become_chief_ps_and_workers_on_ports_per_node():
    cfg = make_cfg("strategy=parameter_server", "cluster=slurm", "cluster.ps=1", "cluster.evaluator=true")
    validate(cfg)
    spec, task = placement.from_slurm(cfg.cluster, "parameter_server", slurm_env(3, "n2", 0))
    assert spec == {"chief": ["n1:23456"], "ps": ["n1:23457"], "worker": ["n1:23458", "n2:23456"],
                    "evaluator": ["n2:23457"]}
    assert task == cluster.Task("worker", 1, "n2:23456")
    mwm = make_cfg("strategy=multi_worker_mirrored", "cluster=slurm").cluster
    spec, task = placement.from_slurm(mwm, "multi_worker_mirrored", slurm_env(0, "n1", 0, tasks=4, per_node="2(x2)"))
    assert spec == {"worker": ["n1:23456", "n1:23457", "n2:23456", "n2:23457"]} and task.name == "worker-0"
    assert placement.slurm_counts("2(x3),1") == [2, 2, 2, 1]
    served = validate(make_cfg("strategy=multi_worker_mirrored", "cluster=slurm", "data.service.workers=2")).cluster
    spec, task = placement.from_slurm(served, "multi_worker_mirrored", slurm_env(4, "n2", 1), service=2)
    assert spec == {"worker": ["n1:23456", "n1:23457"], "dispatcher": ["n1:23458"],
                    "data_worker": ["n2:23456", "n2:23457"]} and task == cluster.Task("data_worker", 1, "n2:23457")
    assert placement.slurm_tasks(served, "multi_worker_mirrored", 2) == 4  # (the fewest: a worker and the service)
    with pytest.raises(ConfigError, match=re.escape("a worker and 3 tasks of the tf.data service make 4 Slurm tasks; "
                                                    "this step has 3: srun -n 4 or more")):
        placement.from_slurm(served, "multi_worker_mirrored", slurm_env(0, "n1", 0, tasks=3, per_node="3", nodes="n1"),
                           service=2)


def test_slurm_gpus_are_shared_out_among_a_nodes_tasks():
    """Without a GPU here, with the variables Slurm sets: 5 tasks, 3 on n1 and 2 on n2, 4 GPUs a node."""
    gpus = {"SLURM_STEP_GPUS": "0,1,2,3"}
    assert placement.slurm_gpus({**slurm_env(3, "n2", 0), **gpus}) == {"CUDA_VISIBLE_DEVICES": "0,1"}
    assert placement.slurm_gpus({**slurm_env(4, "n2", 1), **gpus}) == {"CUDA_VISIBLE_DEVICES": "2,3"}
    assert placement.slurm_gpus({**slurm_env(2, "n1", 2), **gpus}) == {"CUDA_VISIBLE_DEVICES": "2"}  # 4 // 3 each
    assert placement.slurm_gpus({**slurm_env(2, "n1", 2), "SLURM_STEP_GPUS": "0,1"}) == {"CUDA_VISIBLE_DEVICES": "0"}
    assert placement.slurm_gpus({**slurm_env(3, "n2", 0), **gpus, "SLURM_GPUS_PER_TASK": "1"}) == {}  # Slurm's own
    assert placement.slurm_gpus(slurm_env(3, "n2", 0)) == {}  # no GPUs


@pytest.mark.parametrize("env, overrides, message", [
    ({}, [], "cluster=slurm runs as the tasks of a Slurm job step: start it with srun"),
    (slurm_env(0, "n1", 0, tasks=2, per_node="2", nodes="n1"), ["cluster.ps=1"],
     "needs at least 3 Slurm tasks (a chief, 1 ps, a worker); this step has 2"),
    (slurm_env(0, "n1", 0), ["cluster.ps=0"], "needs at least 3 Slurm tasks"),
    (slurm_env(1, "n2", 0), ["cluster.ps=1"], "not in rank order on the nodes: run srun with the default block"),
])
def test_slurm_misfits_are_one_line(env, overrides, message):
    cfg = make_cfg("strategy=parameter_server", "cluster=slurm", *overrides)
    with pytest.raises(ConfigError, match=re.escape(message)):
        placement.from_slurm(cfg.cluster, "parameter_server", env)


def test_local_spec_picks_distinct_free_loopback_ports():
    spec = cluster.local_spec("parameter_server", workers=3, ps=2)
    assert {k: len(v) for k, v in spec.items()} == {"chief": 1, "worker": 3, "ps": 2}
    addresses = [a for v in spec.values() for a in v]
    assert len(set(addresses)) == 6 and all(a.startswith("127.0.0.1:") for a in addresses)
    assert list(cluster.local_spec("multi_worker_mirrored", workers=2, ps=1)) == ["worker"]


def test_local_cluster_config_errors():
    with pytest.raises(ConfigError, match="strategy=parameter_server needs at least one ps task: set cluster.ps=1"):
        validate(make_cfg("strategy=parameter_server", "cluster.ps=0"))
    with pytest.raises(ConfigError, match="cluster.workers=0 must be a positive integer"):
        validate(make_cfg("strategy=multi_worker_mirrored", "cluster.workers=0"))
    with pytest.raises(ConfigError, match="over 3 replicas"):
        validate(make_cfg("strategy=multi_worker_mirrored", "cluster.workers=3"))


def test_port_in_use_is_named():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(ConfigError, match=f"port {port} of ps:0 .* is already in use"):
            cluster.check_port_free(cluster.Task("ps", 0, f"127.0.0.1:{port}"))
    cluster.check_port_free(cluster.Task("ps", 0, f"127.0.0.1:{port}"))  # free again


def test_thread_caps_share_the_cores_and_never_starve_inter_op():
    assert cluster.thread_caps("worker", 2, cores=2) == {"TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "2"}
    assert cluster.thread_caps("worker", 1, cores=8)["TF_NUM_INTRAOP_THREADS"] == "8"
    assert cluster.thread_caps("worker", 4, cores=8)["TF_NUM_INTRAOP_THREADS"] == "2"
    assert cluster.thread_caps("worker", 2, per_worker=3, cores=2)["TF_NUM_INTRAOP_THREADS"] == "3"
    assert cluster.thread_caps("ps", 4, cores=2) == {"TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "2"}


@pytest.mark.slow
def test_private_network_hides_servers_from_the_host():
    """A server inside listens on every interface, yet from here its port is closed."""
    with cluster.PrivateNetwork() as net:
        if not net.available:
            pytest.skip(f"no private network on this platform: {net.reason}")
        server = ("import socket, sys; s = socket.socket(); s.bind(('0.0.0.0', 0)); s.listen();"
                  "print(s.getsockname()[1], flush=True);"
                  "c = socket.create_connection(('127.0.0.1', s.getsockname()[1]), timeout=5);"
                  "print('inside ok', flush=True); sys.stdin.read()")
        proc = subprocess.Popen(net.wrap([sys.executable, "-c", server]), stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
        try:
            port = int(proc.stdout.readline())
            assert proc.stdout.readline().strip() == "inside ok"  # loopback works inside
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection(("127.0.0.1", port), timeout=5).close()
        finally:
            proc.stdin.close()
            proc.wait(timeout=10)
    assert net._holder.poll() is not None  # the namespace's holder is gone with the block


def test_private_network_can_be_turned_off():
    with cluster.PrivateNetwork(enabled=False) as net:
        assert not net.available and "cluster.isolate=false" in net.reason
        assert net.wrap(["x"]) == ["x"]


def test_pinned_workers_get_cores_of_their_own():
    assert [cluster.worker_cores(i, 1, cores=[0, 1]) for i in range(3)] == [{0}, {1}, {0}]
    assert [cluster.worker_cores(i, 2, cores=[0, 1, 2, 3]) for i in range(2)] == [{0, 1}, {2, 3}]


def test_tasks_start_the_usual_way_when_the_fork_server_cannot(tmp_path, caplog):
    """A fork server that dies at start (its imports failed): the task runs its own command instead,
    and the launcher says so, naming the server's log."""
    from distrain.common.rundir import RunDir
    from distrain.launcher.forkserver import ForkServer
    from distrain.launcher.supervisor import TaskProcess

    broken = [sys.executable, "-c", "import sys; sys.exit('ImportError: no tensorflow here')"]
    with ForkServer(tmp_path / "config.yaml", tmp_path / "logs" / "forkserver.log", wrap=lambda _: broken) as forks:
        task = TaskProcess("train", [sys.executable, "-c", "print('started on its own')"], forks=forks)
        task.start(RunDir(tmp_path), prefix=None)
        assert task.proc.wait(timeout=30) == 0
    assert isinstance(task.proc, subprocess.Popen)  # the control: not a forked Child
    task.pump.join(timeout=5)
    assert (tmp_path / "logs" / "train.log").read_text() == "started on its own\n"
    assert "no tensorflow here" in (tmp_path / "logs" / "forkserver.log").read_text()
    assert "tasks start without TensorFlow imported in advance (no fork server: the fork server exited" in caplog.text


def _free_ports(n):
    import portpicker
    return [portpicker.pick_unused_port() for _ in range(n)]


@pytest.mark.slow
@pytest.mark.parametrize("role", ["mwms-worker", "ps-chief"])
def test_a_task_whose_peers_never_come_fails_in_bounded_time_naming_them(tmp_path, role):
    """cluster=manual: a multi_worker_mirrored worker whose peer never starts, and a parameter-server
    chief whose ps and worker are down, stop after cluster.startup_timeout naming the silent peers."""
    from helpers import assert_nothing_left, run_cli

    a, b, c = (f"127.0.0.1:{p}" for p in _free_ports(3))
    if role == "mwms-worker":
        args = ["strategy=multi_worker_mirrored", f"cluster.worker_hosts=[{a},{b}]", "cluster.task_type=worker"]
        silent = [f"worker-1 ({b}"]
    else:
        args = ["strategy=parameter_server", f"cluster.worker_hosts=[{a}]", f"cluster.ps_hosts=[{b}]",
                f"cluster.chief_host={c}", "cluster.task_type=chief"]
        silent = [f"worker-0 ({a}", f"ps-0 ({b}"]
    started = time.monotonic()
    out = run_cli(tmp_path / "run", "cluster=manual", *args, "cluster.startup_timeout=4", "data=synthetic",
                  timeout=120)
    seconds = time.monotonic() - started
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert out.returncode == 1 and len(errors) == 1, out.stderr[-3000:]
    assert "did not come up within 4 s (cluster.startup_timeout): no answer from" in errors[0]
    assert all(peer in errors[0] for peer in silent), errors[0]
    assert "Traceback" not in out.stdout + out.stderr
    assert 4 <= seconds < 4 + 12, seconds  # the timeout, then a prompt stop (SIGKILL: nothing to save yet)
    assert_nothing_left(tmp_path)


def test_tensorflow_errors_of_a_cluster_are_one_line_for_the_launcher():
    """task.lost_peer: errors that say another task of the cluster died or failed the step become
    PeerLost (one line; the launcher restarts the cluster where its budget allows), others stay."""
    import tensorflow as tf
    from omegaconf import OmegaConf

    from distrain.task.failures import lost_peer

    cfg = OmegaConf.create({"cluster": {"peer_timeout": 30}})
    remote = ("2 root error(s) found.\n  (0) INTERNAL: {{function_node __wrapped__Identity_device_/job:chief/replica:0/"
              "task:0/device:CPU:0}} Unable to parse request\nAdditional GRPC error information from remote target "
              "/job:worker/replica:0/task:1/device:CPU:0 while calling "
              "/tensorflow.eager.EagerService/RunComponentFunction")
    assert str(lost_peer(tf.errors.InternalError(None, None, remote), cfg)) == \
        "a task of the cluster failed mid-training (Unable to parse request)"
    assert str(lost_peer(tf.errors.UnavailableError(None, None, "Socket closed"), cfg)) == \
        "a task of the cluster was lost mid-training (Socket closed)"
    assert str(lost_peer(tf.errors.UnavailableError(None, None, "Socket closed"), cfg, "while computing the outputs")) \
        == "a task of the cluster was lost while computing the outputs (Socket closed)"  # (evaluate, predict)
    assert lost_peer(tf.errors.InternalError(None, None, "a bug of this task's own"), cfg) is None  # control
    assert lost_peer(ValueError("not TensorFlow's"), cfg) is None


@pytest.mark.parametrize("overrides, expected", [
    ([], Topology()),
    (["strategy=mirrored"], Topology()),
    (["strategy=multi_worker_mirrored", "cluster.workers=4"], Topology(False, True, True, 4, 0)),
    (["strategy=parameter_server", "cluster.workers=2", "cluster.ps=2"], Topology(True, True, True, 2, 2)),
    (["strategy=multi_worker_mirrored", "cluster=tf_config"], Topology(False, True, False, None, 0)),
])
def test_the_topology_is_decided_once_from_the_config(overrides, expected):
    topology = Topology.of(validate(make_cfg(*overrides)))
    assert topology == expected
    assert topology.synchronous != topology.parameter_servers


def test_a_tasks_topology_comes_from_its_cluster():
    ps = make_cfg("strategy=parameter_server")
    here = {"chief": ["127.0.0.1:1"], "ps": ["localhost:2"], "worker": ["[::1]:3", "127.0.0.1:4"]}
    assert Topology.of(ps, here) == Topology(True, True, True, 2, 1)  # the chief coordinates: 2 train
    assert not Topology.of(ps, {**here, "worker": ["node7:3"]}).local  # the control: a worker elsewhere
    mwms = make_cfg("strategy=multi_worker_mirrored")
    assert Topology.of(mwms, {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2", "127.0.0.1:3"]}).workers == 3
    assert Topology.of(mwms, {}) == Topology()  # a process alone (a test's in-process run)


@pytest.mark.parametrize("task, job, role", [
    (None, None, "train"), (None, {"parts": []}, "compute parts"),
    (("worker", 0), None, "serve"), (("ps", 0), {"parts": []}, "serve"), (("chief", 0), None, "train"),
    (("chief", 0), {"parts": []}, "compute parts"), (("evaluator", 0), None, "evaluate checkpoints"),
])
def test_a_task_process_has_one_role_by_its_place_and_its_job(task, job, role):
    """task.main's one entry point: what a task does, from where it stands (under parameter servers, or a
    process alone) and whether evaluate or predict gave it parts (job.json)."""
    from types import SimpleNamespace

    from distrain.task.main import role as role_of

    context = SimpleNamespace(task=cluster.Task(*task, "127.0.0.1:1") if task else None,
                              topology=Topology(parameter_servers=task is not None, clustered=task is not None))
    assert role_of(context, job) == role


def test_servers_end_with_their_chief_on_slurm_and_under_evaluate_elsewhere():
    """A training's servers on a manual cluster serve chiefs in turn; evaluate's end with its command."""
    from distrain.task.main import serves_until_chief_gone

    manual = make_cfg("strategy=parameter_server", "cluster=manual", "cluster.ps_hosts=[10.0.0.1:2222]",
                      "cluster.worker_hosts=[10.0.0.2:2222]", "cluster.chief_host=10.0.0.3:2222")
    slurm, local = make_cfg("strategy=parameter_server", "cluster=slurm"), make_cfg("strategy=parameter_server")
    assert [serves_until_chief_gone(cfg, job) for cfg in (manual, slurm, local) for job in (None, {})] == [
        False, True, True, True, False, False]
