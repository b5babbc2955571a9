"""What a task trains on: the data loaded once, as arrays in memory (Arrays) or files streamed (Files),
one interface for both (TrainingData): its shape and classes, the global steps of an epoch, a sample for the model's
checks, and the readers (input_pipeline.py) of its training, validation and test splits."""
from typing import NamedTuple, Protocol

import numpy as np

from distrain.common.errors import ConfigError
from distrain.config import schema
from distrain.config.validate import check_batch_divides
from distrain.data import arrays, files
from distrain.data.files import FileData
from distrain.task.context import RunContext
from distrain.task.input_pipeline import InputReader, array_reader, file_reader
from distrain.task.metrics import check_labels


class TrainingData(Protocol):
    """What every module asks of a task's data, arrays or files alike."""
    shape: tuple  # one example's, with its channel axis
    classes: int
    steps: int  # global steps an epoch
    labels: str  # what the labels are (schema.LABELS)
    train_examples: int
    test_examples: int
    sample: np.ndarray  # two examples, for the model's checks
    sample_labels: np.ndarray
    class_names: list | None
    pixels: bool  # its inputs are uint8 images, scaled to [0, 1] as they are read (input_pipeline.py)
    streamed: bool  # every task reads the files itself (else arrays in memory)
    labelled: bool  # False: inputs alone (predict's new data), their labels 0

    def reader(self, cfg, training: bool = True, validation: bool = False, **kwargs) -> InputReader:
        """The reader of a split (input_pipeline.py)."""

    def test_steps(self, batch_size: int) -> int | None:
        """Batches of the test split for Keras's evaluate (None: it counts them itself)."""


class Arrays(NamedTuple):
    """The training and test arrays (data.load), their class count, and the global steps of an epoch."""
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    classes: int
    steps: int  # global steps an epoch
    labels: str  # what the labels are (schema.LABELS)
    x_val: np.ndarray | None = None  # data.validation_split's, held out of the training arrays
    y_val: np.ndarray | None = None
    labelled: bool = True
    class_names: list | None = None  # data.class_names

    shape = property(lambda self: self.x_train.shape[1:])
    train_examples = property(lambda self: len(self.y_train))
    test_examples = property(lambda self: len(self.y_test))
    sample = property(lambda self: self.x_train[:2])  # what check_model runs the model on
    sample_labels = property(lambda self: self.y_train[:2])
    pixels = property(lambda self: self.x_train.dtype == np.uint8)
    streamed = False  # in memory: a parameter-server worker is sent them, or reads them from IDX files

    def reader(self, cfg, training: bool = True, validation: bool = False, **kwargs) -> InputReader:
        """The reader of the training split, else of the test split, or of the validation split where
        data.validation_split held one out."""
        if training:
            x, y = self.x_train, self.y_train
        elif validation and self.y_val is not None:
            x, y = self.x_val, self.y_val
        else:
            x, y = self.x_test, self.y_test
        return array_reader(x, y, cfg, training=training, **kwargs)

    def test_steps(self, batch_size: int) -> None:
        """(Keras's evaluate counts the batches of arrays itself.)"""
        return None


class Files(NamedTuple):
    """Data in files (files.FileData), streamed, with the global steps of an epoch and two decoded images."""
    found: FileData
    steps: int
    sample: np.ndarray

    shape = property(lambda self: tuple(self.found.shape))
    classes = property(lambda self: self.found.num_classes)
    train_examples = property(lambda self: self.found.train_examples)
    test_examples = property(lambda self: self.found.test_examples)
    class_names = property(lambda self: self.found.class_names)
    labelled = property(lambda self: self.found.labelled)
    sample_labels = property(lambda self: np.zeros(len(self.sample), np.int32))  # (class labels)
    labels = "classes"
    pixels = True  # (images, decoded to uint8)
    streamed = True  # every task reads the files itself

    def reader(self, cfg, training: bool = True, validation: bool = False, **kwargs) -> InputReader:
        """The reader of the training split, else of the test split (validation reads the test files)."""
        return file_reader(self.found, cfg, training=training, **kwargs)

    def test_steps(self, batch_size: int) -> int:
        """Batches of the test split, for Keras's evaluate, which cannot count a stream's."""
        return -(-self.test_examples // batch_size)


def load_data(cfg, context: RunContext) -> TrainingData:
    """The training and test arrays, or what the data files hold (as the launcher found them, in the
    run's data.json, else scanned here), checked against the batch and the replicas."""
    t = cfg.trainer
    if context.topology.synchronous and not t.resume:  # (parameter servers: a batch per worker's step; resumed
        check_batch_divides(t.batch_size, context.replicas)  # at another size: split unevenly where need be)
    if cfg.data.source in schema.FILE_SOURCES:
        content = context.run.read_data()
        found = files.from_json(content) if content else files.scan(cfg.data, t.seed)
        return Files(found, _steps(t, found.train_examples), file_reader(found, cfg).source.sample())
    reads = schema.labels_read(cfg.loss, cfg.data)
    (x_train, y_train), (x_test, y_test) = arrays.load(cfg.data, t.seed, reads)
    labels = reads or arrays.labels_of(y_train)
    check_labels(cfg.loss, y_train)
    classes = arrays.num_classes(cfg.data, (y_train, y_test), labels == "classes")
    x_val = y_val = None
    if cfg.data.get("validation_split"):  # the last examples, as fit(validation_split) holds them out
        cut = len(y_train) - max(1, round(len(y_train) * cfg.data.validation_split))
        (x_train, x_val), (y_train, y_val) = np.split(x_train, [cut]), np.split(y_train, [cut])
    return Arrays(x_train, y_train, x_test, y_test, classes, _steps(t, len(y_train)), labels, x_val, y_val,
                  class_names=_names(cfg.data))


def load_test_data(cfg, context: RunContext, known: list | None = None) -> TrainingData:
    """The test split alone, as evaluate and predict read it (the training split is not read: two test
    examples stand in for it in the model's checks). known: the trained model's class names, which an
    image folder's class folders are matched to by name, and which name the classes of data that names
    none (new arrays, shards without image/class/text). Inputs without labels are read with labels 0
    (labelled False). data.num_classes, where set, is the model's outputs."""
    if cfg.data.source in schema.FILE_SOURCES:
        content = context.run.read_data()
        found = files.from_json(content) if content else files.scan(cfg.data, cfg.trainer.seed, train=False,
                                                                     known=known)
        found.class_names = found.class_names or _fitting(known, found.num_classes)
        return Files(found, 1, file_reader(found, cfg).source.sample())
    reads = schema.labels_read(cfg.loss, cfg.data)
    x, y = arrays.load_test(cfg.data, cfg.trainer.seed, reads)
    labelled = y is not None
    if not labelled and not cfg.data.get("num_classes"):
        raise ConfigError("the data holds inputs alone: set data.num_classes (the model's outputs)")
    labels = reads or (arrays.labels_of(y) if labelled else "classes" if cfg.data.num_classes > 1 else "values")
    if not labelled:
        y = np.zeros(len(x), np.int32) if labels == "classes" else np.zeros((len(x), 1), np.float32)
    classes = arrays.num_classes(cfg.data, (y,), labels == "classes")
    return Arrays(x[:2], y[:2], x, y, classes, 1, labels, labelled=labelled,
                  class_names=_names(cfg.data) or (_fitting(known, classes) if labels == "classes" else None))


def _names(data) -> list | None:
    return list(data.class_names) if data.get("class_names") else None


def _fitting(known: list | None, classes: int) -> list:
    """The trained model's class names where they are one per class of the data (else none)."""
    return list(known) if known and len(known) == classes else []


def _steps(t, examples: int) -> int:
    """The global steps (optimizer updates) of an epoch: trainer.steps_per_epoch, else one pass over the
    training examples."""
    steps = t.get("steps_per_epoch") or examples // schema.update_batch(t)
    if steps == 0:
        accumulated = f" x trainer.accumulate_steps={t.accumulate_steps}" if t.get("accumulate_steps", 1) > 1 else ""
        raise ConfigError(f"trainer.batch_size={t.batch_size}{accumulated} is larger than the {examples} training "
                          f"examples: set trainer.batch_size={examples} or less, or trainer.steps_per_epoch")
    return steps
