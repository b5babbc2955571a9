"""What the supervisor does when a task ends: decide() is a function of the task's state alone, and
each task of a local cluster gets the state its kind calls for. No task is started here (stop_all's wait:
plain processes that take their time to end)."""
import logging
import re
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from distrain.common.cluster import Task
from distrain.common.rundir import RunDir
from distrain.launcher import cluster_tasks, supervisor
from distrain.launcher.restarts import (
    DEPARTED,
    FAIL,
    GO_ON,
    LEAVE,
    RESTART_CLUSTER,
    RESTART_IT,
    SHRINK,
    Restarts,
    decide,
    larger,
    per_worker,
    signalled,
    smaller,
)

from helpers import make_cfg


@pytest.mark.parametrize("code, alone, essential, may_restart, others_running, action", [
    (-9, False, True, True, True, RESTART_CLUSTER),  # a multi_worker_mirrored worker, a ps task or the chief killed
    (1, False, True, True, True, RESTART_CLUSTER),   # ... or hung (reported as status 1)
    (-9, True, True, True, True, RESTART_IT),        # a parameter-server worker killed: on its own address
    (-9, True, True, False, True, LEAVE),            # ... past its budget: the other workers go on
    (1, True, True, False, True, LEAVE),             # ... hung
    (-9, True, True, False, False, FAIL),            # ... and the last worker
    (1, False, True, False, True, FAIL),             # a synchronous worker past cluster.max_restarts
    (2, False, True, True, True, FAIL),              # a configuration error: a restart would repeat it
    (2, True, True, True, True, FAIL),               # ... and leaving would hide it
    (-9, False, False, True, True, GO_ON),           # the sidecar evaluator lost: training goes on
    (1, False, False, False, False, GO_ON),
    (0, False, True, False, False, GO_ON),           # a task that finished
    (0, True, True, True, True, GO_ON),
])
def test_what_a_tasks_end_means_for_the_run(code, alone, essential, may_restart, others_running, action):
    assert decide(code, alone=alone, essential=essential, may_restart=may_restart,
                  others_running=others_running) == action


@pytest.mark.parametrize("code, may_restart, may_shrink, action", [
    (-9, False, True, SHRINK),            # a synchronous worker past its budget, cluster.min_workers below: go on
    (1, False, True, SHRINK),             # ... hung
    (-9, True, True, RESTART_CLUSTER),    # a restart left: the cluster restarts whole first
    (-9, False, False, FAIL),             # at cluster.min_workers already (the control)
    (2, False, True, FAIL),               # a configuration error would come back at any size
])
def test_a_synchronous_worker_lost_for_good_shrinks_the_cluster_to_no_fewer_than_min_workers(code, may_restart,
                                                                                            may_shrink, action):
    assert decide(code, alone=False, essential=True, may_restart=may_restart, may_shrink=may_shrink) == action


@pytest.mark.parametrize("workers, least, size", [
    (2, 1, 1), (3, 1, 2), (3, 2, 2), (4, 3, 3),
    (2, 2, None), (2, None, None),  # at cluster.min_workers (null: cluster.workers)
])
def test_a_cluster_shrinks_by_one_down_to_min_workers_and_grows_back_to_workers(workers, least, size):
    assert smaller(workers, least) == size
    assert larger(workers - 1, workers) == workers and larger(workers, workers) is None
    assert per_worker(64, 2) == "32 per worker" and per_worker(64, 3) == "22 or 21 per worker, split unevenly"


@pytest.mark.parametrize("may_restart, others_running, may_restart_cluster, action", [
    (True, True, True, RESTART_CLUSTER),  # it could not rejoin alone: the whole cluster restarts
    (True, True, False, LEAVE),           # ... unless the cluster's restarts are spent: then it leaves too
    (True, False, False, FAIL),           # ... or ends the run, the last worker
    (False, True, True, LEAVE),           # past its own budget: it leaves, as without a departure
])
def test_a_worker_lost_after_another_left_restarts_the_cluster(may_restart, others_running, may_restart_cluster,
                                                               action):
    """Once a parameter-server worker has left the run, TensorFlow's coordinator cannot take another
    back alone (it updates the whole cluster, and the one that left never answers)."""
    assert decide(-9, alone=True, essential=True, may_restart=may_restart, others_running=others_running,
                  one_departed=True, may_restart_cluster=may_restart_cluster) == action
    assert decide(-9, alone=True, essential=True, may_restart=True, others_running=others_running,
                  one_departed=False, may_restart_cluster=may_restart_cluster) == RESTART_IT  # control


@pytest.mark.parametrize("strategy, states", [
    ("multi_worker_mirrored", {"worker-0": (False, True, True), "worker-1": (False, True, True),
                               "evaluator-0": (False, False, True)}),
    ("parameter_server", {"chief-0": (False, True, True), "worker-0": (True, True, False),
                          "worker-1": (True, True, False), "ps-0": (False, True, False),
                          "evaluator-0": (False, False, True)}),
])
def test_each_task_of_a_local_cluster_gets_its_kinds_state(strategy, states):
    """(alone, essential, main) as decide() and the end of a run read them, from the real config."""
    cfg = make_cfg(f"strategy={strategy}", "cluster.workers=2", "cluster.evaluator=true",
                   *(["cluster.ps=1"] if strategy == "parameter_server" else []))
    net = SimpleNamespace(wrap=lambda argv: argv)
    _, tasks = cluster_tasks.cluster_tasks(cfg, ["python"], net, [0, 1], 1, forks=None, evaluator=True)
    assert {t.name: (t.alone, t.essential, t.main) for t in tasks} == states


def test_restart_budgets_are_per_task_alone_and_for_the_cluster_over_a_window():
    """The losses of the issue that asked for it: workers 0, 1, 2, then 0 again, under parameter
    servers: each worker has a budget of its own, so none is spent; a cluster restart draws on another."""
    now = [1000.0]
    restarts = Restarts(2, window=3600, clock=lambda: now[0])
    w0, w1, w2 = (SimpleNamespace(name=f"worker-{i}", alone=True) for i in range(3))
    ps = SimpleNamespace(name="ps-0", alone=False, task=Task("ps", 0, "127.0.0.1:1"))
    for worker in (w0, w1, w2, w0):
        assert restarts.may_restart(worker)
        restarts.take(worker, -9, f"task {worker.name} was killed by SIGKILL", "it on its own address", [worker])
    # w0 twice; the cluster never
    assert not restarts.may_restart(w0) and restarts.may_restart(w1) and restarts.may_restart(ps)
    assert restarts.per_task == {"worker-0": 2, "worker-1": 1, "worker-2": 1}
    assert restarts.exhausted("task worker-0 died", w0) == (
        "task worker-0 died and worker-0 was restarted 2 time(s) already within 3600 s (cluster.restart_window) "
        "(cluster.max_restarts=2); raise cluster.max_restarts, or read its log for why it keeps dying")
    assert restarts.exhausted("task ps-0 died", ps) == "task ps-0 died"  # the cluster's budget: untouched
    restarts.take(ps, -9, "task ps-0 was killed by SIGKILL", "the cluster from its latest checkpoint", [ps, w0])
    assert restarts.may_restart(ps) and "the cluster was restarted 1 time(s)" in restarts.exhausted("x", ps)
    # (what a task losing a peer is told)
    assert restarts.may_restart_cluster() and not Restarts(0).may_restart_cluster()
    now[0] += 3601  # an hour on, the old restarts no longer count
    assert restarts.may_restart(w0) and restarts.exhausted("task worker-0 died", w0) == "task worker-0 died"
    assert [r["time"] for r in restarts.done] == [1000.0] * 5  # each recorded with its time
    # cluster.restart_window=0: every restart counts, however old.
    ever = Restarts(1, window=0, clock=lambda: now[0])
    ever.take(w0, -9, "w0 died", "it on its own address", [w0])
    now[0] += 10 ** 6
    assert not ever.may_restart(w0)
    assert Restarts(0).exhausted("task worker-1 died", w0) == "task worker-1 died, and cluster.max_restarts=0 " \
        "allows no restart"


def test_a_synchronous_worker_lost_with_no_restart_names_the_budget_and_min_workers():
    """The error line of a multi_worker_mirrored worker lost for good: the budget that allowed no restart and
    the cluster.min_workers that would go on without it; a ps task (whose variables are its alone) gets no
    such hint, nor does a cluster of one worker."""
    worker = SimpleNamespace(name="worker-1", alone=False, task=Task("worker", 1, "127.0.0.1:1"))
    why = "task worker-1 was killed by SIGKILL (signal 9)"
    assert Restarts(0, workers=2).exhausted(why, worker) == (
        "task worker-1 was killed by SIGKILL (signal 9), and cluster.max_restarts=0 allows no restart; "
        "cluster.min_workers=1 would go on without it")
    spent = Restarts(1, workers=3)
    spent.take(worker, -9, why, "the cluster from its latest checkpoint", [worker])
    assert spent.exhausted(why, worker).endswith("for why it keeps dying; cluster.min_workers=2 would go on without it")
    ps = SimpleNamespace(name="ps-0", alone=False, task=Task("ps", 0, "127.0.0.1:2"))
    assert Restarts(0, workers=2).exhausted("ps-0 died", ps) == "ps-0 died, and cluster.max_restarts=0 allows no " \
        "restart"
    assert "min_workers" not in Restarts(0, workers=1).exhausted(why, worker)
    assert Restarts(2, workers=2).exhausted(why, worker) == why  # (a budget not spent: the cluster restarts)


def test_the_last_worker_lost_past_its_budget_ends_the_run_in_one_line(tmp_path):
    """_ended() on tasks whose processes are stand-ins: worker 1 left the run already, worker 0 is lost
    with no restart left (cluster.max_restarts=0): the run fails, the line names the task and why."""
    (tmp_path / "logs").mkdir()
    tasks = []
    for name, code in (("worker-0", -9), ("worker-1", -9), ("chief-0", None)):
        task = supervisor.TaskProcess(name, [], alone=name.startswith("worker"))
        task.proc = SimpleNamespace(poll=lambda code=code: code, pid=0)
        task.log_path, task.pump = tmp_path / "logs" / f"{name}.log", SimpleNamespace(join=lambda timeout: None)
        task.log_path.write_text("Epoch 3/9 - global step 96\n")
        tasks.append(task)
    def worker_1_left(budget: Restarts) -> Restarts:
        budget.leave(tasks[1], -9, "task worker-1 was killed by SIGKILL (signal 9)", 1)
        return budget

    outcome = supervisor._ended(tasks, {"worker-1"}, RunDir(tmp_path), worker_1_left(Restarts(0)), lambda status: None)
    assert outcome.status == "failed" and outcome.code == 1  # (a shell reads 1: the signal is in the line)
    assert outcome.error == ("task worker-0 was killed by SIGKILL (signal 9), and no other worker is left; raise "
                             "cluster.max_restarts, or read the workers' logs for why they die")
    budget = worker_1_left(Restarts(1))  # the control: with a restart left, the cluster restarts instead
    outcome = supervisor._ended(tasks, {"worker-1"}, RunDir(tmp_path), budget, lambda status: None)
    assert outcome.restart and [r["restarted"] for r in budget.done] == [DEPARTED,
                                                                         "the cluster from its latest checkpoint"]
    assert budget.gone() == []  # the restarted cluster has every worker again


def test_a_lone_tasks_death_by_a_signal_names_it_and_how_to_go_on():
    """(The run itself, killed by hand: test_resume.)"""
    assert signalled("train", -11, "run", False) == \
        "task train was killed by SIGSEGV (signal 11) before its first checkpoint: run the command again"
    assert signalled("train", -9, "out/run", True) == \
        "task train was killed by SIGKILL (signal 9): go on from its latest checkpoint with trainer.resume=true " \
        "hydra.run.dir=out/run"
    assert signalled("train", -200, "run", True).startswith("task train was killed by signal 200: ")  # no such signal


class Slow(SimpleNamespace):
    """A process that ends `after` seconds after SIGTERM (a task saving its step), as stop_all sees a task."""

    def __init__(self, name: str, after: float):
        code = ("import signal, sys, time; "
                f"signal.signal(signal.SIGTERM, lambda *_: (time.sleep({after}), sys.exit(0))); "
                "print('up', flush=True); time.sleep(60)")
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline() == "up\n"
        super().__init__(name=name, proc=proc, main=True, alone=False, task=None)

    def stop(self, sig=signal.SIGTERM):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)


def test_stopping_tasks_that_take_their_time_says_what_the_launcher_waits_for(caplog):
    """A task still saving its step after SAY_WAIT_SECONDS: one line names it and the seconds left before
    SIGKILL, and it ends on its own. Control: a task that ends at once gets no such line."""
    quick, slow = Slow("worker-1", 0), Slow("worker-0", supervisor.SAY_WAIT_SECONDS + 1)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="distrain"):
        supervisor.stop_all([quick, slow])
    assert supervisor.SAY_WAIT_SECONDS < time.monotonic() - started < supervisor.STOP_GRACE_SECONDS
    assert slow.proc.returncode == 0 and quick.proc.returncode == 0  # (each ended by itself, not SIGKILLed)
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and re.match(r"waiting up to \d+ s more for worker-0 to save the step ", said[0]), said
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="distrain"):
        supervisor.stop_all([Slow("worker-0", 0)])
    assert not caplog.records
