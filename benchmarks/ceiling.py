"""The machine's compute ceiling for a run's model and batch: forward, backward and the optimizer on one
resident batch in a tf.function loop, no input pipeline, no metrics. benchmarks/run.py (section
`ceiling`) compares `train.py` with it.

    python benchmarks/ceiling.py [--seconds 6] [--rounds 5] [train.py overrides...]

The model, optimizer, precision and global batch are the run's own, built by distrain from the same
config as `train.py OVERRIDES` (default strategy, one process). Prints one JSON line: the median
examples/s over rounds of --seconds each (after one round of tracing and warm-up), and every round's.
"""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import distrain  # noqa: E402,F401  (sets TF_USE_LEGACY_KERAS)
from distrain import cli  # noqa: E402 - after the environment is set


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--rounds", type=int, default=5)
    opts, overrides = parser.parse_known_args()

    import tensorflow as tf

    from distrain.common.rundir import RunDir
    from distrain.config.validate import validate
    from distrain.data import arrays
    from distrain.task.context import RunContext
    from distrain.task.input_data import load_data
    from distrain.task.metrics import make_loss
    from distrain.task.setup import set_up, strategy_of

    cfg = validate(cli._compose([], ["trainer.verbose=0", "trainer.save_model=false", *overrides]))
    arrays.settle_source(cfg)  # (as the launcher settles it)
    strategy = strategy_of(cfg, default=True)  # (one process, the run's devices)
    context = RunContext.of(RunDir(Path("."), cfg), cfg).know_strategy(strategy)
    data, model, optimizer, probabilities, policy, _ = set_up(cfg, context, strategy, load_data)
    loss_fn = make_loss(cfg.loss, probabilities)
    batch = cfg.trainer.batch_size
    x, y = next(iter(data.reader(cfg)()))  # one batch of the run's own input, resident from here on
    scaled = hasattr(optimizer, "get_scaled_loss")

    @tf.function
    def steps(n):
        for _ in tf.range(n):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(loss_fn(y, model(x, training=True)))
                if scaled:
                    loss = optimizer.get_scaled_loss(loss)
            grads = tape.gradient(loss, model.trainable_variables)
            if scaled:
                grads = optimizer.get_unscaled_gradients(grads)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return optimizer.iterations

    per_call = 64  # steps per call: the loop's own overhead out of the way
    rates = []
    for _ in range(opts.rounds + 1):
        start, done = time.perf_counter(), 0
        while time.perf_counter() - start < opts.seconds:
            steps(tf.constant(per_call)).numpy()
            done += per_call
        rates.append(done * batch / (time.perf_counter() - start))
    rates = rates[1:]  # (the first: tracing, warm-up)
    print(json.dumps({"examples_per_sec": statistics.median(rates), "rounds": rates, "precision_policy": policy}))


if __name__ == "__main__":
    main()
