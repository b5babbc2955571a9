"""Using a trained run: `distrain evaluate` and `distrain predict` give what plain Keras gives on the same
examples, in input order, and refuse bad input in one line without writing anything."""
import io
import json
import os
import signal
from pathlib import Path

import numpy as np
import pytest

from distrain.common import cluster, cpu
from distrain.data import arrays, write_tfrecords
from distrain.inference import cluster_parts, commands
from distrain.launcher import forkserver, launch

from helpers import RUN_TIMEOUT, alive, during, here, make_cfg, task_pids, task_state, wait_until

pytestmark = pytest.mark.slow  # a trained run, and TensorFlow in this process


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A run of the mlp on the bundled digits (one epoch, its SavedModel and checkpoints kept), and its
    test images as plain Keras gets them (pixels / 255) with their labels."""
    from omegaconf import OmegaConf

    from distrain.task.training import train

    run = tmp_path_factory.mktemp("use") / "run"
    cfg = make_cfg("data.source=bundled", "model=mlp", "trainer.epochs=1", "trainer.verbose=0")
    results, _ = train(cfg, run)  # (in this process: what the launcher adds, config.yaml and results.json, below)
    OmegaConf.save(cfg, run / "config.yaml")
    (run / "results.json").write_text(json.dumps(results))
    _, (x, y) = arrays.load(make_cfg("data.source=bundled").data, 42)
    return run, x, (x.astype("float32") / 255.0), y


@pytest.fixture(scope="module")
def regression(tmp_path_factory):
    """A regression run (mean squared error; MAE and RMSE) of the mlp on tabular rows in a .npz, and its
    test rows and targets."""
    from omegaconf import OmegaConf

    from distrain.task.training import train

    where = tmp_path_factory.mktemp("regression")
    rng = np.random.default_rng(0)
    rows = rng.normal(size=(1000, 8)).astype("float32")
    target = (np.sin(rows[:, 0]) + rows[:, 1] * rows[:, 2] + 0.1 * rng.normal(size=1000)).astype("float32")
    np.savez(where / "rows.npz", x_train=rows[:700], y_train=target[:700], x_test=rows[700:], y_test=target[700:])
    cfg = make_cfg("data=npz", f"data.path={where / 'rows.npz'}", "model=mlp", "loss=mean_squared_error",
                   "metrics=regression", "trainer.epochs=2", "trainer.batch_size=50", "trainer.verbose=0")
    results, _ = train(cfg, where / "run")
    OmegaConf.save(cfg, where / "run" / "config.yaml")
    (where / "run" / "results.json").write_text(json.dumps(results))
    return where / "run", rows[700:], target[700:]


def use(command, run, *args):
    return commands.main(command, [str(run), *args], lambda overrides: make_cfg(*overrides))


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
    assert (f"Evaluated on 2,000 examples of mnist (the SavedModel {run / 'saved_model'}): "
            f"loss {first['loss']:.4f}") in said


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


def test_predict_reads_tfrecord_shards_file_by_file_then_record_by_record(trained, tmp_path, capsys):
    """Shards written round-robin (example i in shard i % 3), test files alone: the outputs come in the files'
    order, each row naming its file and record; a checkpoint's weights (checkpoint=latest) give the same. The
    classes are the model's: no pass over the records' labels before predicting (a training's scan makes one
    where data.num_classes is not set: test_files)."""
    run, pixels, x, y = trained
    write_tfrecords.write(pixels, y, tmp_path, "test", 3)
    order = [i for shard in range(3) for i in range(shard, len(y), 3)]
    shards = ["data=tfrecord", f"data.test_files={tmp_path}/test-*"]  # (no training files: the test split alone)
    assert use("predict", run, *shards, f"out={tmp_path / 'p.csv'}", "checkpoint=latest") == 0
    said = capsys.readouterr().out
    assert "data: 0 training file(s), 3 test file(s); examples counted from the record headers" in said
    assert "one pass over every record" not in said, said
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


def test_new_inputs_without_labels_are_predicted_in_order_and_evaluate_says_it_needs_labels(trained, tmp_path, capsys):
    """Inputs alone: an .npz of one array x, a folder of images at two depths (no class folders), TFRecords
    with no label: predict gives plain Keras's outputs in input order; evaluate is one line (the control)."""
    import tensorflow as tf
    from PIL import Image

    run, pixels, x, _ = trained
    np.savez(tmp_path / "new.npz", x=pixels[:40, ..., 0])
    for i in range(40):  # (in the order of their paths: b/ after a.png's)
        (tmp_path / "new" / ("b" if i >= 20 else "")).mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels[i, ..., 0]).save(tmp_path / "new" / ("b" if i >= 20 else "") / f"{i:02d}.png")
    with tf.io.TFRecordWriter(str(tmp_path / "new.tfrecord")) as writer:
        for image in pixels[:40]:
            writer.write(tf.train.Example(features=tf.train.Features(feature={"image/encoded": tf.train.Feature(
                bytes_list=tf.train.BytesList(value=[tf.io.encode_png(image).numpy()]))})).SerializeToString())
    expected = plain_model(run).predict(x[:40], batch_size=128, verbose=0)
    for name, given in (("npz", ["data=npz", f"data.path={tmp_path / 'new.npz'}"]),
                       ("images", ["data=images", f"data.path={tmp_path / 'new'}"]),
                       ("tfrecord", ["data=tfrecord", f"data.test_files={tmp_path / 'new.tfrecord'}"])):
        assert use("predict", run, *given, f"out={tmp_path / name}.npz") == 0, capsys.readouterr().err
        with np.load(tmp_path / f"{name}.npz") as found:
            np.testing.assert_allclose(found["predictions"], expected, rtol=1e-5, atol=1e-6, err_msg=name)
            assert not np.allclose(found["predictions"], expected[::-1], rtol=1e-5, atol=1e-6)  # (order counts)
        assert use("evaluate", run, *given) == 2
        lines = capsys.readouterr().err.splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: evaluate needs labels, and {name} holds inputs "
                                                       "alone ("), lines
    assert not (run / "evaluations" / "npz.json").exists()


def test_a_test_folder_of_some_classes_is_matched_to_the_models_classes_by_name(trained, tmp_path, capsys):
    """A model that names its classes, evaluated on test/<class>/ folders of three of them: their labels are
    the model's classes of those names (accuracy as plain Keras's with the true labels; numbering the folders
    by position gives another figure: the control). A class the model does not know is one line."""
    import shutil

    from PIL import Image

    run = tmp_path / "run"
    shutil.copytree(trained[0], run, ignore=shutil.ignore_patterns("evaluations"))
    names = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
    (run / "saved_model" / "class_names.txt").write_text("\n".join(names) + "\n")
    _, pixels, x, y = trained
    kept = [i for i in range(300) if y[i] in (1, 3, 7)]
    for i in kept:
        (tmp_path / "new" / "test" / names[y[i]]).mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels[i, ..., 0]).save(tmp_path / "new" / "test" / names[y[i]] / f"{i:03d}.png")
    assert use("evaluate", run, "data=images", f"data.path={tmp_path / 'new'}") == 0, capsys.readouterr().err
    found = json.loads((run / "evaluations" / "images.json").read_text())
    order = sorted(kept, key=lambda i: (names[y[i]], f"{i:03d}"))  # (the folders' order, then the paths')
    model = plain_model(run)
    _, accuracy = model.evaluate(x[order], y[order], verbose=0)
    assert found["examples"] == len(kept) and found["accuracy"] == pytest.approx(accuracy, abs=1e-6)
    by_position = np.array([sorted(["one", "seven", "three"]).index(names[y[i]]) for i in order])
    assert abs(model.evaluate(x[order], by_position, verbose=0)[1] - accuracy) > 0.2  # the control
    (tmp_path / "new" / "test" / "eleven").mkdir()
    Image.fromarray(pixels[0, ..., 0]).save(tmp_path / "new" / "test" / "eleven" / "0.png")
    assert use("evaluate", run, "data=images", f"data.path={tmp_path / 'new'}") == 2
    assert "class folder " + str(tmp_path / "new" / "test" / "eleven") + " names a class the model does not know" \
        in capsys.readouterr().err


def test_predictions_name_the_classes_wherever_the_run_or_the_data_names_them(trained, tmp_path, capsys):
    """New arrays predicted by a model trained with data.class_names (class_names.txt): the CSV's class and
    columns are the names, the .npz and .tfrecord keep indices with the names beside them; shards whose
    records name their classes (image/class/text) name them too. Control: the run that names none gives
    indices, as before."""
    import csv
    import shutil

    import tensorflow as tf

    run, pixels, x, y = trained
    named = tmp_path / "named"
    shutil.copytree(run, named, ignore=shutil.ignore_patterns("evaluations"))
    names = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
    (named / "saved_model" / "class_names.txt").write_text("\n".join(names) + "\n")
    np.savez(tmp_path / "new.npz", x=pixels[:40])
    new = ["data=npz", f"data.path={tmp_path / 'new.npz'}"]  # (data replaced: its class_names are the model's)
    best = plain_model(run).predict(x[:40], verbose=0).argmax(axis=1)

    def table(out):
        return list(csv.reader(io.StringIO(out.read_text())))

    for given, out, columns, classes in ((named, "named.csv", names, [names[c] for c in best]),
                                         (run, "plain.csv", [str(c) for c in range(10)], [str(c) for c in best])):
        assert use("predict", given, *new, f"out={tmp_path / out}") == 0, capsys.readouterr().err
        rows = table(tmp_path / out)
        assert rows[0] == ["index", "source", "class", *(f"p_{c}" for c in columns)]
        assert [row[2] for row in rows[1:]] == classes
    for given, out in ((named, "named"), (run, "plain")):
        assert use("predict", given, *new, f"out={tmp_path / out}.npz") == 0
        assert use("predict", given, *new, f"out={tmp_path / out}.tfrecord") == 0
    with np.load(tmp_path / "named.npz") as found, np.load(tmp_path / "plain.npz") as plain:
        assert list(found["class_names"]) == names and "class_names" not in plain
        assert found["predictions"].argmax(axis=1).tolist() == best.tolist()  # (indices still)
    spec = {"class_names": tf.io.VarLenFeature(tf.string)}
    for out, expected in (("named", [n.encode() for n in names]), ("plain", [])):
        first = next(iter(tf.data.TFRecordDataset(str(tmp_path / f"{out}.tfrecord"))))
        assert tf.io.parse_single_example(first, spec)["class_names"].values.numpy().tolist() == expected
    # Shards that name their classes, predicted by the run that names none: the records' names.
    letters = [chr(ord("a") + c) for c in range(10)]
    write_tfrecords.write(pixels[:40], y[:40], tmp_path / "shards", "test", 2, names=letters)
    assert use("predict", run, "data=tfrecord", f"data.test_files={tmp_path / 'shards'}/test-*",
               f"out={tmp_path / 'shards.csv'}") == 0, capsys.readouterr().err
    assert table(tmp_path / "shards.csv")[0][2:] == ["class", *(f"p_{c}" for c in letters)]


def test_the_served_model_takes_what_predict_takes_and_names_the_classes(trained, tmp_path, capsys):
    """The SavedModel's serving signature and the MLflow pyfunc model (saved here, no tracking server) take
    the images as the data gave them (uint8, with or without the channel axis) and floats as the model takes
    them, and give distrain predict's outputs (1e-6); where the run named its classes, the signature's
    `class` and the pyfunc's columns are the names. The same for an RGB model of an image folder's uint8
    (N, H, W, 3). Control: the pixels unscaled give other outputs."""
    import mlflow.pyfunc
    import tensorflow as tf
    import tf_keras as keras

    from distrain.report.tracking import MODEL_CODE
    from distrain.task.training import save_model

    run, pixels, x, _ = trained
    assert use("predict", run, f"out={tmp_path / 'p.npz'}") == 0, capsys.readouterr().err
    with np.load(tmp_path / "p.npz") as found:
        expected = found["predictions"][:16]
    images = pixels[:16, ..., 0]  # uint8 (16, 28, 28), as the bundled digits are
    serving = tf.saved_model.load(str(run / "saved_model")).signatures
    for given in (images, images[..., None]):
        (outputs,) = serving["serving_default"](image=tf.constant(given)).values()
        np.testing.assert_allclose(outputs.numpy(), expected, rtol=1e-5, atol=1e-6)
    (outputs,) = serving["serving_float"](image=tf.constant(x[:16])).values()
    np.testing.assert_allclose(outputs.numpy(), expected, rtol=1e-5, atol=1e-6)
    (unscaled,) = serving["serving_float"](image=tf.constant(images[..., None].astype("float32"))).values()
    assert not np.allclose(unscaled.numpy(), expected, rtol=1e-5, atol=1e-6)  # the control

    def pyfunc(saved, where):
        mlflow.pyfunc.save_model(str(where), python_model=str(MODEL_CODE), artifacts={"saved_model": str(saved)})
        return mlflow.pyfunc.load_model(str(where))

    served = pyfunc(run / "saved_model", tmp_path / "plain")
    for given in (images, images[..., None], x[:16]):
        np.testing.assert_allclose(served.predict(given), expected, rtol=1e-5, atol=1e-6)
    names = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
    model = keras.models.load_model(str(run / "saved_model"), compile=False)
    save_model(model, tmp_path / "named", names, include_optimizer=False, pixels=(28, 28, 1))
    table = pyfunc(tmp_path / "named", tmp_path / "named_pyfunc").predict(images)
    assert list(table.columns) == names
    np.testing.assert_allclose(table.to_numpy(), expected, rtol=1e-5, atol=1e-6)
    found = tf.saved_model.load(str(tmp_path / "named")).signatures["serving_default"](image=tf.constant(images))
    assert [c.decode() for c in found["class"].numpy()] == [names[i] for i in expected.argmax(axis=1)]
    # An RGB model of an image folder: uint8 (N, H, W, 3).
    rgb = keras.Sequential([keras.Input((8, 8, 3), name="image"), keras.layers.Flatten(), keras.layers.Dense(3)])
    save_model(rgb, tmp_path / "rgb", ["red", "green", "blue"], include_optimizer=False, pixels=(8, 8, 3))
    colours = np.random.default_rng(0).integers(0, 256, (5, 8, 8, 3), dtype=np.uint8)
    wanted = rgb.predict(colours.astype("float32") / 255.0, verbose=0)
    np.testing.assert_allclose(pyfunc(tmp_path / "rgb", tmp_path / "rgb_pyfunc").predict(colours).to_numpy(), wanted,
                               rtol=1e-5, atol=1e-6)
    found = tf.saved_model.load(str(tmp_path / "rgb")).signatures["serving_default"](image=tf.constant(colours))
    assert sorted(found) == ["class", rgb.output_names[0]]
    np.testing.assert_allclose(found[rgb.output_names[0]].numpy(), wanted, rtol=1e-5, atol=1e-6)


def test_an_override_of_the_runs_own_data_is_composed_with_its_option():
    """`data.test_files=...` on a run of data=tfrecord is data=tfrecord's key (composed alone, it is a key of
    the default data option's, which has none: the control)."""
    from omegaconf import OmegaConf

    saved = make_cfg("data=tfrecord", "data.train_files=a-*", "data.test_files=b-*")
    assert commands.runs_choices(saved, ["data.test_files=new/test-*", "trainer.seed=3", "model.dropout=0.2"]) == \
        ["data=tfrecord", "model=cnn"]  # (trainer has one option, and no name)
    assert commands.runs_choices(saved, ["data=npz", "data.path=x.npz"]) == []  # (an option chosen: its own keys)
    cfg = make_cfg(*commands.runs_choices(saved, ["data.test_files=new/test-*"]), "data.test_files=new/test-*")
    assert OmegaConf.select(cfg, "data.test_files") == "new/test-*"
    with pytest.raises(Exception, match="test_files"):  # (Hydra's own error: cli makes it one line)
        make_cfg("data.test_files=new/test-*")


@pytest.mark.parametrize("args, says", [
    (["out=p.txt"], "out=p.txt is of no format predict writes: name a file ending in .npz or .csv or .tfrecord"),
    (["strategy=multi_worker_mirrored", "cluster=manual", "cluster.worker_hosts=[a:1,b:2]", "out=p.npz"],
     "cluster=manual needs this task's role: set cluster.task_type"),
    (["checkpoint=/nowhere/ckpt-3", "out=p.npz"], "checkpoint=/nowhere/ckpt-3 holds no checkpoint"),
    ([], "predict needs out=PATH"),
    (["out=nodir/p.csv"], "out=nodir/p.csv: there is no directory nodir: create it, or name a file in one that exists"),
    (["out=/proc/p.npz"], "out=/proc/p.npz: /proc cannot be written ("),  # (even for root)
    (["out=d.csv", "overwrite=true"], "out=d.csv is a directory: name a file"),  # (d.csv/ made below)
])
def test_bad_input_is_one_line_and_writes_nothing(trained, tmp_path, monkeypatch, capsys, args, says):
    run = trained[0]
    monkeypatch.chdir(tmp_path)
    made = ["d.csv"] if "out=d.csv" in args else []
    for name in made:
        (tmp_path / name).mkdir()
    code = use("predict", run, *args)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert code == 2 and len(lines) == 1, err
    assert says in lines[0]
    assert [p.name for p in tmp_path.iterdir()] == made and not list((tmp_path / "d.csv").glob("*"))  # nothing written


def test_a_refusal_found_by_the_commands_tasks_leaves_the_run_as_it_was(trained, tmp_path, capsys):
    """evaluate on inputs without labels, on a 2-worker cluster: its tasks find the refusal after the command
    laid out evaluations/evaluate/ and its logs; every file of the run is as it was, byte for byte, and one
    line says why. The control: an evaluation that runs does write there."""
    import hashlib
    import shutil

    run = tmp_path / "run"
    shutil.copytree(trained[0], run)
    np.savez(tmp_path / "new.npz", x=trained[1][:40])

    def files():
        return {str(p.relative_to(run)): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in sorted(run.rglob("*")) if p.is_file()}
    before = files()
    code = use("evaluate", run, "strategy=multi_worker_mirrored", "cluster.workers=2", "data=npz",
               f"data.path={tmp_path / 'new.npz'}")
    err = capsys.readouterr().err
    assert code == 2 and [line for line in err.splitlines() if line.startswith("error: ")] == [
        f"error: evaluate needs labels, and npz holds inputs alone ({tmp_path / 'new.npz'} has no y_test or y): give "
        "labelled data, or use distrain predict for the outputs"], err
    assert files() == before
    assert use("evaluate", run, "name=control") == 0 and files() != before


def test_data_that_does_not_fit_the_model_says_both(trained, tmp_path, capsys):
    run = trained[0]
    npz = tmp_path / "small.npz"
    images = np.zeros((20, 14, 14, 1), np.uint8)
    np.savez(npz, x_train=images, y_train=np.arange(20) % 10, x_test=images, y_test=np.arange(20) % 10)
    assert use("evaluate", run, "data=npz", f"data.path={npz}") == 2
    assert "the data's examples are (14, 14, 1), the model takes (28, 28, 1)" in capsys.readouterr().err
    assert use("evaluate", tmp_path) == 2  # no run here at all
    assert f"{tmp_path} holds no distrain run (no config.yaml)" in capsys.readouterr().err


# ---- On a cluster: the outputs in parts, merged in order ---------------------------------------------------

def test_parts_cover_every_example_once_in_order_and_a_missing_part_is_named(tmp_path):
    plan = cluster_parts.plan(10, 4)
    assert plan == [(0, 4), (4, 8), (8, 10)]
    for k, (start, stop) in enumerate(plan):
        cluster_parts.write(tmp_path, k, start, np.arange(start, stop, dtype=np.float32)[:, None] * 2)
    merged = cluster_parts.merge(tmp_path, plan)
    assert list(merged["index"]) == list(range(10)) and list(merged["outputs"][:, 0]) == [2.0 * i for i in range(10)]
    assert cluster_parts.todo(tmp_path, [0, 1, 2]) == []
    cluster_parts.path(tmp_path, 1).unlink()  # control: a part not written is found, and named
    assert cluster_parts.todo(tmp_path, [0, 1, 2]) == [1]
    with pytest.raises(commands.ConfigError, match="1 of 3 parts were not computed \\(part 1\\)"):
        cluster_parts.merge(tmp_path, plan)


def stopped_after_a_part(where, proc, name: str, k: int) -> int:
    """Task `name` SIGSTOPped as soon as its part k is written (its pid from cluster.json), then SIGKILLed:
    how many parts there were when it stopped."""
    wait_until(lambda: cluster_parts.path(where / "parts", k).exists(), proc, f"part {k}", timeout=120, interval=0.005)
    pid = task_state(where, name)["pid"]
    os.kill(pid, signal.SIGSTOP)
    written = len(list((where / "parts").glob("part-*.npz")))
    os.kill(pid, signal.SIGKILL)
    return written


def test_predict_on_two_workers_with_one_killed_gives_every_output_once_in_order(trained, tmp_path):
    """multi_worker_mirrored, 2 workers, TFRecord shards (round-robin) in parts of 8: worker-1 SIGKILLed
    after its first part is restarted alone, computes only the parts not written, and the merged outputs
    are plain Keras's predict in the files' order, each once."""
    run, pixels, x, y = trained
    write_tfrecords.write(pixels, y, tmp_path, "test", 3)
    write_tfrecords.write(pixels[:10], y[:10], tmp_path, "train", 1)
    order = [i for shard in range(3) for i in range(shard, len(y), 3)]
    where, written = run / "evaluations" / "predict", []

    def chaos(proc):
        written.append(stopped_after_a_part(where, proc, "worker-1", 1))
    code, out, _ = during(chaos, lambda: here(tmp_path, [  # (in this process: its fork server is this one's)
        "predict", str(run), "data=tfrecord", f"data.train_files={tmp_path}/train-*",
        f"data.test_files={tmp_path}/test-*", "strategy=multi_worker_mirrored", "cluster.workers=2",
        "trainer.batch_size=8", "part_size=8", f"out={tmp_path / 'p.npz'}"]))
    assert code == 0, out[-3000:]
    written = written[0]
    assert written < len(cluster_parts.plan(len(y), 8)), "every part was written before the kill: nothing was proved"
    cluster = json.loads((where / "cluster.json").read_text())
    assert [r["task"] for r in cluster["restarts"]] == ["worker-1"] and cluster["restarts"][0]["exit_status"] == -9
    log = (where / "logs" / "worker-1.log").read_text()
    assert "parts were written before it (re)started" in log  # (the restarted worker skipped what it had written)
    with np.load(tmp_path / "p.npz") as found:
        predictions, index = found["predictions"], found["index"]
    assert list(index) == list(range(len(y)))
    expected = plain_model(run).predict(x, batch_size=128, verbose=0)[order]
    np.testing.assert_allclose(predictions, expected, rtol=1e-5, atol=1e-6)
    assert not np.allclose(predictions, expected[np.random.default_rng(0).permutation(len(y))], rtol=1e-5, atol=1e-6)
    assert not (where / "parts").exists() and not [p for p in task_pids(where) if alive(p)]


def machines(runs: list, *args, timeout=RUN_TIMEOUT) -> list:
    """`distrain predict` as each machine of a 2-worker cluster=tf_config starts it (two processes here,
    worker i reading runs[i]: one run directory both reach, or a copy each, as machines without a shared
    file system have): (exit status, output) of each, the parts' directory left."""
    import subprocess
    import sys

    spec = {"worker": [f"127.0.0.1:{p}" for p in (cluster.portpicker.pick_unused_port() for _ in runs)]}
    procs = [subprocess.Popen([str(Path(sys.executable).parent / "distrain"), "predict", str(run),
                               "strategy=multi_worker_mirrored", "cluster=tf_config", *args],
                              env={**os.environ, "TF_CONFIG": json.dumps({"cluster": spec, "task": {
                                  "type": "worker", "index": i}})}, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for i, run in enumerate(runs)]
    return [(proc.wait(timeout), proc.stdout.read()) for proc in procs]


def test_machines_sharing_the_run_directory_predict_in_parts_and_its_chief_merges_them(trained, tmp_path):
    """cluster=tf_config, 2 workers on one run directory: worker 0's command writes every output once, in
    order, as plain Keras (worker 1's says its parts are written); a copy of the run per machine (no shared
    file system) is one line on each, naming the marker the other did not leave, and nothing written."""
    import shutil

    run, _, x, _ = trained
    (code0, said0), (code1, said1) = machines([run, run], "part_size=128", f"out={tmp_path / 'p.npz'}")
    assert (code0, code1) == (0, 0), said0[-2000:] + said1[-2000:]
    examples = f"{len(x):,} examples"
    assert f"worker-1: its parts of the {examples} are written; the command of worker-0 merges them" in said1
    assert f"Predicted {examples} of mnist" in said0 and "2 workers, multi_worker_mirrored" in said0
    with np.load(tmp_path / "p.npz") as found:
        assert list(found["index"]) == list(range(len(x)))
        np.testing.assert_allclose(found["predictions"], plain_model(run).predict(x, batch_size=128, verbose=0),
                                   rtol=1e-5, atol=1e-6)
    assert not list((run / "evaluations" / "predict").glob("parts-*"))  # (merged: removed)
    copy = tmp_path / "copy"
    shutil.copytree(run, copy, ignore=shutil.ignore_patterns("evaluations"))
    results = machines([run, copy], "cluster.startup_timeout=3", f"out={tmp_path / 'q.npz'}")
    for (code, said), other in zip(results, ("worker-1", "worker-0")):
        errors = [line for line in said.splitlines() if line.startswith("error: ")]
        assert code == 2 and len(errors) == 1, said[-2000:]
        assert errors[0].startswith(f"error: {other} left no marker in ") and "a shared file system" in errors[0]
    assert not (tmp_path / "q.npz").exists()
    assert subprocess_left(tmp_path) == []


def subprocess_left(path) -> list:
    import subprocess

    return subprocess.run(["pgrep", "-f", str(path)], capture_output=True, text=True).stdout.split()


def test_a_regression_on_arrays_evaluates_and_predicts_as_keras_here_and_on_parameter_servers(regression, tmp_path):
    """The same figures and outputs as plain Keras (1e-5) in this process, and the same outputs predicted
    under parameter servers (2 workers, parts of 64 rows); a shuffled order fails the comparison. (Arrays
    under multi_worker_mirrored: the sweep test below; TFRecord shards on both: the tests above and below.)"""
    run, x, y = regression
    model = plain_model(run)
    expected = model.predict(x, batch_size=50, verbose=0)
    figures = dict(zip(model.metrics_names, model.evaluate(x, y, batch_size=50, verbose=0)))
    assert use("evaluate", run, "name=here") == 0 and use("predict", run, f"out={tmp_path / 'here.npz'}") == 0
    # (in this process, which has TensorFlow loaded already: the command's process alone is spared)
    assert use("predict", run, "strategy=parameter_server", "cluster.workers=2", "part_size=64",
               f"out={tmp_path / 'ps.npz'}") == 0
    found = json.loads((run / "evaluations" / "here.json").read_text())
    assert found["examples"] == len(y) and set(figures) <= set(found)
    for key, value in figures.items():
        assert found[key] == pytest.approx(value, rel=1e-5), key
    shuffled = np.random.default_rng(0).permutation(len(y))
    for name in ("here", "ps"):
        with np.load(tmp_path / f"{name}.npz") as found:
            assert list(found["index"]) == list(range(len(y)))
            np.testing.assert_allclose(found["predictions"], expected, rtol=1e-5, atol=1e-6)
            assert not np.allclose(found["predictions"], expected[shuffled], rtol=1e-5, atol=1e-6)


def test_evaluate_under_parameter_servers_gives_keras_figures(trained, tmp_path):
    """parameter_server, 2 workers, TFRecord shards in parts of 16 (a function per batch, on whichever
    worker is free): the figures are plain Keras's evaluate on the same examples (and, as a control, not
    those of other examples). (A worker killed part-way: the multi_worker_mirrored test above; under
    parameter servers TensorFlow's coordinator runs the lost worker's functions again, or itself fails,
    which restarts the cluster: parts.py.)"""
    run, pixels, x, y = trained
    write_tfrecords.write(pixels, y, tmp_path, "test", 2)
    write_tfrecords.write(pixels[:10], y[:10], tmp_path, "train", 1)
    # The fork server a local cluster's run in this process has (its network's, its kernels': the run's own
    # trainer.onednn=auto): evaluate's tasks come from it.
    with launch.environment(cpu.onednn_env("auto")):
        forks = forkserver.shared(tmp_path / "forkserver.log", cluster.PrivateNetwork.shared().wrap)
    assert use("evaluate", run, "data=tfrecord", f"data.train_files={tmp_path}/train-*",  # (in this process)
               f"data.test_files={tmp_path}/test-*", "strategy=parameter_server", "cluster.workers=2",
               "trainer.batch_size=16", "part_size=16", "name=ps") == 0
    where = run / "evaluations" / "evaluate"
    assert not (where / "logs" / "forkserver.log").exists() and forks.proc.poll() is None  # (no server of its own)
    found = json.loads((run / "evaluations" / "ps.json").read_text())
    loss, accuracy = plain_model(run).evaluate(x, y, batch_size=16, verbose=0)
    assert found["examples"] == 2000 and found["strategy"] == "parameter_server" and found["workers"] == 2
    assert found["loss"] == pytest.approx(loss, rel=1e-5) and found["accuracy"] == pytest.approx(accuracy, abs=1e-6)
    half = plain_model(run).evaluate(x[:1000], y[:1000], batch_size=16, verbose=0)
    assert found["loss"] != pytest.approx(half[0], rel=1e-5)  # control: other examples give other figures
    assert json.loads((where / "cluster.json").read_text())["restarts"] == []
    assert not [p for p in task_pids(where) if alive(p)]
    assert "cpu kernels: oneDNN (trainer.onednn=auto" in (where / "logs" / "chief-0.log").read_text()


@pytest.mark.parametrize("setting, expected", [(None, cpu.onednn_choice("auto")[0]), ("false", "0"), ("true", "1")])
def test_the_tasks_run_the_kernels_the_run_trained_with(trained, monkeypatch, setting, expected):
    """TensorFlow reads TF_ENABLE_ONEDNN_OPTS as it starts: evaluate and predict set it as the run's launcher
    did (trainer.onednn, the run's own unless overridden) before this process's TensorFlow or a cluster's
    fork server and tasks start (on a CPU where TensorFlow's default differs, the kernels would otherwise
    differ from the training's; a cluster's tasks say which they run: the parameter-server test above)."""
    run = trained[0]
    seen = []

    class Cluster:  # what the tasks would start with, seen where the fork server starts
        def __init__(self, *args):
            seen.append(os.environ.get(cpu.ONEDNN))

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

    monkeypatch.setattr(cluster_parts, "Cluster", Cluster)
    monkeypatch.delenv(cpu.ONEDNN, raising=False)
    monkeypatch.setattr(commands, "evaluate_run", lambda *args: {})  # (no tasks to start)
    overrides = ["strategy=multi_worker_mirrored", "cluster.workers=2"]
    commands.one("evaluate", run, overrides + ([f"trainer.onednn={setting}"] if setting else []), {},
                  lambda o: make_cfg(*o))
    assert seen == [expected] and cpu.ONEDNN not in os.environ  # (as it was after)


def test_several_runs_and_data_sets_make_a_job_each_and_end_with_a_table(trained, tmp_path, capsys):
    """A sweep's directory by a glob (its runs, and what is no run: summary.csv, tensorboard/, passed over)
    and -m over three .npz files, one missing (a failed job; the others go on): a job each, their figures
    those of each evaluation alone, a table of them all, exit status 1; predict -m over strategies (here,
    and 2 workers), its out numbered by job."""
    run, pixels, _, y = trained
    for name, n in (("a", 300), ("b", 500)):
        np.savez(tmp_path / f"{name}.npz", x_train=pixels[:n], y_train=y[:n], x_test=pixels[:n], y_test=y[:n])
    (tmp_path / "summary.csv").write_text("")
    (tmp_path / "tensorboard").mkdir()
    args = [str(run), str(tmp_path / "summary.csv"), str(tmp_path / "tensorboard"), "data=npz",
            f"data.path={tmp_path / 'a.npz'},{tmp_path / 'b.npz'},{tmp_path / 'c.npz'}", "name=swept"]
    assert commands.main("evaluate", args, lambda overrides: make_cfg(*overrides), multirun=True) == 1
    said = capsys.readouterr()
    assert f"passed over (no config.yaml: no run): {tmp_path / 'summary.csv'}, {tmp_path / 'tensorboard'}" in said.out
    table = said.out[said.out.index("#  run"):].splitlines()
    assert len(table) == 4 and table[0].split()[:4] == ["#", "run", "data.path", "status"]
    assert [line.split()[3] for line in table[1:]] == ["ok", "ok", "failed"]
    assert said.err.count("error: ") == 1 and "c.npz" in said.err
    for job, n in ((1, 300), (2, 500)):
        found = json.loads((run / "evaluations" / ("swept.json" if job == 1 else "swept-2.json")).read_text())
        alone = plain_model(run).evaluate(pixels[:n] / 255.0, y[:n], batch_size=128, verbose=0)
        assert found["examples"] == n and found["loss"] == pytest.approx(alone[0], rel=1e-5)
        assert f"{found['loss']:.4f}" in table[job]
    # predict, -m over strategies: here, and on 2 workers of multi_worker_mirrored (parts of 64 rows)
    assert commands.main("predict", [str(run), "data=npz", f"data.path={tmp_path / 'b.npz'}", "cluster.workers=2",
                                      "strategy=default,multi_worker_mirrored", "part_size=64",
                                      f"out={tmp_path / 'p.npz'}"],
                          lambda overrides: make_cfg(*overrides), multirun=True) == 0
    expected = plain_model(run).predict(pixels[:500] / 255.0, batch_size=128, verbose=0)
    for n in (0, 1):
        with np.load(tmp_path / f"p-{n}.npz") as found:
            predictions = found["predictions"]
            assert list(found["index"]) == list(range(500))
        np.testing.assert_allclose(predictions, expected, rtol=1e-5, atol=1e-6)
    assert not np.allclose(predictions, expected[::-1], rtol=1e-5, atol=1e-6)  # control: another order
    assert "strategy" in capsys.readouterr().out.splitlines()[-3]  # (the table's header names the swept key)
