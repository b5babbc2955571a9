"""Checkpoints and resume: what a run saves so that it can go on exactly where it stopped.

A checkpoint holds the model, the optimizer (whose `iterations` is the global step) and the training
position with the history so far, as JSON in a string variable, so all of it is written and read
together. `tf.train.CheckpointManager` writes a checkpoint's files first and its name into the
`checkpoint` index last, atomically, so a checkpoint cut short by a crash is never the one resumed.
"""
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import tensorflow as tf

from distrain.common.errors import ConfigError, first_line
from distrain.task.input_pipeline import replica_shares


@dataclass
class Progress:
    """Where training stands: epochs finished, steps of the current epoch finished, that epoch's sums so
    far (over every worker), the history of the finished ones, and the callback that stopped it early."""
    epoch: int = 0
    step: int = 0
    totals: list = field(default_factory=list)  # the epoch's sums so far (metrics.Tally; none yet: [])
    history: dict = field(default_factory=dict)  # name -> a value per epoch: the loss, then each metric
    epoch_seconds: list = field(default_factory=list)
    epoch_cpu_seconds: list = field(default_factory=list)  # this process's CPU time (every thread) per epoch
    seconds: float = 0.0  # spent training the current epoch so far
    restarts: int = 0  # times this run was resumed
    resumed_from_step: int | None = None
    stopped_early: str = ""  # e.g. "callbacks.early_stopping stopped training after epoch 7"
    membership: list = field(default_factory=list)  # each size trained at: {from_step, workers, replicas}


def joined(progress: Progress, workers: int, replicas: int, step: int) -> dict | None:
    """Records the size the run trains at from global `step` on; the size it had before, where that
    differs (a resume at another number of workers or replicas), else None."""
    before = progress.membership[-1] if progress.membership else None
    if before and (before["workers"], before["replicas"]) == (workers, replicas):
        return None
    progress.membership.append({"from_step": step, "workers": workers, "replicas": replicas})
    return before


def resized_line(before: dict, progress: Progress, batch: int, streamed: bool, asynchronous: bool) -> str:
    """What a resume at another size keeps and changes, in one line (streamed: the data is in files)."""
    now = progress.membership[-1]

    def size(m: dict) -> str:
        return f"{m['workers']} worker{'s' * (m['workers'] > 1)}, {m['replicas']} replica{'s' * (m['replicas'] > 1)}"
    line = f"resumed at step {now['from_step']} on {size(now)}; its checkpoint was made on {size(before)}: "
    shares = replica_shares(batch, now["replicas"])
    line += f"each step a batch of {batch} on one worker, as before" if asynchronous else \
        f"the global batch {batch} kept ({shares[0]} per replica)" if len(set(shares)) == 1 else \
        (f"the global batch {batch} kept, split unevenly over the {now['replicas']} replicas ({shares[0]} or "
         f"{shares[-1]} each: the one-example-larger replicas' steps set the pace)")
    if streamed and not asynchronous:
        line += "; the training files' shares change with the workers, so they are read afresh" + (
            f": the rest of epoch {progress.epoch + 1} may read some of its records twice and others not"
            if progress.step else f" from epoch {progress.epoch + 1} on")
    return line


class Checkpoints:
    def __init__(self, model, optimizer, directory: Path, keep: int = 1):
        self.position = tf.Variable("", dtype=tf.string, trainable=False)
        self.checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, progress=self.position)
        self.manager = tf.train.CheckpointManager(self.checkpoint, str(directory), max_to_keep=keep)

    def save(self, progress: Progress, global_step: int) -> str:
        self.position.assign(json.dumps(asdict(progress)))
        return self.manager.save(checkpoint_number=global_step)

    def restore(self, directory: Path) -> Progress:
        """The newest intact checkpoint in `directory` into the model and optimizer; its training position.
        An unreadable newest checkpoint (truncated by a full disk or a crash) falls back to the older ones
        kept, saying which it skipped; none at all, or none readable, is a ConfigError naming it."""
        state = tf.train.get_checkpoint_state(str(directory))
        paths = list(reversed(state.all_model_checkpoint_paths)) if state else []
        if not paths:
            raise ConfigError(f"trainer.resume=true but {directory} holds no checkpoint: "
                              "resume a run that saved one (trainer.save_model=true), or drop trainer.resume")
        skipped = []
        for path in paths:
            try:
                self.checkpoint.restore(path).assert_existing_objects_matched()
                progress = Progress(**json.loads(self.position.numpy().decode()))
            except Exception as exc:  # noqa: BLE001 - truncated files fail in many ways; each is "cannot be resumed"
                skipped.append((Path(path).name, first_line(str(exc))))
                continue
            if skipped:
                print(f"warning: skipped unreadable checkpoint(s) {'; '.join(f'{n} ({why})' for n, why in skipped)}: "
                      f"resuming from {Path(path).name}, the newest intact one", flush=True)
            return progress
        raise ConfigError(f"checkpoint {paths[0]} cannot be resumed ({skipped[0][1]}), nor "
                          f"can the {len(paths) - 1} older one(s) kept: they are corrupt or from another model or "
                          "optimizer; restore the run's own checkpoints or start a new run")


def resume(checkpoints: Checkpoints, directory: Path, steps_per_epoch: int, epochs: int) -> Progress:
    """Restore the latest checkpoint in `directory`; the position to go on from, counted as a restart.
    A run that trained further than `epochs` (trainer.epochs, lowered) is refused: it would end untouched."""
    progress = checkpoints.restore(directory)
    begun = progress.epoch + (1 if progress.step else 0)
    if begun > epochs:
        raise ConfigError(f"trainer.epochs={epochs}, but the run being resumed has trained {progress.epoch} epoch(s)"
                          f"{f' and {progress.step} step(s)' if progress.step else ''} already: set trainer.epochs="
                          f"{begun} or more to go on with it (distrain evaluate RUN_DIR tests it as it is)")
    progress.restarts += 1
    progress.resumed_from_step = int(checkpoints.checkpoint.optimizer.iterations.numpy())
    print(f"resumed from global step {progress.resumed_from_step} (epoch {progress.epoch + 1}, "
          f"step {progress.step} of {steps_per_epoch})", flush=True)
    return progress


def read_position(path: str) -> Progress | None:
    """The training position saved in one checkpoint (for the evaluator), or None if it has none."""
    try:
        text = tf.train.load_checkpoint(path).get_tensor("progress/.ATTRIBUTES/VARIABLE_VALUE")
    except (tf.errors.OpError, ValueError):
        return None
    return Progress(**json.loads(text.decode() if isinstance(text, bytes) else text))


def segments(start: int, end: int, per_call: int, every: int, offset: int, marks=()) -> list:
    """The calls (steps per call) from step `start` to `end` of an epoch, cut into segments that end
    where a checkpoint is due (where the global step, offset + step, is a multiple of `every`) and at
    the global steps `marks` (a profile's start and end)."""
    cuts = sorted({end} | {s for s in range(start + 1, end) if every and (offset + s) % every == 0 or
                           offset + s in marks})
    out, previous = [], start
    for cut in cuts:
        n = cut - previous
        out.append([per_call] * (n // per_call) + [n % per_call] * bool(n % per_call))
        previous = cut
    return out
