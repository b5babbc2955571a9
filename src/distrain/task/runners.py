"""The runners of an epoch's training steps: one tf.function of a few steps (forward pass, loss,
gradients, apply), and how it is called. SyncEpochs: every worker process calls it (multi-worker
mirrored, mirrored, one device). AsyncEpochs: the parameter-server coordinator schedules the calls
on whichever worker is free. The loss and metrics are passed in; what comes back is their sums."""
import time

import numpy as np
import tensorflow as tf
import tf_keras as keras

from distrain.common.lifetime import Heartbeat
from distrain.common.stacks import Position
from distrain.report.results import seconds_since_start
from distrain.report.timesplit import shares
from distrain.task.strategy import replica_devices

# The runners, never deleted: deleting the coordinator's functions removes them from every remote
# task, which after a worker's restart takes seconds (12 s for a run's functions, measured), and
# deleting a multi_worker_mirrored input iterator can wait 1.2 s for the peers (seen in 6 of 10 runs
# with TensorBoard's scalars). A task's process ends without (task.main); so do the tests' (conftest.py).
KEPT = []


def make_train_steps(strategy, model, optimizer, jit_compile: bool, loss_fn, tally, timed: bool = True,
                     accumulate: int = 1, batch: int | None = None):
    """A tf.function that runs `steps` training steps on this worker's replicas and returns this
    worker's sums (metrics.Tally: the losses, each metric's state, the examples). loss_fn(labels,
    outputs): the loss of each example (reduction "none"). The sums stay local: Keras metrics would be
    synchronised across the workers at every step (multi-worker mirrored) or live on the ps tasks.
    timed: stamp the steps for the time split (timesplit.py); else their clocks are zeros. accumulate:
    a step is one update from this many batches, summed on each replica, then one all-reduce (accumulating).
    batch: the global batch, over which each replica's loss is averaged whatever its share (make_gradients)."""
    scaled = isinstance(optimizer, keras.mixed_precision.LossScaleOptimizer)
    gradients = make_gradients(model, optimizer, loss_fn, jit_compile, scaled, 1.0 / accumulate, batch)
    remote = isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy)  # variables on ps tasks
    aggregator = optimizer.inner_optimizer if scaled else optimizer  # (as the loss-scaling one aggregates)

    def update(grads, variables):
        """A replica's update: its clock [seconds in the all-reduce, when its update was done]."""
        if not timed:
            optimizer.apply_gradients(zip(grads, variables))  # all-reduces across replicas
            return tf.zeros([2], tf.float64)
        return timed_update(optimizer, aggregator, grads, variables, remote)

    def step(images, labels):
        """A replica's step: its sums, and its clock."""
        grads, losses, outputs = gradients(images, labels)
        return tally.add(labels, outputs, losses), update(grads, model.trainable_variables)

    first, more, apply = accumulating(gradients, tally, update, model.trainable_variables)

    @tf.function(autograph=False)
    def train_steps(iterator, steps):
        """This worker's sums, and its clock: [seconds waiting for batches, in the all-reduce (a mean over
        its replicas), of the whole call]. Each batch is asked for once the step before is done, so that
        its wait is not the previous step's work."""
        def one_step(done, totals, waited, reducing, finished):
            held = None
            for k in range(accumulate):  # (unrolled: `accumulate` batches, then one update)
                asked = stamp_after([totals, finished])
                with tf.control_dependencies([asked]):
                    batch = next(iterator)
                waited += stamp_after(batch) - asked
                if accumulate == 1:
                    sums, clock = strategy.run(step, args=batch)
                else:
                    held, sums = strategy.run(first, args=batch) if k == 0 else strategy.run(more, args=(*batch, held))
                totals += tf.add_n(strategy.experimental_local_results(sums))
            if accumulate > 1:
                clock = strategy.run(apply, args=(held,))
            clocks = tf.stack(strategy.experimental_local_results(clock))
            reducing += tf.reduce_mean(clocks[:, 0])
            finished = tf.maximum(tf.reduce_max(clocks[:, 1]), asked) if timed else asked
            return done + 1, totals, waited, reducing, finished

        zero = tf.constant(0.0, tf.float64)
        begun = tf.timestamp()
        _, totals, waited, reducing, finished = tf.while_loop(
            lambda done, *_: done < steps, one_step, [tf.zeros_like(steps), tf.zeros([tally.size]), zero, zero, begun])
        span = stamp_after([totals, finished]) - begun
        return totals, tf.cast(tf.stack([waited, reducing, span]), tf.float32)

    return train_steps


def accumulating(gradients, tally, update, variables: list) -> tuple:
    """A replica's functions of an accumulated update (make_train_steps): first(images, labels) gives its
    gradients of a batch (of the variables they reach) and its sums; more(images, labels, held) adds a
    batch's to those held, on this replica alone (no all-reduce); apply(held) is the update."""
    connected = []  # the variables that have gradients (found as the first batch's function is traced)

    def first(images, labels):
        grads, losses, outputs = gradients(images, labels)
        connected[:] = [i for i, g in enumerate(grads) if g is not None]
        return [tf.convert_to_tensor(grads[i]) for i in connected], tally.add(labels, outputs, losses)

    def more(images, labels, held):
        grads, losses, outputs = gradients(images, labels)
        return [h + tf.convert_to_tensor(grads[i]) for h, i in zip(held, connected)], tally.add(labels, outputs, losses)

    def apply(held):
        return update(held, [variables[i] for i in connected])
    return first, more, apply


def make_gradients(model, optimizer, loss_fn, jit_compile: bool, scaled: bool, share: float = 1.0,
                   batch: int | None = None):
    """A tf.function of a replica's forward and backward pass: (gradients, each example's loss, float32
    outputs); XLA compiles this part only, never the cross-worker all-reduce. share: the batch's part of
    an update (1 / trainer.accumulate_steps), by which its loss is multiplied. batch: the global batch
    (trainer.batch_size), over which each replica's loss is averaged, whatever its share of it (replicas
    of a run resumed at another size may take shares one example apart)."""
    # Autograph converts what the user brings, as Keras's fit does: the model's and the loss's calls here
    # (tf_keras converts a subclassed layer's or loss's own code within), the metrics' in the tally. The
    # steps and their helpers here are TensorFlow's ops, branching on Python values only: converting them
    # too cost each task 0.25 s of CPU (measured).
    forward = tf.autograph.to_graph(forward_pass)

    @tf.function(jit_compile=jit_compile, autograph=False)
    def gradients(images, labels):
        with tf.GradientTape() as tape:
            logits, losses = forward(model, loss_fn, images, labels)
            # over the global batch: replica gradients sum to the mean
            loss = tf.nn.compute_average_loss(losses, global_batch_size=batch)
            if model.losses:  # the layers' penalties (kernel_regularizer, add_loss), as fit adds them
                penalty = tf.add_n([tf.cast(x, tf.float32) for x in model.losses])
                loss += tf.nn.scale_regularization_loss(penalty)
                losses = tf.cast(losses, tf.float32) + penalty  # reported as fit reports it: with the penalty
            if share != 1.0:  # (summed over an update's batches: the mean over them all)
                loss *= share
            if scaled:
                loss = optimizer.get_scaled_loss(loss)
        grads = tape.gradient(loss, model.trainable_variables)
        if scaled:
            grads = optimizer.get_unscaled_gradients(grads)
        return grads, losses, tf.cast(logits, tf.float32)
    return gradients


def forward_pass(model, loss_fn, images, labels):
    """The user's model and loss on a batch: what autograph converts in a step (make_train_steps)."""
    logits = model(images, training=True)
    return logits, loss_fn(labels, logits)


def timed_update(optimizer, aggregator, grads, variables, remote: bool) -> tf.Tensor:
    """Apply the gradients, all-reduced across the replicas first as apply_gradients would do it
    (aggregator.aggregate_gradients), stamped: [seconds in the all-reduce (with the wait for the slowest
    replica), when the update was done]."""
    computed = stamp_after(grads)
    pairs = aggregator.aggregate_gradients(list(zip(held_until(grads, computed), variables)))
    reduced = stamp_after([g for g, _ in pairs])
    optimizer.apply_gradients(pairs, skip_gradients_aggregation=True)
    # Done once the variables read back updated (on ps tasks a read is a round trip: once reduced).
    done = reduced if remote else stamp_after([v.read_value() for v in variables])
    return tf.stack([reduced - computed, done])


def stamp_after(structure) -> tf.Tensor:
    """A tf.timestamp() (seconds) taken once every tensor of `structure` is computed."""
    # (On identities of them: a control dependency on a nested tf.function's outputs waits only for its
    # stateful ops, not for the outputs to be computed.)
    with tf.control_dependencies([tf.identity(t) for t in tf.nest.flatten(structure, expand_composites=True)
                                  if isinstance(t, tf.Tensor)]):
        return tf.timestamp()


def held_until(structure, stamp: tf.Tensor):
    """`structure`'s tensors, as identities that wait for `stamp`: what consumes them starts after it."""
    with tf.control_dependencies([stamp]):
        return tf.nest.map_structure(lambda t: t if t is None else tf.identity(t), structure, expand_composites=True)


class SyncEpochs:
    """Synchronous strategies: every worker process makes each call itself. Gradients are all-reduced
    inside every step; the sums of the loss and metrics (the tally's, as make_train_steps returns them)
    only when asked for (checkpoints, epoch end)."""

    first_step_at = None  # time.time() when the first call returned

    def __init__(self, strategy, train_steps, dataset, optimizer, tally, per_call: int, progress: bool,
                 workers: int = 1):
        self.strategy, self.train_steps, self.iterator = strategy, train_steps, iter(dataset)
        self.optimizer, self.tally, self.per_call, self.progress = optimizer, tally, per_call, progress
        self.workers, self.position, self.step_base = workers, Position(), 0

    def begin(self, steps: int, done: int, carried: list) -> None:
        """An epoch of `steps` steps, `done` of them already (resumed), whose sums so far are `carried`."""
        self.local, self.carried, self.done = tf.zeros([len(carried)]), np.array(carried, np.float32), done
        self.clock = tf.zeros([3])  # this epoch's train_steps clock, summed
        names = [*self.tally.names, *(f"val_{name}" for name in self.tally.names)]  # values, never averaged
        self.bar = keras.utils.Progbar(steps, stateful_metrics=names) if self.progress else None
        if self.bar and done:
            self.bar.update(done)

    def run(self, calls: list, on_nan=None, stop=None) -> int:
        """The calls, or those before stop() says to stop; the steps they ran. on_nan(step) as soon as
        this worker's loss is no number (the workers share their weights, so they diverge together)."""
        ran = 0
        for steps in calls:
            sums, clock = self.train_steps(self.iterator, tf.constant(steps))
            self.local, self.clock = self.local + sums, self.clock + clock
            self.done, ran = self.done + steps, ran + steps
            self.position.at(self.step_base + self.done)
            self.first_step_at = self.first_step_at or time.time()
            if on_nan and not np.isfinite(self.local[0].numpy()):
                on_nan(self.done)
            if self.bar and self.done < self.bar.target:  # this worker's running values
                self.bar.update(self.done, self.tally.values(self.local + self.carried), finalize=False)
            if stop and stop():
                break
        return ran

    def totals(self) -> list:
        """The sums of the epoch so far over every worker (all of them must ask)."""
        return (across_workers(self.strategy, self.local).numpy() + self.carried).tolist()

    def end(self, seconds: float) -> tuple[list, dict]:
        """The epoch's sums over every worker, and where the steps' own time went (timesplit.shares of the
        training function's seconds, measured inside it: no tracing, no Python around it; the epoch's
        `seconds` where it measured none): each worker's waits for input and in the all-reduce, averaged over
        the workers, in one all-reduce; and the seconds the steps computed (`steps_seconds`)."""
        both = across_workers(self.strategy, tf.concat([self.local, self.clock], 0)).numpy()
        waited, reducing, span = both[-3:] / self.workers
        split = shares(span if span > 0 else seconds, waited, reducing)
        return (both[:-3] + self.carried).tolist(), split | {"steps_seconds": max(float(span - waited - reducing), 0.0)}

    def show(self, logs: dict) -> None:
        """The epoch's last update of the bar: the whole cluster's values, and validation's."""
        if self.bar:
            self.bar.update(self.done, list(logs.items()), finalize=True)

    def epoch_line(self, steps: int) -> str:
        return f"{steps} steps"

    def scalars(self) -> dict:
        """The epoch's scalars for TensorBoard beyond loss, accuracy and speed."""
        return {"epoch_learning_rate": learning_rate(self.optimizer)}

    def finish(self, model, rebuild) -> tuple:
        """The trained model and its optimizer, to evaluate in this process: these."""
        self.position.done()
        return model, self.optimizer

    def to_save(self, model, optimizer, rebuild, chief: bool) -> tuple | None:
        """What the chief saves as the SavedModel (None elsewhere): the trained model, or where it spans
        several workers a copy built here (saving the replicated model would take every worker, each
        tracing and writing a SavedModel that only the chief keeps). Every worker reads the weights: a
        variable each replica keeps for itself (batch normalisation's statistics) is read with an all-reduce."""
        if self.workers == 1:
            return model, optimizer
        weights = whole_weights(model)
        return local_copy(weights, rebuild) if chief else None

    def describe(self, batch_size: int) -> dict:
        replicas = self.strategy.num_replicas_in_sync
        return {"num_replicas": replicas, "num_workers": self.workers, "num_ps": 0,
                "devices": replica_devices(self.strategy), "per_replica_batch_size": batch_size // replicas,
                "steps_per_execution": self.per_call, "global_steps": int(self.optimizer.iterations.numpy()),
                "seconds_to_first_step": seconds_since_start(self.first_step_at)}


def learning_rate(optimizer) -> float:
    """The optimizer's learning rate: a schedule's at the last step taken (Keras keeps it so)."""
    rate = optimizer.learning_rate
    return float(keras.backend.get_value(rate(optimizer.iterations) if callable(rate) else rate))


def across_workers(strategy, local):
    """The sum of every worker's `local` (one all-reduce); a single process already holds it all."""
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return local
    share = local / len(strategy.extended.worker_devices)  # each of this worker's replicas holds a share
    return strategy.reduce("SUM", strategy.experimental_distribute_values_from_function(lambda _: share),
                           axis=None)


class AsyncEpochs:
    """Parameter servers: this process is the coordinator. It schedules the calls on whichever worker
    is free and waits for them all, counting each worker's steps. A worker that dies loses nothing:
    its calls run again on the others."""
    progress = False
    first_step_at = None  # time.time() when the first call returned

    def __init__(self, strategy, train_steps, dataset_fn, model, optimizer, tally, steps: int,
                 steps_per_execution: int, workers: int, ps: int):
        self.strategy, self.tally, self.workers, self.ps = strategy, tally, workers, ps
        print(placement_table(model.variables + optimizer.variables, ps), flush=True)
        # An epoch ends at a join(): with too few functions per epoch, workers idle while the last ones
        # finish. Keep at least 4 per worker.
        self.per_call = max(1, min(steps_per_execution, steps // (4 * workers)))
        self.coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
        # Kept for the run: a worker builds its dataset later, and again after a restart, from files
        # that dataset_fn may hold (data.TemporaryIdx).
        self.dataset_fn = dataset_fn
        self.iterator = iter(self.coordinator.create_per_worker_dataset(dataset_fn))
        self.optimizer = optimizer
        self.worker_steps = [0] * workers
        self.logged_steps = [0] * workers  # as the last epoch's scalars counted them
        print(f"coordinator up: {workers} worker(s)", flush=True)
        # TensorFlow waits without end for a call on a hung worker or ps task (it retries only on
        # tasks that fail), and so does a checkpoint, which registers a function on every task: the
        # launcher watches this heartbeat instead.
        self.heartbeat, self.position, self.step_base = Heartbeat(), Position(), 0

        @tf.function(autograph=False)  # (TensorFlow's ops only: the user's code is converted in train_steps)
        def scheduled(iterator, steps):
            return tf.distribute.coordinator.experimental_get_current_worker_index(), train_steps(iterator, steps)
        self.scheduled = scheduled

    def begin(self, steps: int, done: int, carried: list) -> None:
        self.sums, self.done = np.array(carried, np.float64), done
        self.clock = np.zeros(3)  # the epoch's calls' train_steps clocks, summed over the workers

    def run(self, calls: list, on_nan=None, stop=None) -> int:
        """The calls, scheduled at once and joined (so all of them run); on_nan(step) if the loss is
        then no number. Returns the steps run."""
        before = self.done
        remote = [(steps, self.coordinator.schedule(self.scheduled, args=(self.iterator, tf.constant(steps))))
                  for steps in calls]
        for steps, value in remote:
            try:
                worker, (worker_totals, clock) = value.fetch()  # once the call has run, on whichever worker took it
            except tf.errors.UnavailableError:  # it ran, but its worker died before its sums were copied here
                continue  # (a failed ps or call is raised again by join() below)
            finally:
                self.heartbeat.pet()
            self.first_step_at = self.first_step_at or time.time()
            self.worker_steps[int(worker)] += steps
            self.done += steps
            self.position.at(self.step_base + self.done)
            self.sums += worker_totals
            self.clock += clock
        self.coordinator.join()
        self.done = before + sum(calls)
        if on_nan and not np.isfinite(self.sums[0]):
            on_nan(self.done)
        return sum(calls)

    def totals(self) -> list:
        return self.sums.tolist()

    def end(self, seconds: float) -> tuple[list, dict]:
        """The epoch's sums, and where the workers' `seconds` went: their waits for input; the time no
        call of theirs ran (waiting for the coordinator to schedule one, for a join) with their all-reduce
        waits as communication."""
        waited, reducing, busy = self.clock
        capacity = seconds * self.workers
        return self.totals(), shares(capacity, waited, reducing + max(capacity - busy, 0.0))

    def show(self, logs: dict) -> None:
        """(No bar: the epoch's line says it.)"""

    def epoch_line(self, steps: int) -> str:
        per_worker = ", ".join(f"worker {i}: {n}" for i, n in enumerate(self.worker_steps))
        return f"global step {int(self.optimizer.iterations.numpy())} ({per_worker})"

    def scalars(self) -> dict:
        """The learning rate, and the steps each worker ran this epoch (asynchronous: a slow or lost
        worker runs fewer)."""
        ran = {f"epoch_steps_worker_{i}": n - before for i, (n, before) in
               enumerate(zip(self.worker_steps, self.logged_steps))}
        self.logged_steps = list(self.worker_steps)
        return {"epoch_learning_rate": learning_rate(self.optimizer), **ran}

    def finish(self, model, rebuild) -> tuple:
        """A copy of the trained model and a fresh optimizer here on the coordinator (rebuild() makes
        them), to evaluate and save: the trained variables live on the ps tasks."""
        self.heartbeat.stop()
        self.position.done()
        return local_copy(whole_weights(model), rebuild)

    def to_save(self, model, optimizer, rebuild, chief: bool) -> tuple:
        """What the coordinator saves as the SavedModel: the copy finish() made."""
        return model, optimizer

    def describe(self, batch_size: int) -> dict:
        workers, ps = self.workers, self.ps
        replicas = self.strategy.num_replicas_in_sync  # per worker
        return {"num_replicas": replicas * workers, "num_workers": workers, "num_ps": ps,
                "devices": replica_devices(self.strategy), "per_replica_batch_size": batch_size // replicas,
                "steps_per_execution": self.per_call, "global_steps": int(self.optimizer.iterations.numpy()),
                "seconds_to_first_step": seconds_since_start(self.first_step_at),
                "worker_steps": {str(i): n for i, n in enumerate(self.worker_steps)}}


def local_copy(weights: list, rebuild) -> tuple:
    """A model built in this process outside the strategy, holding these weights, and a fresh optimizer
    (rebuild() builds both)."""
    model, optimizer = rebuild()
    model.set_weights(weights)
    return model, optimizer


def whole_weights(model) -> list:
    """model.get_weights(), with each variable that strategy.variable_partitioner sharded over the ps
    tasks whole again (Keras lists its shards apart): what a copy built without the partitioner takes."""
    values, seen = [], set()
    for variable in model.weights:
        container = getattr(variable, "_sharded_container", None)  # (set on each shard by TensorFlow)
        sharded = container() if container else None
        if sharded is None:
            values.append(variable.numpy())
        elif id(sharded) not in seen:
            seen.add(id(sharded))
            values.append(tf.concat([shard.read_value() for shard in sharded.variables], axis=0).numpy())
    return values


def placement_table(variables, num_ps: int) -> str:
    """Which ps task holds each variable (shards listed one by one): what replica_device_setter did."""
    lines = [f"variable placement over {num_ps} ps task(s):"]
    for variable in variables:
        for shard in getattr(variable, "variables", [variable]):  # a ShardedVariable lists its shards
            spec = tf.DeviceSpec.from_string(shard.device)
            lines.append(f"  {shard.name:<40} {str(tuple(shard.shape)):<16} {spec.job}:{spec.task}")
    return "\n".join(lines)
