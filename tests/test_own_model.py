"""A user's own Keras model (`model._target_`) and data (`data=npz`, `data._target_`), kept in a directory
of the user's, outside the package: every strategy trains them as it trains the built-in ones."""
import csv
import json
import sys

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras
import yaml

from distrain.common.errors import ConfigError
from distrain.config.validate import validate
from distrain.data import arrays as data
from distrain.task.model import build_model, check_model
from distrain.task.training import train

from helpers import ROOT, assert_nothing_left, make_cfg, run_cli

MODELS = '''
import tensorflow as tf
import tf_keras as keras


def tiny(input_shape, num_classes, width=16):
    """No dropout, no batch normalisation: synchronous training is exact."""
    return keras.Sequential([keras.Input(shape=input_shape), keras.layers.Flatten(),
                             keras.layers.Dense(width, activation="relu"), keras.layers.Dense(num_classes)],
                            name="tiny")


def normalised(input_shape, num_classes, width=16):
    """Batch normalisation: statistics each replica keeps for itself, read across the replicas."""
    return keras.Sequential([keras.Input(shape=input_shape), keras.layers.Flatten(), keras.layers.Dense(width),
                             keras.layers.BatchNormalization(), keras.layers.ReLU(), keras.layers.Dense(num_classes)],
                            name="normalised")


def softmax_cnn(input_shape, num_classes, width=8):
    return keras.Sequential([keras.Input(shape=input_shape), keras.layers.Conv2D(width, 3, activation="relu"),
                             keras.layers.Flatten(), keras.layers.Dense(num_classes, activation="softmax")])


class Subclassed(keras.Model):
    def __init__(self, num_classes, width):
        super().__init__()
        self.flat, self.hidden = keras.layers.Flatten(), keras.layers.Dense(width, activation="relu")
        self.out = keras.layers.Dense(num_classes)

    def call(self, x, training=False):
        return tf.nn.softmax(self.out(self.hidden(self.flat(x))))


def subclassed(input_shape, num_classes, width=16):
    return Subclassed(num_classes, width)


def raises(input_shape, num_classes):
    raise ValueError("this builder wants a GPU")


def not_a_model(input_shape, num_classes):
    return 42


def three_classes(input_shape, num_classes):
    return tiny(input_shape, 3)


def fixed_input(input_shape, num_classes):
    return tiny((32, 32, 3), num_classes)


def sigmoid(input_shape, num_classes):
    return keras.Sequential([keras.Input(shape=input_shape), keras.layers.Flatten(),
                             keras.layers.Dense(num_classes, activation="sigmoid")])
'''

LOADERS = '''
import numpy as np


def blobs(train=384, test=96, size=12, classes=4, seed=0):
    """Float images in [0, 1]: class c lights square c of the image, the rest is noise."""
    rng = np.random.default_rng(seed)

    def draw(n):
        y = rng.integers(0, classes, n)
        x = rng.random((n, size, size)).astype(np.float32) * 0.5
        for c in range(classes):
            x[y == c, c * 2:c * 2 + 3, c * 2:c * 2 + 3] = 1.0
        return x, y
    return draw(train), draw(test)


def broken():
    raise RuntimeError("the bucket is gone")


def flat():
    return np.zeros((10, 8, 8)), np.zeros(10)
'''


def colour_npz(path, train=640, test=160, classes=5, seed=0, **replace):
    """16x16 RGB uint8 images of `classes` classes: class c paints a stripe of colour c % 3 at rows 3c."""
    rng = np.random.default_rng(seed)

    def draw(n):
        y = rng.integers(0, classes, n)
        x = rng.integers(0, 60, (n, 16, 16, 3)).astype(np.uint8)
        for c in range(classes):
            x[y == c, 3 * c:3 * c + 3, :, c % 3] = 250
        return x, y
    (x_train, y_train), (x_test, y_test) = draw(train), draw(test)
    arrays = {"x_train": x_train, "y_train": y_train, "x_test": x_test, "y_test": y_test, **replace}
    np.savez(path, **{k: v for k, v in arrays.items() if v is not None})
    return path


@pytest.fixture
def user_dir(tmp_path, monkeypatch):
    """A user's project: usermodels.py, userdata.py, their own config dir, and an npz of 16x16x3 images."""
    (tmp_path / "usermodels.py").write_text(MODELS)
    (tmp_path / "userdata.py").write_text(LOADERS)
    (tmp_path / "conf" / "model").mkdir(parents=True)
    (tmp_path / "conf" / "data").mkdir(parents=True)
    (tmp_path / "conf" / "model" / "mine.yaml").write_text("_target_: usermodels.tiny\nwidth: 16\n")
    (tmp_path / "conf" / "data" / "blobs.yaml").write_text("_target_: userdata.blobs\nsize: 12\n")
    colour_npz(tmp_path / "colours.npz")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def config(*overrides):
    """The checked config, as a run's task reads it: quick, silent, nothing saved."""
    return validate(make_cfg("trainer.epochs=2", "trainer.batch_size=32", "trainer.verbose=0",
                             "trainer.save_model=false", *overrides))


NPZ = ["data=npz", "data.path=colours.npz"]


# ---- in-process: the builder contract, data of other shapes and classes ----------------------------------

@pytest.mark.slow
def test_an_npz_of_colour_images_and_five_classes_trains(user_dir):
    results, _ = train(config(*NPZ, "model=cnn"), user_dir / "run")
    assert results["input_shape"] == [16, 16, 3] and results["num_classes"] == 5
    assert results["data"] == "npz" and results["model"] == "cnn" and results["model_outputs"] == "logits"
    assert results["test_accuracy"] > 0.6  # chance is 0.2


@pytest.mark.slow
def test_a_loader_gives_the_data_with_its_own_arguments(user_dir):
    results, _ = train(config("data._target_=userdata.blobs", "+data.size=10", "+data.classes=3", "model=mlp"),
                       user_dir / "run")
    assert results["input_shape"] == [10, 10, 1] and results["num_classes"] == 3
    assert results["data"] == "userdata.blobs" and results["train_examples"] == 384
    assert results["test_accuracy"] > 0.6  # chance is 1/3


@pytest.mark.slow
def test_a_user_model_is_the_same_training_under_default_and_mirrored(user_dir):
    """Sync equivalence holds for a user's model: 2 replicas of half the batch == one device (1e-5)."""
    common = [*NPZ, "model._target_=usermodels.tiny", "+model.width=8", "optimizer=sgd",
              "trainer.learning_rate=0.1", "trainer.mixed_precision=false", "strategy.cpu_virtual_devices=2"]
    results, single = train(config("strategy=default", *common), user_dir / "a")
    _, mirrored = train(config("strategy=mirrored", *common), user_dir / "b")
    assert results["model"] == "usermodels.tiny"  # the replaced cnn's own keys (dropout, name) are gone
    assert results["model_params"] == 16 * 16 * 3 * 8 + 8 + 8 * 5 + 5
    for a, b in zip(single.get_weights(), mirrored.get_weights()):
        np.testing.assert_allclose(b, a, atol=1e-5, rtol=0)
    # Control: the comparison can fail; another seed ends elsewhere.
    _, other = train(config("strategy=default", *common, "trainer.seed=7"), user_dir / "c")
    assert max(np.abs(a - b).max() for a, b in zip(single.get_weights(), other.get_weights())) > 1e-3


BRANCHING = '''
import tensorflow as tf
import tf_keras as keras

# Each branches on a tensor with Python's `if`, which traces only as autograph converts it (Keras's fit
# does); no branch changes a value.


class Model(keras.Model):
    def __init__(self, num_classes):
        super().__init__()
        self.flat, self.out = keras.layers.Flatten(), keras.layers.Dense(num_classes)

    def call(self, x, training=False):
        logits = self.out(self.flat(x))
        if tf.reduce_max(tf.abs(logits)) > 1e9:
            logits = tf.clip_by_value(logits, -1e9, 1e9)
        return logits


def model(input_shape, num_classes):
    return Model(num_classes)


class Loss(keras.losses.Loss):
    def call(self, y_true, y_pred):
        loss = keras.losses.sparse_categorical_crossentropy(y_true, y_pred, from_logits=True)
        if tf.reduce_min(loss) < 0.0:
            loss = tf.abs(loss)
        return loss


class Accuracy(keras.metrics.SparseCategoricalAccuracy):
    def update_state(self, y_true, y_pred, sample_weight=None):
        if tf.reduce_min(y_true) < 0:
            y_true = tf.abs(y_true)
        return keras.metrics.SparseCategoricalAccuracy.update_state(self, y_true, y_pred, sample_weight)
'''


@pytest.mark.slow
def test_a_users_model_loss_and_metric_that_branch_on_tensors_train_as_under_fit(user_dir):
    """Autograph converts what the user brings (their model's call, loss, metric), as Keras's fit does,
    though distrain's own step is not converted."""
    (user_dir / "branching.py").write_text(BRANCHING)
    results, _ = train(config(*NPZ, "model._target_=branching.model", "loss._target_=branching.Loss",
                              "+metrics.mine={_target_: branching.Accuracy}", "trainer.mixed_precision=false"),
                       user_dir / "run")
    assert results["test_mine"] == pytest.approx(results["test_accuracy"]) and results["test_accuracy"] > 0.5
    # Control: unconverted, each of them fails to trace.
    import branching

    labels, images = tf.constant([0, 1]), tf.zeros([2, 16, 16, 3])
    for unconverted in (lambda: branching.Model(5)(images), lambda: branching.Loss()(labels, tf.zeros([2, 5])),
                        lambda: branching.Accuracy().update_state(labels, tf.zeros([2, 5]))):
        with pytest.raises(tf.errors.OperatorNotAllowedInGraphError):
            tf.function(unconverted, autograph=False)()


@pytest.mark.slow
@pytest.mark.parametrize("builder", ["softmax_cnn", "subclassed"])
def test_a_softmax_output_is_trained_and_reported_as_probabilities(user_dir, builder):
    """A model ending in softmax (a Keras layer's, or inside a subclassed model's call) is trained with the
    loss of probabilities: its reported test loss is plain Keras's evaluate() with from_logits=False
    (in float32 on every CPU: test_mixed_precision_... checks the 16-bit case)."""
    results, model = train(config(*NPZ, f"model._target_=usermodels.{builder}", "trainer.mixed_precision=false"),
                           user_dir / "run")
    assert results["model_outputs"] == "probabilities"
    assert results["history"]["loss"][1] < results["history"]["loss"][0] and results["test_accuracy"] > 0.6
    (_, _), (x_test, y_test) = data.load(config(*NPZ).data, 42)
    plain = keras.models.clone_model(model) if builder == "softmax_cnn" else model
    plain.set_weights(model.get_weights())
    plain.compile(loss=keras.losses.SparseCategoricalCrossentropy(), metrics=["accuracy"])
    loss, accuracy = plain.evaluate(x_test / 255.0, y_test, batch_size=32, verbose=0)
    assert results["test_loss"] == pytest.approx(loss, rel=1e-5)
    assert results["test_accuracy"] == pytest.approx(accuracy, abs=1e-6)
    # Control: taken as logits (where Keras cannot see the softmax op), the same outputs give another loss.
    probabilities = plain.predict(x_test / 255.0, verbose=0)
    as_logits = tf.nn.sparse_softmax_cross_entropy_with_logits(y_test, probabilities)
    assert abs(float(tf.reduce_mean(as_logits)) - loss) > 0.1


@pytest.mark.slow
@pytest.mark.parametrize("builder", ["softmax_cnn", "subclassed"])
def test_mixed_precision_needs_no_change_in_a_user_model(user_dir, builder):
    """bfloat16 on any CPU (natively where the CPU has AVX512_BF16, as trainer.mixed_precision=auto
    picks there): a softmax in 16 bits is still seen as probabilities, though its rows sum to 1 only
    within bfloat16's precision."""
    try:
        results, model = train(config(*NPZ, f"model._target_=usermodels.{builder}", "trainer.mixed_precision=true"),
                               user_dir / "run")
        assert model(data.load(config(*NPZ).data, 42)[1][0][:2] / 255.0).dtype == "bfloat16"  # as they wrote it
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert results["model_outputs"] == "probabilities" and results["precision_policy"] == "mixed_bfloat16"
    assert np.isfinite(results["test_loss"]) and results["test_accuracy"] > 0.6


@pytest.mark.slow
def test_a_saved_model_goes_on_training_and_is_used_where_its_code_is_not(user_dir, tmp_path_factory, monkeypatch,
                                                                         capsys):
    """A run of the user's builder goes on training from its SavedModel; `distrain evaluate` from another
    directory, where the builder's module is not, loads the SavedModel whole and gives the figures it gives
    beside the code (control: a checkpoint needs the code, and the line says so)."""
    from omegaconf import OmegaConf

    from distrain.inference import commands

    cfg = config(*NPZ, "model._target_=usermodels.tiny", "trainer.save_model=true")
    first, _ = train(cfg, user_dir / "one")
    OmegaConf.save(cfg, user_dir / "one" / "config.yaml")  # (what the launcher adds)
    (user_dir / "one" / "results.json").write_text(json.dumps(first))
    results, model = train(config(*NPZ, f"model.path={user_dir / 'one' / 'saved_model'}"), user_dir / "two")
    assert results["model_params"] == first["model_params"]
    assert results["history"]["loss"][0] < first["history"]["loss"][0]  # it starts where the first ended

    def evaluate(*args):
        return commands.main("evaluate", [str(user_dir / "one"), f"data.path={user_dir / 'colours.npz'}", *args],
                              lambda overrides: make_cfg(*overrides))

    assert evaluate("name=beside") == 0
    monkeypatch.chdir(tmp_path_factory.mktemp("elsewhere"))
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in (str(user_dir), "")])
    monkeypatch.delitem(sys.modules, "usermodels")
    assert evaluate("name=elsewhere") == 0, capsys.readouterr().err
    beside, elsewhere = (json.loads((user_dir / "one" / "evaluations" / f"{name}.json").read_text())
                         for name in ("beside", "elsewhere"))
    assert elsewhere["weights"].endswith("whole: no module of model._target_=usermodels.tiny here")
    assert (elsewhere["loss"], elsewhere["accuracy"]) == (beside["loss"], beside["accuracy"])
    capsys.readouterr()
    assert evaluate("checkpoint=latest") == 2
    assert capsys.readouterr().err.strip().endswith("(a checkpoint needs the model's code; the run's SavedModel, "
                                                    "where there is one, does not)")


@pytest.mark.parametrize("builder, says", [
    ("usermodels.nothing", "model._target_=usermodels.nothing failed (module usermodels ("),
    ("usermodels.raises", "model._target_=usermodels.raises failed (ValueError: this builder wants a GPU, at "),
    ("usermodels.not_a_model", "returned int, not a tf_keras.Model"),
    ("usermodels.three_classes", r"outputs (2, 3) for a batch of 2, not (2, 5): its last layer must have "
                                 "num_classes=5 units"),
    ("usermodels.fixed_input", "does not take images of shape (16, 16, 3)"),
    ("usermodels.sigmoid", "ends with a sigmoid: give its last layer no activation (logits) or softmax"),
])
def test_a_builder_that_does_not_fit_is_one_line(user_dir, builder, says):
    cfg = config(*NPZ, f"model._target_={builder}")
    with pytest.raises(ConfigError) as error:
        model = build_model(cfg.model, (16, 16, 3), 5)
        check_model(model, np.zeros((4, 16, 16, 3), np.float32), 5)
    assert says in str(error.value) and "\n" not in str(error.value)
    # Where the user's code raised (the builder ran, and failed in it), which is what to fix; not where it was
    # not found, nor what it returned.
    assert ("fix it there" in str(error.value)) == (builder == "usermodels.raises"), str(error.value)


def test_a_builder_argument_it_does_not_take_is_named(user_dir):
    with pytest.raises(ConfigError, match=r"TypeError: tiny\(\) got an unexpected keyword argument 'widht'"):
        build_model(config("model._target_=usermodels.tiny", "+model.widht=3").model, (16, 16, 3), 5)


@pytest.mark.parametrize("replace, says", [
    ({"y_test": None}, "has no array y_test (it has x_train, y_train, x_test): point data.path at a file of"),
    ({"y_train": np.zeros(5, np.int64)}, "x_train has 640 images but y_train has shape (5,): give one label per"),
    ({"y_train": np.full(640, 0.5)}, "y_train is not integer class labels (float64)"),
    ({"y_train": -np.ones(640, np.int64)}, "y_train has negative labels (-1)"),
    ({"y_train": np.eye(5)[np.zeros(640, int)]}, "y_train has shape (640, 5), one-hot: give class indices"),
    ({"x_test": np.full((160, 16, 16, 3), np.nan, np.float32)}, "x_test holds NaN or infinite values"),
    ({"x_test": np.zeros((160, 8, 8, 3), np.uint8)}, "training images are (16, 16, 3) but test images (8, 8, 3)"),
    ({"x_train": np.zeros((640, 16, 16, 3), np.int64)}, "x_train is int64: give uint8 images"),
    ({"x_train": np.zeros((640, 16), np.uint8)}, "x_train has shape (640, 16), not images (N, H, W)"),
])
def test_bad_npz_data_is_one_line(tmp_path, replace, says):
    path = colour_npz(tmp_path / "bad.npz", **replace)
    with pytest.raises(ConfigError) as error:
        data.load(validate(make_cfg("data=npz", f"data.path={path}")).data, 0)
    assert says in str(error.value) and "\n" not in str(error.value), str(error.value)


def test_labels_beyond_num_classes_and_files_that_are_no_npz(tmp_path):
    path = colour_npz(tmp_path / "five.npz")
    with pytest.raises(ConfigError, match=r"has label 4, but data.num_classes=3: set data.num_classes=5 or more"):
        data.load(validate(make_cfg("data=npz", f"data.path={path}", "data.num_classes=3")).data, 0)
    (tmp_path / "text.npz").write_text("not an archive")
    with pytest.raises(ConfigError, match=r"text.npz is corrupt or not an .npz file \(not a zip archive\): point"):
        data.load(validate(make_cfg("data=npz", f"data.path={tmp_path / 'text.npz'}")).data, 0)
    # Control: a num_classes above the labels is fine (a class the data happens not to show).
    (x, y), _ = data.load(validate(make_cfg("data=npz", f"data.path={path}", "data.num_classes=7")).data, 0)
    assert x.shape[1:] == (16, 16, 3) and data.num_classes(make_cfg("data.num_classes=7").data, [y]) == 7


@pytest.mark.parametrize("loader, says", [
    ("userdata.broken", "data._target_=userdata.broken failed (RuntimeError: the bucket is gone, at "),
    ("userdata.flat", "data._target_=userdata.flat returned (array(10, 8, 8), array(10,)), not ((x_train, y_train)"),
    ("userdata.nothing", "data._target_=userdata.nothing failed (module userdata ("),
])
def test_a_loader_that_fails_is_one_line(user_dir, loader, says):
    with pytest.raises(ConfigError) as error:
        data.load(config(f"data._target_={loader}").data, 0)
    assert says in str(error.value) and "\n" not in str(error.value), str(error.value)


# ---- as a user runs it: their directory, their config dir, every cluster strategy ------------------------

USER = ["--config-dir", "conf", "model=mine", "data=blobs", "trainer.batch_size=32", "trainer.verbose=2"]


def check_user_run(run_dir):
    results = json.loads((run_dir / "results.json").read_text())
    assert (results["model"], results["data"]) == ("usermodels.tiny", "userdata.blobs")
    assert results["input_shape"] == [12, 12, 1] and results["num_classes"] == 4
    assert results["test_accuracy"] > 0.5  # chance is 0.25


@pytest.mark.slow
def test_a_user_model_and_loader_train_on_parameter_servers(user_dir):
    """Every task process imports the user's modules from the directory the command runs in; the
    model's variables live on the ps task."""
    # 3 epochs: after 2 (24 asynchronous steps) the test accuracy is 0.75-0.85, and once in the suite it was
    # chance; a third epoch gives the check a margin.
    out = run_cli(user_dir / "run", *USER, "strategy=parameter_server", "cluster.workers=2", "cluster.ps=1",
                  "trainer.epochs=3")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    check_user_run(user_dir / "run")
    assert_nothing_left(user_dir)


@pytest.mark.slow
def test_a_multi_worker_run_saves_the_trained_model_once(user_dir):
    """The chief alone saves the SavedModel, from a copy of the trained model built outside the strategy
    (saving the replicated model would take every worker); batch normalisation's statistics, which
    each replica keeps for itself, are read across the workers into it: it holds what the last
    checkpoint holds."""
    out = run_cli(user_dir / "run", *USER, "model._target_=usermodels.normalised", "strategy=multi_worker_mirrored",
                  "cluster.workers=2", "trainer.epochs=2")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    saved = keras.models.load_model(user_dir / "run" / "saved_model")  # as plain Keras loads it
    from usermodels import normalised
    trained, fresh = normalised((12, 12, 1), 4), normalised((12, 12, 1), 4)
    tf.train.Checkpoint(model=trained).restore(tf.train.latest_checkpoint(user_dir / "run" / "checkpoints")) \
        .expect_partial()
    moving_mean = [i for i, w in enumerate(trained.weights) if "moving_mean" in w.name]
    differences = [np.abs(a - b).max() for a, b in zip(saved.get_weights(), trained.get_weights())]
    assert len(differences) == len(trained.weights) == 8 and max(differences) == 0, differences
    # Control: a model of the builder's own (its statistics still zero) differs, there too.
    assert np.abs(saved.get_weights()[moving_mean[0]] - fresh.get_weights()[moving_mean[0]]).max() > 0.01
    assert_nothing_left(user_dir)


@pytest.mark.slow
def test_a_sweep_of_user_models_has_its_builder_argument_column(user_dir):
    """Each job's task imports the user's modules (a cluster's every task too: above)."""
    out = run_cli(user_dir / "unused", "-m", *USER, "trainer.epochs=2", "trainer.save_model=false",
                  "model.width=16,32", "hydra.sweep.dir=sweep")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = list(csv.DictReader((user_dir / "sweep" / "summary.csv").open()))
    assert [(r["model.width"], r["status"], r["model"]) for r in rows] == [("16", "ok", "usermodels.tiny"),
                                                                         ("32", "ok", "usermodels.tiny")]
    assert int(rows[1]["params"]) == 12 * 12 * 32 + 32 + 32 * 4 + 4 > int(rows[0]["params"])
    for row in rows:
        check_user_run(user_dir / "sweep" / row["job"])
    assert_nothing_left(user_dir)


@pytest.mark.slow
def test_a_stopped_run_of_a_user_model_resumes(user_dir, monkeypatch):
    """The builder runs again, and the checkpoint restores its variables. (Stopped in-process: a real kill
    of a run, the same restore after it, is test_resume's.)"""
    from test_resume import Crash, crash_after
    args = [f"hydra.searchpath=[file://{user_dir / 'conf'}]", "model=mine", "data=blobs", "trainer.epochs=3",
            "trainer.checkpoint_every_steps=5", "trainer.save_model=true"]  # 384 // 32 = 12 steps an epoch
    with monkeypatch.context() as patch:
        crash_after(patch, 17)  # the segment from global step 15 to 20 never runs
        with pytest.raises(Crash):
            train(config(*args), user_dir / "run")
    results, _ = train(config(*args, "trainer.resume=true"), user_dir / "run")
    assert results["resumed_from_step"] == 15 and results["global_steps"] == 3 * 12
    assert results["model"] == "usermodels.tiny" and len(results["history"]["loss"]) == 3
    assert results["test_accuracy"] > 0.5  # chance is 0.25


@pytest.mark.slow
def test_a_builder_that_raises_is_one_line_from_its_task(user_dir):
    """As a user meets it: one error line, exit 2, no traceback; where in their code it was raised, which is
    what to fix. (The mistakes found before any task starts, a missing module or npz file among them, are in
    the bad-input catalogue; a builder that is not there: the generic fix, above.)"""
    line = MODELS.splitlines().index('    raise ValueError("this builder wants a GPU")') + 1
    args, says = ["model._target_=usermodels.raises"], \
        f"failed (ValueError: this builder wants a GPU, at {user_dir / 'usermodels.py'}:{line} in raises): fix it there"
    out = run_cli(user_dir / "run", "--config-dir", "conf", "trainer.batch_size=32", *args)
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert out.returncode == 2 and len(errors) == 1 and says in errors[0], out.stderr[-3000:]
    assert "Traceback" not in out.stdout + out.stderr
    assert (user_dir / "run" / "logs").exists()  # a task's log: the builder ran there
    assert_nothing_left(user_dir)


@pytest.mark.slow
def test_the_worked_example_trains_from_its_own_directory(monkeypatch, tmp_path):
    """examples/digits8x8: its loader (scikit-learn's real 8x8 digits), its builder and its config dir."""
    example = ROOT / "examples" / "digits8x8"
    monkeypatch.chdir(example)
    monkeypatch.syspath_prepend(str(example))
    cfg = validate(make_cfg(f"hydra.searchpath=[file://{example / 'conf'}]", "model=small_cnn", "data=digits",
                            "trainer.epochs=4", "trainer.verbose=0", "trainer.save_model=false"))
    results, _ = train(cfg, tmp_path)
    assert (results["model"], results["data"]) == ("models.small_cnn", "digits.load")
    assert results["input_shape"] == [8, 8, 1] and results["num_classes"] == 10
    assert results["train_examples"] + results["test_examples"] == 1797
    assert results["test_accuracy"] > 0.9  # chance is 0.1


def test_a_users_config_dir_adds_options_to_every_group(user_dir):
    """An experiment preset (`# @package _global_`), a trainer preset on the default, a cluster of the
    user's own machines and a launcher preset are options of their groups, checked by the schema as the
    built-in ones are; --help lists them, marked."""
    conf = user_dir / "conf"
    for group, name, text in [
            ("experiment", "quick", "# @package _global_\ndefaults:\n  - override /trainer: fast\n  - override "
                                    "/data: synthetic\ndata:\n  train_examples: 256\n"),
            ("trainer", "fast", "defaults:\n  - default\nepochs: 2\nbatch_size: 32\n"),
            ("cluster", "lab", "defaults:\n  - manual\nworker_hosts: [10.0.0.1:2222, 10.0.0.2:2222]\n"),
            ("hydra/launcher", "pair", "defaults:\n  - joblib\nn_jobs: 3\n"),
            ("trainer", "typo", "defaults:\n  - default\nepochz: 2\n")]:
        (conf / group).mkdir(parents=True, exist_ok=True)
        (conf / group / f"{name}.yaml").write_text(text)
    unused = user_dir / "unused"
    job = run_cli(unused, "--config-dir", "conf", "experiment=quick", "cluster=lab", "strategy=multi_worker_mirrored",
                  "--cfg", "job", timeout=60)
    assert job.returncode == 0, job.stderr[-2000:]
    cfg = yaml.safe_load(job.stdout)
    assert (cfg["trainer"]["epochs"], cfg["trainer"]["batch_size"], cfg["data"]["train_examples"]) == (2, 32, 256)
    assert cfg["cluster"]["name"] == "manual" and cfg["cluster"]["worker_hosts"] == ["10.0.0.1:2222", "10.0.0.2:2222"]
    launcher = run_cli(unused, "--config-dir", "conf", "hydra/launcher=pair", "--cfg", "hydra", timeout=60)
    assert "JoblibLauncher" in launcher.stdout and "n_jobs: 3" in launcher.stdout, launcher.stderr[-2000:]
    bad = run_cli(unused, "--config-dir", "conf", "trainer=typo", timeout=60)
    assert bad.returncode == 2 and bad.stderr.splitlines() == [
        f"error: in {conf / 'trainer' / 'typo.yaml'}: trainer.epochz is not a key of trainer: set e.g. "
        "trainer.epochs=12"], bad.stderr[-2000:]
    shown = run_cli(unused, "--config-dir", "conf", "--help", timeout=60).stdout
    assert "  trainer: default, fast (yours), typo (yours)\n" in shown
    assert "  experiment: quick (yours), scaling_async, scaling_sync, strategies\n" in shown
    assert "  model: cnn, mine (yours), mlp\n" in shown and "  hydra/launcher: pair (yours), slurm\n" in shown
    assert not unused.exists()


def doubled_relu(x):  # an activation of the user's, not registered with Keras
    return 2.0 * tf.nn.relu(x)


class Doubled(keras.layers.Layer):  # a layer of the user's, not registered either
    def call(self, x):
        return 2.0 * x


InScript = type("InScript", (Doubled,), {"__module__": "__main__"})  # one a script defines: Keras names no module


def traced_functions(saved_model) -> list:
    """The names of the functions a SavedModel holds that trace a layer's call."""
    from tensorflow.core.protobuf import saved_model_pb2

    proto = saved_model_pb2.SavedModel.FromString((saved_model / "saved_model.pb").read_bytes())
    return [f.signature.name for f in proto.meta_graphs[0].graph_def.library.function
            if "call_and_return_conditional_losses" in f.signature.name]


@pytest.mark.parametrize("activation, layer, traced", [("relu", keras.layers.ReLU, False),
                                                       (doubled_relu, keras.layers.ReLU, True),
                                                       ("relu", Doubled, True), ("relu", InScript, True)])
def test_a_saved_model_holds_traces_where_plain_keras_needs_them(tmp_path, activation, layer, traced):
    """Keras's own layers and functions: plain Keras rebuilds the model from its config, so the SavedModel
    holds no traced function per layer (0.2 s of CPU less to save). An activation or a layer of the user's:
    the traces stay, and plain Keras loads the model without the user's code. All keep Keras's serving
    signature."""
    from distrain.task.training import save_model

    model = keras.Sequential([keras.Input((4,), name="rows"), keras.layers.Dense(8, activation=activation),
                              layer(), keras.layers.Dense(3, name="scores")])
    model.compile(optimizer="adam", loss="mse")
    save_model(model, tmp_path / "saved_model")
    assert bool(traced_functions(tmp_path / "saved_model")) == traced
    x = np.random.default_rng(0).normal(size=(5, 4)).astype("float32")
    loaded = keras.models.load_model(tmp_path / "saved_model")  # (the user's are not registered: not found by name)
    np.testing.assert_allclose(loaded(x), model(x), rtol=1e-6)
    serving = tf.saved_model.load(str(tmp_path / "saved_model")).signatures["serving_default"]
    assert list(serving.structured_input_signature[1]) == ["rows"] and list(serving.structured_outputs) == ["scores"]
    np.testing.assert_allclose(serving(rows=tf.constant(x))["scores"], model(x), rtol=1e-6)
