"""Image data: where it comes from (numpy only) and the one tf.data pipeline.

Built in: MNIST (bundled, Keras, IDX files), Fashion-MNIST, synthetic. Your own: an .npz file
(data=npz) or a loader function (data._target_). Every source gives uint8 or float32 images with a
channel axis, (N, H, W, C), and integer labels. Loading imports no TensorFlow, so the launcher can
settle `data.source=auto`, and check an .npz file, once for every task.
"""
import gzip
import os
import shutil
import struct
import tempfile
import urllib.request
import zipfile
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

from distrain.common import storage
from distrain.common.errors import ConfigError
from distrain.common.lifetime import scratch
from distrain.config import schema_check
from distrain.config.schema import FILE_SOURCES, label
from distrain.config.validate import instantiate
from distrain.data.files import not_one_class

BUNDLED = Path(__file__).parent / "mnist-10k.npz"
BUNDLED_TRAIN = 8000
KERAS_URL = "https://storage.googleapis.com/tensorflow/tf-keras-datasets/mnist.npz"


def keras_home() -> Path:
    """The Keras cache: KERAS_HOME, else ~/.keras (tf_keras.datasets is told so; alone it ignores KERAS_HOME)."""
    return Path(os.environ.get("KERAS_HOME", Path.home() / ".keras"))


def keras_cache(name: str) -> Path:
    """Where tf_keras.datasets keeps a download."""
    return keras_home() / "datasets" / ("mnist.npz" if name == "mnist" else "fashion-mnist")


def settle_source(cfg) -> str:
    """cfg.data.source made concrete where it is auto, in place (the launcher's, evaluate's, a benchmark's
    config: one rule for all); why that source, in words."""
    cfg.data.source, why = resolve_source(cfg.data)
    return why


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


def load(data, seed: int, reads: str | None = "classes"):
    """((x_train, y_train), (x_test, y_test)), checked for the labels the loss `reads` (schema.LABELS;
    None: what the labels look like, labels_of). Class indices: images (N, H, W, C), uint8 (0-255) or
    float32 (as they are), and integer labels from 0 to num_classes(data, ...) - 1; other labels:
    _any_labels. Bad data is a ConfigError."""
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
    elif source == "npz":
        x_train, y_train, x_test, y_test = _read_npz(Path(data.path), *NPZ_ARRAYS)
        splits = ((x_train, y_train), (x_test, y_test))
    elif source == "loader":
        splits = _call_loader(data)
    elif source == "synthetic":
        splits = synthetic(data.train_examples, data.test_examples, seed)
    else:
        raise ConfigError(f"data.source={source!r} is unknown: use auto, bundled, keras, idx, npz or synthetic")
    return _checked(splits, data, class_indices=(reads or labels_of(splits[0][1])) == "classes")


def load_test(data, seed: int, reads: str | None = "classes"):
    """The test split alone, as evaluate and predict read it: (x_test, y_test), checked as load() checks
    them, with y_test None where the data holds inputs alone. An .npz file's x_test (and y_test) or x (and
    y): its training arrays, if any, are not read. Other sources load as a run loads them."""
    if data.source != "npz":
        return load(data, seed, reads)[1]
    path = Path(data.path)
    held = _read_npz(path)
    x, y = next(((x, y) for x, y in (("x_test", "y_test"), ("x", "y")) if x in held), (None, None))
    if x is None:
        raise ConfigError(f"data file {path} has no array x_test or x (it has {', '.join(held) or 'none'}): save the "
                          "inputs as x (and their labels as y), or as x_test (and y_test)")
    x_test, y_test = _read_npz(path, x, y) if y in held else (*_read_npz(path, x), None)
    (checked,) = _checked(((x_test, y_test),), data, reads == "classes" if reads else
                          y_test is None or labels_of(y_test) == "classes", names=((x, y),))
    return checked[0], (checked[1] if y_test is not None else None)


def labels_of(labels) -> str:
    """What labels look like, where the loss does not say (a loss of the user's): integer indices, one
    per example, are classes; rows of 0 and 1 are one-hot where each sums to 1, else binary; the rest
    are values (regression)."""
    labels = np.asarray(labels)
    if np.issubdtype(labels.dtype, np.integer) and (labels.ndim == 1 or labels.ndim == 2 and labels.shape[1] == 1):
        return "classes"
    if labels.ndim == 2 and labels.shape[1] > 1 and np.isin(labels, (0, 1)).all():
        return "one_hot" if (labels.sum(axis=1) == 1).all() else "binary"
    return "values"


NPZ_ARRAYS = ("x_train", "y_train", "x_test", "y_test")  # the layout of Keras's own mnist.npz
SPLITS = (("x_train", "y_train"), ("x_test", "y_test"))  # each split's arrays, by name


def _call_loader(data):
    """A user's loader, called with the data node's other keys: ((x_train, y_train), (x_test, y_test))."""
    _, own, arguments = schema_check.split("data", data)  # (the keys distrain reads, the loader's arguments)
    splits = instantiate("data._target_", OmegaConf.create({"_target_": own["_target_"], **arguments}),
                         "it must name a function module.name importable from this directory or PYTHONPATH, "
                         "taking the data node's other keys")
    try:
        (x_train, y_train), (x_test, y_test) = splits
        return (np.asarray(x_train), np.asarray(y_train)), (np.asarray(x_test), np.asarray(y_test))
    except (TypeError, ValueError):
        raise ConfigError(f"data._target_={own['_target_']} returned {_layout(splits)}, not ((x_train, y_train), "
                          "(x_test, y_test)) as keras.datasets' load_data() does: return that") from None


def _layout(value) -> str:
    """What a loader returned, briefly: types and nesting, with array shapes."""
    if isinstance(value, (tuple, list)):
        return "(" + ", ".join(_layout(v) for v in value[:4]) + (", ..." if len(value) > 4 else "") + ")"
    return f"array{value.shape}" if hasattr(value, "shape") else type(value).__name__


def num_classes(data, labels, class_indices: bool = True) -> int:
    """data.num_classes, else data.class_names' number, else one more than the largest label of these (the
    training and test labels);
    of other labels (class_indices=False): a label's size (the outputs a model needs: 1 for (N,) labels)."""
    if not class_indices:
        return data.get("num_classes") or int(np.prod(labels[0].shape[1:], dtype=int))
    if data.get("class_names") and not data.get("num_classes"):
        return len(data.class_names)
    return data.get("num_classes") or not_one_class(int(max(int(y.max()) for y in labels)) + 1, "the data's labels")


def _read_npz(path: Path, *names):
    """The named arrays of an .npz file (the bundled digits, or data=npz); with no name, the names it holds."""
    fix = "reinstall the package or use another data.source" if path == BUNDLED else \
        f"point data.path at a file of the arrays {', '.join(names)} saved with numpy.savez"
    if not path.exists():
        raise ConfigError(f"data file {path} is missing: " + (fix if path == BUNDLED else
                          "point data.path at your .npz file"))
    if path.is_file() and not zipfile.is_zipfile(path):  # else numpy tries to unpickle it, and says so
        raise ConfigError(f"data file {path} is corrupt or not an .npz file (not a zip archive): {fix}")
    try:
        with np.load(path, allow_pickle=False) as f:
            missing = [name for name in names if name not in f.files]
            if missing:
                raise ConfigError(f"data file {path} has no array {missing[0]} "
                                  f"(it has {', '.join(f.files) or 'none'}): {fix}")
            return tuple(f[name] for name in names) if names else tuple(f.files)
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise ConfigError(f"data file {path} is corrupt or not an .npz file ({exc}): {fix}") from None


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


def check_files(data, seed: int = 0, reads: str | None = "classes"):
    """The data files are there and sound (else ConfigError): a run, or a cluster, finds out before it
    starts. IDX files: the four are there; an .npz file: read and checked whole, as a task will; TFRecord
    files and image folders: scanned (files.FileData, returned)."""
    if data.source in FILE_SOURCES:
        from distrain.data.files import scan  # (TensorFlow: only where there are files to scan)

        return scan(data, seed)
    if data.source == "idx":
        for split in ("train", "t10k"):
            for kind in ("images", "labels"):
                idx_file(Path(data.path), split, kind)
    elif data.source == "npz":
        load(data, seed=0, reads=reads)


def _read_idx_dir(path: Path):
    return tuple((read_idx(idx_file(path, split, "images")), read_idx(idx_file(path, split, "labels")))
                 for split in ("train", "t10k"))


def train_idx_files(data) -> list[Path]:
    """The training IDX files (images, labels) of data.source=idx."""
    return [idx_file(Path(data.path), "train", kind) for kind in ("images", "labels")]


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


# The IDX element types distrain reads and writes: the MNIST files' uint8, and for other data
# int32 labels and float32 images (big-endian, as the format says).
IDX_TYPES = {0x08: np.dtype("u1"), 0x0C: np.dtype(">i4"), 0x0D: np.dtype(">f4")}


def write_idx(path: Path, array, compress: bool = False) -> None:
    """An IDX file of a uint8, integer (as int32) or float (as float32) array (gzipped: path + .gz)."""
    array = np.asarray(array)
    code = 0x08 if array.dtype == np.uint8 else 0x0D if np.issubdtype(array.dtype, np.floating) else 0x0C
    header = struct.pack(">HBB", 0, code, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    raw = header + np.ascontiguousarray(array, dtype=IDX_TYPES[code]).tobytes()
    if compress:
        path, raw = path.with_name(path.name + ".gz"), gzip.compress(raw)
    path.parent.mkdir(parents=True, exist_ok=True)
    storage.write_atomic(path, raw)


def idx_header(path: Path) -> tuple[int, np.dtype]:
    """The header's length in bytes and the element type of an IDX file (read from its first bytes)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        zero, code, ndim = struct.unpack(">HBB", f.read(4))
    if zero != 0 or code not in IDX_TYPES:
        raise ValueError("not an IDX file of unsigned bytes, int32 or float32")
    return 4 + 4 * ndim, IDX_TYPES[code]


def read_idx(path: Path) -> np.ndarray:
    """One IDX file (optionally gzipped) as an array of its type (uint8 for MNIST's)."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            raw = f.read()
        header, dtype = idx_header(path)
        shape = struct.unpack(f">{(header - 4) // 4}I", raw[4:header])
        return np.frombuffer(raw, dtype, offset=header).reshape(shape).astype(dtype.newbyteorder("="), copy=False)
    except (OSError, ValueError, struct.error, EOFError) as exc:
        raise ConfigError(f"IDX file {path} is corrupt ({exc}): replace it") from None


def _checked(splits, data, class_indices: bool = True, names=SPLITS):
    """The splits with a channel axis, float images as float32 and labels as int32; or a ConfigError
    naming what is wrong with them (names: each split's arrays, as the file names them). Other labels than
    class indices (a loss of other labels): features of any shape (N, ...) (a channel axis for (N, H, W)
    images), labels of any shape, integer or float."""
    if not class_indices:
        return _any_labels(splits, data, names)
    where = _where(data)
    out = []
    for (x, y), (images, labels) in zip(names, splits):
        images = np.asarray(images)
        if images.ndim not in (3, 4) or len(images) == 0:
            raise ConfigError(f"{where}: {x} has shape {images.shape}, not images (N, H, W) or (N, H, W, C): "
                              "give one image per row")
        if images.dtype != np.uint8 and not np.issubdtype(images.dtype, np.floating):
            raise ConfigError(f"{where}: {x} is {images.dtype}: give uint8 images (0-255, scaled to [0, 1]) "
                              "or float images (taken as they are)")
        if np.issubdtype(images.dtype, np.floating):
            images = images.astype(np.float32, copy=False)
            if not np.isfinite(images).all():
                raise ConfigError(f"{where}: {x} holds NaN or infinite values: clean the images")
        images = images[..., None] if images.ndim == 3 else images
        if labels is None:  # (inputs alone: predict's)
            out.append((images, None))
            continue
        labels = np.asarray(labels)
        if labels.ndim == 2 and labels.shape[1] > 1:
            raise ConfigError(f"{where}: {y} has shape {labels.shape}, one-hot: give class indices (N,), "
                              "e.g. y.argmax(axis=1)")
        labels = labels.reshape(-1) if labels.ndim == 2 else labels
        if labels.ndim != 1 or len(labels) != len(images):
            raise ConfigError(f"{where}: {x} has {len(images)} images but {y} has shape {labels.shape}: "
                              "give one label per image")
        if not (np.issubdtype(labels.dtype, np.integer) or np.issubdtype(labels.dtype, np.floating)
                and np.array_equal(labels, np.round(labels))):
            raise ConfigError(f"{where}: {y} is not integer class labels ({labels.dtype}): give labels 0, "
                              "1, ..., num_classes - 1")
        if labels.min() < 0:
            raise ConfigError(f"{where}: {y} has negative labels ({labels.min()}): give labels 0, 1, ..., "
                              "num_classes - 1")
        out.append((images, labels.astype(np.int32)))
    if len(out) == 2 and out[0][0].shape[1:] != out[1][0].shape[1:]:
        raise ConfigError(f"{where}: training images are {out[0][0].shape[1:]} but test images "
                          f"{out[1][0].shape[1:]}: give both splits the same image shape")
    labelled = [y for _, y in out if y is not None]
    if labelled:
        classes = num_classes(data, labelled)
        largest = max(int(y.max()) for y in labelled)
        if largest >= classes:
            raise ConfigError(f"{where} has label {largest}, but data.num_classes={classes}: set "
                              f"data.num_classes={largest + 1} or more, or null to count them")
    return tuple(out)


def _where(data) -> str:
    if data.source in ("npz", "idx") and data.get("path"):
        return f"data from {data.path}"
    return f"data from {label(data)}" if data.source == "loader" else f"data from source {data.source}"


def _any_labels(splits, data, names=None):
    """_checked(class_indices=False): one label (of any shape) per example, numbers; integer labels as int32,
    others as float32; a label that is one number as a row of one, (N, 1)."""
    where = f"data from {data.path}" if data.get("path") else f"data from {label(data)}"
    out = []
    for (x, y), (features, labels) in zip(names or SPLITS, splits):
        features = np.asarray(features)
        labels = np.zeros(len(features), np.float32) if labels is None else np.asarray(labels)  # (inputs alone)
        if features.ndim < 2 or len(features) == 0 or len(labels) != len(features):
            raise ConfigError(f"{where}: {x} has shape {features.shape} and {y} {labels.shape}: give one "
                              "example per row of x and one label per row of y")
        for name, array in ((x, features), (y, labels)):
            if not (np.issubdtype(array.dtype, np.integer) or np.issubdtype(array.dtype, np.floating)):
                raise ConfigError(f"{where}: {name} is {array.dtype}, not numbers: give numeric arrays")
            if np.issubdtype(array.dtype, np.floating) and not np.isfinite(array).all():
                raise ConfigError(f"{where}: {name} holds NaN or infinite values: clean the data")
        if features.dtype != np.uint8:
            features = features.astype(np.float32, copy=False)
        labels = labels.astype(np.int32 if np.issubdtype(labels.dtype, np.integer) else np.float32, copy=False)
        labels = labels[:, None] if labels.ndim == 1 else labels  # (N, 1), as the model's outputs: a loss per example
        out.append((features[..., None] if features.ndim == 3 else features, labels))
    if len(out) == 2 and (out[0][0].shape[1:] != out[1][0].shape[1:] or out[0][1].shape[1:] != out[1][1].shape[1:]):
        (x_train, y_train), (x_test, y_test) = out
        raise ConfigError(f"{where}: the training split's examples and labels are {x_train.shape[1:]} and "
                          f"{y_train.shape[1:]}, the test split's {x_test.shape[1:]} and {y_test.shape[1:]}: give "
                          "both splits the same shapes")
    return tuple(out)


def synthetic(train_examples: int, test_examples: int, seed: int):
    """One random template per class; each example keeps 3/4 of its template's pixels, rest noise."""
    rng = np.random.default_rng(seed)
    templates = rng.integers(0, 256, (10, 28, 28), dtype=np.uint8)

    def draw(n):
        labels = rng.integers(0, 10, n).astype(np.uint8)
        noise = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        return np.where(rng.random((n, 28, 28)) < 0.75, templates[labels], noise), labels

    return draw(train_examples), draw(test_examples)
