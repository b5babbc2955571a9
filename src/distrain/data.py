"""MNIST-shaped data: where it comes from (numpy only) and the one tf.data pipeline.

Loading imports no TensorFlow, so the launcher can settle `data.source=auto` once for every task.
"""
import gzip
import os
import re
import shutil
import struct
import tempfile
import urllib.request
import zipfile
from pathlib import Path

import numpy as np

from .config import ConfigError
from .process import scratch

BUNDLED = Path(__file__).parent / "data" / "mnist-10k.npz"
BUNDLED_TRAIN = 8000
KERAS_URL = "https://storage.googleapis.com/tensorflow/tf-keras-datasets/mnist.npz"


def keras_home() -> Path:
    """The Keras cache: KERAS_HOME, else ~/.keras (tf_keras.datasets is told so; alone it ignores KERAS_HOME)."""
    return Path(os.environ.get("KERAS_HOME", Path.home() / ".keras"))


def keras_cache(name: str) -> Path:
    """Where tf_keras.datasets keeps a download."""
    return keras_home() / "datasets" / ("mnist.npz" if name == "mnist" else "fashion-mnist")


def resolve_source(data) -> tuple[str, str]:
    """For source=auto: the concrete source to use, and why."""
    if data.source != "auto":
        return data.source, "set in the config"
    cache = keras_cache(data.name)
    if data.name != "mnist":
        if cache.exists():
            return "keras", f"Keras cache found at {cache}"
        if data.path and Path(data.path).is_dir():
            return "idx", f"IDX files found in {data.path}"
        raise ConfigError(f"no {data.name} data found (no {cache}, no {data.path}): "
                          "install Debian's dataset-fashion-mnist or set data.source=keras")
    if cache.exists():
        return "keras", f"Keras cache found at {cache}"
    if not data.download_timeout:
        return "bundled", f"no Keras cache at {cache}, download off (data.download_timeout=0)"
    failure = _download(KERAS_URL, cache, data.download_timeout)
    if failure is None:
        return "keras", f"downloaded full MNIST to {cache}"
    return "bundled", f"no Keras cache at {cache}, download failed ({failure})"


def _download(url: str, dest: Path, timeout: float):
    """Fetch url to dest; None on success, else why not."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response, open(part, "wb") as f:
            shutil.copyfileobj(response, f)
        os.replace(part, dest)  # atomic: a half download never looks like a cache
        return None
    except OSError as exc:
        part.unlink(missing_ok=True)
        return getattr(exc, "reason", exc)


def load(data, seed: int):
    """((x_train, y_train), (x_test, y_test)): uint8 images (N, 28, 28), int labels (N,)."""
    source = data.source
    if source == "bundled":
        images, labels = _read_npz(BUNDLED, "images", "labels")
        order = np.random.default_rng(seed).permutation(len(labels))  # the file is sorted by class
        images, labels = images[order], labels[order]
        splits = ((images[:BUNDLED_TRAIN], labels[:BUNDLED_TRAIN]),
                  (images[BUNDLED_TRAIN:], labels[BUNDLED_TRAIN:]))
    elif source == "keras":
        import tf_keras  # downloads into keras_cache() when missing
        module = tf_keras.datasets.mnist if data.name == "mnist" else tf_keras.datasets.fashion_mnist
        try:
            splits = module.load_data(cache_dir=str(keras_home()))
        except Exception as exc:  # noqa: BLE001 - any failure here is "no data", said in one line
            raise ConfigError(f"data.source=keras could not load {data.name} ({exc}): "
                              "check the network or use data.source=bundled") from None
    elif source == "idx":
        splits = _read_idx_dir(Path(data.path))
    elif source == "synthetic":
        splits = synthetic(data.train_examples, data.test_examples, seed)
    else:
        raise ConfigError(f"data.source={source!r} is unknown: use auto, bundled, keras, idx or synthetic")
    for images, labels in splits:
        _check(images, labels, source)
    return splits


def _read_npz(path: Path, images_key: str, labels_key: str):
    try:
        with np.load(path) as f:
            return f[images_key], f[labels_key]
    except FileNotFoundError:
        raise ConfigError(f"data file {path} is missing: reinstall the package or use another data.source") from None
    except (OSError, ValueError, KeyError, zipfile.BadZipFile, EOFError) as exc:
        raise ConfigError(f"data file {path} is corrupt ({exc}): replace it or use another data.source") from None


def idx_file(path: Path, split: str, kind: str) -> Path:
    """The IDX file of a split (train, t10k) and kind (images, labels) in the directory `path`."""
    if not path.is_dir():
        raise ConfigError(f"data.path={path} is not a directory: point it at the IDX files "
                          "(for Fashion-MNIST: apt-get install dataset-fashion-mnist)")
    hits = sorted(path.glob(f"{split}*-{kind}-idx*-ubyte*"))
    if not hits:
        raise ConfigError(f"no {split}-{kind}-idx?-ubyte[.gz] file in {path}: point data.path at a "
                          "directory that holds the four MNIST-format IDX files")
    return hits[0]


def check_idx_dir(path: Path) -> None:
    """The four IDX files are there (else ConfigError): a run, or a cluster, finds out before it starts."""
    for split in ("train", "t10k"):
        for kind in ("images", "labels"):
            idx_file(path, split, kind)


def _read_idx_dir(path: Path):
    return tuple((read_idx(idx_file(path, split, "images")), read_idx(idx_file(path, split, "labels")))
                 for split in ("train", "t10k"))


OTHER_DATA = "holds other data than the coordinator read"
HASH_BUCKETS = 2 ** 62  # tf.strings.to_hash_bucket_fast: the file's 64-bit fingerprint, in range


def read_train_files(data, expect=None):
    """The training images and labels as TensorFlow ops that read the IDX files where they run, or None
    for a source that is not files. A parameter-server worker reads its data itself this way: arrays
    captured in its dataset function would be shipped to every worker through the coordinator (at
    60,000 examples, about 5 s of start-up and 0.5 GB more memory per worker, measured).

    expect: train_file_hashes() of the coordinator's files; a worker whose files differ (another
    version of the data at the same path) fails rather than train on them."""
    if data.source != "idx":
        return None
    import tensorflow as tf

    def read(path: Path, header: int, expected):  # the header is checked when the coordinator loads the files
        raw = _contents(path)
        if expected is not None:  # a fingerprint of the bytes: no copy of them, unlike a sum
            same = tf.equal(tf.strings.to_hash_bucket_fast(raw, HASH_BUCKETS), tf.constant(expected, tf.int64))
            with tf.control_dependencies([tf.debugging.Assert(same, [f"{path} {OTHER_DATA}"])]):
                raw = tf.identity(raw)
        return tf.io.decode_raw(raw, tf.uint8)[header:]

    files = _train_files(data)
    images, labels = (read(f, header, e) for f, header, e in zip(files, (16, 8), expect or (None, None)))
    return tf.reshape(images, [-1, 28, 28]), labels


def train_file_hashes(data) -> tuple[int, int] | None:
    """Fingerprints of the training IDX files (images, labels) as this machine holds them."""
    if data.source != "idx":
        return None
    import tensorflow as tf

    return tuple(int(tf.strings.to_hash_bucket_fast(_contents(f), HASH_BUCKETS)) for f in _train_files(data))


def _train_files(data) -> list[Path]:
    return [idx_file(Path(data.path), "train", kind) for kind in ("images", "labels")]


def _contents(path: Path):
    """A file's bytes, decompressed, as a TensorFlow op (it runs where the function runs)."""
    import tensorflow as tf

    raw = tf.io.read_file(str(path))
    return tf.io.decode_compressed(raw, "GZIP") if path.suffix == ".gz" else raw


LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")


def on_this_machine(cluster_spec: dict) -> bool:
    """Every task of the cluster at a loopback address: one machine, one disk."""
    return all(address.rpartition(":")[0] in LOOPBACK for tasks in cluster_spec.values() for address in tasks)


class TemporaryIdx:
    """Training arrays written once as IDX files in a temporary directory (removed with this object, at
    exit, or with the local cluster's scratch directory): a local cluster's parameter-server workers
    read them as they read data.source=idx (read_train_files says why)."""
    source = "idx"

    def __init__(self, images, labels):
        self._dir = tempfile.TemporaryDirectory(prefix="distrain-data-", dir=scratch())
        self.path = self._dir.name
        for kind, array in (("images", images), ("labels", labels)):
            write_idx(Path(self.path) / f"train-{kind}-idx{array.ndim}-ubyte", array)


def write_idx(path: Path, array, compress: bool = False) -> None:
    """An MNIST-format IDX file of a uint8 array (gzipped: path + .gz)."""
    header = struct.pack(">HBB", 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    raw = header + np.ascontiguousarray(array, dtype=np.uint8).tobytes()
    if compress:
        path, raw = path.with_name(path.name + ".gz"), gzip.compress(raw)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(raw)


def unreadable_on_worker(exc: Exception, data) -> ConfigError | None:
    """A worker's failure to read data.path (missing there, or other data), as one line; else None."""
    import tensorflow as tf

    exc = getattr(exc, "original_exception", exc)  # the coordinator wraps a failed dataset (ClosureInputError)
    if data.source != "idx" or not isinstance(exc, (tf.errors.NotFoundError, tf.errors.InvalidArgumentError)):
        return None
    fix = ("every parameter-server worker reads the IDX files itself: give each worker's machine the same "
           f"files at data.path={data.path}")
    other = re.search(rf"([^\s\[\]'\"]+) {OTHER_DATA}", exc.message)
    if other:
        return ConfigError(f"a worker's {other.group(1)} {OTHER_DATA}: {fix}")
    if isinstance(exc, tf.errors.NotFoundError) and str(data.path) in exc.message:
        missing = re.sub(r"\{\{function_node [^}]*\}\}", "", exc.message.splitlines()[0]).strip()
        return ConfigError(f"a worker cannot read its training data ({missing}): {fix}")
    return None


def read_idx(path: Path) -> np.ndarray:
    """One IDX file (optionally gzipped) as a uint8 array."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            raw = f.read()
        zero, dtype, ndim = struct.unpack(">HBB", raw[:4])
        if zero != 0 or dtype != 0x08:
            raise ValueError("not an unsigned-byte IDX file")
        shape = struct.unpack(f">{ndim}I", raw[4:4 + 4 * ndim])
        return np.frombuffer(raw, np.uint8, offset=4 + 4 * ndim).reshape(shape)
    except (OSError, ValueError, struct.error, EOFError) as exc:
        raise ConfigError(f"IDX file {path} is corrupt ({exc}): replace it") from None


def _check(images, labels, source):
    if images.ndim != 3 or images.shape[1:] != (28, 28) or len(images) != len(labels) or len(labels) == 0:
        raise ConfigError(f"data from source {source} has images {images.shape} and labels {labels.shape}, "
                          "expected (N, 28, 28) and (N,): check the data files")
    if labels.min() < 0 or labels.max() > 9:
        raise ConfigError(f"data from source {source} has labels outside 0-9: check the data files")


def synthetic(train_examples: int, test_examples: int, seed: int):
    """One random template per class; each example keeps 3/4 of its template's pixels, rest noise."""
    rng = np.random.default_rng(seed)
    templates = rng.integers(0, 256, (10, 28, 28), dtype=np.uint8)

    def draw(n):
        labels = rng.integers(0, 10, n).astype(np.uint8)
        noise = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        return np.where(rng.random((n, 28, 28)) < 0.75, templates[labels], noise), labels

    return draw(train_examples), draw(test_examples)


def make_dataset(images, labels, batch_size, *, seed, shuffle_buffer=0, repeat=False, shard=None,
                 part=None, drop_remainder=False, skip=0, n=None):
    """The pipeline every strategy uses: shuffle (fixed seed) and batch example indices, then gather
    and normalise each batch from the in-memory uint8 arrays, prefetching ahead of the model.

    Shuffling indices rather than images is cheap, and lets a worker build only its own part of
    each batch: part=(i, n) keeps slice i of n of every batch, in order, so n sync workers together
    see exactly the batches one device would. shard=(n, i) keeps every n-th example instead
    (parameter-server workers, each reading its own share). The arrays live in memory as tensors,
    which is the cache: nothing is decoded twice.
    """
    import tensorflow as tf  # here, not at the top: the launcher reads data without TensorFlow

    n = n or len(labels)  # n: when images and labels are tensors of a size known only when they run
    images, labels = tf.convert_to_tensor(images), tf.cast(tf.convert_to_tensor(labels), tf.int32)
    ds = tf.data.Dataset.range(n)
    if shard is not None:
        ds = ds.shard(*shard)
    if shuffle_buffer:
        ds = ds.shuffle(min(shuffle_buffer, n), seed=seed, reshuffle_each_iteration=True)
    ds = ds.batch(batch_size, drop_remainder=drop_remainder)
    if repeat:  # after batching: every epoch is a fresh shuffle cut into whole batches
        ds = ds.repeat()
    if skip:  # a resumed run: the batches already trained, passed over as indices (cheap)
        ds = ds.skip(skip)
    if part is not None:
        i, parts = part
        size = batch_size // parts
        ds = ds.map(lambda idx: idx[i * size:(i + 1) * size])
    ds = ds.map(lambda idx: (tf.expand_dims(tf.cast(tf.gather(images, idx), tf.float32) / 255.0, -1),
                             tf.gather(labels, idx)), num_parallel_calls=tf.data.AUTOTUNE)
    options = tf.data.Options()
    options.deterministic = True
    # Evaluation data goes to strategies whole: split it by element, the same way on every worker.
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return ds.prefetch(tf.data.AUTOTUNE).with_options(options)
