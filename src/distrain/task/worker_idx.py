"""A parameter-server worker's own reading of the training arrays where they are IDX files (it reads them
where it runs, rather than be sent them through the coordinator), checked against the coordinator's
fingerprints; and a worker's failure to read its data, as one line."""
import re
from pathlib import Path

import tensorflow as tf

from distrain.common.errors import ConfigError, first_line
from distrain.data.arrays import idx_header, train_idx_files

OTHER_DATA = "holds other data than the coordinator read"
HASH_BUCKETS = 2 ** 62  # tf.strings.to_hash_bucket_fast: the file's 64-bit fingerprint, in range


def read_train_files(data, like, expect=None):
    """The training images and labels as TensorFlow ops that read the IDX files where they run, shaped
    and typed `like` the coordinator's (images, labels), or None for a source that is not files. A
    parameter-server worker reads its data itself this way: arrays captured in its dataset function
    would be shipped to every worker through the coordinator (at 60,000 examples, about 5 s of
    start-up and 0.5 GB more memory per worker, measured).

    expect: train_file_hashes() of the coordinator's files; a worker whose files differ (another
    version of the data at the same path) fails rather than train on them."""
    if data.source != "idx":
        return None
    def read(path: Path, array, expected):
        raw = _contents(path)
        if expected is not None:  # a fingerprint of the bytes: no copy of them, unlike a sum
            same = tf.equal(tf.strings.to_hash_bucket_fast(raw, HASH_BUCKETS), tf.constant(expected, tf.int64))
            with tf.control_dependencies([tf.debugging.Assert(same, [f"{path} {OTHER_DATA}"])]):
                raw = tf.identity(raw)
        header, dtype = idx_header(path)  # checked when the coordinator loaded the file
        values = tf.io.decode_raw(tf.strings.substr(raw, header, -1), tf.as_dtype(dtype), little_endian=False)
        return tf.reshape(tf.cast(values, array.dtype), [-1, *array.shape[1:]])

    files = train_idx_files(data)
    return tuple(read(f, array, e) for f, array, e in zip(files, like, expect or (None, None)))


def train_file_hashes(data) -> tuple[int, int] | None:
    """Fingerprints of the training IDX files (images, labels) as this machine holds them."""
    if data.source != "idx":
        return None
    return tuple(int(tf.strings.to_hash_bucket_fast(_contents(f), HASH_BUCKETS)) for f in train_idx_files(data))


def _contents(path: Path):
    """A file's bytes, decompressed, as a TensorFlow op (it runs where the function runs)."""
    raw = tf.io.read_file(str(path))
    return tf.io.decode_compressed(raw, "GZIP") if path.suffix == ".gz" else raw




def unreadable_on_worker(exc: Exception, data) -> ConfigError | None:
    """A worker's failure to read data.path (missing there, or other data), or its data files, as one line;
    else None."""
    exc = getattr(exc, "original_exception", exc)  # the coordinator wraps a failed dataset (ClosureInputError)
    if data.source not in ("idx", "tfrecord", "images") or \
            not isinstance(exc, (tf.errors.NotFoundError, tf.errors.InvalidArgumentError)):
        return None
    if data.source != "idx":  # data in files: a file the launcher found, missing where a task reads it
        missing = re.search(r"NotFoundError|No such file or directory", exc.message) and \
            re.search(r"(/[^\s;,'\"]+)[:;,]? No such file", exc.message)
        if isinstance(exc, tf.errors.NotFoundError) or missing:
            path = missing.group(1) if missing else first_line(exc.message, None)
            return ConfigError(f"a task cannot read the data file {path}, which the launcher found: every worker "
                               "reads the data files itself, at the same path; give each machine the same files "
                               "(shared storage), or fix data.train_files / data.path")
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
