"""The reference: the same training written by hand with plain tf_keras `Model.fit`, as the Keras
"simple MNIST convnet" example does it. benchmarks/run.py compares `train.py strategy=default` with it.

    python benchmarks/plain_keras.py [--epochs 4] [--batch 128] [--jit-compile] [--mixed-bfloat16] [--out r.json]

Same model, data (the bundled 8,000 training digits, shuffled and split as distrain splits them),
batch, optimizer and learning rate. Same definition of examples/s: examples trained in the epochs
after the first (tracing, warm-up), over those epochs' seconds.
"""
import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402 - after the environment is set

BUNDLED = Path(__file__).resolve().parents[1] / "src" / "distrain" / "data" / "mnist-10k.npz"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--jit-compile", action="store_true")
    parser.add_argument("--mixed-bfloat16", action="store_true")
    parser.add_argument("--out", type=Path)
    opts = parser.parse_args()
    import tf_keras as keras  # (here: --help answers without TensorFlow)

    with np.load(BUNDLED) as f:
        images, labels = f["images"], f["labels"]
    order = np.random.default_rng(opts.seed).permutation(len(labels))
    images = (images[order].astype("float32") / 255.0)[..., None]
    labels = labels[order].astype("int32")
    x_train, y_train, x_test, y_test = images[:8000], labels[:8000], images[8000:], labels[8000:]

    keras.utils.set_random_seed(opts.seed)
    if opts.mixed_bfloat16:
        keras.mixed_precision.set_global_policy("mixed_bfloat16")
    model = keras.Sequential([
        keras.Input(shape=(28, 28, 1)),
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.MaxPooling2D(2),
        keras.layers.Conv2D(64, 3, activation="relu"),
        keras.layers.MaxPooling2D(2),
        keras.layers.Flatten(),
        keras.layers.Dropout(0.5),
        keras.layers.Dense(10),
        keras.layers.Activation("linear", dtype="float32"),
    ])
    model.compile(optimizer=keras.optimizers.Adam(0.002),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"],
                  jit_compile=opts.jit_compile)
    seconds, started = [], []
    times = keras.callbacks.LambdaCallback(on_epoch_begin=lambda epoch, logs: started.append(time.perf_counter()),
                                           on_epoch_end=lambda epoch, logs: seconds.append(time.perf_counter()
                                                                                           - started[-1]))
    model.fit(x_train, y_train, batch_size=opts.batch, epochs=opts.epochs, shuffle=True, verbose=0, callbacks=[times])
    _, accuracy = model.evaluate(x_test, y_test, batch_size=opts.batch, verbose=0)
    timed = seconds[1:] or seconds
    results = {"examples_per_sec": len(y_train) * len(timed) / sum(timed), "epoch_seconds": seconds,
               "test_accuracy": float(accuracy)}
    print(json.dumps(results))
    if opts.out:
        opts.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
