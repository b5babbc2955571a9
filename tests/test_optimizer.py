"""The optimizer and the learning rate over the run: each option of the optimizer and schedule groups
(or a tf_keras class of the user's own), the warm-up, the scaling with the global batch, and a trained
model that plain Keras loads."""
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import tf_keras as keras

from distrain.config.schema_check import check
from distrain.task.optimizer import Warmup, learning_rate, make_optimizer

from helpers import RUN_TIMEOUT, make_cfg, small, tensorboard_values


def checked(*overrides):
    """The config as a run gets it: composed, then checked (a user's own class keeps only its arguments)."""
    return check(make_cfg(*overrides))


@pytest.mark.parametrize("option, cls, arguments", [
    ("adam", keras.optimizers.Adam, {"beta_1": 0.9, "amsgrad": False}),
    ("adamw", keras.optimizers.AdamW, {"weight_decay": 0.004}),
    ("sgd", keras.optimizers.SGD, {"momentum": 0.0, "nesterov": False}),
    ("rmsprop", keras.optimizers.RMSprop, {"rho": 0.9}),
])
def test_each_optimizer_option_is_its_keras_class_with_its_arguments(option, cls, arguments):
    optimizer, line = make_optimizer(make_cfg(f"optimizer={option}", "trainer.learning_rate=0.01"), 100)
    assert type(optimizer) is cls and line == f"optimizer: {option}, learning rate 0.01"
    config = optimizer.get_config()
    assert config["learning_rate"] == pytest.approx(0.01)
    assert {k: config[k] for k in arguments} == pytest.approx(arguments)


def test_optimizer_arguments_and_a_users_own_class():
    sgd, _ = make_optimizer(make_cfg("optimizer=sgd", "optimizer.momentum=0.9", "optimizer.nesterov=true",
                                     "optimizer.global_clipnorm=1.0"), 100)
    assert (sgd.get_config()["momentum"], sgd.nesterov, sgd.global_clipnorm) == (pytest.approx(0.9), True, 1.0)
    own, line = make_optimizer(checked("optimizer._target_=tf_keras.optimizers.Adamax", "optimizer.beta_2=0.99"), 100)
    assert type(own) is keras.optimizers.Adamax and own.get_config()["beta_2"] == pytest.approx(0.99)
    assert line == "optimizer: tf_keras.optimizers.Adamax, learning rate 0.002"  # not adam's name


def test_what_only_the_task_can_check_is_one_line():
    """(Found where TensorFlow runs, after the launcher's checks: a task prints the ConfigError as one line.)"""
    from distrain.common.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^the warm-up \(250 steps\) is not shorter than the run \(125 steps\): "
                                          r"lower schedule.warmup_steps or schedule.warmup_epochs"):
        learning_rate(make_cfg("schedule.warmup_epochs=2", "trainer.epochs=1"), 125)
    with pytest.raises(ConfigError, match=r"^optimizer._target_=tf_keras.optimizers.Adamax failed \(TypeError: .*"
                                          r"momentum.*\): it must name a tf_keras optimizer class"):
        make_optimizer(checked("optimizer._target_=tf_keras.optimizers.Adamax", "+optimizer.momentum=0.9"), 100)
    learning_rate(make_cfg("schedule.warmup_epochs=0.5", "trainer.epochs=1"), 125)  # the control


def test_float16_wraps_the_optimizer_in_loss_scaling():
    optimizer, _ = make_optimizer(make_cfg("optimizer=adamw"), 100, policy="mixed_float16")
    assert isinstance(optimizer, keras.mixed_precision.LossScaleOptimizer)
    assert type(optimizer.inner_optimizer) is keras.optimizers.AdamW


def rates(schedule, steps):
    return [float(schedule(step)) for step in steps]


def test_the_constant_default_is_the_plain_learning_rate():
    rate, line = learning_rate(make_cfg(), 100)
    assert rate == 0.002 and line == "learning rate 0.002"  # no wrapper: the optimizer of every earlier run


def test_cosine_with_warmup_and_linear_scaling_gives_the_rates_of_its_formula():
    cfg = make_cfg("schedule=cosine", "schedule.warmup_steps=10", "trainer.lr_scaling=linear",
                   "trainer.batch_size=256", "trainer.epochs=2", "trainer.learning_rate=0.01")
    rate, line = learning_rate(cfg, 50)  # 100 steps in all
    assert isinstance(rate, Warmup)
    steps = [0, 4, 9, 10, 50, 99]
    expected = [0.02 * min(1, (s + 1) / 10) * 0.5 * (1 + math.cos(math.pi * s / 100)) for s in steps]
    assert rates(rate, steps) == pytest.approx(expected, rel=1e-5, abs=1e-9)  # (float32)
    assert line == ("learning rate 0.02 (trainer.learning_rate 0.01 x 2: linear scaling, global batch 256 / reference "
                    "128) reached by a linear warm-up over the first 10 steps then times the schedule cosine (decay "
                    "over 100 steps)")
    # The control: without the warm-up and the scaling, the rates are cosine's alone.
    plain, _ = learning_rate(make_cfg("schedule=cosine", "trainer.epochs=2", "trainer.learning_rate=0.01"), 50)
    assert rates(plain, steps) == pytest.approx([0.01 * 0.5 * (1 + math.cos(math.pi * s / 100)) for s in steps],
                                                rel=1e-5, abs=1e-9)


@pytest.mark.parametrize("overrides, steps, expected", [
    (["trainer.lr_scaling=sqrt", "trainer.batch_size=512", "schedule.warmup_epochs=0.5"], [0, 24, 25, 80],
     [0.004 / 25, 0.004, 0.004, 0.004]),
    (["schedule=exponential", "schedule.decay_steps=10", "schedule.decay_rate=0.5"], [0, 10, 20],
     [0.002, 0.001, 0.0005]),
    (["schedule=piecewise", "schedule.boundaries=[10,20]", "schedule.values=[0.1,0.01,0.001]"], [5, 15, 25],
     [0.1, 0.01, 0.001]),
    (["schedule._target_=tf_keras.optimizers.schedules.PolynomialDecay", "+schedule.decay_steps=10",
      "+schedule.end_learning_rate=0.0"], [0, 5, 10], [0.002, 0.001, 0.0]),
])
def test_each_schedule_option_and_a_users_own(overrides, steps, expected):
    rate, _ = learning_rate(checked(*overrides), 50)
    assert rates(rate, steps) == pytest.approx(expected, rel=1e-5, abs=1e-9)


def test_a_warmup_schedule_survives_keras_serialization():
    rate, _ = learning_rate(make_cfg("schedule=cosine", "schedule.warmup_steps=5", "trainer.lr_scaling=linear",
                                     "trainer.batch_size=256"), 50)
    again = keras.optimizers.schedules.deserialize(keras.optimizers.schedules.serialize(rate))
    assert rates(again, [0, 3, 7, 300]) == pytest.approx(rates(rate, [0, 3, 7, 300]))


PLAIN_LOAD = """
import sys
import tf_keras as keras
for path in sys.argv[1:]:
    try:
        model = keras.models.load_model(path)
    except Exception as exc:
        print("fails", type(exc).__name__, str(exc).splitlines()[0][:200])
    else:
        print("loads", f"{type(model.loss).__name__} {type(model.optimizer).__name__}" if model.optimizer
              else "uncompiled")
"""


def load_in_plain_keras(*paths) -> list:
    """What a process that never imported distrain makes of these saved models: one line each."""
    out = subprocess.run([sys.executable, "-c", PLAIN_LOAD, *map(str, paths)], capture_output=True, text=True,
                         timeout=RUN_TIMEOUT, env={**os.environ, "TF_USE_LEGACY_KERAS": "1",
                                                   "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.split("\n")[:len(paths)]


@pytest.mark.slow
def test_warmup_and_scaling_train_under_mirrored_and_the_model_loads_in_plain_keras(tmp_path):
    """2 replicas, SGD with Nesterov momentum, cosine decay after a warm-up of half an epoch, the rate scaled
    with the batch: TensorBoard logs the schedule's rate at each epoch's end; the saved models load in a
    process without distrain (this run's without its optimizer, whose warm-up is distrain's)."""
    from distrain.task.metrics import Float32
    from distrain.task.training import train

    cfg = small("strategy=mirrored", "strategy.cpu_virtual_devices=2", "model=mlp", "optimizer=sgd",
                "optimizer.momentum=0.9", "optimizer.nesterov=true", "schedule=cosine", "schedule.warmup_epochs=0.5",
                "trainer.lr_scaling=linear", "trainer.reference_batch_size=32", "trainer.learning_rate=0.05",
                "trainer.epochs=3", "trainer.save_model=true", "trainer.tensorboard=true")
    results, model = train(cfg, tmp_path / "run")
    assert (results["optimizer"], results["schedule"], results["lr_scaling"]) == ("sgd", "cosine", "linear")
    assert results["test_accuracy"] > 0.5, results["history"]
    steps = 1024 // 64  # an epoch; 48 in all, 8 of warm-up, at 0.05 x 64 / 32
    logged = tensorboard_values(tmp_path / "run" / "tensorboard" / "train")["epoch_learning_rate"]
    # The rate of each epoch's last step (15, 31, 47), as Keras's optimizer keeps it.
    assert logged == pytest.approx([0.1 * 0.5 * (1 + math.cos(math.pi * s / 48)) for s in (15, 31, 47)], rel=1e-4)
    assert results["global_steps"] == 3 * steps and results["learning_rate"] == 0.05

    plain = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])  # the control: distrain's own loss
    plain.compile(optimizer="sgd", loss=Float32(keras.losses.SparseCategoricalCrossentropy(from_logits=True)))
    plain.save(str(tmp_path / "distrain_loss"))
    said = load_in_plain_keras(tmp_path / "run" / "saved_model", tmp_path / "distrain_loss")
    assert said[0] == "loads uncompiled", said  # (with its optimizer: test_task's regression run)
    assert said[1].startswith("fails ValueError Unknown loss function: 'distrain>Float32'"), said
    x = np.random.default_rng(0).random((4, 28, 28, 1), np.float32)
    reloaded = keras.models.load_model(tmp_path / "run" / "saved_model")
    np.testing.assert_allclose(reloaded(x), model(x), atol=1e-6)
