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
import hashlib
import io
import json
import shutil
import socket
import sys
import time
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

from distrain.common import cluster as cluster_lib
from distrain.common import placement, storage
from distrain.common.errors import ConfigError, print_error
from distrain.common.messages import error_line
from distrain.common.rundir import RunDir
from distrain.common.topology import Topology
from distrain.launcher import cluster_tasks
from distrain.launcher.launch import scratch_dir
from distrain.launcher.supervisor import Outcome

PART_BATCHES = 16  # a part's batches at most by default: a restart redoes at most this much of a task's work


class ClusterFailed(ConfigError):
    """The command's cluster failed (a task lost, not bad input): one line as a refusal is, but what it
    wrote in evaluations/ (its logs) is kept."""


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
    """The cluster cfg names, for evaluate or predict. On this machine (cluster=local): its network and
    fork server start on entry (TensorFlow imports there while this process loads the model and the data;
    both kept for this process's next command, as a run's are), its tasks in compute(), their config and
    logs in RUN_DIR/evaluations/<command>/. Spread over machines (slurm, tf_config, manual: the same
    command started on each): this machine's task alone, its config and logs in
    RUN_DIR/evaluations/<command>/<task>/; the parts go under the run directory, which every machine must
    reach (a shared file system: checked by markers, below), and the chief's command merges them."""

    def __init__(self, cfg, run_dir: Path, command: str):
        self.cfg, self.run_dir, self.command = cfg, Path(run_dir), command
        self.spec = self.task = None  # on a cluster spread over machines, the cluster and this machine's task
        if not Topology.of(cfg).local:
            self.spec, self.task = placement.this_task(cfg.cluster, cfg.strategy.name)
        place = self.run_dir / "evaluations" / command
        self.where = RunDir(place / self.task.name if self.task else place, cfg)

    def __enter__(self):
        if self.task is None:
            cluster_tasks.start_ahead(self.cfg, self.where)
        self._scratch = scratch_dir()
        self._scratch.__enter__()
        return self

    def __exit__(self, *exc):
        self._scratch.__exit__(*exc)

    @property
    def merges(self) -> bool:
        """Whether this process merges the parts: on a cluster spread over machines, the chief's only
        (the coordinator under parameter servers, the first worker under multi_worker_mirrored)."""
        return self.task is None or self.task.name == cluster_lib.chief_of(self.spec)

    def compute(self, data, options: dict) -> tuple[dict | None, float]:
        """Every part computed by the tasks: ({index, outputs[, labels]} in order, the seconds they took);
        (None, seconds) where another machine's command merges them."""
        cfg, where = self.cfg, self.where
        batch, workers = cfg.trainer.batch_size, Topology.of(cfg, self.spec).workers
        # PART_BATCHES batches, or fewer where that gives each worker two parts at least; whole batches
        size = int(options.get("part_size") or min(PART_BATCHES * batch, -(-data.test_examples // (2 * workers))))
        size = -(-max(size, 1) // batch) * batch
        parts = plan(data.test_examples, size)
        job = {"run_dir": str(self.run_dir.resolve()), "checkpoint": options.get("checkpoint"), "parts": parts,
               "labels": self.command == "evaluate"}
        if self.task is None:
            directory = where / "parts"
            shutil.rmtree(directory, ignore_errors=True)
        else:  # shared by the machines: named by what the parts hold, so kept across attempts of one command
            directory = where.path.parent / f"parts-{self._key(job)}"
        directory.mkdir(parents=True, exist_ok=True)
        where.path.mkdir(parents=True, exist_ok=True)
        where.write_config(OmegaConf.to_yaml(cfg, resolve=True))
        found = getattr(data, "found", None)
        if found is not None:  # (the tasks read the files without scanning them again)
            where.write_data(found.to_json())
        where.write_job({**job, "parts_dir": str(directory.resolve())})
        start, merged = time.perf_counter(), None
        try:
            if self.task is not None and self.task.type != "evaluator" and Topology.of(cfg).synchronous:
                self._meet(directory / "markers")
            outcome = self._run([sys.executable, "-m", "distrain.task", str(where.config)])
            if outcome.status == "interrupted":  # (Ctrl-C, SIGTERM: the command ends, as a run does)
                print_error(outcome.error)
                raise SystemExit(outcome.code)
            if outcome.code:
                failed = ConfigError if outcome.code == 2 else ClusterFailed  # (bad input a task found, or not)
                raise failed(outcome.error.removeprefix(error_line("")) or f"the cluster failed (exit status "
                             f"{outcome.code}): its logs are in {where.logs}")
            if not self.merges:
                return None, time.perf_counter() - start
            if self.task is not None:
                self._await(directory, parts, workers)
            merged = merge(directory, parts)
            return merged, time.perf_counter() - start
        finally:
            if self.task is None or merged is not None:  # (elsewhere, a failed command's parts serve the next)
                shutil.rmtree(directory, ignore_errors=True)

    def _key(self, job: dict) -> str:
        """What the parts hold, in a few characters: the job, the config but for its cluster group (whose
        keys differ by machine under cluster=manual), the cluster's tasks, and the run's weights as they are
        (a run trained further since holds others)."""
        cfg = OmegaConf.to_container(self.cfg, resolve=True)
        cfg.pop("cluster", None)
        run = RunDir(self.run_dir, self.cfg)
        weights = [run.saved_model / "saved_model.pb", run.checkpoints / "checkpoint"]
        stamps = [(str(p), p.stat().st_mtime_ns, p.stat().st_size) for p in weights if p.is_file()]
        shape = {kind: len(addresses) for kind, addresses in self.spec.items()}  # (ports differ by Slurm job)
        text = json.dumps([job, cfg, shape, stamps], sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    def _meet(self, markers: Path) -> None:
        """Each task's marker in the shared directory, and every other's seen, within
        cluster.startup_timeout: else one line, the parts could not be merged (a directory not shared)."""
        markers.mkdir(exist_ok=True)
        storage.write_atomic(markers / f"{self.task.name}.json",
                             json.dumps({"host": socket.gethostname(), "address": self.task.address}))
        names = [f"{kind}-{i}" for kind, addresses in self.spec.items() if kind != "evaluator"
                 for i in range(len(addresses))]
        timeout = self.cfg.cluster.startup_timeout
        deadline = time.monotonic() + timeout
        while missing := [n for n in names if not (markers / f"{n}.json").is_file()]:
            if time.monotonic() > deadline:
                raise ConfigError(f"{', '.join(missing)} left no marker in {markers} within {timeout:g} s "
                                  "(cluster.startup_timeout): evaluate and predict on several machines write their "
                                  "parts under the run directory, so every machine must reach it at the same path (a "
                                  "shared file system); start the same command on every machine")
            time.sleep(0.5)

    def _await(self, directory: Path, parts: list, workers: int) -> None:
        """Every part written, the other machines' too: while a part comes at least every
        cluster.startup_timeout seconds; else one line naming the parts missing and whose they are."""
        timeout = self.cfg.cluster.startup_timeout
        seen, since = -1, time.monotonic()
        while missing := [k for k in range(len(parts)) if not path(directory, k).exists()]:
            if len(parts) - len(missing) > seen:
                seen, since = len(parts) - len(missing), time.monotonic()
            elif time.monotonic() - since > timeout:
                ranks = sorted({k % workers for k in missing})
                raise ConfigError(f"{len(missing)} of {len(parts)} parts were not written within {timeout:g} s of the "
                                  f"last (cluster.startup_timeout; {_few(missing)}, of the workers of rank "
                                  f"{', '.join(map(str, ranks))}): read their logs in their machines' "
                                  f"{directory.parent}/<task>/logs; the same command again computes only those")
            time.sleep(0.5)

    def _run(self, argv: list) -> Outcome:
        """The tasks, run as a training's are (cluster_tasks.py), but that each worker computes parts of its
        own: a worker that dies is restarted alone, up to cluster.max_restarts times; a parameter server
        that dies restarts them all (its copy of the model is gone), and they go on with the parts not
        written yet. On a cluster spread over machines, this machine's task alone (not restarted: the same
        command again goes on with the parts not written)."""
        if self.task is None:
            return cluster_tasks.run_local(self.cfg, self.where, argv, independent_workers=True)
        if self.task.type == "evaluator":
            return Outcome(0, "ok")  # (an evaluator has nothing to compute)
        return cluster_tasks.run_this_task(self.cfg, self.where, argv, self.spec, self.task)
