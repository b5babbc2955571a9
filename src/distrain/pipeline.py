"""The input pipelines: every tf.data dataset a run trains or evaluates on is built here, by an
InputReader that turns a source and a tf.distribute.InputContext into the dataset of one input
pipeline (as Model Garden's InputReader does). data.py loads the arrays without TensorFlow.
"""
import re
from pathlib import Path

import tensorflow as tf

from .data import idx_header, train_idx_files
from .errors import ConfigError


class InputReader:
    """The dataset of one input pipeline, for strategy.distribute_datasets_from_function (training)
    or for Keras's evaluate (test data, no context).

    images, labels: the arrays data.load() gives; cfg: the run's config (trainer.batch_size and seed,
    data.shuffle_buffer). training: shuffled, repeated, whole global batches; else each example once,
    in order. skip: global batches already trained (a resumed synchronous run). workers: under
    parameter servers, how many workers share the data, each reading its own shard, from `files`
    (cfg.data where it is IDX files, or data.TemporaryIdx) where those are files, checked against the
    coordinator's fingerprints `expect`."""

    def __init__(self, images, labels, cfg, *, training: bool = True, skip: int = 0, workers: int = 0,
                 files=None, expect=None):
        self.images, self.labels, self.cfg = images, labels, cfg
        self.training, self.skip, self.workers = training, skip, workers
        self.files, self.expect = files, expect  # (held for the run: `files` may own them, TemporaryIdx)

    def __call__(self, context: tf.distribute.InputContext | None = None) -> tf.data.Dataset:
        t, shuffle = self.cfg.trainer, self.cfg.data.shuffle_buffer
        if not self.training:
            return make_dataset(self.images, self.labels, t.batch_size, seed=t.seed)
        if self.workers:  # runs on the worker: its own shard, a batch per step of its own
            worker = tf.distribute.coordinator.experimental_get_current_worker_index()
            on_worker = read_train_files(self.files or self.cfg.data, (self.images, self.labels), self.expect)
            return make_dataset(*(on_worker or (self.images, self.labels)),
                                context.get_per_replica_batch_size(t.batch_size), seed=t.seed,
                                shuffle_buffer=shuffle, repeat=True, shard=(self.workers, worker),
                                n=len(self.labels))
        # Synchronous: every pipeline builds the same shuffled global batches and keeps the slice for
        # its own replicas, one per-replica batch per element: the global batch is exactly the one a
        # single device would take. Every step is a full global batch (the remainder is dropped).
        replicas_here = context.num_replicas_in_sync // context.num_input_pipelines
        ds = make_dataset(self.images, self.labels, t.batch_size, seed=t.seed, drop_remainder=True, repeat=True,
                          shuffle_buffer=shuffle, skip=self.skip,
                          part=(context.input_pipeline_id, context.num_input_pipelines))
        return ds.rebatch(context.get_per_replica_batch_size(t.batch_size)) if replicas_here > 1 else ds


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
    """A worker's failure to read data.path (missing there, or other data), as one line; else None."""
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




def make_dataset(images, labels, batch_size, *, seed, shuffle_buffer=0, repeat=False, shard=None,
                 part=None, drop_remainder=False, skip=0, n=None):
    """The pipeline every reader builds: shuffle (fixed seed) and batch example indices, then gather
    and normalise each batch from the in-memory arrays (data.load() gives them), prefetching ahead of the model.

    Shuffling indices rather than images is cheap, and lets a worker build only its own part of
    each batch: part=(i, n) keeps slice i of n of every batch, in order, so n sync workers together
    see exactly the batches one device would. shard=(n, i) keeps every n-th example instead
    (parameter-server workers, each reading its own share). The arrays live in memory as tensors,
    which is the cache: nothing is decoded twice.
    """
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
    pixels = images.dtype == tf.uint8  # scaled to [0, 1]; float images are taken as they are

    def gather(idx):
        x = tf.cast(tf.gather(images, idx), tf.float32)
        return (x / 255.0 if pixels else x), tf.gather(labels, idx)

    ds = ds.map(gather, num_parallel_calls=tf.data.AUTOTUNE)
    options = tf.data.Options()
    options.deterministic = True
    # Evaluation data goes to strategies whole: split it by element, the same way on every worker.
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return ds.prefetch(tf.data.AUTOTUNE).with_options(options)
