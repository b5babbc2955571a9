"""Local multi-process clusters: sync (multi_worker_mirrored) and async (parameter_server) training.

Every test is bounded in time and checks that no process it caused is left behind.
"""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import portpicker
import pytest
import tensorflow as tf
import tf_keras as keras

from distrain.data import arrays
from distrain.launcher import memory
from distrain.launcher.supervisor import STOP_GRACE_SECONDS
from distrain.task.training import train

from helpers import (
    TRAIN_PY,
    assert_nothing_left,
    check_evaluations,
    ctrl_c_servers,
    finish,
    kill_in_epoch_2,
    kill_task,
    make_cfg,
    reap,
    run_cli,
    start,
    task_state,
    tensorboard_values,
    to_the_launcher,
    untimed,
    wait_until,
    while_running,
    write_idx,
)

pytestmark = pytest.mark.slow  # every test starts a cluster of processes

BUNDLED_ONE_EPOCH = ["data.source=bundled", "trainer.epochs=1", "trainer.verbose=2", "trainer.save_model=false",
                     "model=mlp"]


SYNTHETIC_THREE_EPOCHS = ["data=synthetic", "data.train_examples=1024", "data.test_examples=256", "trainer.epochs=3",
                          "trainer.verbose=2", "model=mlp"]  # 1024 // 128 = 8 steps an epoch


# multi_worker_mirrored's cluster learning (with XLA, a sidecar evaluator and oneDNN off, on files each
# worker reads its own): test_files.


def test_parameter_server_one_ps_two_workers_learn(tmp_path):
    """...from IDX files, which each worker reads itself, and with a sidecar evaluator."""
    (x_train, y_train), (x_test, y_test) = arrays.load(make_cfg(*SYNTHETIC_THREE_EPOCHS[:3]).data, 42)
    for split, images, labels in (("train", x_train, y_train), ("t10k", x_test, y_test)):
        write_idx(tmp_path / "idx" / f"{split}-images-idx3-ubyte", images, compress=True)
        write_idx(tmp_path / "idx" / f"{split}-labels-idx1-ubyte", labels, compress=True)
    run_dir = tmp_path / "run"
    out = run_cli(run_dir, "strategy=parameter_server", "cluster.workers=2", "cluster.ps=1", "cluster.evaluator=true",
                  *SYNTHETIC_THREE_EPOCHS[3:], "data.source=idx", f"data.path={tmp_path / 'idx'}",
                  "trainer.batch_size=64", "trainer.tensorboard=true", "trainer.profile=[20,30]", "trainer.epochs=4")
    assert out.returncode == 0, out.stdout[-4000:]
    # The profiler: the coordinator's trace, and each worker's, asked of its server.
    traces = sorted(p.parent.parent.parent.parent.name
                    for p in (run_dir / "tensorboard").glob("*/plugins/profile/*/*.xplane.pb"))
    workers = list((run_dir / "tensorboard" / "workers").glob("plugins/profile/*/*.xplane.pb"))
    assert traces == ["chief-0", "workers", "workers"] and len(workers) == 2, traces
    results = json.loads((run_dir / "results.json").read_text())
    assert (results["num_workers"], results["num_ps"]) == (2, 1)
    assert results["data_source"] == "idx" and results["train_examples"] == 1024
    # It learned: asynchronous steps on 2 cores beside other tests vary too much for an accuracy bound (at 48
    # steps it ranged from 0.21 to 0.97), but the mean loss of the last epoch is below the first's, which
    # starts from an untrained model. (How well such runs learn: the synchronous tests, seeded and exact.)
    loss = results["history"]["loss"]
    assert len(loss) == 4 and loss[-1] < loss[0], results["history"]
    steps = results["worker_steps"]
    assert set(steps) == {"0", "1"} and all(n > 0 for n in steps.values())  # both workers trained
    assert sum(steps.values()) == results["global_steps"]  # every step updated the ps variables once
    # TensorBoard: each worker's steps per epoch, and the run as a session of the HParams dashboard.
    scalars = tensorboard_values(run_dir / "tensorboard" / "train")
    assert [sum(scalars[f"epoch_steps_worker_{i}"]) for i in (0, 1)] == [steps["0"], steps["1"]]
    assert len(scalars["epoch_steps_worker_0"]) == 4
    session = tensorboard_values(run_dir / "tensorboard")
    hparams = session["_hparams_/session_start_info"][0].hparams
    assert (hparams["strategy"].string_value, hparams["workers"].number_value, hparams["ps"].number_value) == (
        "parameter_server", 2, 1)
    assert hparams["data.source"].string_value == "idx"  # what the command line chose
    assert session["test_accuracy"] == [pytest.approx(results["test_accuracy"])]
    chief_log = (run_dir / "logs" / "chief-0.log").read_text()
    assert "variable placement over 1 ps task(s):" in chief_log
    assert "dense/kernel:0" in chief_log and "ps:0" in chief_log
    assert "Epoch 4/4 - global step" in chief_log and "worker 0:" in chief_log and "worker 1:" in chief_log
    # (and forkserver.log where this process's first local cluster ran: test_sweep)
    assert sorted(p.name for p in (run_dir / "logs").iterdir() if p.name != "forkserver.log") == [
        "chief-0.log", "evaluator-0.log", "ps-0.log", "worker-0.log", "worker-1.log"]
    # Where the start-up went: each task's time to its "ready" line, then the first step. (Not ordered
    # across tasks: the launcher times a line as it reads it, and a server says so just after it starts
    # listening, so the coordinator may connect and say so first: seen once, 2.83 s against the ps's 2.95.)
    ready = {t["name"]: t["seconds_to_ready"] for t in json.loads((run_dir / "cluster.json").read_text())["tasks"]}
    assert all(ready[name] > 0 for name in ("ps-0", "worker-0", "worker-1", "chief-0")), ready
    assert ready["chief-0"] < results["seconds_to_first_step"]  # (the data and the step's tracing come between)
    check_evaluations(run_dir, out.stdout, last="ckpt-64", epoch=4)
    assert_nothing_left(run_dir)


def check_forked(run_dir):
    """Every task of the running cluster is a child of the run's fork server (TensorFlow imported
    once), in a process group of its own (the launcher signals it as a whole), on the cores
    cluster.json gives it."""
    parents = set()
    for task in json.loads((run_dir / "cluster.json").read_text())["tasks"]:
        state = Path(f"/proc/{task['pid']}/stat").read_text().rpartition(")")[2].split()
        parents.add(int(state[1]))
        assert int(state[2]) == task["pid"], task  # its process group
        if task["cores"]:
            assert os.sched_getaffinity(task["pid"]) == set(task["cores"]), task
    (server,) = parents
    assert Path(f"/proc/{server}/cmdline").read_bytes().split(b"\0")[1:4] == [b"-m", b"distrain.launcher.forkserver",
                                                                              b"(shared)"]


def test_parameter_server_workers_are_restarted_within_their_budget_then_leave_then_restart_the_cluster(
        tmp_path, monkeypatch):
    """cluster.max_restarts=1 within cluster.restart_window=6 s, two workers. Each lost in turn (0, then 1
    once 0 is back, as losses spread over time are) is restarted on its own address and trains again.
    Worker 0 lost once its restart is older than the window is restarted again; lost again at once, it is
    past its budget and leaves the run, which goes on with worker 1 (its steps grow, worker 0's do not).
    Worker 1 lost next cannot rejoin alone with worker 0 gone: the cluster restarts from its latest
    checkpoint, every worker in it. Ctrl-C then ends it all."""
    run_dir, tmp, window = tmp_path / "run", tmp_path / "tmp", 6  # (its last restart trains again within it)
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))  # this run's temporary files, apart from other runs'
    chief_log = run_dir / "logs" / "chief-0.log"
    logs = [run_dir / "logs" / f"worker-{i}.log" for i in range(2)]
    epochs = lambda: re.findall(r"\(worker 0: (\d+), worker 1: (\d+)\)",
                                chief_log.read_text())
    restarts = lambda: json.loads((run_dir / "cluster.json").read_text())["restarts"]
    seen = {}

    def chaos(run):
        def trains_again(i):
            lost = int(epochs()[-1][i])
            wait_until(lambda: int(epochs()[-1][i]) > lost + 8, run, f"worker {i} to train again")

        def restarted_longer_ago_than_the_window(i):
            last = [r["time"] for r in restarts() if r["task"] == f"worker-{i}"][-1]
            wait_until(lambda: time.time() > last + window + 0.5, run, f"worker {i}'s restart to leave the window")

        try:
            wait_until(lambda: chief_log.exists() and len(epochs()) >= 2, run, "epoch 2")
            seen["scratch"] = scratch = list(tmp.glob("distrain-scratch-*/distrain-data-*/train-*"))
            assert len(scratch) == 2  # the control: while it runs, the workers read the synthetic data from there
            cluster = json.loads((run_dir / "cluster.json").read_text())
            if cluster["network"] == "private network namespace":  # where the platform allows one
                for address in [a for addresses in cluster["cluster"].values() for a in addresses]:
                    host, port = address.split(":")
                    with pytest.raises(ConnectionRefusedError):  # the servers are unreachable from outside
                        socket.create_connection((host, int(port)), timeout=5).close()
            for i in range(2):
                kill_task(run_dir, f"worker-{i}")
                wait_until(lambda i=i: "--- restart 1 ---" in logs[i].read_text(), run, f"worker {i}'s restart")
                trains_again(i)
            check_forked(run_dir)  # the restarted workers too
            restarted_longer_ago_than_the_window(0)
            kill_task(run_dir, "worker-0")  # its restart is older than the window: restarted again
            wait_until(lambda: task_state(run_dir, "worker-0")["restarts"] == 2, run, "worker 0's second restart")
            # Not while the coordinator takes it back: a worker lost during TensorFlow's cluster update leaves
            # that update failed, and the coordinator then never schedules on the workers it was taking back.
            trains_again(0)
            kill_task(run_dir, "worker-0")  # (its new pid) within the window of the last: past its budget
            wait_until(lambda: len(restarts()) == 4, run, "worker 0 to leave")
            since = len(epochs())
            wait_until(lambda: len(epochs()) > since, run, "an epoch without worker 0")
            first = [int(n) for n in epochs()[since]]

            def grew():
                return next(([int(n) for n in e] for e in epochs()[since + 1:] if int(e[1]) > first[1]), None)
            wait_until(grew, run, "worker 1 to train on without worker 0")
            seen["left"] = [first, grew()]
            restarted_longer_ago_than_the_window(1)
            kill_task(run_dir, "worker-1")
            lost = time.monotonic()
            wait_until(lambda: "--- restart 1 ---" in chief_log.read_text(), run, "the cluster's restart")
            # With no worker left the chief cannot finish its step: it is not given the grace period to.
            assert time.monotonic() - lost < STOP_GRACE_SECONDS
            wait_until(lambda: "Epoch 2/1000" in chief_log.read_text().partition("--- restart 1 ---")[2], run,
                       "the restarted cluster's epoch 2")
            seen["everyone"] = [int(n) for n in epochs()[-1]]
        finally:
            to_the_launcher(signal.SIGINT, run)  # (also when a check above failed: no waiting for 1000 epochs)
    code, out = while_running(run_dir, "strategy=parameter_server", "cluster.workers=2", "cluster.ps=1",
                              "data=synthetic", "data.train_examples=2048", "trainer.epochs=1000",
                              "trainer.batch_size=32", "trainer.save_model=false", "trainer.verbose=2",
                              "cluster.max_restarts=1", f"cluster.restart_window={window}", "model=mlp", chaos=chaos)
    left, everyone = seen["left"], seen["everyone"]
    assert code == 130 and "Traceback" not in out, out[-4000:]
    for i, times in ((0, 2), (1, 1)):
        assert out.count(f"task worker-{i} was killed by SIGKILL (signal 9): restarting it on its own address "
                         f"(restart 1 of 1 "
                         f"within {window} s (cluster.restart_window), cluster.max_restarts)") == times
    assert (f"task worker-0 was killed by SIGKILL (signal 9) and worker-0 was restarted 1 time(s) already within "
            f"{window} s "
            "(cluster.restart_window) (cluster.max_restarts=1): it leaves the run, which goes on with 1 worker(s)"
            ) in out
    assert left[1][0] == left[0][0] and left[1][1] > left[0][1]
    assert ("task worker-1 was killed by SIGKILL (signal 9) (worker-0 left the run, and TensorFlow's coordinator "
            "takes a worker "
            "back only once every worker answers): restarting the cluster from its latest checkpoint (restart 1 of 1 "
            f"within {window} s (cluster.restart_window), cluster.max_restarts)") in out
    assert all(n > 0 for n in everyone)  # the restarted cluster trains on every worker, worker 0 too
    done = [(r["task"], r["restarted"]) for r in untimed(restarts())]
    assert done[:5] == [
        ("worker-0", "it on its own address"), ("worker-1", "it on its own address"),
        ("worker-0", "it on its own address"), ("worker-0", "no: it left the run"),
        ("worker-1", "the cluster from its latest checkpoint")]
    # (Once, on a slow machine, the restarted cluster's first step failed inside TensorFlow: a request
    # between two tasks arrived corrupt. The chief says so in one line and the launcher restarts the
    # cluster again, as its budget allows; nothing else may follow.)
    assert all(r == ("chief-0", "the cluster from its latest checkpoint") for r in done[5:]), done
    assert "Failed to connect" not in out  # the coordinator's retries stay in its log
    assert "ERROR:tensorflow" not in out and "ERROR:tensorflow" in chief_log.read_text()  # (the control)
    assert_nothing_left(run_dir)
    assert not [p for p in seen["scratch"] if p.exists()]  # ...and they went with the run


def test_a_parameter_server_worker_with_no_restart_left_leaves_and_the_run_ends_without_it(tmp_path):
    """cluster.max_restarts=0: worker 1 lost leaves the run at once; worker 0 trains to the end, the run
    learns, and results.json says who left and how many workers there were at the end. (6 epochs: worker 1
    dies in epoch 3, once epoch 2's line is out, so epochs 4-6 are worker 0's alone and it runs more steps
    than worker 1 however the others were shared; with 3, a worker 0 slowed by the machine ran 96 to
    worker 1's 96.)"""
    run_dir = tmp_path / "run"
    code, out = while_running(run_dir, "strategy=parameter_server", "cluster.workers=2", "cluster.ps=1",
                              "data=synthetic", "data.train_examples=2048", "trainer.epochs=6", "trainer.batch_size=32",
                              "trainer.verbose=2", "trainer.save_model=false", "cluster.max_restarts=0", "model=mlp",
                              chaos=kill_in_epoch_2(run_dir / "logs" / "chief-0.log", run_dir, "worker-1"))
    assert code == 0, out[-4000:]
    assert "task worker-1 was killed by SIGKILL (signal 9): it leaves the run, which goes on with 1 worker(s)" in out
    results = json.loads((run_dir / "results.json").read_text())
    loss = results["history"]["loss"]
    assert len(loss) == 6 and loss[-1] < loss[0], loss  # it learned (no accuracy bound on async steps: above)
    assert untimed(results["task_restarts"]) == [{"task": "worker-1", "exit_status": -9, "budget": "worker-1",
                                                  "restarted": "no: it left the run"}]
    assert (results["workers_left_the_run"], results["final_num_workers"]) == (["worker-1"], 1)
    steps = results["worker_steps"]
    # (Not summing to global_steps: the coordinator runs again elsewhere the steps a lost worker had in
    # flight, which may have updated the variables already: at least once, as TensorFlow documents.)
    assert steps["0"] > steps["1"] > 0
    assert_nothing_left(run_dir)


@pytest.mark.parametrize("strategy, says", [
    ("multi_worker_mirrored", "[worker-0] error: worker 1 stopped answering for 5 s (cluster.peer_timeout)"),
    ("parameter_server", "error: task chief-0 made no progress for 5 s (cluster.peer_timeout)")])
def test_a_hung_task_ends_the_run_within_the_peer_timeout(tmp_path, strategy, says):
    """Before that, at half the timeout, the stall is explained: every live task's stacks go into its log,
    and one line names the task that stopped answering and where the others wait. `distrain stacks`
    shows the same while the run goes on; each task's peak memory is the kernel's (/proc)."""
    run_dir = tmp_path / "run"
    trains = "chief-0" if strategy == "parameter_server" else "worker-0"
    log = run_dir / "logs" / f"{trains}.log"
    then = {}

    def chaos(run):
        wait_until(lambda: log.exists() and "Epoch 2/50" in log.read_text(), run, "epoch 2")
        then["asked"] = subprocess.run([sys.executable, str(TRAIN_PY), "stacks", str(run_dir)], capture_output=True,
                                       text=True, timeout=30)
        seen = memory.resident_mib(task_state(run_dir, trains)["pid"])
        assert seen, f"{trains} gone after distrain stacks: {task_state(run_dir, trains)}\n{log.read_text()[-3000:]}"
        then["peak"] = seen[0]
        kill_task(run_dir, "worker-1", signal.SIGSTOP)  # alive, but it never answers again
        then["hung"] = time.monotonic()
    code, out = while_running(run_dir, f"strategy={strategy}", "cluster.workers=2", "cluster.ps=1", "data=synthetic",
                              "data.train_examples=1024", "data.test_examples=256", "trainer.epochs=50",
                              "trainer.batch_size=32", "trainer.verbose=2", "cluster.peer_timeout=5",
                              "cluster.max_restarts=0", "model=mlp", chaos=chaos)  # 32 steps an epoch
    asked, peak_then = then["asked"], then["peak"]
    assert code == 1, out[-3000:]
    assert time.monotonic() - then["hung"] < 5 + 20  # detection, then the stopped task is stopped for good
    assert says in out and "Traceback" not in out, out[-3000:]
    assert asked.returncode == 0 and f"--- {trains} (step " in asked.stdout, asked.stdout + asked.stderr
    assert re.search(r'File ".*distrain/task/(runners|checkpoints|training)\.py", line \d+ in ', asked.stdout), \
        asked.stdout
    waits = (r"chief-0 is (waiting for the workers' steps|saving a checkpoint) at step \d+" if strategy ==
             "parameter_server" else r"worker-0 waits in (a training step \(the gradients'|the epoch's) all-reduce"
             r".* at step \d+")
    stalled = re.search(r"stalled: worker-1 stopped answering(?: at step \d+)?; .*", out)
    assert stalled and re.search(waits, stalled.group(0)), out[-3000:]
    assert "Python stacks at" in log.read_text() and "(no answer" in (run_dir / "logs" / "worker-1.log").read_text()
    peaks = {t["name"]: t["peak_rss_mib"] for t in json.loads((run_dir / "cluster.json").read_text())["tasks"]}
    # The kernel's figure, looked at while it ran: its peak (VmHWM) may read a little lower later (its counts
    # are summed per CPU, lazily, and not every unmapping updates the peak).
    assert 0.98 * peak_then <= peaks[trains] < 2 * peak_then
    assert_nothing_left(run_dir)


def half_read_request(proc, run_dir, seconds: float = 120) -> bool:
    """Whether a parameter-server chief ended before its first epoch on TensorFlow's "Unable to parse
    request": a new coordinator of servers that served another one meets it at times (about 1 run in 5 of
    the test below, in a suite on 2 cores), says it in one line and exits 1. A known gap: the launcher of a
    chief of servers elsewhere does not start it again (a local cluster's does); the issue tracker has it."""
    log, deadline = run_dir / "logs" / "chief-0.log", time.monotonic() + seconds
    while proc.poll() is None and time.monotonic() < deadline:
        if log.exists() and re.search(r"\(worker 0: \d+, worker 1: \d+\)", log.read_text()):
            return False  # an epoch done: it goes on
        time.sleep(0.2)
    if proc.poll() != 1 or not log.exists():
        return False
    said = [line for line in log.read_text().splitlines() if line.startswith("error:")]
    if said == ["error: a task of the cluster failed mid-training (Unable to parse request); nothing saved "
                "(trainer.save_model=false): go on with trainer.resume=true"]:
        finish(proc)
        return True
    return False


def test_manual_mode_by_hand_in_terminals_of_their_own(tmp_path):
    """ps and two workers each started on their own, as the classic scripts were, on another machine
    (another directory, where data.path=idx holds its own copy of the IDX files), serving until
    stopped; chiefs come to them in turn:
    - one whose labels differ from the workers' stops at once in one line (it would train on them);
    - one trains and learns on both workers; worker 1 is killed (its launcher and task, as a lost
      machine), then started again with the same command on the same address, as an orchestrator
      would: the coordinator takes it back (its steps grow again). Ctrl-C ends that chief, then each
      server. (A chief that trains to its end: test_tf_config_chief_and_worker_match_one_device.)"""
    (x_train, y_train), (x_test, y_test) = arrays.load(make_cfg(*SYNTHETIC_THREE_EPOCHS[:3]).data, 42)
    for machine, train_labels in (("here", y_train), ("there", y_train), ("elsewhere", (y_train + 1) % 10)):
        for split, images, labels in (("train", x_train, train_labels), ("t10k", x_test, y_test)):
            write_idx(tmp_path / machine / "idx" / f"{split}-images-idx3-ubyte", images, compress=True)
            write_idx(tmp_path / machine / "idx" / f"{split}-labels-idx1-ubyte", labels, compress=True)
    ps, *workers, chief = (f"127.0.0.1:{portpicker.pick_unused_port()}" for _ in range(4))
    common = ["strategy=parameter_server", "cluster=manual", f"cluster.worker_hosts=[{','.join(workers)}]",
              f"cluster.ps_hosts=[{ps}]", f"cluster.chief_host={chief}", "data.source=idx", "data.path=idx",
              "trainer.batch_size=32", "trainer.save_model=false", "trainer.verbose=2", "model=mlp"]
    as_chief = [*common, "cluster.task_type=chief", "cluster.task_index=0"]
    worker_1 = [*common, "cluster.task_type=worker", "cluster.task_index=1"]
    there, killed_tmp = tmp_path / "there", tmp_path / "tmp"
    killed_tmp.mkdir()  # the scratch directory its killed launcher leaves: here, not in /tmp
    servers = [start(there / "ps", *common, "cluster.task_type=ps", "cluster.task_index=0"),
               start(there / "worker-0", *common, "cluster.task_type=worker", "cluster.task_index=0"),
               start(there / "worker-1", *worker_1, env={**os.environ, "TMPDIR": str(killed_tmp)})]
    worker_log = there / "worker-1" / "logs" / "worker-1.log"
    try:
        other = run_cli(tmp_path / "elsewhere" / "chief", *as_chief, "trainer.epochs=2")
        text = other.stdout + other.stderr
        assert other.returncode == 2, text[-4000:]
        assert "Traceback" not in text and "ERROR:tensorflow" not in text
        assert [line for line in text.splitlines() if line.startswith("error:")] == [
            "error: a worker's idx/train-labels-idx1-ubyte.gz holds other data than the coordinator read: every "
            "parameter-server worker reads the IDX files itself: give each worker's machine the same files at "
            "data.path=idx"]

        long_run = tmp_path / "here" / "long"
        proc = start(long_run, *as_chief, "trainer.epochs=1000")
        if half_read_request(proc, long_run):  # (once: the second chief then goes on)
            long_run = tmp_path / "here" / "long-again"
            proc = start(long_run, *as_chief, "trainer.epochs=1000")
        chief_log = long_run / "logs" / "chief-0.log"
        steps = lambda: re.findall(r"\(worker 0: (\d+), worker 1: (\d+)\)", chief_log.read_text())
        try:
            wait_until(lambda: chief_log.exists() and len(steps()) >= 2 and int(steps()[-1][1]) > 0, proc, "epoch 2")
            servers[2].kill()  # the launcher; its task dies with it
            servers[2].communicate(timeout=30)
            wait_until(lambda: len({n for _, n in steps()[-3:]}) == 1, proc, "3 epochs without worker 1")
            lost = int(steps()[-1][1])
            servers[2] = start(there / "worker-1", *worker_1)  # the same command again
            wait_until(lambda: "ready" in worker_log.read_text().partition("--- started again")[2], proc,
                       "its restart")
            wait_until(lambda: int(steps()[-1][1]) > lost, proc, "worker 1's steps to grow again")
        finally:
            proc.send_signal(signal.SIGINT)
            out = finish(proc)
        assert proc.returncode == 130 and "Traceback" not in out, out[-4000:]
        assert "this process is task chief:0" in out, out[-4000:]
        # It learned: asynchronous steps have no accuracy to bound (test_parameter_server_one_ps_two_workers_learn),
        # but over its 5 epochs or more some epoch's mean loss is below the first's, from an untrained model.
        losses = [float(v) for v in re.findall(r"Epoch \d+/1000 - .* - loss: ([\d.]+)", chief_log.read_text())]
        assert len(losses) >= 5 and min(losses[1:]) < losses[0], losses
        ctrl_c_servers(servers)  # ps and workers serve until stopped, the restarted one too
    finally:
        reap(servers)
    first, _, again = worker_log.read_text().partition("--- started again")
    assert "ready" in first and "ready" in again  # the log goes on
    assert_nothing_left(tmp_path)


def test_tf_config_chief_and_worker_match_one_device(tmp_path):
    """As Kubernetes would start them: the same command, TF_CONFIG differing by task; the chief reports.
    2 workers with global batch B end with the same weights as one device with batch B."""
    overrides = ["model=mlp", "optimizer=sgd", "trainer.learning_rate=0.1", "data=synthetic",
                 "data.train_examples=1024", "data.test_examples=128", "trainer.epochs=2",
                 "trainer.batch_size=64", "trainer.verbose=0", "trainer.mixed_precision=false"]  # exact: float32
    spec = {"chief": [f"127.0.0.1:{portpicker.pick_unused_port()}"],
            "worker": [f"127.0.0.1:{portpicker.pick_unused_port()}"]}
    procs = {}
    for task_type in ("chief", "worker"):
        env = {**os.environ, "TF_CONFIG": json.dumps({"cluster": spec, "task": {"type": task_type, "index": 0}}),
               "TF_ENABLE_ONEDNN_OPTS": "0"}  # the user's own choice, which wins over the config's
        procs[task_type] = start(tmp_path / task_type, "strategy=multi_worker_mirrored", "cluster=tf_config",
                                 "trainer.onednn=true", *overrides, "trainer.verbose=2", env=env)
    outs = {name: finish(proc) for name, proc in procs.items()}
    for name, proc in procs.items():
        assert proc.returncode == 0, outs[name][-4000:]
    run_dir = tmp_path / "chief"
    worker_results = json.loads((run_dir / "results.json").read_text())
    assert worker_results["onednn"] is False
    assert "(TF_ENABLE_ONEDNN_OPTS=0 in the environment, which wins" in outs["chief"]
    assert (worker_results["num_workers"], worker_results["num_replicas"]) == (2, 2)
    assert not (tmp_path / "worker" / "results.json").exists()  # only the chief writes results
    for name in procs:
        assert_nothing_left(tmp_path / name)
    single_results, single = train(make_cfg(*overrides, "trainer.save_model=false"), tmp_path / "single")
    # The epoch lines are global values, not one worker's: the same as one device's, epoch by epoch.
    for key in ("loss", "accuracy"):
        np.testing.assert_allclose(worker_results["history"][key], single_results["history"][key], rtol=1e-4)
    assert worker_results["test_accuracy"] == pytest.approx(single_results["test_accuracy"], abs=0.02)  # 128 test
    # examples: weights within 1e-5 may still tell one near a boundary apart
    restored = keras.models.clone_model(single)
    checkpoint = tf.train.Checkpoint(model=restored)
    checkpoint.restore(tf.train.latest_checkpoint(run_dir / "checkpoints")).expect_partial()
    moved = 0.0
    for w_workers, w_single, w_init in zip(restored.get_weights(), single.get_weights(),
                                           keras.models.clone_model(single).get_weights()):
        np.testing.assert_allclose(w_workers, w_single, atol=1e-5, rtol=0)
        moved = max(moved, float(np.abs(w_single - w_init).max()))
    assert moved > 1e-2  # training changed the weights, so agreeing means something


def test_two_workers_accumulating_batches_all_reduce_once_per_update_and_match_the_large_batch(tmp_path):
    """multi_worker_mirrored, 2 workers, trainer.accumulate_steps=4 of batch 32: 14 updates of 128 examples,
    with the weights of one device trained with batch 128 (1e-5; the control: training moved them)."""
    from test_training import ACCUMULATED

    args = [*ACCUMULATED[:-1], "data=synthetic", "data.test_examples=256", "trainer.verbose=2"]
    run_dir = tmp_path / "run"
    out = run_cli(run_dir, *args, "strategy=multi_worker_mirrored", "cluster.workers=2", "trainer.batch_size=32",
                  "trainer.accumulate_steps=4")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    results = json.loads((run_dir / "results.json").read_text())
    assert (results["global_steps"], results["global_batch_size"], results["accumulate_steps"]) == (14, 128, 4)
    assert "7 steps per epoch" in out.stdout + out.stderr
    _, single = train(make_cfg(*args, "trainer.batch_size=128", "trainer.save_model=false"), tmp_path / "single")
    restored = keras.models.clone_model(single)
    tf.train.Checkpoint(model=restored).restore(tf.train.latest_checkpoint(run_dir / "checkpoints")).expect_partial()
    for w_workers, w_single in zip(restored.get_weights(), single.get_weights()):
        np.testing.assert_allclose(w_workers, w_single, atol=1e-5, rtol=0)
    assert max(np.abs(a - b).max() for a, b in zip(single.get_weights(),
                                                    keras.models.clone_model(single).get_weights())) > 1e-2
    assert_nothing_left(tmp_path)


def test_a_task_that_does_not_come_up_is_named_with_its_log(tmp_path):
    run_dir = tmp_path / "run"
    # TensorFlow alone takes seconds to import, so no task can be up within 0.5 s.
    out = run_cli(run_dir, "strategy=multi_worker_mirrored", "cluster.startup_timeout=0.5", *BUNDLED_ONE_EPOCH,
                  process=True)  # (a fork server of its own: this process's would start tasks in time)
    assert out.returncode == 1
    assert "error: task worker-0 did not come up within 0.5 s (cluster.startup_timeout); the end of its log" \
        in out.stderr
    assert_nothing_left(run_dir)


@pytest.mark.parametrize("args, env, message", [
    (["strategy=parameter_server", "cluster.ps=0"], {}, "strategy=parameter_server needs at least one ps task"),
    (["strategy=parameter_server", "cluster=tf_config"], {"TF_CONFIG": "{oops"}, "TF_CONFIG is not valid JSON"),
    (["strategy=multi_worker_mirrored", "cluster=manual", "cluster.worker_hosts=[127.0.0.1:1,localhost]",
      "cluster.task_type=worker"], {}, "worker address 'localhost' is not host:port"),
    (["strategy=multi_worker_mirrored", "cluster=manual", "cluster.worker_hosts=[127.0.0.1:1]",
      "cluster.task_type=worker", "cluster.task_index=3"], {}, "task index 3 is outside the cluster"),
])
def test_misconfigured_clusters_get_one_line(tmp_path, args, env, message):
    out = run_cli(tmp_path / "run", *args, *BUNDLED_ONE_EPOCH, env_extra=env)
    assert out.returncode == 2
    errors = [line for line in (out.stdout + out.stderr).splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and message in errors[0], out.stdout + out.stderr
    assert "Traceback" not in out.stdout + out.stderr


def test_port_in_use_is_one_line(tmp_path):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        out = run_cli(tmp_path / "run", "strategy=parameter_server", "cluster=manual", "cluster.task_type=ps",
                      f"cluster.ps_hosts=[127.0.0.1:{port}]", "cluster.worker_hosts=[127.0.0.1:1]",
                      "cluster.chief_host=127.0.0.1:2", *BUNDLED_ONE_EPOCH)
    assert out.returncode == 2
    assert f"error: port {port} of ps:0 (127.0.0.1:{port}) is already in use" in out.stdout + out.stderr
    assert "Traceback" not in out.stdout + out.stderr


def test_a_diverging_parameter_server_run_stops_with_one_line(tmp_path):
    run_dir = tmp_path / "run"
    out = run_cli(run_dir, "strategy=parameter_server", "cluster.workers=2", "data=synthetic", "model=mlp",
                  "optimizer=sgd", "trainer.learning_rate=1e30", "trainer.epochs=5", "trainer.verbose=2")
    assert out.returncode == 2, out.stdout[-3000:]
    assert "[chief-0] error: the training loss became NaN or infinite in epoch 1" in out.stderr  # errors: stderr
    assert "error:" not in out.stdout
    assert "Traceback" not in out.stdout + out.stderr
    assert not (run_dir / "results.json").exists()  # nothing claims success
    assert json.loads((run_dir / "status.json").read_text())["status"] == "failed"
    assert_nothing_left(run_dir)


@pytest.mark.parametrize("workers", [2, 1])
def test_the_terminal_shows_each_epoch_s_last_progress_and_the_chief_s_set_up(tmp_path, workers):
    """multi_worker_mirrored with progress bars (trainer.verbose=1): the terminal's last progress line of each
    epoch is the epoch's last step (8/8), as the chief's log keeps it; the chief's precision and optimizer
    lines are there, a 1-worker cluster's too (its lines as a one-process run's, without the task's name)."""
    out = run_cli(tmp_path / "run", "strategy=multi_worker_mirrored", f"cluster.workers={workers}",
                  *SYNTHETIC_THREE_EPOCHS[:3], "trainer.epochs=2", "trainer.verbose=1", "trainer.save_model=false",
                  "model=mlp")
    said = out.stdout + out.stderr
    assert out.returncode == 0, said[-3000:]
    for text in (said, (tmp_path / "run" / "logs" / "worker-0.log").read_text()):
        shown = [line.rsplit("\r", 1)[-1] for line in text.splitlines()]
        epochs = [i for i, line in enumerate(shown) if re.search(r"Epoch \d/2$", line)]
        assert len(epochs) == 2, shown
        for first, end in zip(epochs, [*epochs[1:], len(shown)]):  # the last progress line of each epoch
            progress = [line for line in shown[first:end] if re.search(r"\d+/\d+ \[", line)]
            assert progress and re.search(r"\b8/8 \[", progress[-1]), shown[first:end]
    named = "[worker-0] " if workers > 1 else ""  # (a task alone speaks as a run of one process does)
    for what in ("precision: ", "cpu kernels: ", "optimizer: adam"):
        assert any(line.startswith(named + what) for line in said.splitlines()), (what, said[-3000:])
    assert_nothing_left(tmp_path)
