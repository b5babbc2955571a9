"""The evaluator task of a cluster (cluster.evaluator=true): no server, no strategy; it evaluates the
chief's checkpoints as they appear, on the test data, and the task writes evaluation.json."""
from pathlib import Path

import tensorflow as tf

from distrain.task.checkpoints import read_position
from distrain.task.context import RunContext
from distrain.task.input_data import load_data
from distrain.task.model import compile_model
from distrain.task.setup import set_up


def evaluate_checkpoints(cfg, context: RunContext) -> dict:
    """Evaluate each checkpoint the chief writes, until the run's last (the last epoch's, or the one a
    callback stopped training at), with the model and data the training builds."""
    t, run = cfg.trainer, context.run
    data, model, optimizer, probabilities, _, _ = set_up(cfg, context, tf.distribute.get_strategy(), load_data)
    compile_model(model, optimizer, cfg, probabilities)
    test_ds = data.reader(cfg, training=False)()
    directory = run.checkpoints
    print(f"evaluator: waiting for checkpoints in {directory}", flush=True)
    evaluations = []
    for path in tf.train.checkpoints_iterator(str(directory)):  # each newest checkpoint, once
        try:
            tf.train.Checkpoint(model=model).restore(path).expect_partial()
        except tf.errors.NotFoundError:  # pruned before we got to it
            continue
        except (tf.errors.OpError, ValueError) as exc:  # cut short (a full disk): the next one will do
            print(f"evaluator: skipped {Path(path).name}, which cannot be read ({type(exc).__name__})", flush=True)
            continue
        position = read_position(path)
        if position is None:  # pruned before we got to it
            continue
        test = model.evaluate(test_ds, steps=data.test_steps(t.batch_size), verbose=0, return_dict=True)
        epoch, step = position.epoch, position.step  # epochs finished, steps into the next
        evaluations.append({"checkpoint": Path(path).name, "epoch": epoch, "step": step, **test})
        where = f"epoch {epoch}" + (f" + {step} steps" if step else "")
        said = ", ".join(f"{name} {value:.4f}" for name, value in test.items())
        print(f"evaluator: {where} ({Path(path).name}): test {said}", flush=True)
        if epoch >= t.epochs or position.stopped_early:  # the run's last checkpoint
            break
    return {"checkpoint_dir": str(directory), "evaluations": evaluations}
