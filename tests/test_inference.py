"""Using a trained run: `distrain evaluate` and `distrain predict` give what plain Keras gives on the same
examples, in input order, and refuse bad input in one line without writing anything."""
import io
import json

import numpy as np
import pytest

from distrain import data, inference, tfrecords
from helpers import make_cfg

pytestmark = pytest.mark.slow  # a trained run, and TensorFlow in this process


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A run of the mlp on the bundled digits (one epoch, its SavedModel and checkpoints kept), and its
    test images as plain Keras gets them (pixels / 255) with their labels."""
    from omegaconf import OmegaConf

    from distrain.training import train

    run = tmp_path_factory.mktemp("use") / "run"
    cfg = make_cfg("data.source=bundled", "model=mlp", "trainer.epochs=1", "trainer.verbose=0")
    results, _ = train(cfg, run)  # (in this process: what the launcher adds, config.yaml and results.json, below)
    OmegaConf.save(cfg, run / "config.yaml")
    (run / "results.json").write_text(json.dumps(results))
    _, (x, y) = data.load(make_cfg("data.source=bundled").data, 42)
    return run, x, (x.astype("float32") / 255.0), y


def use(command, run, *args):
    return inference.main(command, [str(run), *args], lambda overrides: make_cfg(*overrides))


def plain_model(run):
    import tf_keras as keras

    return keras.models.load_model(str(run / "saved_model"))  # as a user without distrain loads it


def test_evaluate_gives_what_keras_evaluate_gives_and_never_overwrites(trained, capsys):
    run, _, x, y = trained
    results_before = (run / "results.json").read_text()
    assert use("evaluate", run) == 0 and use("evaluate", run) == 0
    first, second = (json.loads((run / "evaluations" / name).read_text()) for name in ("mnist.json", "mnist-2.json"))
    loss, accuracy = plain_model(run).evaluate(x, y, batch_size=128, verbose=0)
    assert first["loss"] == pytest.approx(loss, rel=1e-5) and first["accuracy"] == pytest.approx(accuracy, abs=1e-6)
    assert {k: v for k, v in second.items() if k != "seconds"} == {k: v for k, v in first.items() if k != "seconds"}
    assert first["examples"] == len(y) == 2000
    assert (run / "results.json").read_text() == results_before  # the run's own figures stay
    said = capsys.readouterr().out
    assert f"Evaluated on 2,000 examples of mnist (the SavedModel {run / 'saved_model'}): loss {first['loss']:.4f}" in said


def test_predict_gives_what_keras_predict_gives_in_input_order(trained, tmp_path):
    run, _, x, _ = trained
    assert use("predict", run, f"out={tmp_path / 'p.npz'}") == 0
    with np.load(tmp_path / "p.npz") as found:
        predictions, index = found["predictions"], found["index"]
    expected = plain_model(run).predict(x, batch_size=128, verbose=0)
    assert list(index) == list(range(len(x)))
    np.testing.assert_allclose(predictions, expected, rtol=1e-5, atol=1e-6)
    shuffled = np.random.default_rng(0).permutation(len(x))  # control: another order fails the comparison
    assert not np.allclose(predictions, expected[shuffled], rtol=1e-5, atol=1e-6)
    # .tfrecord: an Example per input, its index, its source and its outputs, in the same order.
    import tensorflow as tf

    assert use("predict", run, f"out={tmp_path / 'p.tfrecord'}") == 0
    spec = {"index": tf.io.FixedLenFeature([], tf.int64), "source": tf.io.FixedLenFeature([], tf.string),
            "outputs": tf.io.FixedLenFeature([expected.shape[1]], tf.float32)}
    records = [tf.io.parse_single_example(r, spec) for r in tf.data.TFRecordDataset(str(tmp_path / "p.tfrecord"))]
    assert [int(r["index"]) for r in records] == list(range(len(x))) and records[5]["source"].numpy() == b"row 5"
    np.testing.assert_allclose(np.stack([r["outputs"].numpy() for r in records]), expected, rtol=1e-5, atol=1e-6)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.npz", "p.tfrecord"]  # (no temporary file left)


def test_predict_reads_tfrecord_shards_file_by_file_then_record_by_record(trained, tmp_path):
    """Shards written round-robin (example i in shard i % 3): the outputs come in the files' order, each
    row naming its file and record; a checkpoint's weights (checkpoint=latest) give the same."""
    run, pixels, x, y = trained
    tfrecords.write(pixels, y, tmp_path, "test", 3)
    tfrecords.write(pixels[:10], y[:10], tmp_path, "train", 1)
    order = [i for shard in range(3) for i in range(shard, len(y), 3)]
    shards = ["data=tfrecord", f"data.train_files={tmp_path}/train-*", f"data.test_files={tmp_path}/test-*"]
    assert use("predict", run, *shards, f"out={tmp_path / 'p.csv'}", "checkpoint=latest") == 0
    rows = list(__import__("csv").reader(io.StringIO((tmp_path / "p.csv").read_text())))
    assert rows[0] == ["index", "source", "class", *(f"p_{c}" for c in range(10))]
    assert rows[1][:2] == ["0", f"{tmp_path}/test-00000-of-00003.tfrecord#0"]
    assert rows[2][:2] == ["1", f"{tmp_path}/test-00000-of-00003.tfrecord#1"]
    assert rows[-1][:2] == ["1999", f"{tmp_path}/test-00002-of-00003.tfrecord#665"] and len(rows) == 2001
    import tensorflow as tf

    expected = tf.nn.softmax(plain_model(run).predict(x, batch_size=128, verbose=0)).numpy()
    found = np.array([[float(p) for p in row[3:]] for row in rows[1:]])
    np.testing.assert_allclose(found, expected[order], rtol=1e-4, atol=1e-6)
    assert not np.allclose(found, expected, rtol=1e-4, atol=1e-6)  # control: the arrays' order is another
    assert not (run / "evaluations" / "no data.json").exists()  # (other data: scanned, nothing left anywhere)


@pytest.mark.parametrize("args, says", [
    (["out=p.txt"], "out=p.txt is of no format predict writes: name a file ending in .npz or .csv or .tfrecord"),
    (["strategy=multi_worker_mirrored", "out=p.npz"], "strategy=multi_worker_mirrored: evaluate and predict run in "
                                                      "one process for now"),
    (["checkpoint=/nowhere/ckpt-3", "out=p.npz"], "checkpoint=/nowhere/ckpt-3 holds no checkpoint"),
    ([], "predict needs out=PATH"),
])
def test_bad_input_is_one_line_and_writes_nothing(trained, tmp_path, monkeypatch, capsys, args, says):
    run = trained[0]
    monkeypatch.chdir(tmp_path)
    code = use("predict", run, *args)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert code == 2 and len(lines) == 1, err
    assert says in lines[0]
    assert not list(tmp_path.iterdir())  # nothing written


def test_data_that_does_not_fit_the_model_says_both(trained, tmp_path, capsys):
    run = trained[0]
    npz = tmp_path / "small.npz"
    images = np.zeros((20, 14, 14, 1), np.uint8)
    np.savez(npz, x_train=images, y_train=np.arange(20) % 10, x_test=images, y_test=np.arange(20) % 10)
    assert use("evaluate", run, "data=npz", f"data.path={npz}") == 2
    assert "the data's examples are (14, 14, 1), the model takes (28, 28, 1)" in capsys.readouterr().err
    assert use("evaluate", tmp_path) == 2  # no run here at all
    assert f"{tmp_path} holds no distrain run (no config.yaml)" in capsys.readouterr().err
