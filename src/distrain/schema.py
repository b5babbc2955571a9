"""The config schema: every key of every group option, with its type, default, range and meaning.

Each dataclass is registered in Hydra's ConfigStore as `schema/<group>/<option>`, and the YAML file of
that option (conf/<group>/<option>.yaml) extends it. So Hydra and OmegaConf convert or refuse a value
of the wrong type while composing, and `checking.check()` refuses keys the schema does not have (a `+key=...`
gets past composition) and values outside their range. This module declares; checking.py checks a
composed config against it and explains what it refuses (and lists the keys for --help). Checks that
relate several keys live in config.py. No TensorFlow here: bad input fails in about a second.
"""
import math
import os
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Callable, ClassVar, List, NamedTuple, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

CORES = len(os.sched_getaffinity(0))
MAX_PER_CORE = 8  # virtual devices, or local cluster tasks, per core: beyond that a run only crawls


class Check(NamedTuple):
    """A range: `ok(value)`, and what a value must be, as in "trainer.epochs=0 must be ..."."""
    ok: Callable[[Any], bool]
    says: str


POSITIVE = Check(lambda v: v > 0, "must be a positive integer")
NOT_NEGATIVE = Check(lambda v: v >= 0, "must be 0 or more")
FINITE_POSITIVE = Check(lambda v: math.isfinite(v) and v > 0, "must be a finite positive number")
SECONDS = Check(lambda v: math.isfinite(v) and v > 0, "must be a positive number of seconds")
FRACTION = Check(lambda v: 0 <= v < 1, "must be at least 0 and below 1")
SEED = Check(lambda v: 0 <= v < 2**32, "must be an integer from 0 to 2**32-1")
TARGET = Check(lambda v: "." in v and all(part.isidentifier() for part in v.split(".")),
               "must be module.function, importable from this directory or PYTHONPATH")


def at_most(high: int, why: str) -> Check:
    return Check(lambda v: 0 <= v <= high, f"must be from 0 to {high} ({why})")


def one_of(*options) -> Check:
    return Check(lambda v: v in options, "is not one of " + ", ".join(str(o).lower() for o in options))


def key(default, doc: str, check: Check | None = None, example=None):
    """A config key: its default, what it means (shown by --help), its range, and a valid value to
    suggest when the default is none."""
    meta = {"doc": doc, "check": check, "example": example}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


class DataSource(StrEnum):  # str() and f-strings give the name
    auto = "auto"
    bundled = "bundled"
    keras = "keras"
    idx = "idx"
    npz = "npz"
    synthetic = "synthetic"
    tfrecord = "tfrecord"
    images = "images"


FILE_SOURCES = (DataSource.tfrecord, DataSource.images)  # streamed from files (files.py, pipeline.py), never loaded


class StrategyName(StrEnum):  # the strategy group's options; compare names with these, not with strings
    default = "default"
    one_device = "one_device"
    mirrored = "mirrored"
    central_storage = "central_storage"
    multi_worker_mirrored = "multi_worker_mirrored"
    parameter_server = "parameter_server"


MWMS, PS = StrategyName.multi_worker_mirrored, StrategyName.parameter_server
CLUSTER_STRATEGIES = (MWMS, PS)  # the strategies whose tasks come from the cluster group


class Communication(StrEnum):  # str() and f-strings give the name
    auto = "auto"
    ring = "ring"
    nccl = "nccl"


# ---- trainer ----------------------------------------------------------------------------------------

@dataclass
class Trainer:
    epochs: int = key(12, "passes over the training data", POSITIVE)
    batch_size: int = key(128, "GLOBAL batch: each of N replicas gets batch_size / N", POSITIVE)
    steps_per_epoch: Optional[int] = key(None, "global steps an epoch (null: one pass over the training data); "
                                         "for data larger than a pass should take", POSITIVE, example=1000)
    learning_rate: float = key(0.002, "the learning rate (the schedule's initial one), for trainer.reference_batch_size "
                               "under trainer.lr_scaling", FINITE_POSITIVE)
    lr_scaling: str = key("none", "the learning rate grows with the global batch: linear (x batch / reference, "
                          "Goyal et al. 2017; pair it with schedule.warmup_epochs), sqrt, or none",
                          one_of("none", "linear", "sqrt"))
    reference_batch_size: int = key(128, "the global batch trainer.learning_rate is meant for (trainer.lr_scaling)",
                                    POSITIVE)
    seed: int = key(42, "seed of weights, shuffling and dropout", SEED)
    steps_per_execution: int = key(8, "training steps per tf.function call (parameter servers: per scheduled "
                                   "function, at least 4 per worker an epoch); more cuts per-call overhead", POSITIVE)
    mixed_precision: Any = key("auto", "true: mixed_float16 on GPUs, mixed_bfloat16 on CPUs; auto: the same where "
                               "the hardware does it natively (tensor cores; AVX512_BF16 or AMX), else float32",
                               one_of(False, True, "auto"))
    onednn: Any = key("auto", "TensorFlow's oneDNN CPU kernels; auto: on for x86 CPUs without a GPU (TensorFlow "
                      "itself leaves them off on CPUs without AVX512_VNNI, AVX512_BF16, AVX_VNNI or AMX); "
                      "TF_ENABLE_ONEDNN_OPTS in the environment wins", one_of(False, True, "auto"))
    jit_compile: bool = key(False, "XLA-compile the forward and backward pass")
    tensorboard: Any = key("auto", "TensorBoard logs in <run dir>/tensorboard: per-epoch scalars, and the run as a "
                           "session of the HParams dashboard; auto: on in sweeps (-m), off for single runs",
                           one_of(False, True, "auto"))
    save_model: bool = key(True, "checkpoints (each epoch, and see below) + the SavedModel, in the run directory")
    checkpoint_every_steps: int = key(0, "also a checkpoint every N global steps within epochs (0: at epoch "
                                      "ends only)", NOT_NEGATIVE)
    checkpoint_dir: Optional[str] = key(None, "null: <run dir>/checkpoints; on a real cluster, storage every "
                                        "task can read")
    keep_checkpoints: int = key(3, "the newest N checkpoints are kept; a resume falls back to an older one when the "
                                "newest cannot be read", POSITIVE)
    resume: Any = key(False, "true: go on from the latest checkpoint of the run in hydra.run.dir; auto: the "
                      "same if there is one, else start (for tasks an orchestrator restarts)",
                      one_of(False, True, "auto"))
    stop_on_nan: bool = key(True, "stop at the step the loss becomes NaN or infinite, keeping the last good "
                            "checkpoint")
    verbose: int = key(1, "0 silent, 1 progress bar, 2 one line per epoch", one_of(0, 1, 2))
    validate_every: int = key(0, "evaluate on the test data every N epochs and after the last, giving val_loss and "
                              "val_<metric> to the history, callbacks and TensorBoard (0: once, at the end)",
                              NOT_NEGATIVE)
    objective: str = key("test_accuracy", "the number of results.json a sweep's Optuna search optimises "
                         "(test_loss, test_<metric>, final_train_loss, examples_per_sec; set "
                         "hydra.sweeper.direction=minimize for a loss)")


def lr_factor(t) -> float:
    """The factor trainer.lr_scaling puts on trainer.learning_rate for the global batch."""
    ratio = t.batch_size / t.reference_batch_size
    return {"none": 1.0, "linear": ratio, "sqrt": math.sqrt(ratio)}[t.lr_scaling]


# ---- model ------------------------------------------------------------------------------------------

MODEL_PATH_DOC = ("a saved Keras model (.keras file or SavedModel directory, e.g. a run's saved_model) to go on "
                  "training instead of building one")


@dataclass
class Cnn:
    _target_: str = key("distrain.model.cnn", "the builder: called with input_shape, num_classes and the keys below")
    name: str = key("cnn", "the Keras simple MNIST convnet")
    dropout: float = key(0.5, "dropout rate before the last layer", FRACTION)
    path: Optional[str] = key(None, MODEL_PATH_DOC, example="outputs/DATE/TIME/saved_model")


@dataclass
class Mlp:
    _target_: str = key("distrain.model.mlp", "the builder: called with input_shape, num_classes and the keys below")
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


def labels_read(loss) -> str | None:
    """What the config's loss reads (LABELS), or None for a loss of the user's."""
    found = [s for s in SCHEMAS["loss"].values() if defaults(s)["_target_"] == loss.get("_target_")]
    return found[0].labels if found else None


@dataclass
class OwnLoss:
    """A loss of the user's own: `_target_` names a tf_keras Loss class; its other keys are its arguments."""
    _target_: Optional[str] = key(None, "the loss, module.Class: a tf_keras.losses.Loss, called with the node's other "
                                  "keys and reduction", TARGET, example="tf_keras.losses.LogCosh")


# ---- data -------------------------------------------------------------------------------------------

NUM_CLASSES = key(None, "classes (null: one more than the largest label)", POSITIVE, example=10)
VALIDATION_SPLIT = key(0.0, "the last fraction of the training examples, held out as validation data (as "
                       "fit(validation_split) does): trainer.validate_every evaluates on it instead of the test data",
                       FRACTION, example=0.2)
SHUFFLE_BUFFER = key(10000, "examples in the shuffle buffer (0: no shuffling, the examples in their order every "
                     "epoch, as fit(shuffle=False))", NOT_NEGATIVE)


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
    validation_split: float = key(0.0, "where there is no test/: the fraction of train/ held out for testing, "
                                  "seeded", FRACTION, example=0.2)
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
    num_classes: Optional[int] = NUM_CLASSES
    validation_split: float = VALIDATION_SPLIT


# ---- strategy ---------------------------------------------------------------------------------------

VIRTUAL = at_most(MAX_PER_CORE * CORES, f"{MAX_PER_CORE} per core on this machine's {CORES} cores")


@dataclass
class Strategy:
    name: str = key("default", "tf.distribute's default strategy: one device, TensorFlow's placement")
    cpu_virtual_devices: int = key(0, ">1 splits the CPU into N logical devices", VIRTUAL, example=2)


@dataclass
class OneDevice(Strategy):
    name: str = key("one_device", "OneDeviceStrategy: variables and compute on one device")
    device: str = key("/cpu:0", "the device, e.g. /cpu:0 or /gpu:0")


@dataclass
class Mirrored(Strategy):
    name: str = key("mirrored", "MirroredStrategy: one replica per device, gradients all-reduced")
    devices: Optional[List[str]] = key(None, "null: every GPU, else the (virtual) CPUs; or a list such as "
                                       "[/gpu:0,/gpu:1]", example="[/cpu:0,/cpu:1]")


@dataclass
class CentralStorage(Mirrored):
    name: str = key("central_storage", "CentralStorageStrategy: variables on one device, compute mirrored")
    parameter_device: str = key("/cpu:0", "where the variables live")


@dataclass
class MultiWorkerMirrored:
    name: str = key("multi_worker_mirrored", "MultiWorkerMirroredStrategy: synchronous SGD across workers")
    communication: Communication = key(Communication.auto, "auto, ring (gRPC, any device) or nccl (GPUs)")


@dataclass
class ParameterServer:
    name: str = key("parameter_server", "ParameterServerStrategy + ClusterCoordinator: asynchronous SGD")
    variable_partitioner: bool = key(False, "shard large variables across the ps tasks")
    min_shard_bytes: int = key(262144, "...into shards of at least this size", POSITIVE)
    max_shards: Optional[int] = key(None, "...and at most this many (null: one per ps task)", POSITIVE, example=2)
    steps_per_schedule: Optional[int] = key(None, "deprecated: use trainer.steps_per_execution", POSITIVE)


# ---- cluster ----------------------------------------------------------------------------------------

@dataclass
class Local:
    name: str = key("local", "the whole cluster on this machine, each task a process, ports picked free")
    workers: int = key(2, "worker tasks", POSITIVE)
    ps: int = key(1, "parameter-server tasks (strategy=parameter_server only)", NOT_NEGATIVE)
    evaluator: bool = key(False, "a sidecar evaluator task evaluates each epoch's checkpoint")
    threads_per_worker: Optional[int] = key(None, "TensorFlow threads per worker task (null: the cores shared "
                                            "among the workers)", POSITIVE, example=1)
    pin_workers: bool = key(False, "each worker on cores of its own (CPU affinity)")
    startup_timeout: float = key(60.0, "seconds for every task to come up, else stop with its log", SECONDS)
    peer_timeout: float = key(30.0, "seconds a task may stop answering mid-training (hung, frozen, cut off) "
                              "before the run fails naming it", SECONDS)
    isolate: Any = key("auto", "private network namespace: auto (if the platform allows), true (required), false",
                       one_of("auto", True, False))
    max_restarts: int = key(3, "restarts allowed within cluster.restart_window: of each parameter-server worker "
                            "(restarted alone), and of the whole cluster (from its checkpoint: a lost synchronous "
                            "worker, ps task or chief); 0: the first death ends the run", NOT_NEGATIVE)
    restart_window: float = key(3600.0, "seconds over which cluster.max_restarts counts restarts (older ones no "
                                "longer count, so a long run survives occasional losses); 0: ever",
                                Check(lambda v: math.isfinite(v) and v >= 0, "must be 0 (ever) or a number of seconds"))


@dataclass
class TfConfig:
    name: str = key("tf_config", "this process is one task of the cluster TF_CONFIG describes")
    startup_timeout: float = key(600.0, "seconds to wait for the other tasks, else stop naming them", SECONDS)
    peer_timeout: float = key(30.0, "seconds a task may stop answering mid-training (hung, frozen, cut off) "
                              "before the run fails naming it", SECONDS)


@dataclass
class Manual(TfConfig):
    name: str = key("manual", "the classic flags: this process is one task of the cluster they describe")
    worker_hosts: List[str] = key([], "worker addresses, e.g. [h1:2222,h2:2222]")
    ps_hosts: List[str] = key([], "parameter-server addresses")
    chief_host: Optional[str] = key(None, "the chief's address (parameter_server)", example="h4:2222")
    task_type: Optional[str] = key(None, "this task's role", one_of("chief", "worker", "ps"), example="worker")
    task_index: int = key(0, "this task's index in its role", NOT_NEGATIVE)


@dataclass
class Slurm(TfConfig):
    name: str = key("slurm", "this process is one task of a Slurm job step (srun): the cluster comes from Slurm")
    workers: Optional[int] = key(None, "workers (null: every Slurm task not otherwise used); a sweep with "
                                 "hydra/launcher=slurm asks Slurm for this many", POSITIVE, example=2)
    ps: int = key(0, "parameter_server: ps tasks; rank 0 is the chief, then the ps, then the workers",
                  NOT_NEGATIVE)
    evaluator: bool = key(False, "the last Slurm task is a sidecar evaluator of each checkpoint")
    port_base: int = key(23456, "a node's tasks listen on port_base + 100 x (job id mod 200), +1, ... (jobs "
                         "sharing a node do not collide)",
                         Check(lambda v: 1024 <= v <= 65000, "must be a port from 1024 to 65000"))


@dataclass
class Root:
    """The primary config: the groups' nodes are checked by their own schema."""
    strategy: Any = None
    model: Any = None
    data: Any = None
    trainer: Any = None
    cluster: Any = None
    optimizer: Any = None
    schedule: Any = None
    loss: Any = None
    metrics: Any = None  # {name: {_target_: a tf_keras metric class, its arguments}}: checked by checking.py
    callbacks: Any = None  # {name: {_target_: a tf_keras callback class, its arguments}}: the same


# group -> option -> schema. A YAML option extends one of these (its `defaults:` names it).
SCHEMAS = {
    "strategy": {"default": Strategy, "one_device": OneDevice, "mirrored": Mirrored,
                 "central_storage": CentralStorage, "multi_worker_mirrored": MultiWorkerMirrored,
                 "parameter_server": ParameterServer},
    "model": {"cnn": Cnn, "mlp": Mlp},
    "data": {"mnist": Data, "fashion_mnist": FashionMnist, "synthetic": Synthetic, "npz": Npz, "tfrecord": TFRecord,
             "images": Images},
    "trainer": {"default": Trainer},
    "optimizer": {"adam": Adam, "adamw": AdamW, "sgd": Sgd, "rmsprop": RMSprop},
    "schedule": {"constant": Constant, "cosine": Cosine, "exponential": Exponential, "piecewise": Piecewise},
    "loss": {"sparse_categorical_crossentropy": SparseCategoricalCrossentropy,
             "categorical_crossentropy": CategoricalCrossentropy, "binary_crossentropy": BinaryCrossentropy,
             "mean_squared_error": MeanSquaredError, "mean_absolute_error": MeanAbsoluteError, "huber": Huber},
    "cluster": {"local": Local, "tf_config": TfConfig, "manual": Manual, "slurm": Slurm},
}


# Groups whose options may be the user's own: a node with a `_target_` that is no built-in option's.
OWN = {"model": Builder, "data": Loader, "optimizer": OwnOptimizer, "schedule": OwnSchedule, "loss": OwnLoss}


def defaults(schema) -> dict:
    """An option's keys and their defaults, as plain values (enums as their names)."""
    return OmegaConf.to_container(OmegaConf.structured(schema), enum_to_str=True)


def register() -> None:
    """The options of the groups that name a class (OWN) are stored untyped: a preset or override that
    names another class with arguments of its own then composes, and checking.check() types what is
    the schema's and checks the rest against the class. The other groups stay typed while composing."""
    store = ConfigStore.instance()
    store.store(name="schema", node=Root)
    for group, options in SCHEMAS.items():
        for option, schema in options.items():
            store.store(group=f"schema/{group}", name=option, node=defaults(schema) if group in OWN else schema)


def label(node) -> str:
    """How results and summaries name a model or dataset: its name, else its builder's or loader's
    _target_, else (a saved model) its path."""
    return node.get("name") or node.get("_target_") or str(node.get("path"))


register()  # on import, as Hydra's structured configs are: the YAML options extend these
