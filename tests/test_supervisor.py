"""What the supervisor does when a task ends: decide() is a function of the task's state alone, and
each task of a local cluster gets the state its kind calls for. No process is started here."""
from types import SimpleNamespace

import pytest

from distrain import launcher
from distrain.supervisor import FAIL, GO_ON, RESTART_CLUSTER, RESTART_IT, Restarts, decide
from helpers import make_cfg


@pytest.mark.parametrize("code, alone, essential, restarts_left, action", [
    (-9, False, True, True, RESTART_CLUSTER),  # a multi_worker_mirrored worker, a ps task or the chief killed
    (1, False, True, True, RESTART_CLUSTER),   # ... or hung (reported as status 1)
    (-9, True, True, True, RESTART_IT),        # a parameter-server worker killed: on its own address
    (-9, True, True, False, FAIL),             # ... past cluster.max_restarts
    (1, False, True, False, FAIL),             # a synchronous worker past cluster.max_restarts
    (2, False, True, True, FAIL),              # a configuration error: a restart would repeat it
    (2, True, True, True, FAIL),
    (-9, False, False, True, GO_ON),           # the sidecar evaluator lost: training goes on
    (1, False, False, False, GO_ON),
    (0, False, True, False, GO_ON),            # a task that finished
    (0, True, True, True, GO_ON),
])
def test_what_a_tasks_end_means_for_the_run(code, alone, essential, restarts_left, action):
    assert decide(code, alone, essential, restarts_left) == action


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
    _, tasks = launcher._cluster_tasks(cfg, ["python"], net, [0, 1], 1, forks=None)
    assert {t.name: (t.alone, t.essential, t.main) for t in tasks} == states


def test_the_restart_budget_is_shared_and_says_when_it_is_spent():
    restarts, task = Restarts(2), SimpleNamespace(name="worker-1")
    assert restarts.left()
    restarts.take(task, -9, "task worker-1 exited with status -9", "it on its own address", [task])
    assert restarts.left() and restarts.per_task["worker-1"] == 1
    restarts.take(task, -9, "task worker-1 exited with status -9", "it on its own address", [task])
    assert not restarts.left()
    assert "restarted 2 time(s) already (cluster.max_restarts=2)" in restarts.exhausted("task worker-1 died")
    assert Restarts(0).exhausted("task worker-1 died") == "task worker-1 died"  # none taken: nothing to add
