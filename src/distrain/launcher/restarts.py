"""What a lost task means for the run, as pure functions of its state: `decide` picks the action, and
`Restarts` keeps the budgets (cluster.max_restarts within cluster.restart_window) and the record of
each restart. The supervisor acts on them; nothing here starts or stops a process."""
import logging
import signal
import time
from collections import Counter

log = logging.getLogger("distrain")

# What to do about a task that ended (or hung): decide() picks one.
GO_ON, RESTART_IT, LEAVE, RESTART_CLUSTER, FAIL = "go on", "restart it", "leave", "restart the cluster", "fail"
SHRINK = "restart the cluster with fewer workers"


def decide(code: int, *, alone: bool, essential: bool, may_restart: bool, others_running: bool = False,
           one_departed: bool = False, may_restart_cluster: bool = False, may_shrink: bool = False) -> str:
    """What a task's end means for the run. code: its exit status (1 if it hung); alone: it can be
    restarted on its own (a parameter-server worker); essential: the run cannot go on without it (not
    a sidecar evaluator); may_restart: its budget (cluster.max_restarts) allows another restart;
    others_running: other tasks like it still run, so that one past its budget may leave the run to them;
    one_departed: a task like it has left the run already, so that one restarted alone could not rejoin
    (TensorFlow's coordinator takes a worker back only once every worker answers): the cluster
    restarts instead, as may_restart_cluster (the cluster's budget) allows. may_shrink: a synchronous
    cluster may go on without it (cluster.min_workers), where the budget allows no restart.
    A status of 2 is a configuration error, which a restart would repeat and leaving would hide."""
    if code == 0:
        return GO_ON
    can_restart = may_restart and code != 2
    if alone and code != 2:
        if can_restart and not one_departed:
            return RESTART_IT
        if can_restart and may_restart_cluster:
            return RESTART_CLUSTER
        if others_running:
            return LEAVE
        return FAIL if essential else GO_ON
    if essential:
        if can_restart:
            return RESTART_CLUSTER
        return SHRINK if may_shrink and code != 2 else FAIL
    return GO_ON


def smaller(workers: int, least: int | None) -> int | None:
    """The size a synchronous cluster of `workers` goes on at when one is lost for good: one fewer, if
    that leaves `least` (cluster.min_workers; None: every worker needed); else None."""
    return workers - 1 if workers - 1 >= (least or workers) else None


def larger(workers: int, most: int) -> int | None:
    """The size a cluster that shrank grows back to: one more, up to `most` (cluster.workers)."""
    return workers + 1 if workers < most else None


def per_worker(batch: int, workers: int) -> str:
    """A global batch's share per worker, in words: even, or one example apart."""
    low = batch // workers
    return f"{low} per worker" if batch % workers == 0 else f"{low + 1} or {low} per worker, split unevenly"


DEPARTED = "no: it left the run"  # the record of a worker past its budget (Restarts.leave)


def how_ended(name: str, code: int) -> str:
    """How a task ended, in words: its exit status, or the signal that killed it (a status of -N)."""
    if code < 0:
        known = -code in set(signal.Signals)
        return f"task {name} was killed by " + (f"{signal.Signals(-code).name} (signal {-code})" if known
                                                else f"signal {-code}")
    return f"task {name} exited with status {code}"


def signalled(name: str, code: int, run_dir: str, checkpointed: bool) -> str:
    """The line of a run's one task that a signal ended (kill -9, a crash): no restart, so how to go on."""
    then = f": go on from its latest checkpoint with trainer.resume=true hydra.run.dir={run_dir}" if checkpointed \
        else " before its first checkpoint: run the command again"
    return f"{how_ended(name, code)}{then}"


class Restarts:
    """The restart budgets of a local cluster, and the record of each restart. cluster.max_restarts
    counts, over the last cluster.restart_window seconds (0: ever), the restarts of each task restarted
    alone (a parameter-server worker) and, apart, the restarts of the whole cluster."""
    CLUSTER = "the cluster"

    def __init__(self, limit: int, window: float = 0.0, clock=time.time, workers: int = 0,
                 min_workers: int | None = None, batch: int = 0, whole: bool = True):
        self.limit, self.window, self.clock, self.done = limit, window, clock, []
        self.whole = whole  # False: only tasks restarted alone are (one training process, its data service)
        self.per_task = Counter()  # times each task was started again
        # A synchronous cluster's size now, the fewest it may go on with, and the global batch it keeps
        self.workers, self.min_workers, self.batch, self.configured = workers, min_workers, batch, workers

    def may_shrink(self, task=None) -> bool:
        """Whether the cluster may go on at a smaller size without `task` (a synchronous worker; None: any)."""
        worker = task is None or (task.task is not None and task.task.type == "worker" and not task.alone)
        return worker and smaller(self.workers, self.min_workers) is not None

    def may_grow(self) -> bool:
        """Whether a cluster that shrank may take a worker back: its restart budget renewed (the restarts
        that spent it are older than cluster.restart_window), below cluster.workers."""
        return larger(self.workers, self.configured) is not None and self.may_restart_cluster()

    def grow(self) -> str:
        """The cluster grows back (from a checkpoint of the step it is at: the supervisor stops its tasks
        as a preemption does); the line that says so, recorded."""
        before, self.workers = self.workers, larger(self.workers, self.configured)
        self.done.append({"task": None, "exit_status": None, "restarted": f"the cluster with {self.workers} "
                          f"worker(s)", "budget": "cluster.min_workers", "workers": self.workers,
                          "time": round(self.clock(), 3)})
        why = (f"the cluster's restarts that spent cluster.max_restarts={self.limit} are older than "
               f"cluster.restart_window={self.window:g} s: growing back from {before} to {self.workers} of "
               f"{self.configured} workers from a checkpoint of the step it is at, global batch {self.batch} kept "
               f"({per_worker(self.batch, self.workers)})")
        log.warning(why)
        return why

    def shrink(self, task, code: int | None, why: str, lost_at: int | None, checkpoint: int | None) -> None:
        """`task`, lost for good at global step `lost_at`: the cluster goes on with fewer workers from the
        `checkpoint` step, which is said in one line and recorded."""
        self.workers = smaller(self.workers, self.min_workers)
        self.done.append({"task": task.name, "exit_status": code, "restarted": f"the cluster with {self.workers} "
                          f"worker(s)", "budget": "cluster.min_workers", "lost_at_step": lost_at,
                          "from_step": checkpoint or 0, "workers": self.workers, "time": round(self.clock(), 3)})
        self.per_task.update([task.name])
        at = f" at step {lost_at}" if lost_at is not None else ""
        log.warning("%s; %s lost for good%s: going on with %d of %d workers from step %d, global batch %d kept (%s)",
                    self.spent(why, task), task.name, at, self.workers, self.configured, checkpoint or 0, self.batch,
                    per_worker(self.batch, self.workers))

    def _counted(self, task) -> list:
        """The restarts that count against the budget `task` draws on: its own if it restarts alone."""
        return self._within_window(task.name if task.alone else self.CLUSTER)

    def _within_window(self, budget: str) -> list:
        since = self.clock() - self.window if self.window else float("-inf")
        return [r for r in self.done if r["budget"] == budget and r["time"] >= since]

    def may_restart(self, task) -> bool:
        """Whether the budget `task` draws on allows another restart."""
        return (task.alone or self.whole) and len(self._counted(task)) < self.limit

    def gone(self) -> list[str]:
        """The workers that left the run since the cluster last started (a restart of it brings all back)."""
        since = max((i + 1 for i, r in enumerate(self.done) if r["budget"] == self.CLUSTER), default=0)
        return sorted({r["task"] for r in self.done[since:] if r["restarted"] == DEPARTED})

    def may_restart_cluster(self) -> bool:
        """Whether a lost essential task would restart the cluster (rather than end the run)."""
        return self.whole and len(self._within_window(self.CLUSTER)) < self.limit

    def take(self, task, code: int | None, why: str, what: str, restarted: list, whole: bool = False) -> None:
        """`task` exited with `code` (None: it hung), as `why` says: the `restarted` tasks start again
        (`whole`: the cluster, from the cluster's budget whatever the task)."""
        budget = self.CLUSTER if whole or not task.alone else task.name
        self.done.append({"task": task.name, "exit_status": code, "restarted": what, "budget": budget,
                          "time": round(self.clock(), 3)})
        self.per_task.update(t.name for t in restarted)
        log.warning("%s: restarting %s (restart %d of %d%s, cluster.max_restarts)", why, what,
                    len(self._within_window(budget)), self.limit, self._within())

    def leave(self, task, code: int | None, why: str, others: int) -> None:
        """`task`, past its budget, leaves the run to the `others` like it."""
        spent = self.spent(why, task)
        self.done.append({"task": task.name, "exit_status": code, "restarted": DEPARTED,
                          "budget": task.name, "time": round(self.clock(), 3)})
        log.warning("%s: it leaves the run, which goes on with %d worker(s)", spent, others)

    def spent(self, why: str, task) -> str:
        """`why` a task ended, with how much of the budget it drew on was spent, if any was."""
        counted = self._counted(task)
        if not counted:
            return why
        whom = f"{task.name} was" if task.alone else "the cluster was"
        return f"{why} and {whom} restarted {len(counted)} time(s) already{self._within()} " \
               f"(cluster.max_restarts={self.limit})"

    def exhausted(self, why: str, task) -> str:
        """The line for a task past its budget: spent(), and what to do about it; for a synchronous worker,
        the cluster.min_workers that would have gone on without it."""
        if self._counted(task):
            line = f"{self.spent(why, task)}; raise cluster.max_restarts, or read its log for why it keeps dying"
        elif self.limit == 0:
            line = f"{why}, and cluster.max_restarts=0 allows no restart"
        else:
            return why
        if not task.alone and task.task is not None and task.task.type == "worker" and self.workers > 1:
            line += f"; cluster.min_workers={self.workers - 1} would go on without it"
        return line

    def _within(self) -> str:
        return f" within {self.window:g} s (cluster.restart_window)" if self.window else ""
