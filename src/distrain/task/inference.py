"""One task of a clustered evaluate or predict (cluster_parts.py), started by the launcher with TF_CONFIG
saying which: a multi_worker_mirrored worker computes its parts (into job.json's parts_dir); under
parameter servers the ps and worker tasks serve while the chief reads every part and schedules its
batches on the workers."""
import collections
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

from distrain.common import cluster as cluster_lib
from distrain.common.errors import FINAL, fail
from distrain.common.lifetime import die_with_parent, exit_now
from distrain.common.messages import say_ready
from distrain.common.rundir import RunDir
from distrain.common.stacks import answer_stack_requests
from distrain.inference import cluster_parts as parts
from distrain.task.context import RunContext
from distrain.task.main import lost_peer, serve

AHEAD = 64  # batches scheduled on the workers beyond the one the coordinator waits for


def main(argv=None) -> int:
    die_with_parent()
    answer_stack_requests()
    where = RunDir(Path((argv or sys.argv[1:])[0]))
    cfg = OmegaConf.load(where.config)
    job = json.loads((where / "job.json").read_text())
    try:
        spec, task = cluster_lib.from_tf_config(os.environ.get("TF_CONFIG"), cfg.strategy.name)
        context = RunContext.of(RunDir(where.path, cfg), cfg, spec, task)
        ps = context.topology.parameter_servers
        if ps and task.type in ("ps", "worker"):  # (on machines of their own: until the coordinator is gone)
            cluster_lib.check_port_free(task)
            return serve(context, not context.topology.local, cfg.cluster.startup_timeout)
        import tensorflow as tf

        from distrain.common.cpu import onednn_line
        from distrain.inference.commands import load
        from distrain.task.strategy import configure_devices, make_strategy

        configure_devices(cfg.strategy)
        print(onednn_line(), flush=True)
        if ps:
            cluster_lib.wait_for_peers(cluster_lib.peers(spec, task))
        strategy = make_strategy(cfg.strategy, context) if ps else tf.distribute.get_strategy()
        data, model, _, _ = load(cfg, Path(job["run_dir"]), job, False, strategy, where)
        say_ready(task)
        plan = [tuple(p) for p in job["parts"]]
        mine = range(len(plan)) if ps else range(cluster_lib.rank(spec, task), len(plan), context.topology.workers)
        directory = Path(job["parts_dir"])
        todo = parts.todo(directory, list(mine))
        step = tf.function(lambda x: model(x, training=False), reduce_retracing=True)  # (Keras's predict_step)
        # One dataset for all its parts (its functions traced once), batches within parts (parts.py)
        ds = data.reader(cfg, training=False, examples=[plan[k] for k in todo])() if todo else []
        batches = scheduled(step, strategy, ds) if ps else ((np.asarray(step(x), np.float32), y.numpy()) for x, y in ds)
        progress = Progress(task.name, len(todo), len(mine))
        try:
            for k, outputs, labels in by_part(batches, todo, plan):
                parts.write(directory, k, plan[k][0], outputs, labels if job["labels"] else None)
                progress.one_more(len(outputs))
        except tf.errors.OpError as exc:  # (a parameter server lost: the launcher restarts the cluster)
            lost = lost_peer(exc, cfg, during="while computing the outputs")
            if lost is None:
                raise
            print(f"{lost}: the launcher restarts the cluster, which goes on with the parts not written", flush=True)
            os._exit(1)  # not a normal exit: TensorFlow's shutdown would wait for the lost peer
    except FINAL as exc:
        return fail(exc)
    if ps:  # the coordinator: all is written
        sys.stderr.flush()
        os._exit(0)  # TensorFlow's shutdown would remove its functions from every remote task
    return 0


def by_part(batches, todo: list, plan: list):
    """(k, outputs, labels) of each part k of `todo` in turn, from the (outputs, labels) of its batches."""
    outputs, labels = [], []
    parts_left = iter(todo)
    k = next(parts_left, None)
    for out, y in batches:
        outputs.append(out)
        labels.append(y)
        if sum(map(len, outputs)) == plan[k][1] - plan[k][0]:
            yield k, np.concatenate(outputs), np.concatenate(labels)
            outputs, labels, k = [], [], next(parts_left, None)
    if outputs or k is not None:  # (the reader's promise: the examples of the parts, no more, no fewer)
        raise RuntimeError(f"the parts' examples and the batches read do not match at part {k}: report this")


def scheduled(step, strategy, ds):
    """The (outputs, labels) of each batch in turn, computed by the workers: a function per batch,
    scheduled on whichever worker is free (and run again on another if its worker is lost), fetched in
    order. Up to AHEAD batches are scheduled ahead of the one awaited."""
    import tensorflow as tf

    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    waiting = collections.deque()
    for x, y in ds:
        waiting.append((coordinator.schedule(step, args=(x,)), y.numpy()))
        if len(waiting) > AHEAD:
            yield _fetched(*waiting.popleft())
    while waiting:
        yield _fetched(*waiting.popleft())


def _fetched(remote, labels) -> tuple:
    return np.asarray(remote.fetch(), np.float32), labels


class Progress:
    """A line every few seconds: the parts done of this task's, and its examples/s."""

    def __init__(self, name: str, todo: int, mine: int, every: float = 5.0):
        self.name, self.todo, self.mine, self.every = name, todo, mine, every
        self.done = self.examples = 0
        self.start = self.said = time.monotonic()
        if todo < mine:
            print(f"{name}: {mine - todo} of its {mine} parts were written before it (re)started; "
                  f"it computes the other {todo}", flush=True)

    def one_more(self, examples: int) -> None:
        self.done, self.examples = self.done + 1, self.examples + examples
        now = time.monotonic()
        if now - self.said >= self.every or self.done == self.todo:
            self.said = now
            print(f"{self.name}: {self.done} of {self.todo} parts, {self.examples:,} examples, "
                  f"{self.examples / max(now - self.start, 1e-9):,.0f} examples/s", flush=True)


if __name__ == "__main__":
    exit_now(main())
