"""The input pipelines: every tf.data dataset a run trains or evaluates on is built here, by the
InputReader, which turns a source (ArraySource, FileSource: the examples, and how to decode them) and
a tf.distribute.InputContext into the dataset of one input pipeline (as Model Garden's InputReader
does). data/arrays.py loads the arrays without TensorFlow.
"""
import glob
import os
import re
from typing import NamedTuple

import numpy as np
import tensorflow as tf

from distrain.common.errors import ConfigError, first_line
from distrain.data import files
from distrain.task.worker_idx import read_train_files

# The functions the datasets here map build their graphs with tf.cond where they branch, so autograph's
# conversion of them buys nothing; it cost each process that reads files 1.4 s of CPU (measured).
unconverted = tf.autograph.experimental.do_not_convert


class Part(NamedTuple):
    """Which part of the training data an input pipeline reads: pipeline `index` of `pipelines`, in
    batches of `batch`; own: a parameter-server worker's own shard, else its part of every global batch,
    from its example `first` on."""
    pipelines: int
    index: int
    batch: int
    own: bool
    first: int = 0


def replica_shares(batch: int, replicas: int) -> list[int]:
    """Each replica's examples of a global batch: equal where the batch divides over the replicas, else
    the first batch % replicas one more (a run resumed at another size keeps its global batch so)."""
    return [batch // replicas + (i < batch % replicas) for i in range(replicas)]



class InputReader:
    """The dataset of one input pipeline, for strategy.distribute_datasets_from_function (training) or
    for Keras's evaluate (test data, no context), as Model Garden's InputReader makes it: the source
    gives the examples and decodes them (ArraySource: arrays in memory; FileSource: TFRecord shards or
    image files); which part of the data this pipeline reads, and the dataset's options, are decided
    here, once, for both.

    cfg: the run's config (trainer.batch_size and seed, data.shuffle_buffer). training: shuffled,
    repeated, whole batches; else each example once, in order. skip: global batches already trained
    (a resumed synchronous run). topology (context.Topology): under parameter servers each worker reads
    its own shard, a batch per step of its own; synchronous pipelines each read their part of every
    global batch, one per-replica batch per element. examples: [(start, stop), ...], the test examples of
    these ranges alone, in order (the parts of a clustered evaluate or predict a task computes:
    inference/cluster_parts.py), batched within each range where the ranges are whole batches."""

    def __init__(self, source, cfg, *, training: bool = True, skip: int = 0, topology=None, examples=None):
        self.source, self.cfg, self.training, self.skip = source, cfg, training, skip
        self.examples = examples
        self.own_shards = topology.workers if topology is not None and topology.parameter_servers else 0
        self.served = None  # the tf.data service the training split is read through (serve())

    def serve(self, where: str, run, start_step: int, pipelines: int) -> "InputReader":
        """The training split read through the tf.data service at `where` (data.service: data_service.Served,
        for `pipelines` input pipelines; 0: parameter-server workers, a batch per worker's step)."""
        from distrain.task.data_service import Served

        self.served = Served.of(self.source, self.cfg, where, run, start_step, pipelines)
        return self

    def __call__(self, context: tf.distribute.InputContext | None = None) -> tf.data.Dataset:
        t = self.cfg.trainer
        if not self.training:
            return _finish(self.source.test(self.cfg, self.examples), training=False)
        here = []  # the examples of each replica this pipeline feeds (synchronous)
        if self.own_shards:  # runs on the worker
            part = Part(self.own_shards, tf.distribute.coordinator.experimental_get_current_worker_index(),
                        context.get_per_replica_batch_size(t.batch_size), own=True)
        else:
            pipelines, index = (context.num_input_pipelines, context.input_pipeline_id) if context else (1, 0)
            shares = replica_shares(t.batch_size, context.num_replicas_in_sync if context else 1)
            each = len(shares) // pipelines  # (the replicas this pipeline feeds, in order)
            here = shares[index * each:(index + 1) * each]
            part = Part(pipelines, index, sum(here), own=False, first=sum(shares[:index * each]))
        if self.served:
            ds = self.served.read(None if part.own else part.index)
        else:
            ds = self.source.train(part, self.cfg, self.skip)
        if not part.own and len(here) > 1:
            ds = ds.rebatch(here if len(set(here)) > 1 else here[0])
        return _finish(ds, training=True)

    def sharding_line(self, pipelines: int) -> str:
        """How `pipelines` input pipelines share the training data, in one line ("" where there is
        nothing to say, or the data service shares it: training.served says how)."""
        return "" if self.served else self.source.sharding_line(pipelines)


def _finish(ds: tf.data.Dataset, training: bool) -> tf.data.Dataset:
    options = tf.data.Options()
    options.deterministic = True  # (the same batches on every run: exact resume)
    # Sharded here already (training), or evaluated whole: tf.distribute splits the test data by element,
    # the same way on every worker (never by FILE).
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF if training \
        else tf.data.experimental.AutoShardPolicy.DATA
    return ds.prefetch(tf.data.AUTOTUNE).with_options(options)


def _indices(ranges: list) -> np.ndarray:
    """The examples of the ranges [(start, stop), ...], in order."""
    return np.concatenate([np.arange(a, b) for a, b in ranges])


def _numbered_records(f) -> tf.data.Dataset:
    """A TFRecord file's records, each as (the file, its index in the file, the serialized record)."""
    return tf.data.TFRecordDataset(f).enumerate().map(lambda i, r: (f, i, r))


class ArraySource:
    """Arrays in memory (data.load()), each batch gathered and normalised from them by index. Under
    parameter servers a worker reads them itself where they are `idx_files` (cfg.data where it is IDX
    files, or data.TemporaryIdx), checked against the coordinator's fingerprints `expect`."""

    def __init__(self, images, labels, idx_files=None, expect=None):
        self.images, self.labels = images, labels
        self.idx_files, self.expect = idx_files, expect  # (held for the run: they may own them, TemporaryIdx)

    def test(self, cfg, ranges: list | None = None) -> tf.data.Dataset:
        take = _indices(ranges) if ranges else slice(None)
        return make_dataset(self.images[take], self.labels[take], cfg.trainer.batch_size, seed=cfg.trainer.seed)

    def train(self, part: Part, cfg, skip: int) -> tf.data.Dataset:
        t, shuffle = cfg.trainer, cfg.data.shuffle_buffer
        if part.own:
            on_worker = read_train_files(self.idx_files or cfg.data, (self.images, self.labels), self.expect)
            return make_dataset(*(on_worker or (self.images, self.labels)), part.batch, seed=t.seed,
                                shuffle_buffer=shuffle, repeat=True, shard=(part.pipelines, part.index),
                                n=len(self.labels))
        # Every pipeline builds the same shuffled global batches and keeps its part: the global batch is
        # exactly the one a single device would take. Every step is a full global batch (the remainder
        # is dropped).
        return make_dataset(self.images, self.labels, t.batch_size, seed=t.seed, drop_remainder=True, repeat=True,
                            shuffle_buffer=shuffle, skip=skip, part=(part.first, part.batch),
                            accumulate=t.get("accumulate_steps") or 1)

    def served(self, batch: int, cfg) -> tf.data.Dataset:
        """The whole training split in shuffled, repeated batches of `batch`, for the tf.data service."""
        n = len(self.labels)
        # The service hands out the source's elements as splits, each asked of the dispatcher: whole chunks
        # of indices, not one index each (measured: 0.4x the in-trainer rate one by one).
        chunks = tf.data.Dataset.range(-(-n // SPLIT)).flat_map(
            unconverted(lambda c: tf.data.Dataset.range(c * SPLIT, tf.minimum((c + 1) * SPLIT, n))))
        return make_dataset(self.images, self.labels, batch, seed=cfg.trainer.seed, indices=chunks,
                            shuffle_buffer=cfg.data.shuffle_buffer, repeat=True, drop_remainder=True)

    def sharding_line(self, pipelines: int) -> str:
        return ""


def array_reader(images, labels, cfg, *, idx_files=None, expect=None, **kwargs) -> InputReader:
    return InputReader(ArraySource(images, labels, idx_files, expect), cfg, **kwargs)


def file_reader(found, cfg, **kwargs) -> InputReader:
    return InputReader(FileSource(found, cfg.data), cfg, **kwargs)


class FileSource:
    """Data in files (files.FileData: TFRecord shards, or image files with their class indices), streamed:
    the files interleaved in parallel, records shuffled in a bounded buffer (data.shuffle_buffer),
    decoded in parallel after that (so that skipping the batches a resumed run trained costs no
    decoding), batched and prefetched.

    Sharded as tf.distribute means it: each input pipeline (a multi_worker_mirrored worker, a
    parameter-server worker) reads its own files where there are at least as many files as pipelines
    (FILE), else its share of every file's records (DATA)."""

    def __init__(self, found, data):
        self.found, self.data = found, data

    def test(self, cfg, ranges: list | None = None) -> tf.data.Dataset:
        """The test examples (of the ranges [(start, stop), ...]): file by file, in the files' order, then
        the records', as predict promises. A range reads only the files it spans."""
        found = self.found
        if not ranges:
            ds = self._records(found.test_files, found.test_labels, in_order=True)
        elif found.kind == "images":  # (a file per example)
            take = _indices(ranges)
            ds = self._records([found.test_files[i] for i in take], [found.test_labels[i] for i in take], in_order=True)
        else:  # each range's stretch of each file it spans, from the record counts of the file headers
            ends = files.record_ends(tuple(found.test_files))
            starts = np.concatenate([[0], ends[:-1]])
            stretches = [(f, max(a - s, 0), min(b, e) - max(a, s)) for a, b in ranges
                         for f, s, e in zip(found.test_files, starts, ends) if s < b and e > a]
            names, firsts, counts = zip(*stretches)
            ds = tf.data.Dataset.from_tensor_slices((list(names), np.int64(firsts), np.int64(counts))).flat_map(
                unconverted(lambda f, first, n: _numbered_records(f).skip(first).take(n)))
        return ds.batch(cfg.trainer.batch_size).map(self._decode, num_parallel_calls=tf.data.AUTOTUNE)

    def train(self, part: Part, cfg, skip: int) -> tf.data.Dataset:
        t, found, data = cfg.trainer, self.found, self.data
        pipelines, index, batch = part.pipelines, part.index, part.batch
        paths, labels = list(found.train_files), list(found.train_labels)
        order = t.seed if data.shuffle_buffer else None  # (the files in a new seeded order each pass)
        if pipelines > 1 and len(paths) >= pipelines:  # FILE: files index, index + pipelines, ...
            ds = self._records(paths, labels, order, shard=(pipelines, index), check=part.own)
        else:  # DATA: every file, one record in `pipelines`
            ds = self._records(paths, labels, order, check=part.own)
            if pipelines > 1:
                ds = ds.shard(pipelines, index)
        cache = data.get("cache")
        if cache:  # decoded once, the first epoch; then read from the cache
            ds = ds.batch(DECODE).map(self._decode, num_parallel_calls=tf.data.AUTOTUNE).unbatch()
            ds = ds.cache("" if cache == "memory" else cache)
        if data.shuffle_buffer:
            ds = ds.shuffle(data.shuffle_buffer, seed=t.seed, reshuffle_each_iteration=True)
        ds = ds.repeat()
        if skip:  # a resumed run: the batches already trained, passed over as records
            ds = ds.skip(skip * batch)
        if cache:
            return ds.batch(batch, drop_remainder=True)
        if batch <= DECODE:  # a batch's records parsed together (2.2x faster than one by one, measured)
            return ds.batch(batch, drop_remainder=True).map(self._decode, num_parallel_calls=tf.data.AUTOTUNE)
        # in chunks of DECODE records (a larger batch's unrolled decoding is slow to build)
        ds = ds.batch(DECODE, drop_remainder=True).map(self._decode, num_parallel_calls=tf.data.AUTOTUNE)
        return ds.unbatch().batch(batch, drop_remainder=True)

    def served(self, batch: int, cfg) -> tf.data.Dataset:
        """The whole training split in shuffled, repeated batches of `batch`, for the tf.data service."""
        return self.train(Part(1, 0, batch, own=False), cfg, 0)

    def _same_files(self):
        """A check, run where the worker reads its data: its machine holds the training files the launcher
        found for the coordinator, by name (a worker on another machine may see other files): TFRecord
        shards that data.train_files matches there, no fewer and no more; each image of data.path's train/
        (others there may be held out by data.test_split, or not be images)."""
        data, images = self.data, self.found.kind == "images"
        where = "data.path's train/ images" if images else "data.train_files"
        patterns = sorted({os.path.join(glob.escape(os.path.dirname(f)), "*") for f in self.found.train_files}) \
            if images else [os.path.abspath(os.path.expanduser(p)) for p in files.patterns(data.train_files)]
        found = tf.concat([tf.io.matching_files(p) for p in patterns], 0)
        expected = tf.constant(self.found.train_files)
        missing = tf.sparse.to_dense(tf.sets.difference([expected], [found]))[0]
        extra = tf.zeros([0], tf.string) if images else tf.sparse.to_dense(tf.sets.difference([found], [expected]))[0]

        def says(_):
            return tf.strings.format("sees {} of the coordinator's {} files (missing: {}; others: {})", (
                tf.size(expected) - tf.size(missing), tf.size(expected), missing[:3], extra[:3]))
        return _check(tf.equal(tf.size(missing) + tf.size(extra), 0),
                      lambda _: tf.constant(f"{where} on a parameter-server worker"), says,
                      "give every worker's machine the same files at the same path")

    def sharding_line(self, pipelines: int) -> str:
        """How `pipelines` input pipelines share the training files, in one line."""
        count = len(self.found.train_files)
        warning = "" if count >= pipelines else "warning: "
        return f"{warning}input: {pipelines} pipelines (one per worker), sharded by " + (
            f"FILE: each reads {count // pipelines}{'' if count % pipelines == 0 else f' or {count // pipelines + 1}'} "
            f"of the {count} training files"
            if count >= pipelines else f"DATA: each reads all {count} training file(s) and keeps 1 record in "
            f"{pipelines} (fewer files than workers; as many files as workers would spare the reading)")

    def _records(self, paths: list, labels: list, seed: int | None = None, shard=None,
                 check: bool = False, in_order: bool = False) -> tf.data.Dataset:
        """Image files: (path, label) pairs; TFRecord files: (file, index, serialized record), interleaved.
        seed: the files in a new order each pass, seeded (None: in order). shard: (pipelines, this one), of
        the files. in_order: one file after the other, else several interleaved (the training's).
        check: a parameter-server worker's, which first checks that it sees the coordinator's files."""
        images = self.found.kind == "images"
        slices = (paths, tf.constant(labels, tf.int32)) if images else paths
        if check:  # a parameter-server worker, before it reads any
            ds = tf.data.Dataset.from_tensors(0).map(unconverted(lambda _: self._same_files())).flat_map(
                unconverted(lambda _: tf.data.Dataset.from_tensor_slices(slices)))
        else:
            ds = tf.data.Dataset.from_tensor_slices(slices)
        if shard is not None:
            ds = ds.shard(*shard)
        if seed is not None:
            ds = ds.shuffle(len(paths), seed=seed, reshuffle_each_iteration=True)
        if images:
            return ds
        return ds.interleave(unconverted(_numbered_records),
                             cycle_length=1 if in_order else min(len(paths), 8), block_length=1,
                             num_parallel_calls=tf.data.AUTOTUNE,
                             deterministic=True)

    @unconverted
    def _decode(self, *batch):
        """A batch of examples: pixels scaled to [0, 1], in the shape data.json holds (resized if
        data.image_size), and their labels. A record or image that does not fit is an error naming it
        (bad_data says it in one line)."""
        raws, labels, where, checks = self._read(batch)
        data, (height, width, channels) = self.data, self.found.shape
        whole = batch[0].shape[0]  # the batch's size, where it is known (training's whole batches)
        if not self.found.encoded:  # raw pixels, data.image_size x data.channels: the batch at once
            with tf.control_dependencies(checks):
                images = tf.reshape(tf.io.decode_raw(raws, tf.uint8), [-1, height, width, channels])
            return tf.cast(images, tf.float32) / 255.0, tf.identity(labels)

        resize = bool(data.get("image_size"))

        def decode(raw):  # one image: resized (bilinear, as Keras's image_dataset_from_directory), or as it is
            image = tf.io.decode_image(raw, channels=channels, expand_animations=False)
            return tf.image.resize(image, [height, width]) if resize else image

        def stack(images, first):  # images of the first image's size (checked, unless resized) as one tensor
            if not resize:
                sizes = tf.stack([tf.shape(image) for image in images])[:, :2]
                with tf.control_dependencies([_check(
                        tf.reduce_all(sizes == [height, width], axis=1), lambda i: where(first + i),
                        lambda i: tf.strings.format("is {}x{}, the first image {}x{}", (sizes[i][0], sizes[i][1],
                                                                                      height, width)),
                        "set data.image_size=[H,W] to resize them all")]):
                    images = [tf.ensure_shape(image, [height, width, channels]) for image in images]
            return tf.cast(tf.stack(images), tf.float32)

        with tf.control_dependencies(checks):
            if whole is not None:  # unrolled: 40% less CPU per PNG digit than map_fn's loop (measured)
                images = stack([decode(raw) for raw in tf.unstack(raws, whole)], 0)
            else:  # a batch of any size (evaluation's last): one image at a time
                images = tf.map_fn(lambda i: stack([decode(raws[i])], i)[0], tf.range(tf.shape(labels, tf.int64)[0]),
                                   fn_output_signature=tf.TensorSpec([height, width, channels], tf.float32))
        return images / 255.0, tf.identity(labels)

    def _read(self, batch):
        """(A batch's raw images and labels, where each came from (for an error line), and the checks of
        its records: a feature missing, a label out of range, not an image, raw pixels of another size)."""
        data, found = self.data, self.found
        height, width, channels = found.shape
        whole = batch[0].shape[0]
        if found.kind == "images":
            paths, labels = batch
            raws = tf.map_fn(tf.io.read_file, paths) if whole is None else \
                tf.stack([tf.io.read_file(path) for path in tf.unstack(paths, whole)])
            where = lambda i: tf.strings.format("image {}", paths[i])
            checks = []
        else:
            paths, indexes, serialized = batch
            keys = (data.image_key, data.label_key) if found.labelled else (data.image_key,)  # (else inputs alone)
            parsed = tf.io.parse_example(serialized, {key: tf.io.FixedLenFeature(
                [], tf.string if key == data.image_key else tf.int64, default_value="" if key == data.image_key else -1)
                for key in keys})
            raws = parsed[data.image_key]
            labels = tf.cast(parsed[data.label_key], tf.int32) if found.labelled else tf.zeros(tf.shape(raws), tf.int32)
            where = lambda i: tf.strings.format("record {} of {}", (indexes[i], paths[i]))
            checks = [_check(tf.strings.length(raws) > 0, where, f"has no {data.image_key} (data.image_key)"),
                      _check(labels >= 0, where, f"has no {data.label_key} (data.label_key), or a negative label")]
        checks.append(_check(labels < found.num_classes, where, lambda i: tf.strings.format(
            "has label {}, outside [0, {})", (labels[i], found.num_classes)), "set data.num_classes higher, or fix it"))
        if found.encoded:
            checks.append(_check(tf.reduce_any([tf.strings.substr(raws, 0, len(m)) == m for m in MAGIC], axis=0), where,
                                 "is not a PNG, JPEG, GIF or BMP image", "replace it, or remove it"))
        else:
            size = height * width * channels
            checks.append(_check(tf.strings.length(raws) == size, where, lambda i: tf.strings.format(
                "holds {} raw bytes, not {}", (tf.strings.length(raws[i]), size)),
                "fix data.image_size and data.channels"))
        return raws, labels, where, checks

    def sample(self, n: int = 2):
        """A few decoded test images, as a numpy array (what check_model runs the model on)."""
        ds = self._records(self.found.test_files[:1] if self.found.kind == "tfrecord" else self.found.test_files[:n],
                           self.found.test_labels[:n])
        return next(iter(ds.batch(n).map(self._decode)))[0].numpy()


SPLIT = 1024  # examples of arrays the tf.data service hands a data worker at a time (data_service.py)
DECODE = 128  # records parsed and decoded together: unrolled, 40% less CPU per PNG digit than map_fn (measured)
BAD = "@@"  # around the line a data check gives (_check), inside TensorFlow's error: bad_data finds it
MAGIC = (files.PNG, files.JPEG, files.GIF, files.BMP)  # the first bytes of the images decode_image reads


def _check(ok, where, says, fix: str = "fix it, or remove it"):
    """An op that stops the pipeline where `ok` (a boolean, or one per example of a batch) is false, with
    an error naming the first example that fails, what is wrong with it and what to do. where(i), says(i):
    functions of that example's index making string tensors (says may be text), called only when the
    check fails: the strings cost nothing where the data is sound. What must not run before the check
    depends on it (tf.control_dependencies)."""
    ok = tf.reshape(ok, [-1])

    def fail():
        i = tf.argmin(tf.cast(ok, tf.int32))
        message = tf.strings.join([BAD, "the data's ", where(i), " ", says(i) if callable(says) else says,
                                   f": {fix}", BAD])
        with tf.control_dependencies([tf.debugging.Assert(False, [message])]):
            return tf.constant(False)
    return tf.cond(tf.reduce_all(ok), lambda: tf.constant(True), fail)


def bad_data(exc: Exception) -> ConfigError | None:
    """A data check's error (_check), or an image TensorFlow could not decode, as one line; else None."""
    exc = getattr(exc, "original_exception", exc)  # the coordinator wraps a failed dataset (ClosureInputError)
    if not isinstance(exc, tf.errors.OpError):
        return None
    said = re.search(f"{BAD}(.*?){BAD}", exc.message, re.S)
    if said:
        return ConfigError(said.group(1).replace('\\"', '"').replace("\\'", "'"))
    if re.search(r"Invalid PNG data|jpeg|Invalid JPEG|Input size should match|decode", exc.message, re.I) and \
            "Decode" in exc.message:
        first = first_line(exc.message)
        return ConfigError(f"an image of the data files does not decode ({first}): find it with Pillow (PIL.Image"
                           ".open(path).load()) and replace or remove it")
    if isinstance(exc, tf.errors.DataLossError):  # TFRecordDataset's framing or checksum, after the scan
        first = first_line(exc.message)
        return ConfigError(f"a TFRecord file of the data is corrupted or cut short ({first}): it changed after the "
                           "launcher read its headers, or differs on this task's machine; rewrite it, and run again "
                           "(the launcher names a file cut short)")
    return None


def make_dataset(images, labels, batch_size, *, seed, shuffle_buffer=0, repeat=False, shard=None,
                 part=None, drop_remainder=False, skip=0, n=None, accumulate=1, indices=None):
    """The examples of arrays in memory (data.load() gives them): shuffle (fixed seed) and batch example
    indices, then gather and normalise each batch from the arrays (InputReader prefetches and sets the
    options).

    Shuffling indices rather than images is cheap, and lets a worker build only its own part of
    each batch: part=(first, size) keeps examples first to first + size of every batch, so the sync
    workers together see exactly the batches one device would. shard=(n, i) keeps every n-th example instead
    (parameter-server workers, each reading its own share). accumulate: the batches of an update
    (trainer.accumulate_steps), cut from its examples, so that an epoch is whole updates as it is whole
    batches of one batch that many times larger. The arrays live in memory as tensors, which is the
    cache: nothing is decoded twice.
    """
    n = n or len(labels)  # n: when images and labels are tensors of a size known only when they run
    images, labels = tf.convert_to_tensor(images), tf.convert_to_tensor(labels)  # (int32 class labels: data/arrays.py)
    ds = tf.data.Dataset.range(n) if indices is None else indices  # (the examples' indices: the service's, split)
    if shard is not None:
        ds = ds.shard(*shard)
    if shuffle_buffer:
        ds = ds.shuffle(min(shuffle_buffer, n), seed=seed, reshuffle_each_iteration=True)
    if accumulate > 1:  # an update's batches, cut from its examples: an epoch is whole updates, as one batch's
        ds = ds.batch(batch_size * accumulate, drop_remainder=True).unbatch()
    ds = ds.batch(batch_size, drop_remainder=drop_remainder)
    if repeat:  # after batching: every epoch is a fresh shuffle cut into whole batches
        ds = ds.repeat()
    if skip:  # a resumed run: the batches already trained, passed over as indices (cheap)
        ds = ds.skip(skip)
    if part is not None:
        first, size = part  # (first, size): this pipeline's examples of each global batch
        ds = ds.map(unconverted(lambda idx: idx[first:first + size]))
    pixels = images.dtype == tf.uint8  # scaled to [0, 1]; float images are taken as they are

    @unconverted
    def gather(idx):
        x = tf.cast(tf.gather(images, idx), tf.float32)
        return (x / 255.0 if pixels else x), tf.gather(labels, idx)

    return ds.map(gather, num_parallel_calls=tf.data.AUTOTUNE)
