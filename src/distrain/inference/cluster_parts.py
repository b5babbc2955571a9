"""Evaluate and predict on a local cluster (multi_worker_mirrored, parameter_server): the test split cut
into parts of consecutive examples, in input order. Whichever task computes a part writes its outputs
to a part file of its own, atomically (written whole under a temporary name, then renamed), so that a
task restarted part-way computes only the parts not written yet; the launcher then merges the part
files in order and checks that every example is there exactly once.

Who computes which part: under multi_worker_mirrored, worker i the parts i, i + N, ... (N workers; a
forward pass needs no all-reduce, so each predicts with its own copy of the model, and one that dies is
restarted alone); under parameter servers the coordinator reads every part and schedules a function per
batch on whichever worker is free (TensorFlow's ClusterCoordinator runs a function again elsewhere if
its worker is lost, and the coordinator places each result by its batch)."""
import io
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

from distrain.common import cluster as cluster_lib
from distrain.common import storage
from distrain.common.errors import ConfigError, print_error
from distrain.common.messages import error_line
from distrain.common.rundir import RunDir
from distrain.common.topology import Topology
from distrain.launcher import forkserver
from distrain.launcher.launch import scratch_dir
from distrain.launcher.restarts import Restarts
from distrain.launcher.supervisor import Outcome, TaskProcess, run_tasks

PART_BATCHES = 16  # a part's batches at most by default: a restart redoes at most this much of a task's work


def plan(examples: int, size: int) -> list[tuple[int, int]]:
    """The parts, (start, stop) of each, in input order."""
    return [(start, min(start + size, examples)) for start in range(0, examples, size)]


def path(directory: Path, k: int) -> Path:
    return Path(directory) / f"part-{k:06d}.npz"


def todo(directory: Path, mine: list[int]) -> list[int]:
    """The parts of `mine` not written yet (a restarted task's are those it had not finished)."""
    return [k for k in mine if not path(directory, k).exists()]


def write(directory: Path, k: int, start: int, outputs, labels=None) -> None:
    """Part k's outputs (and, for evaluate, its labels), whole or not at all."""
    buffer = io.BytesIO()
    extra = {} if labels is None else {"labels": labels}
    np.savez(buffer, index=np.arange(start, start + len(outputs)), outputs=outputs, **extra)
    storage.write_atomic(path(directory, k), buffer.getvalue())


def merge(directory: Path, parts: list) -> dict:
    """Every part's outputs (and labels) in order: {index, outputs[, labels]}, each example once, else
    a ConfigError naming the parts missing or wrong."""
    missing = [k for k in range(len(parts)) if not path(directory, k).exists()]
    if missing:
        raise ConfigError(f"{len(missing)} of {len(parts)} parts were not computed ({_few(missing)}): the tasks' "
                          "logs say why; run the command again")
    pieces = []
    for k, (start, stop) in enumerate(parts):
        with np.load(path(directory, k)) as part:
            pieces.append({name: part[name] for name in part.files})
        if list(pieces[-1]["index"]) != list(range(start, stop)):
            raise ConfigError(f"part {k} holds examples other than {start} to {stop - 1}: report this")
    return {name: np.concatenate([p[name] for p in pieces]) for name in pieces[0]} if pieces else {}


def _few(ks: list) -> str:
    return "part " + ", ".join(map(str, ks[:5])) + (f" and {len(ks) - 5} more" if len(ks) > 5 else "")


class Cluster:
    """The local cluster cfg names, for evaluate or predict: its network and fork server start on entry
    (TensorFlow imports there while this process loads the model and the data; both kept for this
    process's next command, as a run's are), its tasks in compute(). Their config and logs go to
    RUN_DIR/evaluations/<command>/."""

    def __init__(self, cfg, run_dir: Path, command: str):
        self.cfg, self.run_dir, self.command = cfg, Path(run_dir), command
        self.where = RunDir(self.run_dir / "evaluations" / command, cfg)

    def __enter__(self):
        c = self.cfg.cluster
        self.net = cluster_lib.PrivateNetwork.shared(enabled=c.isolate is not False)
        self.forks = forkserver.shared(self.where.log("forkserver"), self.net.wrap)
        self._scratch = scratch_dir()
        self._scratch.__enter__()
        return self

    def __exit__(self, *exc):
        self._scratch.__exit__(*exc)

    def compute(self, data, options: dict) -> tuple[dict, float]:
        """Every part computed by the tasks: ({index, outputs[, labels]} in order, the seconds they took)."""
        cfg, where = self.cfg, self.where
        batch = cfg.trainer.batch_size
        # PART_BATCHES batches, or fewer where that gives each worker two parts at least; whole batches
        size = int(options.get("part_size") or min(PART_BATCHES * batch,
                                                   -(-data.test_examples // (2 * cfg.cluster.workers))))
        size = -(-max(size, 1) // batch) * batch
        parts = plan(data.test_examples, size)
        directory = where / "parts"
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True)
        where.write_config(OmegaConf.to_yaml(cfg, resolve=True))
        found = getattr(data, "found", None)
        if found is not None:  # (the tasks read the files without scanning them again)
            where.write_data(found.to_json())
        storage.write_atomic(where / "job.json", json.dumps({
            "run_dir": str(self.run_dir.resolve()), "checkpoint": options.get("checkpoint"), "parts": parts,
            "labels": self.command == "evaluate"}))
        start = time.perf_counter()
        try:
            outcome = self._run([sys.executable, "-m", "distrain.task.inference", str(where.path)])
            if outcome.status == "interrupted":  # (Ctrl-C, SIGTERM: the command ends, as a run does)
                print_error(outcome.error)
                raise SystemExit(outcome.code)
            if outcome.code:
                raise ConfigError(outcome.error.removeprefix(error_line("")) or f"the cluster failed (exit status "
                                  f"{outcome.code}): its logs are in {where.logs}")
            return merge(directory, parts), time.perf_counter() - start
        finally:
            shutil.rmtree(directory, ignore_errors=True)

    def _run(self, argv: list) -> Outcome:
        """The tasks, supervised as a training's are (supervisor.run_tasks): a worker that dies is
        restarted alone, up to cluster.max_restarts times; a parameter server that dies restarts them all
        (its copy of the model is gone), and they go on with the parts not written yet."""
        cfg, where = self.cfg, self.where
        c, topology = cfg.cluster, Topology.of(cfg)
        restarts = Restarts(c.max_restarts, c.restart_window)
        while True:
            spec = cluster_lib.local_spec(cfg.strategy.name, c.workers, c.ps)
            tasks = []
            for task_type, addresses in spec.items():
                for index, address in enumerate(addresses):
                    task = cluster_lib.Task(task_type, index, address)
                    env = {**cluster_lib.task_env(spec, task), **cluster_lib.thread_caps(task_type, c.workers)}
                    serves = topology.parameter_servers and task_type != "chief"
                    tasks.append(TaskProcess(task.name, self.net.wrap(argv), env, main=not serves,
                                             alone=task_type == "worker", quiet=task.name not in ("chief-0",
                                                                                                  "worker-0"),
                                             task=task, restarts=restarts.per_task[task.name], forks=self.forks))
            outcome = run_tasks(tasks, where, startup_timeout=c.startup_timeout, restarts=restarts,
                                on_change=lambda status, spec=spec, tasks=tasks: where.write_cluster(
                                    {"strategy": cfg.strategy.name, "status": status, "cluster": spec,
                                     "restarts": restarts.done, "tasks": [t.describe() for t in tasks if t.proc]}))
            if not outcome.restart:
                return outcome
