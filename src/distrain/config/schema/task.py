"""What a run learns: the model, data, optimizer, schedule and loss groups' keys, each option a class
(`_target_`) or a source of data; the user's own options (Builder, Loader, Own*) take any class."""
import math
import re
from dataclasses import dataclass, field
from typing import Any, ClassVar, List, Optional

from .keys import FINITE_POSITIVE, FRACTION, NOT_NEGATIVE, POSITIVE, TARGET, Check, DataSource, key, one_of

# ---- model ------------------------------------------------------------------------------------------

MODEL_PATH_DOC = ("a saved Keras model (.keras file or SavedModel directory, e.g. a run's saved_model) to go on "
                  "training instead of building one")


@dataclass
class Cnn:
    _target_: str = key("distrain.task.model.cnn",
                        "the builder: called with input_shape, num_classes and the keys below")
    name: str = key("cnn", "the Keras simple MNIST convnet")
    dropout: float = key(0.5, "dropout rate before the last layer", FRACTION)
    path: Optional[str] = key(None, MODEL_PATH_DOC, example="outputs/DATE/TIME/saved_model")


@dataclass
class Mlp:
    _target_: str = key("distrain.task.model.mlp",
                        "the builder: called with input_shape, num_classes and the keys below")
    name: str = key("mlp", "the classic distributed-MNIST network: pixels -> hidden ReLU -> logits")
    hidden_units: int = key(100, "units of the hidden layer", Check(lambda v: 0 < v <= 65536,
                                                                    "must be from 1 to 65536"))
    path: Optional[str] = key(None, MODEL_PATH_DOC, example="outputs/DATE/TIME/saved_model")


@dataclass
class Builder:
    """A model option of the user's own: `_target_` names a builder; its other keys are the builder's
    arguments, but for these."""
    _target_: Optional[str] = key(None, "the builder, module.function: called inside the strategy's scope with "
                                  "input_shape, num_classes and the node's other keys; returns a tf_keras.Model",
                                  TARGET, example="mymodels.small_cnn")
    path: Optional[str] = key(None, MODEL_PATH_DOC, example="outputs/DATE/TIME/saved_model")


# ---- optimizer and learning-rate schedule -------------------------------------------------------------

LEARNING_RATE_DOC = "called with learning_rate (trainer.learning_rate, or the schedule) and the keys below"
NOT_NEGATIVE_NUMBER = Check(lambda v: math.isfinite(v) and v >= 0, "must be a finite number, 0 or more")
CLIP = key(None, "clip each gradient to this norm (null: no clipping)", FINITE_POSITIVE, example=1.0)
GLOBAL_CLIP = key(None, "clip the gradients together to this global norm (null: no clipping)", FINITE_POSITIVE,
                  example=1.0)


@dataclass
class Adam:
    _target_: str = key("tf_keras.optimizers.Adam", LEARNING_RATE_DOC)
    name: str = key("adam", "Adam (Kingma and Ba)")
    beta_1: float = key(0.9, "decay of the first-moment estimates", FRACTION)
    beta_2: float = key(0.999, "decay of the second-moment estimates", FRACTION)
    epsilon: float = key(1e-7, "added to the denominator, for numerical stability", FINITE_POSITIVE)
    amsgrad: bool = key(False, "the AMSGrad variant")
    clipnorm: Optional[float] = CLIP
    global_clipnorm: Optional[float] = GLOBAL_CLIP


@dataclass
class AdamW(Adam):
    _target_: str = key("tf_keras.optimizers.AdamW", LEARNING_RATE_DOC)
    name: str = key("adamw", "Adam with decoupled weight decay (Loshchilov and Hutter)")
    weight_decay: float = key(0.004, "decoupled weight decay, times the learning rate", NOT_NEGATIVE_NUMBER)


@dataclass
class Sgd:
    _target_: str = key("tf_keras.optimizers.SGD", LEARNING_RATE_DOC)
    name: str = key("sgd", "stochastic gradient descent, with momentum where set")
    momentum: float = key(0.0, "momentum (0: plain SGD; 0.9 is common)", FRACTION)
    nesterov: bool = key(False, "Nesterov momentum")
    clipnorm: Optional[float] = CLIP
    global_clipnorm: Optional[float] = GLOBAL_CLIP


@dataclass
class RMSprop:
    _target_: str = key("tf_keras.optimizers.RMSprop", LEARNING_RATE_DOC)
    name: str = key("rmsprop", "RMSprop")
    rho: float = key(0.9, "decay of the moving average of squared gradients", FRACTION)
    momentum: float = key(0.0, "momentum", FRACTION)
    epsilon: float = key(1e-7, "added to the denominator, for numerical stability", FINITE_POSITIVE)
    clipnorm: Optional[float] = CLIP
    global_clipnorm: Optional[float] = GLOBAL_CLIP


@dataclass
class OwnOptimizer:
    """An optimizer option of the user's own: `_target_` names a Keras optimizer class (or a function
    returning one); its other keys are its arguments."""
    _target_: Optional[str] = key(None, "the optimizer, module.Class: " + LEARNING_RATE_DOC + "; a "
                                  "tf_keras.optimizers.Optimizer", TARGET, example="tf_keras.optimizers.Adamax")


WARMUP_STEPS = key(0, "linear warm-up from 0 over the first N global steps (0: none)", NOT_NEGATIVE)
WARMUP_EPOCHS = key(0.0, "the same in epochs (0: none); set one of warmup_steps and warmup_epochs",
                    NOT_NEGATIVE_NUMBER)
DECAY_STEPS = key(None, "global steps to decay over (null: the whole run, trainer.epochs x steps per epoch)",
                  POSITIVE, example=1000)


@dataclass
class Constant:
    _target_: Optional[str] = key(None, "none: trainer.learning_rate throughout (after any warm-up)")
    name: str = key("constant", "the learning rate stays trainer.learning_rate")
    warmup_steps: int = WARMUP_STEPS
    warmup_epochs: float = WARMUP_EPOCHS


@dataclass
class Cosine:
    _target_: str = key("tf_keras.optimizers.schedules.CosineDecay", "called with initial_learning_rate "
                        "(trainer.learning_rate) and the keys below")
    name: str = key("cosine", "cosine decay from trainer.learning_rate (Loshchilov and Hutter, SGDR)")
    decay_steps: Optional[int] = DECAY_STEPS
    alpha: float = key(0.0, "the last learning rate, a fraction of the first", Check(lambda v: 0 <= v <= 1,
                                                                                     "must be from 0 to 1"))
    warmup_steps: int = WARMUP_STEPS
    warmup_epochs: float = WARMUP_EPOCHS


@dataclass
class Exponential:
    _target_: str = key("tf_keras.optimizers.schedules.ExponentialDecay", "called with initial_learning_rate "
                        "(trainer.learning_rate) and the keys below")
    name: str = key("exponential", "the learning rate times decay_rate every decay_steps")
    decay_steps: Optional[int] = DECAY_STEPS
    decay_rate: float = key(0.1, "the factor over decay_steps", Check(lambda v: 0 < v <= 1,
                                                                      "must be above 0 and at most 1"))
    staircase: bool = key(False, "decay in steps of decay_steps, not smoothly")
    warmup_steps: int = WARMUP_STEPS
    warmup_epochs: float = WARMUP_EPOCHS


@dataclass
class Piecewise:
    _target_: str = key("tf_keras.optimizers.schedules.PiecewiseConstantDecay", "called with the keys below")
    name: str = key("piecewise", "constant learning rates between global-step boundaries")
    boundaries: List[int] = key([1000, 2000], "the global steps where the rate changes")
    values: List[float] = key([0.002, 0.0002, 0.00002], "the rates: one more than boundaries")
    warmup_steps: int = WARMUP_STEPS
    warmup_epochs: float = WARMUP_EPOCHS


@dataclass
class OwnSchedule:
    """A schedule of the user's own: `_target_` names a tf_keras LearningRateSchedule (or a function
    returning one); its other keys are its arguments."""
    _target_: Optional[str] = key(None, "the schedule, module.Class: called with the keys of the node, and "
                                  "initial_learning_rate (trainer.learning_rate) where it takes one",
                                  TARGET, example="tf_keras.optimizers.schedules.PolynomialDecay")
    warmup_steps: int = WARMUP_STEPS
    warmup_epochs: float = WARMUP_EPOCHS


# ---- loss and metrics ---------------------------------------------------------------------------------

FROM_LOGITS = key("auto", "whether the model outputs logits; auto: as its last activation says (softmax, sigmoid: "
                  "probabilities)", one_of("auto", True, False))
LOSS_DOC = "the loss class: called with the keys below (and reduction)"


@dataclass
class SparseCategoricalCrossentropy:
    labels: ClassVar[str] = "classes"
    _target_: str = key("tf_keras.losses.SparseCategoricalCrossentropy", LOSS_DOC)
    name: str = key("sparse_categorical_crossentropy", "single-label classification: integer labels 0..classes-1")
    from_logits: Any = FROM_LOGITS


@dataclass
class CategoricalCrossentropy:
    labels: ClassVar[str] = "one_hot"
    _target_: str = key("tf_keras.losses.CategoricalCrossentropy", LOSS_DOC)
    name: str = key("categorical_crossentropy", "single-label classification: one-hot label rows")
    from_logits: Any = FROM_LOGITS
    label_smoothing: float = key(0.0, "label smoothing", FRACTION)


@dataclass
class BinaryCrossentropy:
    labels: ClassVar[str] = "binary"
    _target_: str = key("tf_keras.losses.BinaryCrossentropy", LOSS_DOC)
    name: str = key("binary_crossentropy", "binary or multi-label classification: rows of 0/1 labels, one output each "
                    "(sigmoid)")
    from_logits: Any = FROM_LOGITS
    label_smoothing: float = key(0.0, "label smoothing", FRACTION)


@dataclass
class MeanSquaredError:
    labels: ClassVar[str] = "values"
    _target_: str = key("tf_keras.losses.MeanSquaredError", LOSS_DOC)
    name: str = key("mean_squared_error", "regression: float targets")


@dataclass
class MeanAbsoluteError:
    labels: ClassVar[str] = "values"
    _target_: str = key("tf_keras.losses.MeanAbsoluteError", LOSS_DOC)
    name: str = key("mean_absolute_error", "regression: float targets")


@dataclass
class Huber:
    labels: ClassVar[str] = "values"
    _target_: str = key("tf_keras.losses.Huber", LOSS_DOC)
    name: str = key("huber", "regression, robust to outliers: squared below delta, linear above")
    delta: float = key(1.0, "where the loss turns from squared to linear", FINITE_POSITIVE)


# What a loss reads (its `labels`): class indices, one-hot rows, rows of 0/1 per output, or values
# (regression). A loss of the user's says nothing: the labels themselves decide (data.labels_kind).


LABELS = ("classes", "one_hot", "binary", "values")
# Keras's compile(metrics=["accuracy"]): the accuracy of those labels; none of values.
ACCURACY = {"classes": "tf_keras.metrics.SparseCategoricalAccuracy", "one_hot": "tf_keras.metrics.CategoricalAccuracy",
            "binary": "tf_keras.metrics.BinaryAccuracy", "values": None}


@dataclass
class OwnLoss:
    """A loss of the user's own: `_target_` names a tf_keras Loss class; its other keys are its arguments."""
    _target_: Optional[str] = key(None, "the loss, module.Class: a tf_keras.losses.Loss, called with the node's other "
                                  "keys and reduction", TARGET, example="tf_keras.losses.LogCosh")


# ---- data -------------------------------------------------------------------------------------------

NUM_CLASSES = key(None, "classes (null: one more than the largest label)", POSITIVE, example=10)
CLASS_NAMES = key(None, "the classes' names in the order of their labels 0, 1, ..., kept with the model "
                  "(class_names.txt): an image folder's class folders are matched to them by name (null: none for "
                  "arrays; TFRecords' image/class/text; a folder's class folders, sorted)",
                  Check(lambda v: len(v) > 1 and len(set(v)) == len(v) and all(str(n) for n in v),
                        "must be two or more distinct names"), example=["cat", "dog"])
VALIDATION_SPLIT = key(0.0, "the last fraction of the training examples, held out as validation data (as "
                       "fit(validation_split) does): trainer.validate_every evaluates on it instead of the test data",
                       FRACTION, example=0.2)
SHUFFLE_BUFFER = key(10000, "examples in the shuffle buffer (0: no shuffling, the examples in their order every "
                     "epoch, as fit(shuffle=False))", NOT_NEGATIVE)


@dataclass
class DataService:
    """The tf.data service: a dispatcher and data workers run the training split's input pipeline and
    stream its batches to the trainers (docs/data_in_files.md)."""
    workers: int = key(0, "data workers the run starts on this machine as tasks of its own, with a dispatcher "
                       "(cluster=local; 0: the input pipeline runs in each trainer)", NOT_NEGATIVE, example=2)
    sharding: str = key("dynamic", "dynamic: the service hands out the data's splits as its workers ask, each "
                        "example at most once a pass across all trainers; off: each trainer reads every example "
                        "each pass", one_of("dynamic", "off"))
    address: Optional[str] = key(None, "grpc://host:port of a dispatcher that already runs, instead of one the run "
                                 "starts", Check(lambda v: bool(re.fullmatch(r"(grpc://)?[^:/\s]+:\d{1,5}", v)),
                                                 "must be grpc://host:port"), example="grpc://10.0.0.5:5050")


def service_workers(data) -> int:
    """The data workers of the run's tf.data service that its command starts (data.service.workers; a run
    directory's config from before the key has none)."""
    return (data.get("service") or {}).get("workers") or 0


def service_key():
    return field(default_factory=DataService, metadata={"doc": "the tf.data service: its keys below", "check": None,
                                                        "example": None})


@dataclass
class Data:
    _target_: Optional[str] = key(None, "a loader of your own instead (module.function, see data=npz too): called "
                                  "with the node's other keys, returns ((x_train, y_train), (x_test, y_test))",
                                  TARGET, example="mydata.load")
    name: str = key("mnist", "the dataset")
    source: DataSource = key(DataSource.auto, "auto: Keras cache, else a short download try, else bundled; "
                             "bundled: 10,000 digits shipped in the package; keras: full 60k/10k; idx: "
                             "IDX files in data.path; npz: an .npz file in data.path; synthetic: generated")
    path: Optional[str] = key(None, "directory of IDX files (data.source=idx), or the .npz file (data.source=npz)")
    download_timeout: float = key(5.0, "seconds for the download try of source=auto (0: never try)",
                                  Check(lambda v: 0 <= v <= 3600, "must be from 0 to 3600 seconds"))
    shuffle_buffer: int = SHUFFLE_BUFFER
    num_classes: Optional[int] = NUM_CLASSES
    validation_split: float = VALIDATION_SPLIT
    class_names: Optional[List[str]] = CLASS_NAMES
    service: DataService = service_key()


@dataclass
class FashionMnist(Data):
    name: str = key("fashion_mnist", "Zalando's Fashion-MNIST: 60k/10k grey 28x28 images of 10 kinds of clothing")
    source: DataSource = key(DataSource.idx, "idx: Debian's dataset-fashion-mnist (apt-get install "
                             "dataset-fashion-mnist); or keras, auto")
    path: Optional[str] = key("/usr/share/datasets/fashion-mnist", "directory of its IDX files")


@dataclass
class Synthetic(Data):
    name: str = key("synthetic", "deterministic, learnable MNIST-shaped data (one noisy template per class)")
    source: DataSource = key(DataSource.synthetic, "synthetic")
    train_examples: int = key(4096, "training examples", POSITIVE)
    test_examples: int = key(1024, "test examples", POSITIVE)


@dataclass
class Npz(Data):
    name: str = key("npz", "your own images in an .npz file: arrays x_train, y_train, x_test, y_test, as in "
                    "Keras's mnist.npz")
    source: DataSource = key(DataSource.npz, "npz")
    path: Optional[str] = key(None, "the .npz file", example="mydata.npz")


@dataclass
class InFiles(Data):
    """What both layouts of data in files take."""
    image_size: Optional[List[int]] = key(None, "[H, W]: images of another size are resized to it, as Keras does "
                                          "(null: every image must be the size of the first)",
                                          Check(lambda v: len(v) == 2 and all(0 < x <= 65536 for x in v),
                                                "must be [H, W], two positive sizes"), example=[28, 28])
    channels: Optional[int] = key(None, "1 (grey) or 3 (RGB): images are decoded to it (null: what the first image "
                                  "has)", one_of(1, 3), example=1)
    cache: Optional[str] = key(None, "null: stream the files every epoch; memory: keep the decoded examples in "
                               "memory after the first epoch; or a directory for a cache on disk")


@dataclass
class TFRecord(InFiles):
    name: str = key("tfrecord", "your own TFRecord shards of tf.train.Example records: an encoded image (PNG, JPEG) "
                    "or raw uint8 pixels, and an int64 label")
    source: DataSource = key(DataSource.tfrecord, "tfrecord")
    train_files: Any = key(None, "glob pattern, or list of patterns, of the training TFRecord files (every task "
                           "reads them at the same path)", example="'data/train-*.tfrecord'")
    test_files: Any = key(None, "glob pattern, or list of patterns, of the test TFRecord files",
                          example="'data/test-*.tfrecord'")
    image_key: str = key("image/encoded", "the records' image feature (bytes)")
    label_key: str = key("image/class/label", "the records' label feature (int64)")
    num_classes: Optional[int] = key(None, "classes (null: one more than the largest label, read in one pass over "
                                     "the records before training)", POSITIVE, example=10)


@dataclass
class Images(InFiles):
    name: str = key("images", "your own folder of images: path/train/<class>/*, path/test/<class>/* (PNG, JPEG, BMP, "
                    "GIF), classes in sorted folder order as Keras's image_dataset_from_directory reads them")
    source: DataSource = key(DataSource.images, "images")
    path: Optional[str] = key(None, "the folder holding train/ (and test/)", example="data/flowers")
    test_split: float = key(0.0, "where there is no test/: the fraction of each class of train/ held out as the "
                            "test data, seeded", FRACTION, example=0.2)
    num_classes: Optional[int] = key(None, "classes (null: the number of class folders)", POSITIVE, example=10)


@dataclass
class Loader:
    """A data option of the user's own: `_target_` names a loader; its other keys are the loader's
    arguments, but for these."""
    _target_: Optional[str] = key(None, "the loader, module.function: called with the node's other keys; returns "
                                  "((x_train, y_train), (x_test, y_test)) numpy arrays", TARGET,
                                  example="mydata.load")
    source: str = key("loader", "loader", one_of("loader"))
    shuffle_buffer: int = SHUFFLE_BUFFER
    service: DataService = service_key()
    num_classes: Optional[int] = NUM_CLASSES
    validation_split: float = VALIDATION_SPLIT
