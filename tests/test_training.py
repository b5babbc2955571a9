"""Every single-machine strategy trains in-process on 2 virtual CPUs; sync training is exact."""
import re

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

import distrain.task.strategy
from distrain.common.errors import ConfigError, Diverged
from distrain.task import training
from distrain.task.training import train

from helpers import small, tensorboard_values

pytestmark = pytest.mark.slow  # every test trains (make test-fast leaves them out)

REQUIRED = {"strategy", "num_replicas", "num_workers", "num_ps", "model", "model_params", "epochs",
            "global_batch_size", "data_source", "train_examples", "test_examples", "train_seconds",
            "examples_per_sec", "test_accuracy", "test_loss", "final_train_loss"}


@pytest.mark.parametrize("strategy, overrides, replicas", [
    ("default", [], 1),
    ("one_device", ["strategy.device=/cpu:1"], 1),
    ("mirrored", ["strategy.cpu_virtual_devices=2"], 2),
    ("central_storage", ["strategy.cpu_virtual_devices=2"], 2),
])
def test_each_strategy_trains_and_reports(tmp_path, strategy, overrides, replicas):
    results, _ = train(small(f"strategy={strategy}", "trainer.epochs=2", *overrides), tmp_path)
    assert REQUIRED <= results.keys()
    assert results["num_replicas"] == replicas == len(results["devices"])
    assert results["per_replica_batch_size"] * replicas == results["global_batch_size"] == 64
    assert results["train_examples"] == 1024 and results["test_examples"] == 256
    assert results["test_accuracy"] > 0.5  # chance is 0.1
    assert results["history"]["loss"][1] < results["history"]["loss"][0]
    assert results["examples_per_sec"] > 0 and len(results["epoch_seconds"]) == 2


def sgd_mlp(strategy, batch_size=64):
    return small(f"strategy={strategy}", "strategy.cpu_virtual_devices=2", "model=mlp", "optimizer=sgd",
                 "trainer.learning_rate=0.1", "trainer.epochs=2", f"trainer.batch_size={batch_size}",
                 "trainer.mixed_precision=false")  # exact comparisons are made in float32


ACCUMULATED = ["model=mlp", "optimizer=adam", "schedule=cosine", "schedule.warmup_steps=3", "trainer.epochs=2",
               "data.train_examples=1000",  # (7 updates of 128 an epoch, 104 examples left over: dropped alike)
               "trainer.mixed_precision=false", "trainer.save_model=false"]  # float32: exact comparisons


def test_accumulated_batches_are_the_update_of_one_batch_that_many_times_larger(tmp_path, monkeypatch):
    """trainer.accumulate_steps=4 of batch 32 (one device; mirrored over 2 replicas) == batch 128: Adam's
    moments, the warm-up and the cosine decay counted in updates (global_steps), the weights and the
    losses within 1e-5; the gradients all-reduced once an update (the step function holds as many
    all-reduces as without accumulation, not 4 times as many). Control: batch 32 without accumulation
    ends elsewhere."""
    reduces = []
    aggregate = keras.optimizers.Optimizer.aggregate_gradients
    monkeypatch.setattr(keras.optimizers.Optimizer, "aggregate_gradients",
                        lambda self, pairs: reduces.append(1) or aggregate(self, pairs))  # (counted as traced)
    mirrored = ["strategy=mirrored", "strategy.cpu_virtual_devices=2"]
    large, whole = train(small(*ACCUMULATED, "trainer.batch_size=128"), tmp_path / "large")
    reduces.clear()
    train(small(*ACCUMULATED, *mirrored, "trainer.batch_size=128"), tmp_path / "large-mirrored")
    once = len(reduces)
    for strategy in (["strategy=default"], mirrored):
        reduces.clear()
        results, model = train(small(*ACCUMULATED, *strategy, "trainer.batch_size=32", "trainer.accumulate_steps=4"),
                               tmp_path / strategy[0])
        if strategy == mirrored:
            assert len(reduces) == once > 0, (len(reduces), once)
        assert (results["global_steps"], results["global_batch_size"]) == (large["global_steps"], 128) == (14, 128)
        for a, b in zip(whole.get_weights(), model.get_weights()):
            np.testing.assert_allclose(b, a, atol=1e-5, rtol=0)
        np.testing.assert_allclose(results["history"]["loss"], large["history"]["loss"], atol=1e-5, rtol=0)
        assert abs(results["test_loss"] - large["test_loss"]) < 1e-5
    plain, _ = train(small(*ACCUMULATED, "trainer.batch_size=32"), tmp_path / "plain")
    assert plain["global_steps"] == 62 and abs(plain["test_loss"] - large["test_loss"]) > 1e-3


def test_mirrored_is_the_same_training_as_one_device(tmp_path):
    """Gradients averaged over 2 replicas of batch B/2 == one device with batch B (model=mlp, SGD)."""
    _, single = train(sgd_mlp("default"), tmp_path)
    _, mirrored = train(sgd_mlp("mirrored"), tmp_path)
    _, half_batch = train(sgd_mlp("default", batch_size=32), tmp_path)
    for w_single, w_mirrored in zip(single.get_weights(), mirrored.get_weights()):
        np.testing.assert_allclose(w_mirrored, w_single, atol=1e-5, rtol=0)
    # The comparison can fail: a per-replica batch mistake (each replica taking B/2 steps) would show.
    deltas = [np.abs(a - b).max() for a, b in zip(single.get_weights(), half_batch.get_weights())]
    assert max(deltas) > 1e-3


def test_device_that_is_not_there(tmp_path):
    with pytest.raises(ConfigError, match=r"device /gpu:3 is not on this machine \(it has /cpu:0, /cpu:1\)"):
        train(small("strategy=mirrored", "strategy.devices=[/cpu:0,/gpu:3]"), tmp_path)


def test_batch_must_divide_over_the_replicas_found(tmp_path):
    with pytest.raises(ConfigError, match="must divide evenly over 2 replicas"):
        train(small("strategy=mirrored", "strategy.cpu_virtual_devices=2", "trainer.batch_size=63"), tmp_path)


def test_mixed_precision_xla_and_steps_per_execution(tmp_path):
    results, model = train(small("model=mlp", "trainer.mixed_precision=true", "trainer.jit_compile=true",
                                 "trainer.steps_per_execution=4", "trainer.epochs=2"), tmp_path)
    assert results["precision_policy"] == "mixed_bfloat16"  # no GPU here: bfloat16 is the CPU's kind
    assert model.layers[2].compute_dtype == "bfloat16" and model.layers[-1].compute_dtype == "float32"  # the logits
    assert results["test_accuracy"] > 0.5
    assert keras.mixed_precision.global_policy().name == "mixed_bfloat16"
    train(small("model=mlp", "trainer.mixed_precision=false"), tmp_path)
    assert keras.mixed_precision.global_policy().name == "float32"  # reset by the next run


@pytest.mark.parametrize("strategy", ["mirrored", "central_storage"])
def test_xla_compiles_the_step_on_one_cpu_device(tmp_path, strategy):
    """On GPUs every replica is compiled alike; on the CPU, XLA has one device (config.py refuses more).
    (one_device runs the default strategy's step, compiled in test_mixed_precision_xla_...)"""
    results, _ = train(small(f"strategy={strategy}", "strategy.devices=[/cpu:0]", "model=mlp",
                             "trainer.jit_compile=true", "trainer.epochs=2"), tmp_path)
    assert results["jit_compile"] is True and results["test_accuracy"] > 0.5


def test_saves_checkpoint_savedmodel_and_tensorboard(tmp_path):
    results, model = train(small("trainer.save_model=true", "trainer.tensorboard=true"), tmp_path)
    assert list((tmp_path / "checkpoints").glob("ckpt-16.index"))  # numbered by global step
    scalars = tensorboard_values(tmp_path / "tensorboard" / "train")  # one epoch: one value each
    assert scalars["epoch_accuracy"] == [pytest.approx(results["history"]["accuracy"][0])]
    assert scalars["epoch_learning_rate"] == [pytest.approx(0.002)]
    assert scalars["epoch_examples_per_sec"] == [pytest.approx(results["examples_per_sec"], rel=1e-3)]
    loaded = keras.models.load_model(tmp_path / "saved_model")
    x = tf.random.uniform((4, 28, 28, 1), seed=1)
    np.testing.assert_allclose(loaded(x), model(x), atol=1e-6)
    restored = keras.models.clone_model(model)
    tf.train.Checkpoint(model=restored).restore(str(tmp_path / "checkpoints" / "ckpt-16")).expect_partial()
    np.testing.assert_allclose(restored(x), model(x), atol=1e-6)


def test_float16_policy_scales_the_loss(tmp_path, monkeypatch):
    """GPUs with tensor cores get mixed_float16, whose small gradients need loss scaling: run that path
    on the CPU, with the machine said to have such a GPU. Without the unscaling, SGD would take steps
    32768 times too large and diverge."""
    monkeypatch.setattr(distrain.task.strategy, "gpu_capabilities", lambda: [(8, 0)])
    try:
        results, model = train(small("model=mlp", "optimizer=sgd", "trainer.learning_rate=0.1", "trainer.epochs=2",
                                     "trainer.mixed_precision=auto"), tmp_path)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert isinstance(model.optimizer, keras.mixed_precision.LossScaleOptimizer)
    assert model.layers[2].compute_dtype == "float16"
    assert results["history"]["loss"][1] < results["history"]["loss"][0] and results["test_accuracy"] > 0.5


@pytest.mark.parametrize("strategy", ["default", "mirrored"])
def test_a_diverging_run_stops_at_the_step_it_diverges(tmp_path, strategy):
    config = small(f"strategy={strategy}", "strategy.cpu_virtual_devices=2", "model=mlp", "optimizer=sgd",
                   "trainer.learning_rate=1e9", "trainer.epochs=3", "trainer.save_model=true",
                   "trainer.checkpoint_every_steps=1")
    with pytest.raises(Diverged, match=r"loss became NaN or infinite in epoch 1, step (\d+) .*lower "
                                          r"trainer.learning_rate \(now 1000000000.0\)") as stopped:
        train(config, tmp_path)
    step = int(re.search(r"step (\d+)", str(stopped.value)).group(1))
    assert 1 <= step < 16  # within the first epoch, not at its end
    # Only the checkpoints before the divergence were written: every one of them holds finite weights.
    kept = sorted(int(p.stem.split("-")[1]) for p in (tmp_path / "checkpoints").glob("ckpt-*.index"))
    assert kept == list(range(max(1, step - 3), step))
    for number in kept:
        reader = tf.train.load_checkpoint(str(tmp_path / "checkpoints" / f"ckpt-{number}"))
        assert all(np.isfinite(reader.get_tensor(n)).all() for n in reader.get_variable_to_shape_map()
                   if n.startswith("model/"))
    # Control: with the check off the same run goes on to the end, with a NaN loss.
    results, _ = train(small(f"strategy={strategy}", "strategy.cpu_virtual_devices=2", "model=mlp",
                             "optimizer=sgd", "trainer.learning_rate=1e9", "trainer.stop_on_nan=false"), tmp_path)
    assert not np.isfinite(results["history"]["loss"][-1])


@pytest.mark.parametrize("strategy", ["default", "mirrored"])
def test_a_run_that_validates_compiles_its_model_once(tmp_path, monkeypatch, strategy):
    """The test after training reuses the model compiled (and its evaluation traced) for validation: a
    second compile would trace it again, about 0.2 s of every such run. (Parameter servers evaluate a
    copy, compiled apart: test_files.)"""
    compiled, compile_model = [], training.compile_model
    monkeypatch.setattr(training, "compile_model", lambda model, *args, **kwargs: (
        compiled.append(model), compile_model(model, *args, **kwargs)))
    results, model = train(small(f"strategy={strategy}", "strategy.cpu_virtual_devices=2", "model=mlp",
                                 "trainer.validate_every=1"), tmp_path)
    assert compiled == [model]
    assert results["history"]["val_loss"][-1] == pytest.approx(results["test_loss"], rel=1e-5)  # the same weights
    compiled.clear()  # the control: a run that does not validate compiles it for the test alone
    train(small(f"strategy={strategy}", "strategy.cpu_virtual_devices=2", "model=mlp"), tmp_path / "other")
    assert len(compiled) == 1
