"""The way in for a user's own classes: a preset, a config file or the command line names any class by
`_target_` with its own arguments, in every group that names one, and it works in one step; an
argument the class does not take is one line naming it, the class and what the class takes. And the
default metric follows the loss, as Keras's `"accuracy"` does."""
import sys

import numpy as np
import pytest

from distrain.common.errors import ConfigError
from distrain.config.schema import labels_read
from distrain.config.targets import check_arguments, takes
from distrain.config.validate import validate
from distrain.task.metrics import pick_accuracy

from helpers import make_cfg

USER_CODE = '''
import numpy as np
import tf_keras as keras


def small_cnn(input_shape, num_classes, width=32):
    return keras.Sequential([keras.Input(shape=input_shape), keras.layers.Flatten(),
                             keras.layers.Dense(width, activation="relu"), keras.layers.Dense(num_classes)])


def load(n=64, seed=0):
    rng = np.random.default_rng(seed)
    return ((rng.integers(0, 256, (n, 8, 8), dtype=np.uint8), rng.integers(0, 3, n)),
            (rng.integers(0, 256, (16, 8, 8), dtype=np.uint8), rng.integers(0, 3, 16)))


class Focal(keras.losses.Loss):
    def __init__(self, gamma=2.0, **kwargs):
        super().__init__(**kwargs)
        self.gamma = gamma

    def call(self, y_true, y_pred):
        return keras.losses.sparse_categorical_crossentropy(y_true, y_pred, from_logits=True)
'''

# group: (the preset's node, the argument the class takes, a typo of it and its fix), each as a user writes it.
PRESETS = {
    "optimizer": ("optimizer: {_target_: tf_keras.optimizers.AdamW, weight_decay: 0.0001}",
                  "weight_decay", "weight_decai", "set optimizer.weight_decay=0.0001 instead"),
    "schedule": ("schedule: {_target_: tf_keras.optimizers.schedules.PolynomialDecay, decay_steps: 100, power: 2.0}",
                 "power", "powr", "set schedule.power=2.0 instead"),
    "loss": ("loss: {_target_: usercode.Focal, gamma: 3.0}", "gamma", "gama", "set loss.gamma=3.0 instead"),
    "model": ("model: {_target_: usercode.small_cnn, width: 16}", "width", "widht", "set model.width=16 instead"),
    "data": ("data: {_target_: usercode.load, n: 32}", "n", "count", "drop data.count, or name a class"),
    "metrics": ("metrics: {top2: {_target_: tf_keras.metrics.SparseTopKCategoricalAccuracy, k: 2}}", "k", "kk",
                "set metrics.top2.k=2 instead"),
    "callbacks": ("callbacks: {stop: {_target_: tf_keras.callbacks.EarlyStopping, monitor: loss, patience: 2}}",
                  "patience", "patiense", "set callbacks.stop.patience=2 instead"),
}


@pytest.fixture
def user_conf(tmp_path, monkeypatch):
    (tmp_path / "usercode.py").write_text(USER_CODE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "conf" / "experiment").mkdir(parents=True)
    yield tmp_path / "conf"
    sys.modules.pop("usercode", None)


def preset(conf, name: str, node: str):
    """The experiment preset `name` of this node, composed and checked as `train.py experiment=NAME` would."""
    (conf / "experiment" / f"{name}.yaml").write_text(f"# @package _global_\n{node}\n")
    return validate(make_cfg(f"hydra.searchpath=[file://{conf}]", f"experiment={name}"))


@pytest.mark.parametrize("group", PRESETS)
def test_a_preset_names_a_class_with_its_own_arguments_in_every_group(user_conf, group):
    node, argument, typo, fix = PRESETS[group]
    cfg = preset(user_conf, group, node)
    check_arguments(cfg)  # the class takes what the preset gives it
    given = cfg[group] if group not in ("metrics", "callbacks") else list(cfg[group].values())[-1]  # (beside accuracy)
    assert argument in given
    # The control: the same preset with an argument the class does not take.
    cfg = preset(user_conf, f"{group}_typo", node.replace(f"{argument}:", f"{typo}:"))
    with pytest.raises(ConfigError) as error:
        check_arguments(cfg)
    line = str(error.value)
    assert f".{typo} is not an argument of " in line and "(it takes " in line and fix in line, line
    assert "\n" not in line


def test_what_a_replaced_option_brought_along_is_not_the_users_mistake(user_conf):
    cfg = preset(user_conf, "adamw", PRESETS["optimizer"][0])
    assert cfg.optimizer.name == "adamw" and cfg.optimizer.weight_decay == 0.0001  # the built-in option's keys
    cfg = validate(make_cfg("optimizer._target_=tf_keras.optimizers.SGD", "+optimizer.momentun=0.9"))
    assert "beta_1" not in cfg.optimizer and cfg.optimizer.name == "sgd"  # Adam's keys did not come along
    with pytest.raises(ConfigError, match=r"^optimizer.momentun is not an argument of tf_keras.optimizers.SGD \(it "
                                          r"takes .*momentum.*\): set optimizer.momentum=0.9 instead$"):
        check_arguments(cfg)
    cfg = preset(user_conf, "mse", "loss: {_target_: tf_keras.losses.MeanSquaredError}")
    assert cfg.loss.name == "mean_squared_error" and "from_logits" not in cfg.loss
    own = preset(user_conf, "own", "optimizer: {_target_: tf_keras.optimizers.Adamax, beta_1: 0.8}")
    assert dict(own.optimizer) == {"_target_": "tf_keras.optimizers.Adamax", "beta_1": 0.8}  # the user's value stays
    # A built-in option keeps its typed keys and ranges: the control.
    with pytest.raises(ConfigError, match=r"^optimizer.momentum=1.5 must be at least 0 and below 1"):
        validate(make_cfg("optimizer=sgd", "optimizer.momentum=1.5"))
    with pytest.raises(ConfigError, match=r"^optimizer.beta_1=abc must be a number"):
        validate(make_cfg("optimizer.beta_1=abc"))


def test_a_signature_says_what_a_class_takes_through_its_bases():
    assert {"momentum", "weight_decay", "clipvalue"} <= takes("tf_keras.optimizers.SGD")  # SGD's and Optimizer's
    assert "beta_1" not in takes("tf_keras.optimizers.SGD")
    assert takes("tf_keras.metrics.BinaryAccuracy") >= {"threshold", "name", "dtype"}
    assert takes("tf_keras.losses.MeanSquaredError") == {"reduction", "name"}
    assert takes("distrain.task.model.cnn") == {"input_shape", "num_classes", "dropout", "name"}
    assert takes("builtins.dict") is None and takes("nosuchmodule.thing") is None  # any: nothing refused


# ---- the default metric follows the loss ---------------------------------------------------------------

@pytest.mark.parametrize("loss, labels, picked", [
    ("sparse_categorical_crossentropy", "classes", "SparseCategoricalAccuracy"),
    ("categorical_crossentropy", "one_hot", "CategoricalAccuracy"),
    ("binary_crossentropy", "binary", "BinaryAccuracy"),
    ("mean_squared_error", "values", None), ("mean_absolute_error", "values", None), ("huber", "values", None)])
def test_the_default_accuracy_follows_the_loss(loss, labels, picked):
    cfg = validate(make_cfg(f"loss={loss}"))
    assert labels_read(cfg.loss) == labels
    metrics, line = pick_accuracy(cfg.metrics, labels, probabilities=False)
    if picked:
        assert metrics.accuracy._target_ == f"tf_keras.metrics.{picked}" and picked in line
    else:
        assert "accuracy" not in metrics and line.startswith("metrics.accuracy: none")
    if labels == "binary":  # of logits: thresholded at 0, a probability of 0.5
        assert metrics.accuracy.threshold == 0 and "threshold" not in pick_accuracy(cfg.metrics, labels,
                                                                                    True)[0].accuracy
    # The control: the user's own metrics win.
    own = validate(make_cfg(f"loss={loss}", "metrics=regression")).metrics
    assert pick_accuracy(own, labels, False) == (own, "")


def test_a_users_loss_lets_the_labels_say_what_they_are():
    from distrain.data.arrays import labels_of

    assert labels_read(make_cfg("loss._target_=usercode.Focal").loss) is None
    assert labels_of(np.array([0, 2, 1])) == "classes"
    assert labels_of(np.array([[0, 1, 0], [1, 0, 0]])) == "one_hot"
    assert labels_of(np.array([[0, 1, 1], [1, 0, 0]], np.float32)) == "binary"
    assert labels_of(np.array([0.5, 1.25])) == "values" and labels_of(np.array([[0.5], [2.0]])) == "values"


def test_where_the_labels_cannot_tell_the_line_names_the_key_that_settles_it():
    """Float labels 0., 1., 2. under a loss of the user's look like values: the model gets one output and
    the loss fails; the line says data.num_classes settles it, and with it set they are class indices."""
    import tensorflow as tf
    import tf_keras as keras

    from distrain.task.metrics import check_loss

    own = make_cfg("loss._target_=usercode.Focal")
    assert labels_read(own.loss, own.data) is None
    assert labels_read(own.loss, make_cfg("data.num_classes=3").data) == "classes"  # the key that settles it
    assert labels_read(make_cfg("loss=huber").loss, make_cfg("data.num_classes=3").data) == "values"  # a built-in's own
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
    labels, outputs = np.array([[2.0], [1.0]], np.float32), tf.zeros((2, 1))
    with pytest.raises(ConfigError, match=r"these were taken for values \(regression\); if they are class indices, "
                                          r"set data.num_classes=K"):
        check_loss(loss, labels, outputs, "usercode.Focal", guessed="values")
    with pytest.raises(ConfigError, match=r"give the model's last layer as many units"):  # the control: a built-in's
        check_loss(loss, labels, outputs, "sparse_categorical_crossentropy")
