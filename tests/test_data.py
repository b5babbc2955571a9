"""Data sources (bundled, idx, keras cache / download, synthetic) and the tf.data pipeline."""
import functools
import hashlib
import http.server
import threading
from pathlib import Path

import numpy as np
import pytest

from distrain.common.errors import ConfigError
from distrain.data import arrays

from helpers import make_cfg, write_idx

PER_CLASS = [1001, 1127, 991, 1032, 980, 863, 1014, 1070, 944, 978]  # from the data README


def test_bundled_file_is_the_documented_one():
    digest = hashlib.sha256(arrays.BUNDLED.read_bytes()).hexdigest()
    assert digest == "0217e13bd0668deb198aa7d305edbf0331eb89f8a6e7dd226e03d1aa3a9bd4ef"
    assert (arrays.BUNDLED.parent / "README.md").read_text().count("Yann LeCun") == 1


def test_bundled_split_is_8000_2000_shuffled_and_complete():
    (xtr, ytr), (xte, yte) = arrays.load(make_cfg("data.source=bundled").data, seed=42)
    assert xtr.shape == (8000, 28, 28, 1) and xte.shape == (2000, 28, 28, 1)  # with a channel axis
    assert xtr.dtype == np.uint8 and xtr.max() == 255
    assert np.bincount(np.concatenate([ytr, yte]), minlength=10).tolist() == PER_CLASS
    assert len(set(yte.tolist())) == 10  # shuffled before the split: every class in the test set
    (xtr2, ytr2), _ = arrays.load(make_cfg("data.source=bundled").data, seed=42)
    np.testing.assert_array_equal(ytr, ytr2)
    (_, ytr3), _ = arrays.load(make_cfg("data.source=bundled").data, seed=7)
    assert not np.array_equal(ytr, ytr3)


@pytest.fixture
def idx_dir(tmp_path):
    (xtr, ytr), (xte, yte) = arrays.synthetic(300, 100, seed=3)
    for prefix, x, y, gz in (("train", xtr, ytr, True), ("t10k", xte, yte, False)):
        write_idx(tmp_path / f"{prefix}-images-idx3-ubyte", x, gz)
        write_idx(tmp_path / f"{prefix}-labels-idx1-ubyte", y, gz)
    return tmp_path, (xtr, ytr), (xte, yte)


def test_idx_directory_plain_and_gzipped(idx_dir):
    path, (xtr, ytr), (xte, yte) = idx_dir
    (a, b), (c, d) = arrays.load(make_cfg("data.source=idx", f"data.path={path}").data, seed=0)
    for got, want in ((a, xtr[..., None]), (b, ytr), (c, xte[..., None]), (d, yte)):
        np.testing.assert_array_equal(got, want)


def test_corrupt_idx_file_is_one_clear_error(idx_dir):
    path = idx_dir[0]
    (path / "t10k-images-idx3-ubyte").write_bytes(b"\x00\x00\x08\x03garbage")
    with pytest.raises(ConfigError, match="t10k-images-idx3-ubyte is corrupt"):
        arrays.load(make_cfg("data.source=idx", f"data.path={path}").data, seed=0)


def test_missing_idx_files_and_directory(tmp_path):
    with pytest.raises(ConfigError, match="no train-images-idx"):
        arrays.load(make_cfg("data.source=idx", f"data.path={tmp_path}").data, seed=0)
    with pytest.raises(ConfigError, match="is not a directory"):
        arrays.load(make_cfg("data.source=idx", f"data.path={tmp_path / 'nope'}").data, seed=0)


@pytest.mark.parametrize("content, message", [(None, "is missing"), (b"not a zip", "is corrupt")])
def test_missing_or_corrupt_bundled_file(tmp_path, monkeypatch, content, message):
    fake = tmp_path / "mnist-10k.npz"
    if content is not None:
        fake.write_bytes(content)
    monkeypatch.setattr(arrays, "BUNDLED", fake)
    with pytest.raises(ConfigError, match=message):
        arrays.load(make_cfg("data.source=bundled").data, seed=0)


def test_npz_with_wrong_shapes_is_rejected(tmp_path, monkeypatch):
    fake = tmp_path / "bad.npz"
    np.savez(fake, images=np.zeros((10, 32), np.uint8), labels=np.zeros(10, np.uint8))
    monkeypatch.setattr(arrays, "BUNDLED", fake)
    with pytest.raises(ConfigError, match=r"x_train has shape \(10, 32\), not images \(N, H, W\)"):
        arrays.load(make_cfg("data.source=bundled").data, seed=0)


def test_auto_prefers_the_keras_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KERAS_HOME", str(tmp_path))
    cfg = make_cfg("data.download_timeout=0").data
    assert arrays.resolve_source(cfg)[0] == "bundled"
    (tmp_path / "datasets").mkdir()
    (tmp_path / "datasets" / "mnist.npz").write_bytes(b"cached")
    source, why = arrays.resolve_source(cfg)
    assert source == "keras" and "Keras cache found" in why


def test_the_keras_source_reads_the_cache_auto_found(tmp_path, monkeypatch):
    """KERAS_HOME's cache, where source=auto finds it, is the one loaded (tf_keras alone reads ~/.keras)."""
    monkeypatch.setenv("KERAS_HOME", str(tmp_path))
    (x, y), (xt, yt) = arrays.synthetic(300, 100, seed=5)
    for prefix, images, labels in (("train", x, y), ("t10k", xt, yt)):
        write_idx(tmp_path / "datasets" / "fashion-mnist" / f"{prefix}-images-idx3-ubyte", images, True)
        write_idx(tmp_path / "datasets" / "fashion-mnist" / f"{prefix}-labels-idx1-ubyte", labels, True)
    cfg = make_cfg("data=fashion_mnist", "data.source=auto").data
    assert arrays.resolve_source(cfg) == ("keras", f"Keras cache found at {tmp_path}/datasets/fashion-mnist")
    (images, labels), _ = arrays.load(make_cfg("data=fashion_mnist", "data.source=keras").data, seed=0)
    np.testing.assert_array_equal(images, x[..., None])
    np.testing.assert_array_equal(labels, y)


@pytest.fixture
def local_server(tmp_path):
    """An HTTP server on 127.0.0.1 serving tmp_path/www; stopped after the test."""
    www = tmp_path / "www"
    www.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(www))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield www, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join()


def test_auto_downloads_into_the_keras_cache(tmp_path, monkeypatch, local_server):
    www, url = local_server
    (www / "mnist.npz").write_bytes(arrays.BUNDLED.read_bytes())
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "keras"))
    monkeypatch.setattr(arrays, "KERAS_URL", f"{url}/mnist.npz")
    source, why = arrays.resolve_source(make_cfg().data)
    assert (source, why.split(" to ")[0]) == ("keras", "downloaded full MNIST")
    assert (tmp_path / "keras" / "datasets" / "mnist.npz").read_bytes() == arrays.BUNDLED.read_bytes()


def test_auto_falls_back_to_bundled_when_the_download_fails(tmp_path, monkeypatch, local_server):
    _, url = local_server
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "keras"))
    monkeypatch.setattr(arrays, "KERAS_URL", f"{url}/absent.npz")  # 404
    source, why = arrays.resolve_source(make_cfg().data)
    assert source == "bundled" and "download failed" in why
    assert not list((tmp_path / "keras" / "datasets").iterdir())  # no half file left as a "cache"


def test_fashion_mnist_without_files_says_how_to_get_them(tmp_path, monkeypatch):
    monkeypatch.setenv("KERAS_HOME", str(tmp_path))
    cfg = make_cfg("data=fashion_mnist", "data.source=auto", f"data.path={tmp_path / 'none'}").data
    with pytest.raises(ConfigError, match="install Debian's dataset-fashion-mnist"):
        arrays.resolve_source(cfg)


def test_synthetic_is_deterministic_and_class_dependent():
    (x1, y1), _ = arrays.synthetic(500, 10, seed=1)
    (x2, y2), _ = arrays.synthetic(500, 10, seed=1)
    np.testing.assert_array_equal(x1, x2)
    # Same-class images agree on far more pixels than different-class ones: there is a signal to learn.
    same = np.mean(x1[y1 == 3][0] == x1[y1 == 3][1])
    other = np.mean(x1[y1 == 3][0] == x1[y1 == 4][0])
    assert same > 0.5 > other


def test_pipeline_normalises_batches_and_shuffles_reproducibly():
    import tensorflow as tf

    from distrain.task import input_pipeline  # noqa: F401 (TensorFlow)

    (x, y), _ = arrays.synthetic(100, 1, seed=0)
    x = x[..., None]  # as load() gives images: with a channel axis
    batches = list(input_pipeline.make_dataset(x, y, 32, seed=5, shuffle_buffer=1000))
    assert [b[0].shape for b in batches] == [(32, 28, 28, 1)] * 3 + [(4, 28, 28, 1)]
    images = np.concatenate([b[0] for b in batches])
    assert images.dtype == np.float32 and 0.0 <= images.min() and images.max() <= 1.0
    labels = np.concatenate([b[1] for b in batches])
    assert sorted(labels.tolist()) == sorted(y.tolist()) and labels.tolist() != y.tolist()
    again = np.concatenate([b[1] for b in input_pipeline.make_dataset(x, y, 32, seed=5, shuffle_buffer=1000)])
    np.testing.assert_array_equal(labels, again)
    shard = list(input_pipeline.make_dataset(x, y, 16, seed=5, shard=(2, tf.constant(1, tf.int64))))
    assert sum(len(b[1]) for b in shard) == 50 and shard[0][0].shape[0] == 16
    np.testing.assert_array_equal(np.concatenate([b[1] for b in shard]), y[1::2])  # worker 1's half


def test_worker_parts_reassemble_the_one_device_batches():
    """Sync workers each build their slice of every global batch: together, exactly one device's."""
    from distrain.task import input_pipeline  # noqa: F401 (TensorFlow)

    (x, y), _ = arrays.synthetic(200, 1, seed=0)

    def batches(**kwargs):
        ds = input_pipeline.make_dataset(x, y, 64, seed=9, shuffle_buffer=1000, drop_remainder=True, **kwargs)
        return [b[1].numpy() for b in ds]

    whole = batches()
    halves = [batches(part=(first, 32)) for first in (0, 32)]
    assert len(whole) == 3 and all(len(b) == 64 for b in whole)  # 200 // 64, remainder dropped
    for step, batch in enumerate(whole):
        np.testing.assert_array_equal(np.concatenate([halves[0][step], halves[1][step]]), batch)
    assert not np.array_equal(halves[0][0], halves[1][0])
    # Uneven (a run resumed on 3 replicas keeps its batch of 64): 22, 21, 21 examples, together the same.
    assert input_pipeline.replica_shares(64, 3) == [22, 21, 21] and input_pipeline.replica_shares(64, 2) == [32, 32]
    pipelines = lambda batch: [sum(input_pipeline.replica_shares(batch, 4)[i:i + 2]) for i in (0, 2)]  # noqa: E731
    assert pipelines(64) == [32, 32] and pipelines(66) == [34, 32]  # (2 pipelines of 2 replicas each)
    thirds = [batches(part=(first, size)) for first, size in ((0, 22), (22, 21), (43, 21))]
    for step, batch in enumerate(whole):
        np.testing.assert_array_equal(np.concatenate([third[step] for third in thirds]), batch)


def test_repeated_epochs_are_reshuffled_whole_batches():
    from distrain.task import input_pipeline  # noqa: F401 (TensorFlow)

    (x, y), _ = arrays.synthetic(96, 1, seed=0)
    ds = input_pipeline.make_dataset(x, y, 32, seed=3, shuffle_buffer=1000, repeat=True, drop_remainder=True)
    epochs = np.concatenate([b[1].numpy() for b in ds.take(6)]).reshape(2, 96)
    assert sorted(epochs[0]) == sorted(epochs[1]) == sorted(y.tolist())  # each epoch: every example once
    assert epochs[0].tolist() != epochs[1].tolist()


@pytest.mark.parametrize("compress", [True, False])
def test_a_parameter_server_worker_reads_idx_files_itself(tmp_path, compress):
    """TensorFlow ops read the same arrays numpy does, wherever they run."""
    import tensorflow as tf

    from distrain.task import (
        input_pipeline,  # noqa: F401 (TensorFlow)
        worker_idx,
    )

    (x, y), _ = arrays.synthetic(300, 10, seed=3)
    write_idx(tmp_path / "train-images-idx3-ubyte", x, compress)
    write_idx(tmp_path / "train-labels-idx1-ubyte", y, compress)
    like = (x[..., None], y.astype(np.int32))  # as the coordinator holds them
    images, labels = worker_idx.read_train_files(make_cfg("data.source=idx", f"data.path={tmp_path}").data, like)
    np.testing.assert_array_equal(images.numpy(), like[0])
    np.testing.assert_array_equal(labels.numpy(), y)
    assert labels.dtype == tf.int32
    assert worker_idx.read_train_files(make_cfg("data.source=bundled").data, like) is None  # not files: shipped


def test_float_images_and_large_labels_go_through_idx_files(tmp_path):
    """Other data (float images, labels past 255) takes the same way to parameter-server workers."""
    from distrain.task import (
        input_pipeline,  # noqa: F401 (TensorFlow)
        worker_idx,
    )

    x = np.random.default_rng(0).random((50, 6, 5, 3)).astype(np.float32)
    y = np.arange(50, dtype=np.int32) * 7  # up to 343
    files = arrays.TemporaryIdx(x, y)
    np.testing.assert_array_equal(arrays.read_idx(Path(files.path) / "train-images-idx4-ubyte"), x)
    images, labels = worker_idx.read_train_files(files, (x, y), worker_idx.train_file_hashes(files))
    np.testing.assert_array_equal(images.numpy(), x)
    np.testing.assert_array_equal(labels.numpy(), y)


def test_the_worker_dataset_function_ships_no_arrays_when_workers_read_files(idx_dir, monkeypatch):
    """The function the coordinator sends every worker: with data.source=idx it holds the file names,
    not the data (control: the same data as arrays is inside it)."""
    import tensorflow as tf

    from distrain.common.topology import Topology
    from distrain.task.input_pipeline import array_reader

    monkeypatch.setattr(tf.distribute.coordinator, "experimental_get_current_worker_index", lambda: 0)
    path, (x, y), _ = idx_dir
    context = tf.distribute.InputContext(num_input_pipelines=1, input_pipeline_id=0, num_replicas_in_sync=1)

    def constant_bytes(cfg, source=None) -> int:
        fn = array_reader(x, y, cfg, topology=Topology(parameter_servers=True, clustered=True, workers=2, ps=1),
                         idx_files=source)
        graph = tf.function(lambda: fn(context)._variant_tensor).get_concrete_function().graph
        return sum(tf.make_ndarray(op.get_attr("value")).nbytes for op in graph.get_operations() if op.type == "Const")

    from_files = constant_bytes(make_cfg("data.source=idx", f"data.path={path}"))
    as_arrays = constant_bytes(make_cfg("data=synthetic"))
    # Other data on a local cluster: written to files once, which the workers read.
    from_temporary_files = constant_bytes(make_cfg("data=synthetic"), arrays.TemporaryIdx(x, y))
    assert as_arrays >= x.nbytes  # the control: 300 images travel inside the function
    assert from_files < 4096 and from_temporary_files < 4096


def test_a_local_clusters_workers_read_other_data_from_temporary_files():
    from distrain.task import (
        input_pipeline,  # noqa: F401 (TensorFlow)
        worker_idx,
    )

    (x, y), _ = arrays.synthetic(300, 10, seed=3)
    files = arrays.TemporaryIdx(x, y)
    images, labels = worker_idx.read_train_files(files, (x, y), worker_idx.train_file_hashes(files))
    np.testing.assert_array_equal(images.numpy(), x)
    np.testing.assert_array_equal(labels.numpy(), y)
    path = Path(files.path)
    del files
    assert not path.exists()  # gone with the object that the dataset function holds


def test_a_worker_whose_files_differ_or_vanish_fails_in_one_line(tmp_path):
    """A worker checks the files it reads against the fingerprints of the coordinator's copy."""
    import tensorflow as tf

    from distrain.task import (
        input_pipeline,  # noqa: F401 (TensorFlow)
        worker_idx,
    )

    (x, y), _ = arrays.synthetic(300, 10, seed=3)
    for machine, labels in (("here", y), ("there", (y + 1) % 10)):  # there: another version of the labels
        write_idx(tmp_path / machine / "train-images-idx3-ubyte", x, True)
        write_idx(tmp_path / machine / "train-labels-idx1-ubyte", labels, True)
    cfg = make_cfg("data.source=idx", f"data.path={tmp_path / 'here'}").data
    there = make_cfg("data.source=idx", f"data.path={tmp_path / 'there'}").data
    hashes = worker_idx.train_file_hashes(cfg)  # on the coordinator, of its copy
    images, labels = tf.function(lambda: worker_idx.read_train_files(cfg, (x, y), hashes))()  # as a worker runs it
    np.testing.assert_array_equal(labels.numpy(), y)  # the control: the same files pass
    with pytest.raises(tf.errors.InvalidArgumentError) as raised:
        worker_idx.read_train_files(there, (x, y), worker_idx.train_file_hashes(cfg))
    error = worker_idx.unreadable_on_worker(raised.value, there)
    assert str(error) == (f"a worker's {tmp_path}/there/train-labels-idx1-ubyte.gz holds other data than the "
                          f"coordinator read: every parameter-server worker reads the IDX files itself: give each "
                          f"worker's machine the same files at data.path={tmp_path}/there")

    read = tf.function(lambda: worker_idx.read_train_files(cfg, (x, y)))
    read.get_concrete_function()  # the file names are settled where the function is made, as on a coordinator
    (tmp_path / "here" / "train-labels-idx1-ubyte.gz").unlink()  # ...and the worker has no such file
    with pytest.raises(tf.errors.NotFoundError) as raised:
        read()
    assert str(worker_idx.unreadable_on_worker(raised.value, cfg)).startswith(
        f"a worker cannot read its training data ({tmp_path}/here/train-labels-idx1-ubyte.gz; No such file or "
        "directory): every parameter-server worker reads the IDX files itself")
    assert worker_idx.unreadable_on_worker(tf.errors.NotFoundError(None, None, "elsewhere"), cfg) is None
    assert worker_idx.unreadable_on_worker(ValueError("x"), cfg) is None
