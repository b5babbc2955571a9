"""Data in files: TFRecord shards and image folders, made here from the bundled digits, scanned without
TensorFlow, streamed, sharded per worker, trained under every kind of strategy, resumed exactly, and
every bad input one line."""
import json
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from distrain.common.errors import ConfigError
from distrain.common.topology import Topology
from distrain.data import arrays, files

from helpers import RUN_TIMEOUT, assert_nothing_left, check_evaluations, make_cfg, record_file, run_cli

QUICK = ["model=mlp", "optimizer=sgd", "trainer.learning_rate=0.1", "trainer.batch_size=64", "trainer.verbose=2"]


def digits(n: int, seed: int = 0):
    (x, y), _ = arrays.load(make_cfg("data.source=bundled").data, seed)
    return x[:n], y[:n]


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """960 training digits in 4 shards, 320 test digits in 2 (written by distrain's own writer)."""
    from distrain.data import write_tfrecords

    out = tmp_path_factory.mktemp("shards")
    x, y = digits(1280)
    write_tfrecords.write(x[:960], y[:960], out, "train", 4)
    write_tfrecords.write(x[960:], y[960:], out, "test", 2)
    return out


def tfrecord(shards, *more):
    return ["data=tfrecord", f"data.train_files={shards}/train-*", f"data.test_files={shards}/test-*", *more]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """An image folder of 600 digits: train/ and test/ by class, grey and RGB PNGs, a fifth of them 32x32."""
    root = tmp_path_factory.mktemp("folder")
    x, y = digits(600, seed=1)
    for i in range(600):
        image = Image.fromarray(x[i, ..., 0])
        image = image.convert("RGB") if i % 3 == 0 else image
        image = image.resize((32, 32)) if i % 5 == 0 else image
        path = root / ("train" if i < 480 else "test") / f"digit-{y[i]}" / f"{i}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        image.save(path)
    return root


# ---- the scan, without TensorFlow ---------------------------------------------------------------------

def test_the_scan_counts_records_from_their_headers_and_finds_the_classes(shards, folder):
    found = files.scan(make_cfg(*tfrecord(shards)).data, seed=42)
    assert (found.train_examples, found.test_examples, found.num_classes) == (960, 320, 10)
    assert found.shape == [28, 28, 1] and found.encoded and len(found.train_files) == 4
    assert "counted from the record headers" in found.how and "one pass over every record" in found.how
    given = files.scan(make_cfg(*tfrecord(shards, "data.num_classes=12")).data, seed=42)
    assert given.num_classes == 12 and "one pass" not in given.how  # the control: no pass when given
    images = files.scan(make_cfg("data=images", f"data.path={folder}", "data.image_size=[28,28]").data, seed=42)
    assert (images.train_examples, images.test_examples, images.num_classes) == (480, 120, 10)
    assert images.class_names == [f"digit-{d}" for d in range(10)]
    assert images.train_labels[:1] == [0] and images.train_labels[-1:] == [9]


def test_test_split_holds_out_a_seeded_fraction_of_each_class(folder, tmp_path):
    only_train = tmp_path / "only_train"
    only_train.mkdir()
    (only_train / "train").symlink_to(folder / "train", target_is_directory=True)
    cfg = make_cfg("data=images", f"data.path={only_train}", "data.image_size=[28,28]", "data.test_split=0.25")
    a, b = files.scan(cfg.data, seed=1), files.scan(cfg.data, seed=1)
    assert a.test_files == b.test_files and not set(a.test_files) & set(a.train_files)
    assert a.train_examples + a.test_examples == 480 and 100 <= a.test_examples <= 140
    assert files.scan(cfg.data, seed=2).test_files != a.test_files  # the control: another seed, another split


def test_classes_are_matched_by_name_in_training_and_in_a_test_split_alone(folder, tmp_path):
    """data.class_names orders an image folder's classes (the control: by default, the folders sorted); a test/
    of some of train/'s classes keeps their labels; a class folder of neither is one line."""
    some = tmp_path / "some"
    (some / "test").mkdir(parents=True)
    (some / "train").symlink_to(folder / "train", target_is_directory=True)
    for digit in (7, 3):
        (some / "test" / f"digit-{digit}").symlink_to(folder / "test" / f"digit-{digit}", target_is_directory=True)
    base = ["data=images", f"data.path={some}", "data.image_size=[28,28]"]
    found = files.scan(make_cfg(*base).data, seed=0)
    assert found.class_names == [f"digit-{d}" for d in range(10)] and set(found.test_labels) == {3, 7}
    backwards = [f"digit-{d}" for d in range(9, -1, -1)]
    given = files.scan(make_cfg(*base, f"data.class_names=[{','.join(backwards)}]").data, seed=0)
    assert given.class_names == backwards and set(given.test_labels) == {6, 2}  # (9 - 3, 9 - 7)
    assert given.train_files[0].split("/")[-2] == "digit-9" and given.train_labels[0] == 0
    # The test split alone (evaluate, predict): the model's classes, by name; else the folders' sorted order, said.
    alone = files.scan(make_cfg(*base).data, seed=0, train=False, known=backwards)
    assert set(alone.test_labels) == {6, 2} and "matched by name to the classes of the model" in alone.how
    sorted_ = files.scan(make_cfg(*base, "data.num_classes=10").data, seed=0, train=False)
    assert set(sorted_.test_labels) == {0, 1} and "taken to be the folders in sorted order (digit-3, digit-7)" in \
        sorted_.how
    (some / "test" / "digit-x").symlink_to(folder / "test" / "digit-1", target_is_directory=True)
    with pytest.raises(ConfigError, match=f"the class folder {some}/test/digit-x is not a class of {some}/train"):
        files.scan(make_cfg(*base).data, seed=0)
    with pytest.raises(ConfigError, match="digit-x names a class the model does not know"):
        files.scan(make_cfg(*base).data, seed=0, train=False, known=backwards)


def test_tfrecords_name_their_classes_as_write_tfrecords_writes_them(tmp_path):
    """image/class/text names each label's class (write-tfrecords writes it from data.class_names); the
    control: shards without it name none; two names for one label are one line."""
    from distrain.data import write_tfrecords

    x, y = digits(64)
    names = "zero one two three four five six seven eight nine".split()
    write_tfrecords.write(x, y, tmp_path / "named", "train", 2, names=names)
    write_tfrecords.write(x, y, tmp_path / "plain", "train", 2)
    scan = lambda where: files.scan(make_cfg("data=tfrecord", f"data.train_files={where}/*",
                                             f"data.test_files={where}/*").data, seed=0)
    assert scan(tmp_path / "named").class_names == names and scan(tmp_path / "plain").class_names == []
    renamed = list(names)
    renamed[int(y[0])] = "other"  # (the first record's label named otherwise in a second file)
    write_tfrecords.write(x[:1], y[:1], tmp_path / "named", "zz", 1, names=renamed)
    with pytest.raises(ConfigError, match=f"label {int(y[0])} is named both {names[int(y[0])]} and other"):
        scan(tmp_path / "named")


# ---- the pipeline -------------------------------------------------------------------------------------

def test_each_pipeline_reads_only_its_own_files(tmp_path):
    """Shard k holds label k alone: a worker's batches show which files it read. FILE sharding with as
    many files as pipelines; DATA sharding (every file, a share of its records) with fewer."""
    import tensorflow as tf

    from distrain.data import write_tfrecords
    from distrain.task import input_pipeline

    x, _ = digits(400)
    for k in range(4):
        write_tfrecords.write(x[k * 100:(k + 1) * 100], np.full(100, k), tmp_path / f"f{k}", "train", 1)
    cfg = make_cfg("data=tfrecord", f"data.train_files={tmp_path}/f*/train-*", f"data.test_files={tmp_path}/f0/*",
                   "trainer.batch_size=40", "data.num_classes=4")
    found = files.scan(cfg.data, seed=42)

    def labels(pipelines: int, index: int) -> set:
        context = tf.distribute.InputContext(num_input_pipelines=pipelines, input_pipeline_id=index,
                                             num_replicas_in_sync=pipelines)
        ds = input_pipeline.file_reader(found, cfg)(context)
        return set(np.concatenate([y.numpy() for _, y in ds.take(10)]).tolist())

    assert labels(2, 0) == {0, 2} and labels(2, 1) == {1, 3}  # FILE: files 0, 2 and 1, 3
    assert labels(1, 0) == {0, 1, 2, 3}  # the control: one pipeline reads them all
    reader = input_pipeline.file_reader(found, cfg)
    assert "sharded by FILE: each reads 2 of the 4" in reader.sharding_line(2)
    assert reader.sharding_line(5).startswith("warning: input: 5 pipelines (one per worker), sharded by DATA")
    assert labels(5, 4) == {0, 1, 2, 3}  # 5 pipelines, 4 files: each a share of every file


def test_a_batch_larger_than_a_decoding_chunk_holds_the_same_examples(shards):
    """Batches of more than pipeline.DECODE records are decoded in chunks of DECODE: a batch of 256 is the
    two batches of 128 that the same seed gives (control: another seed, other examples)."""
    from distrain.task import input_pipeline

    def first(batch: int, n: int, seed: int = 42):
        cfg = make_cfg(*tfrecord(shards, "data.num_classes=10", f"trainer.batch_size={batch}", f"trainer.seed={seed}"))
        got = list(input_pipeline.file_reader(files.scan(cfg.data, seed=0), cfg)().take(n))
        return np.concatenate([x.numpy() for x, _ in got]), np.concatenate([y.numpy() for _, y in got])

    assert input_pipeline.DECODE == 128
    (large, large_labels), (small, small_labels) = first(256, 1), first(128, 2)
    assert large.shape == (256, 28, 28, 1)
    np.testing.assert_array_equal(large, small)
    np.testing.assert_array_equal(large_labels, small_labels)
    assert not np.array_equal(first(128, 2, seed=7)[1], small_labels)


@pytest.mark.slow
def test_a_resumed_run_on_files_ends_as_one_never_stopped(shards, tmp_path, monkeypatch):
    """In-process (the loop every single-process strategy shares): killed mid-epoch, resumed from the
    checkpoint, the batches after it are the ones an uninterrupted run takes (skipped as records)."""
    from test_resume import Crash, crash_after

    from distrain.task.training import train

    config = tfrecord(shards, "data.num_classes=10", "model=mlp", "optimizer=sgd", "trainer.learning_rate=0.1",
                      "trainer.batch_size=64", "trainer.epochs=2", "trainer.verbose=0",
                      "trainer.checkpoint_every_steps=5")  # 960 // 64 = 15 steps an epoch
    results, whole = train(make_cfg(*config), tmp_path / "whole")
    assert results["train_examples"] == 960 and results["global_steps"] == 30
    crash_after(monkeypatch, 22)
    with pytest.raises(Crash):
        train(make_cfg(*config), tmp_path / "stopped")
    monkeypatch.undo()
    results, resumed = train(make_cfg(*config, "trainer.resume=true"), tmp_path / "stopped")
    assert results["resumed_from_step"] == 20 and results["global_steps"] == 30
    for a, b in zip(whole.get_weights(), resumed.get_weights()):
        np.testing.assert_allclose(b, a, atol=1e-6, rtol=0)
    _, other = train(make_cfg(*config, "trainer.seed=7"), tmp_path / "other")  # the control
    assert max(np.abs(a - b).max() for a, b in zip(whole.get_weights(), other.get_weights())) > 1e-3


# ---- training, as a user runs it ----------------------------------------------------------------------

@pytest.mark.slow
def test_tfrecord_shards_train_under_mirrored_with_a_set_number_of_steps(shards, tmp_path):
    """In-process, on 2 virtual CPUs: every strategy in one process reads through the same reader."""
    from distrain.task.training import train

    results, _ = train(make_cfg(*tfrecord(shards, "strategy=mirrored", "strategy.cpu_virtual_devices=2", *QUICK,
                                          "trainer.epochs=3", "trainer.steps_per_epoch=10", "trainer.verbose=0",
                                          "trainer.save_model=false")), tmp_path / "run")
    assert results["num_replicas"] == 2 and results["global_steps"] == 30 and results["test_examples"] == 320
    assert results["test_accuracy"] > 0.7, results["history"]


@pytest.mark.slow
def test_an_image_folder_trains_and_its_class_names_go_with_the_model(folder, tmp_path):
    out = run_cli(tmp_path / "run", "data=images", f"data.path={folder}", "data.image_size=[28,28]",
                  "data.channels=1", *QUICK, "trainer.epochs=3")
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["class_names"] == [f"digit-{d}" for d in range(10)] and results["input_shape"] == [28, 28, 1]
    assert results["history"]["loss"][-1] < results["history"]["loss"][0], results["history"]  # it learned
    names = (tmp_path / "run" / "saved_model" / "class_names.txt").read_text().split()
    assert names == results["class_names"]
    assert "10 class folders, 480 training and 120 test image(s)" in out.stderr + out.stdout
    # Decoding PNGs for a small model: the input pipeline's CPU time is said, with what spares it (control:
    # test_accounting's in-memory default, whose input takes a few percent).
    assert results["input_cpu_share"] > 0.15 and "data.cache=memory (or a directory) decodes them once" in out.stdout


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["multi_worker_mirrored", "parameter_server"])
def test_tfrecord_shards_train_on_a_local_cluster_each_worker_its_files(shards, tmp_path, strategy):
    """With validation, a callback that stops training and a sidecar evaluator: EarlyStopping sees no
    gain of 10 in val_loss after epoch 1, so every worker stops after epoch 2 of 20 (parameter servers:
    the coordinator validates on a copy of the weights), the evaluator stops at that checkpoint, and the
    run ends ok. multi_worker_mirrored also with the XLA-compiled step, the GPU path (which says on a CPU
    what it costs), and oneDNN off in every task, the fork server's children too (on by default:
    test_cli's default run)."""
    mwms = strategy == "multi_worker_mirrored"
    run_dir = tmp_path / "run"
    out = run_cli(run_dir, *tfrecord(shards, "data.num_classes=10"), f"strategy={strategy}",
                  "cluster.workers=2", *(["cluster.ps=1"] if not mwms else []), *QUICK, "cluster.evaluator=true",
                  *(["trainer.jit_compile=true", "trainer.onednn=false"] if mwms else []),
                  "trainer.epochs=20", "trainer.validate_every=1",
                  "callbacks=early_stopping", "+callbacks.early_stopping.min_delta=10",
                  "callbacks.early_stopping.patience=1", "callbacks.early_stopping.restore_best_weights=false")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "input: 2 pipelines (one per worker), sharded by FILE: each reads 2 of the 4 training files" in out.stdout
    results = json.loads((run_dir / "results.json").read_text())
    assert results["num_workers"] == 2 and results["data_source"] == "tfrecord"
    # It learned. (2 epochs of 15 steps; asynchronous under parameter servers: no accuracy bound.)
    assert results["history"]["loss"][1] < results["history"]["loss"][0], results["history"]
    assert results["stopped_early"] == "callbacks.early_stopping (EarlyStopping) stopped training after epoch 2"
    assert len(results["history"]["val_loss"]) == 2
    assert results["history"]["val_loss"][-1] == pytest.approx(results["test_loss"], rel=1e-5)  # the same weights
    chief = [line for line in out.stdout.splitlines() if line.startswith(("[worker-0] ", "[chief-0] "))]
    assert "stopped training after epoch 2" in chief[-2]  # its results' line (the evaluator's may come after)
    assert re.search(r"peak resident memory: (chief-0 [\d,]+ MiB, )?worker-0 [\d,]+ MiB, worker-1 [\d,]+ MiB",
                     out.stdout)
    assert results["time_split"]["communication"] > 0, results["time_split"]  # all-reduce, or waits for a step
    check_evaluations(run_dir, out.stdout, last="ckpt-30", epoch=2)  # 2 epochs of 15 steps, not 20
    if mwms:  # both workers stopped there, together
        logs = [(run_dir / "logs" / f"worker-{i}.log").read_text() for i in (0, 1)]
        assert all("Epoch 2/20 - 15 steps - " in log and "Epoch 3/20" not in log for log in logs), logs[1][-2000:]
        assert results["onednn"] is False and "cpu kernels: Eigen, oneDNN off (trainer.onednn=false)" in out.stdout
        assert (results["num_replicas"], results["num_ps"]) == (2, 0)
        assert results["jit_compile"] is True and out.stdout.count("warning: trainer.jit_compile=true on a CPU") == 1
        assert 0 < results["seconds_to_first_step"] < RUN_TIMEOUT  # from the command's start, across processes
        assert "[worker-0] Test accuracy" in out.stdout and "[worker-1] Test accuracy" not in out.stdout
        tasks = json.loads((run_dir / "cluster.json").read_text())["tasks"]
        assert [(t["name"], t["state"]) for t in tasks] == [
            ("worker-0", "exited 0"), ("worker-1", "exited 0"), ("evaluator-0", "exited 0")]
    assert_nothing_left(run_dir)


# ---- bad data met while streaming: one line (what the launcher finds first: the bad-input catalogue) ------

def _shard(path: Path, images: list, labels: list) -> Path:
    import tensorflow as tf

    with tf.io.TFRecordWriter(str(path)) as writer:
        for image, label in zip(images, labels):
            encoded = image if isinstance(image, bytes) else tf.io.encode_png(image).numpy()
            writer.write(tf.train.Example(features=tf.train.Features(feature={
                "image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(value=[encoded])),
                "image/class/label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label]))}))
                .SerializeToString())
    return path


@pytest.mark.parametrize("case", ["label outside", "size differs", "not an image"])
def test_a_bad_record_met_while_streaming_is_one_line_naming_it(shards, tmp_path, case):
    """What the scan cannot see without decoding every record stops the pipeline at that record, named
    (the task says it in one line: bad_data)."""
    import tensorflow as tf

    from distrain.task.input_pipeline import bad_data, file_reader

    x, y = digits(64, seed=3)
    images, labels = list(x), [int(v) for v in y]
    if case == "label outside":
        labels[40] = 12
    elif case == "size differs":
        images[40] = np.zeros((32, 32, 1), np.uint8)
    else:
        images[40] = b"no image at all"
    bad = _shard(tmp_path / "bad.tfrecord", images, labels)
    cfg = make_cfg("data=tfrecord", f"data.train_files={bad}", f"data.test_files={shards}/test-*",
                   "data.num_classes=10", "data.shuffle_buffer=1", "trainer.batch_size=8")
    reader = file_reader(files.scan(cfg.data, seed=0), cfg)
    assert len(list(reader().take(5))) == 5  # the records before it stream
    with pytest.raises(tf.errors.InvalidArgumentError) as raised:
        list(reader().take(8))
    says = {"label outside": "has label 12, outside [0, 10): set data.num_classes higher, or fix it",
            "size differs": "is 32x32, the first image 28x28: set data.image_size=[H,W] to resize them all",
            "not an image": "is not a PNG, JPEG, GIF or BMP image: replace it, or remove it"}[case]
    assert str(bad_data(raised.value)) == f'the data\'s record 40 of "{bad}" {says}'
    assert bad_data(ValueError("x")) is None and bad_data(tf.errors.InvalidArgumentError(None, None, "x")) is None


def test_a_file_cut_short_after_the_scan_is_one_line(tmp_path):
    """The launcher's scan finds a file cut short before anything starts (the bad-input cases below); one
    cut later (or only on a worker's machine) fails where it is read, in one line too."""
    import tensorflow as tf

    from distrain.task.input_pipeline import bad_data, file_reader

    x, y = digits(64, seed=3)
    shard = _shard(tmp_path / "cut.tfrecord", list(x), [int(v) for v in y])
    cfg = make_cfg("data=tfrecord", f"data.train_files={shard}", f"data.test_files={shard}", "data.num_classes=10",
                   "trainer.batch_size=8")
    reader = file_reader(files.scan(cfg.data, seed=0), cfg)
    assert len(list(reader().take(8))) == 8  # the control: whole, it streams
    shard.write_bytes(shard.read_bytes()[:-100])
    with pytest.raises(tf.errors.DataLossError) as raised:
        list(reader().take(8))
    assert str(bad_data(raised.value)).startswith("a TFRecord file of the data is corrupted or cut short (")


def test_raw_pixels_with_their_size_given_are_read(tmp_path):
    """The control of "raw, no size": the same record with data.image_size and data.channels scans."""
    import tensorflow as tf

    raw = record_file(tmp_path / "raw.tfrecord", {
        "image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(value=[bytes(784)])),
        "image/class/label": tf.train.Feature(int64_list=tf.train.Int64List(value=[1]))})
    cfg = make_cfg("data=tfrecord", f"data.train_files={raw}", f"data.test_files={raw}", "data.image_size=[28,28]",
                   "data.channels=1")
    found = files.scan(cfg.data, seed=0)
    assert not found.encoded and found.shape == [28, 28, 1] and found.num_classes == 2
    with pytest.raises(ConfigError, match="holds 784 raw bytes, not H x W x C = 2352"):
        files.scan(make_cfg("data=tfrecord", f"data.train_files={raw}", f"data.test_files={raw}",
                            "data.image_size=[28,28]", "data.channels=3").data, seed=0)


def test_a_data_file_missing_where_a_task_reads_it_is_one_line(shards, tmp_path):
    """A file the launcher found, gone (or never there) where a worker reads it: one line naming it."""
    import tensorflow as tf

    from distrain.task import input_pipeline, worker_idx

    cfg = make_cfg(*tfrecord(shards, "data.num_classes=10", "trainer.batch_size=32"))
    found = files.scan(cfg.data, seed=0)
    gone = tmp_path / "train-00001-of-00004.tfrecord"
    found.train_files = [found.train_files[0], str(gone)]
    with pytest.raises(tf.errors.NotFoundError) as raised:
        list(input_pipeline.file_reader(found, cfg)().take(40))
    assert str(worker_idx.unreadable_on_worker(raised.value, cfg.data)).startswith(
        f"a task cannot read the data file {gone}")
    assert worker_idx.unreadable_on_worker(raised.value, make_cfg("data=synthetic").data) is None  # not files


def test_raw_and_png_shards_stream_the_same_pixels(tmp_path):
    """write-tfrecords' two encodings, read back: the pixels of the arrays they came from, scaled to [0, 1]."""
    from distrain.data import write_tfrecords
    from distrain.task import input_pipeline

    x, y = digits(50)
    for encoding in ("png", "raw"):
        write_tfrecords.write(x, y, tmp_path / encoding, "test", 1, raw=encoding == "raw")
        cfg = make_cfg("data=tfrecord", f"data.train_files={tmp_path / encoding}/*",
                       f"data.test_files={tmp_path / encoding}/*",
                       "data.num_classes=10", "trainer.batch_size=50",
                       *(["data.image_size=[28,28]", "data.channels=1"] if encoding == "raw" else []))
        found = files.scan(cfg.data, seed=0)
        assert found.encoded == (encoding == "png")
        images, labels = next(iter(input_pipeline.file_reader(found, cfg, training=False)()))
        np.testing.assert_array_equal(labels.numpy(), y)
        np.testing.assert_allclose(images.numpy(), x / 255.0, atol=1e-6)


@pytest.mark.parametrize("kind", ["tfrecord", "images"])
def test_a_parameter_server_worker_checks_it_sees_the_coordinators_files(shards, folder, tmp_path, monkeypatch, kind):
    """Before it reads any, a worker matches the files on its own machine against the files the launcher
    found: here the coordinator saw a file the worker's disk lacks (control: the same files)."""
    import tensorflow as tf

    from distrain.task import input_pipeline

    monkeypatch.setattr(tf.distribute.coordinator, "experimental_get_current_worker_index", lambda: 0)
    context = tf.distribute.InputContext(num_input_pipelines=1, input_pipeline_id=0, num_replicas_in_sync=1)
    args = tfrecord(shards, "data.num_classes=10") if kind == "tfrecord" else \
        ["data=images", f"data.path={folder}", "data.image_size=[28,28]"]
    cfg = make_cfg(*args, "trainer.batch_size=32")
    found = files.scan(cfg.data, seed=0)
    workers = Topology(parameter_servers=True, clustered=True, workers=2, ps=1)
    assert len(list(input_pipeline.file_reader(found, cfg, topology=workers)(context).take(2))) == 2  # the control
    lacking = shards / "train-00009-of-00004.tfrecord" if kind == "tfrecord" else folder / "train" / "digit-3" / "x.png"
    found.train_files = [str(lacking), *found.train_files]
    found.train_labels = [3, *found.train_labels] if kind == "images" else []
    with pytest.raises(tf.errors.InvalidArgumentError) as raised:
        list(input_pipeline.file_reader(found, cfg, topology=workers)(context).take(2))
    line = str(input_pipeline.bad_data(raised.value))
    n = len(found.train_files)
    where = "data.train_files" if kind == "tfrecord" else "data.path's train/ images"
    assert line.startswith(f"the data's {where} on a parameter-server worker sees {n - 1} of the coordinator's {n} "
                           "files (missing: [") and str(lacking) in line, line
    assert line.endswith("give every worker's machine the same files at the same path"), line
