"""Any Keras task, not only classification of images: the loss and metrics by `_target_` (regression,
multi-label, one-hot labels), labels and features of any shape, metrics summed as states across
replicas and workers, and a trained model that plain Keras loads."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

from distrain.config.schema_check import check
from distrain.task.metrics import Tally, make_metrics

from helpers import ROOT, RUN_TIMEOUT, assert_nothing_left, make_cfg, run_cli, tensorboard_values

TIME_SPLIT = {"time_input", "time_compute", "time_communication", "time_steps_seconds"}  # per epoch, in the history

MODELS = '''
import tf_keras as keras

def seeded(input_shape, num_classes, activation=None, l2=0.0):
    """The same initial weights in every process (seeded initializers), and an L2 penalty on the hidden
    layer: for comparisons with plain Keras's fit."""
    def init(seed):
        return keras.initializers.GlorotUniform(seed=seed)
    return keras.Sequential([
        keras.Input(shape=input_shape),
        keras.layers.Dense(16, activation="relu", kernel_initializer=init(1),
                           kernel_regularizer=keras.regularizers.L2(l2) if l2 else None),
        keras.layers.Dense(num_classes, activation=activation, kernel_initializer=init(2))], name="seeded")


def dense(input_shape, num_classes, width=32, activation=None):
    """Features of any shape in, num_classes outputs (a label's size: 1 for a number)."""
    return keras.Sequential([keras.Input(shape=input_shape), keras.layers.Flatten(),
                             keras.layers.Dense(width, activation="relu"),
                             keras.layers.Dense(num_classes, activation=activation)], name="dense")
'''


def test_metric_states_summed_over_replicas_give_the_metric_of_the_whole_batch():
    """Two replicas each see half the batch; their states summed give what one metric over the whole
    batch gives, for a mean (MAE), a ratio of counts (precision) and a curve (AUC)."""
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, (64, 3)).astype(np.float32)
    outputs = np.clip(labels * 0.3 + rng.random((64, 3)) * 0.7, 0, 1).astype(np.float32)
    node = make_cfg("metrics=binary", "+metrics.precision={_target_: tf_keras.metrics.Precision}",
                    "+metrics.mae={_target_: tf_keras.metrics.MeanAbsoluteError}").metrics
    tally = Tally(make_metrics(node), labels[:2], outputs[:2])
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    dataset = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices((labels, outputs)).batch(64))

    @tf.function
    def sums(batch):
        per_replica = strategy.run(lambda y, p: tally.add(y, p, tf.zeros([tf.shape(y)[0]])), args=batch)
        return tf.add_n(strategy.experimental_local_results(per_replica))

    summed = dict(tally.values(sums(next(iter(dataset)))))
    whole = {}
    for name, metric in make_metrics(node).items():  # one metric seeing the whole batch
        metric.update_state(labels, outputs)
        whole[name] = float(metric.result())
    assert summed.keys() - {"loss"} == whole.keys() == {"accuracy", "auc", "precision", "mae"}
    for name, value in whole.items():
        assert summed[name] == pytest.approx(value, abs=1e-6), name
    halves = []  # the control: the mean of each half's AUC is not the AUC of the whole
    for part in (slice(0, 32), slice(32, 64)):
        auc = keras.metrics.AUC()
        auc.update_state(labels[part], outputs[part])
        halves.append(float(auc.result()))
    assert abs(np.mean(halves) - whole["auc"]) > 1e-3


def test_a_metric_that_cannot_be_summed_is_one_line():
    from distrain.common.errors import ConfigError

    class Last(keras.metrics.Metric):  # keeps the last batch's value: not a sum
        def __init__(self, name="last"):
            super().__init__(name=name)
            self.last = self.add_weight(name="last", initializer="zeros")

        def update_state(self, y_true, y_pred, sample_weight=None):
            return self.last.assign(tf.reduce_mean(y_pred))

        def result(self):
            return self.last

    with pytest.raises(ConfigError, match=r"metrics.last \(Last\) keeps a state that is not a sum"):
        Tally({"last": Last()}, np.zeros((2, 1), np.float32), np.zeros((2, 1), np.float32))


def test_a_metric_of_probabilities_given_logits_is_one_line():
    from distrain.common.errors import ConfigError
    from distrain.task.metrics import check_metrics_read_the_outputs as check
    from distrain.task.metrics import pick_accuracy

    binary = make_cfg("loss=binary_crossentropy", "metrics=binary").metrics
    with pytest.raises(ConfigError, match=r"^metrics.accuracy \(tf_keras.metrics.BinaryAccuracy\) reads probabilities, "
                                          r"but the model outputs logits .*: set \+metrics.accuracy.threshold=0 "):
        check(binary, probabilities=False)
    with pytest.raises(ConfigError, match=r"^metrics.auc \(tf_keras.metrics.AUC\) .*: set \+metrics.auc.from_logits"):
        check(make_cfg("metrics=binary", "~metrics.accuracy").metrics, probabilities=False)
    check(binary, probabilities=True)  # the controls: a sigmoid output, and metrics set for logits
    check(make_cfg("metrics=binary", "+metrics.accuracy.threshold=0", "+metrics.auc.from_logits=true").metrics,
          probabilities=False)
    for labels in ("classes", "binary"):  # the default: sparse categorical accuracy (the highest output, either
        check(pick_accuracy(make_cfg().metrics, labels, False)[0], probabilities=False)  # way); binary at 0


def test_the_one_hot_loss_given_class_indices_is_one_line():
    from distrain.common.errors import ConfigError
    from distrain.task.metrics import check_labels

    node = make_cfg("loss=categorical_crossentropy").loss
    with pytest.raises(ConfigError, match=r"^loss=categorical_crossentropy reads one-hot label rows \(N, classes\), "
                                          r"not labels of shape \(8, 1\): use loss=sparse_categorical_crossentropy"):
        check_labels(node, np.zeros((8, 1), np.int32))
    check_labels(node, np.eye(3, dtype=np.float32))  # the control: one-hot rows


def test_the_binary_loss_given_class_indices_is_one_line():
    """MNIST's labels 0-9 under loss=binary_crossentropy would train on a loss that goes negative."""
    from distrain.common.errors import ConfigError
    from distrain.task.metrics import check_labels

    node = make_cfg("loss=binary_crossentropy").loss
    with pytest.raises(ConfigError, match=r"^loss=binary_crossentropy reads labels from 0 to 1 \(one per output\), "
                                          r"but these run from 0 to 9: use loss=sparse_categorical_crossentropy"):
        check_labels(node, np.arange(10, dtype=np.int32)[:, None])
    check_labels(node, np.array([[0, 1, 1], [1, 0, 0]], np.float32))  # the control: rows of 0/1


def test_a_sweeps_objective_must_be_a_number_its_runs_report():
    from distrain.common.errors import ConfigError
    from distrain.config.validate import check_objective

    with pytest.raises(ConfigError, match=r"^trainer.objective=test_accuracy is not a figure of a run: set it to one "
                                          r"of loss, mae, rmse, test_loss, test_mae, test_rmse, final_train_loss"):
        check_objective(make_cfg("loss=huber", "metrics=regression"))
    check_objective(make_cfg("loss=huber", "metrics=regression", "trainer.objective=test_mae"))  # the control


def regression_data(path, n=1200, features=8, seed=0):
    """Tabular rows and a float target: a fixed smooth function of them, plus a little noise."""
    np.savez(path, **dict(zip(("x_train", "y_train", "x_test", "y_test"), _splits(*_regression_rows(n, features,
                                                                                                    seed)))))
    return path


PLAIN_PREDICT = """
import sys
import numpy as np
import tf_keras as keras
model = keras.models.load_model(sys.argv[1])
x = np.load(sys.argv[2])["x_test"][:5]
print(type(model.loss).__name__, type(model.optimizer).__name__, model.predict(x, verbose=0).shape)
"""


@pytest.mark.slow
def test_regression_on_tabular_rows_trains_as_a_user_runs_it_and_loads_in_plain_keras(tmp_path):
    """A user's model on (N, 8) float rows with a float target, mean squared error, MAE and RMSE, from the
    command line; the SavedModel predicts in plain Keras. (Metric states summed across workers: the
    clusters of test_files, and the unit test above.)"""
    (tmp_path / "mymodels.py").write_text(MODELS)
    npz = regression_data(tmp_path / "rows.npz")
    run_dir = tmp_path / "run"
    out = run_cli(run_dir, "data=npz", f"data.path={npz}", "model._target_=mymodels.dense", "loss=mean_squared_error",
                  "metrics=regression", "optimizer=adam", "trainer.learning_rate=0.02", "trainer.epochs=4",
                  "trainer.batch_size=50", "trainer.verbose=2")
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads((run_dir / "results.json").read_text())
    assert results["input_shape"] == [8] and results["num_classes"] == 1
    assert set(results["history"]) == {"loss", "mae", "rmse", *TIME_SPLIT} and "test_accuracy" not in results
    baseline = float(np.var(np.load(npz)["y_test"]))  # the error of always predicting the mean
    assert results["test_loss"] < 0.3 * baseline, results
    assert results["test_rmse"] == pytest.approx(np.sqrt(results["test_loss"]), rel=1e-3)  # two measures, one error
    assert results["history"]["rmse"][-1] < results["history"]["rmse"][0]
    assert "Test mae " in out.stdout + out.stderr and " - mae: " in out.stdout + out.stderr
    said = subprocess.run([sys.executable, "-c", PLAIN_PREDICT, str(run_dir / "saved_model"), str(npz)],
                          capture_output=True, text=True, timeout=RUN_TIMEOUT,
                          env={**os.environ, "TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert said.returncode == 0 and said.stdout.split("\n")[0] == "MeanSquaredError Adam (5, 1)", said.stderr[-2000:]
    assert_nothing_left(tmp_path)


def multi_label_data(n=1200, seed=1):
    """(N, 6) rows, multi-hot labels (N, 3): three rules of the features."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 6)).astype(np.float32)
    y = np.stack([x[:, 0] > 0, x[:, 1] + x[:, 2] > 0, x[:, 3] * x[:, 4] > 0], axis=1).astype(np.float32)
    return x, y


# Each task as distrain's config names it, and as plain Keras's compile() would: the same classes.
FIT_TASKS = {
    "regression": (["loss=mean_squared_error", "metrics=regression", "optimizer=adam", "schedule=cosine",
                    "+model.l2=0.01", "trainer.learning_rate=0.01"],
                   lambda steps: dict(optimizer=keras.optimizers.Adam(keras.optimizers.schedules.CosineDecay(
                       0.01, decay_steps=steps)), loss=keras.losses.MeanSquaredError(),
                       metrics=[keras.metrics.MeanAbsoluteError(name="mae"),
                                keras.metrics.RootMeanSquaredError(name="rmse")]), {"activation": None, "l2": 0.01}),
    "multi_label": (["loss=binary_crossentropy", "metrics=binary", "optimizer=sgd", "optimizer.momentum=0.9",
                     "+model.activation=sigmoid", "trainer.learning_rate=0.1"],
                    lambda steps: dict(optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
                                       loss=keras.losses.BinaryCrossentropy(),
                                       metrics=[keras.metrics.BinaryAccuracy(name="accuracy"),
                                                keras.metrics.AUC(name="auc")]), {"activation": "sigmoid"}),
}


@pytest.mark.slow
@pytest.mark.parametrize("task", FIT_TASKS)
def test_sync_training_reports_what_keras_fit_reports_and_mirrored_ends_alike(tmp_path, task):
    """distrain without shuffling (data.shuffle_buffer=0), float32: each epoch's training loss (with the
    L2 penalty) and metrics equal plain Keras fit(shuffle=False)'s on the same data, initial weights,
    optimizer, schedule and batch; the weights too. mirrored on 2 virtual CPUs ends with the same weights."""
    from distrain.task.training import train

    overrides, compile_args, builder_args = FIT_TASKS[task]
    rows = _regression_rows() if task == "regression" else multi_label_data()
    np.savez(tmp_path / "d.npz", **dict(zip(("x_train", "y_train", "x_test", "y_test"), _splits(*rows))))
    sys.modules.setdefault("test_task_models", _module(MODELS))
    epochs, batch = 3, 50  # 1000 training rows: 20 whole batches an epoch
    ran = {}
    for strategy in ("default", "mirrored"):
        cfg = check(make_cfg("data=npz", f"data.path={tmp_path / 'd.npz'}", "data.shuffle_buffer=0",
                             "model._target_=test_task_models.seeded", f"strategy={strategy}",
                             "trainer.mixed_precision=false", f"trainer.epochs={epochs}",
                             f"trainer.batch_size={batch}", "trainer.verbose=0", "trainer.save_model=false",
                             *overrides))
        results, model = train(cfg, tmp_path / strategy)
        ran[strategy] = results["history"], [w.copy() for w in model.get_weights()]
    if task == "regression":  # it learns: always predicting the mean would cost about 1.3
        assert results["test_loss"] < 0.3 and results["num_classes"] == 1, results
    else:  # a sigmoid output is no longer refused: the loss reads probabilities
        assert results["model_outputs"] == "probabilities" and results["num_classes"] == 3
        assert results["test_accuracy"] > 0.8 and results["test_auc"] > 0.85, results

    data = np.load(tmp_path / "d.npz")
    x, y = data["x_train"], data["y_train"].reshape(1000, -1)

    def fit(shuffle: bool):
        keras.utils.set_random_seed(0)  # (the shuffled control's order)
        plain = sys.modules["test_task_models"].seeded((x.shape[1],), y.shape[1], **builder_args)
        plain.compile(**compile_args(epochs * 1000 // batch))
        history = plain.fit(x, y, batch_size=batch, epochs=epochs, shuffle=shuffle, verbose=0).history
        return history, plain.get_weights()

    history, weights = fit(shuffle=False)
    for strategy, (reported, trained) in ran.items():
        assert set(reported) == set(history) | TIME_SPLIT  # (and where each epoch's time went)
        for name in history:
            assert reported[name] == pytest.approx(history[name], rel=1e-5, abs=1e-6), (strategy, name)
        for ours, theirs in zip(trained, weights):
            np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5, err_msg=strategy)
    # The control: fit on another order of the same batches fails the same comparisons.
    shuffled, other = fit(shuffle=True)
    assert shuffled["loss"] != pytest.approx(history["loss"], rel=1e-5, abs=1e-6)
    assert not all(np.allclose(a, b, rtol=1e-5, atol=1e-5) for a, b in zip(other, weights))


def _regression_rows(n=1200, features=8, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, features)).astype(np.float32)
    return x, (x[:, 0] - 0.5 * x[:, 1] + 0.25 * x[:, 2] * x[:, 3] + 0.05 * rng.normal(size=n)).astype(np.float32)


def _splits(x, y, train=1000):
    return x[:train], y[:train], x[train:], y[train:]


def _module(source: str):
    import types

    module = types.ModuleType("test_task_models")
    exec(source, module.__dict__)
    return module


@pytest.mark.slow
def test_validation_and_callbacks_see_the_logs_fit_would_give_them(tmp_path):
    """Validation every epoch gives val_loss and val_accuracy to the history, TensorBoard's validation/
    and the callbacks; ReduceLROnPlateau halves the rate when the loss does not fall by 10, and
    EarlyStopping ends the run after its second validation, with the reason in results.json."""
    from distrain.task.training import train

    cfg = check(make_cfg("data=synthetic", "data.train_examples=1024", "data.test_examples=256", "model=mlp",
                         "trainer.batch_size=64", "trainer.epochs=6", "trainer.verbose=0", "trainer.save_model=false",
                         "trainer.tensorboard=true", "trainer.validate_every=1", "callbacks=early_stopping",
                         "+callbacks.early_stopping.min_delta=10", "callbacks.early_stopping.patience=1",
                         "+callbacks.halve={_target_: tf_keras.callbacks.ReduceLROnPlateau, monitor: loss, factor: 0.5,"
                         " patience: 0, min_delta: 10, verbose: 0}"))
    results, _ = train(cfg, tmp_path / "run")
    history = results["history"]
    assert results["stopped_early"] == "callbacks.early_stopping (EarlyStopping) stopped training after epoch 2"
    assert len(history["loss"]) == len(history["val_loss"]) == 2 and results["global_steps"] == 2 * 16
    assert results["test_loss"] == pytest.approx(history["val_loss"][0], rel=1e-5)  # the best weights, restored
    validation = tensorboard_values(tmp_path / "run" / "tensorboard" / "validation")
    assert validation["epoch_loss"] == pytest.approx(history["val_loss"])
    assert validation["epoch_accuracy"] == pytest.approx(history["val_accuracy"])
    rates = tensorboard_values(tmp_path / "run" / "tensorboard" / "train")["epoch_learning_rate"]
    # Epoch 1 sets the callback's best loss; epoch 2 does not beat it by 10: halved, before the rate is logged.
    assert rates == pytest.approx([0.002, 0.001])


@pytest.mark.slow
def test_validation_split_holds_out_the_last_training_rows_for_validation(tmp_path):
    """data.validation_split=0.2 of 1000 rows: training on the first 800 (16 steps of 50 an epoch), and
    validation on the last 200, as fit(validation_split=0.2) holds them out; the test set stays test_*."""
    from distrain.task.training import train

    npz = regression_data(tmp_path / "rows.npz")
    sys.modules.setdefault("test_task_models", _module(MODELS))
    cfg = check(make_cfg("data=npz", f"data.path={npz}", "data.validation_split=0.2", "trainer.validate_every=1",
                         "model._target_=test_task_models.dense", "loss=mean_squared_error", "metrics=regression",
                         "trainer.epochs=2", "trainer.batch_size=50", "trainer.verbose=0", "trainer.save_model=false"))
    results, model = train(cfg, tmp_path / "run")
    assert results["global_steps"] == 2 * 16 and results["train_examples"] == 800, results
    data = np.load(npz)
    held_out = model.evaluate(data["x_train"][800:], data["y_train"][800:, None], verbose=0, return_dict=True)
    assert results["history"]["val_loss"][-1] == pytest.approx(held_out["loss"], rel=1e-5)
    assert results["history"]["val_mae"][-1] == pytest.approx(held_out["mae"], rel=1e-5)
    assert results["test_loss"] != pytest.approx(held_out["loss"], rel=1e-3)  # the control: the test set is another


@pytest.mark.slow
def test_a_16_bit_output_is_evaluated_in_float32_and_the_user_is_told(tmp_path, capsys):
    """Under mixed precision a user's model that ends in a 16-bit layer: Keras's evaluate would give
    its metrics 16-bit outputs and labels (R2Score refuses them); distrain's evaluate casts both back to
    float32, and a line says to give the last layer dtype='float32'."""
    from distrain.task.training import train

    npz = regression_data(tmp_path / "rows.npz")
    sys.modules.setdefault("test_task_models", _module(MODELS))
    cfg = check(make_cfg("data=npz", f"data.path={npz}", "trainer.validate_every=1", "trainer.mixed_precision=true",
                         "model._target_=test_task_models.dense", "loss=mean_squared_error", "metrics=regression",
                         "+metrics.r2={_target_: tf_keras.metrics.R2Score}", "trainer.epochs=2",
                         "trainer.batch_size=50", "trainer.verbose=2", "trainer.save_model=false"))
    try:
        results, model = train(cfg, tmp_path / "run")
        data = np.load(npz)
        plain = sys.modules["test_task_models"].dense((8,), 1)  # the control: Keras's own evaluate
        plain.compile(loss="mse", metrics=[keras.metrics.R2Score()])
        with pytest.raises(ValueError, match="requested dtype float32 for Tensor with dtype bfloat16"):
            plain.evaluate(data["x_test"], data["y_test"], verbose=0)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert ("warning: model dense outputs bfloat16 (mixed_bfloat16), and Keras's evaluate rounds float labels to the "
            "outputs' type: give its last layer dtype='float32'") in capsys.readouterr().out
    y, outputs = data["y_test"], model.predict(data["x_test"], batch_size=50, verbose=0).astype(np.float32)[:, 0]
    r2 = 1 - np.sum((y - outputs) ** 2) / np.sum((y - y.mean()) ** 2)
    # (predict's bfloat16 kernels may round otherwise than evaluate's: to 1e-3)
    assert results["test_r2"] == pytest.approx(r2, abs=1e-3) and results["history"]["val_r2"][-1] == results["test_r2"]


@pytest.mark.slow
@pytest.mark.parametrize("example, check", [
    ("diabetes", lambda r: r["test_loss"] < 0.75 and r["num_classes"] == 1 and "stopped_early" in r),  # mean: 1
    ("breast_cancer", lambda r: r["test_accuracy"] > 0.9 and r["test_auc"] > 0.95),  # the majority: 0.63
])
def test_the_task_examples_train_from_their_own_directories(monkeypatch, tmp_path, example, check):
    """examples/diabetes (regression, validation rows, early stopping) and examples/breast_cancer
    (binary, AdamW, warm-up and cosine): their loaders read scikit-learn's bundled tables, their
    experiment presets name the task."""
    from distrain.config.validate import validate
    from distrain.task.training import train

    directory = ROOT / "examples" / example
    monkeypatch.chdir(directory)
    monkeypatch.syspath_prepend(str(directory))
    sys.modules.pop("models", None)  # (every example has a models.py: another's may be imported)
    try:
        cfg = validate(make_cfg(f"hydra.searchpath=[file://{directory / 'conf'}]", f"experiment={example}",
                                "trainer.verbose=0", "trainer.save_model=false"))
        results, _ = train(cfg, tmp_path)
    finally:
        sys.modules.pop("models", None)
        sys.modules.pop(example, None)
    assert check(results), {k: v for k, v in results.items() if k != "history"}


@pytest.mark.slow
def test_a_metric_that_fails_in_evaluate_is_one_line(tmp_path):
    """tf_keras's R2Score under mirrored replicas and mixed precision: Keras reads its lazily made
    variables where it cannot, in evaluate() only. One line naming the fix, not a traceback (nor, on
    a cluster, a restart that fails alike); the control, in float32, trains and validates."""
    from distrain.common.errors import ConfigError
    from distrain.task.training import train

    npz = regression_data(tmp_path / "rows.npz")
    sys.modules.setdefault("test_task_models", _module(MODELS))

    def run(precision: str):
        cfg = check(make_cfg("data=npz", f"data.path={npz}", "trainer.validate_every=1", "strategy=mirrored",
                             "strategy.cpu_virtual_devices=2", f"trainer.mixed_precision={precision}",
                             "model._target_=test_task_models.dense", "loss=mean_squared_error", "metrics=regression",
                             "+metrics.r2={_target_: tf_keras.metrics.R2Score}", "trainer.epochs=1",
                             "trainer.batch_size=50", "trainer.verbose=0", "trainer.save_model=false"))
        try:
            return train(cfg, tmp_path / precision)[0]
        finally:
            keras.mixed_precision.set_global_policy("float32")
    with pytest.raises(ConfigError, match=r"^evaluating the model with the config's loss and metrics failed "
                                          r"\(NotImplementedError: call `variable.read_value\(\)` inside .*\): check "
                                          r"that loss and metrics fit .* try trainer.mixed_precision=false$"):
        run("true")
    assert "val_r2" in run("false")["history"]


def test_a_callback_with_per_batch_hooks_is_told_apart():
    """The loop calls epoch hooks only: a callback of per-batch hooks (TerminateOnNaN's on_batch_end) is
    said; one of epoch hooks (EarlyStopping) is not, the control."""
    from distrain.task.training import _batch_hooks

    assert _batch_hooks(keras.callbacks.TerminateOnNaN())
    assert not _batch_hooks(keras.callbacks.EarlyStopping())
