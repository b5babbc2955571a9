"""The config schema: every key of every group option, with its type, default, range and meaning.

keys.py is its language (a key, the ranges, the names configs compare against); run.py declares how a
run runs (trainer, strategy, cluster); task.py what it learns (model, data, optimizer, schedule, loss);
logger.py where its figures go besides its directory.
Each option is registered here in Hydra's ConfigStore as `schema/<group>/<option>`, and the YAML file
of that option (conf/<group>/<option>.yaml) extends it. schema_check.py checks a composed config against
it and explains what it refuses (and lists the keys for --help); checks that relate several keys live
in validate.py. No TensorFlow here: bad input fails in about a second.
"""
from dataclasses import dataclass
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from .keys import CLUSTER_STRATEGIES, CORES, FILE_SOURCES, MAX_PER_CORE, MWMS, PS, TARGET, DataSource, StrategyName
from .logger import LOGGERS, Mlflow
from .run import (
    CentralStorage,
    Local,
    Manual,
    Mirrored,
    MultiWorkerMirrored,
    OneDevice,
    ParameterServer,
    Slurm,
    Strategy,
    TfConfig,
    Trainer,
    lr_factor,
    update_batch,
)
from .task import (
    ACCURACY,
    LABELS,
    Adam,
    AdamW,
    BinaryCrossentropy,
    Builder,
    CategoricalCrossentropy,
    Cnn,
    Constant,
    Cosine,
    Data,
    Exponential,
    FashionMnist,
    Huber,
    Images,
    Loader,
    MeanAbsoluteError,
    MeanSquaredError,
    Mlp,
    Npz,
    OwnLoss,
    OwnOptimizer,
    OwnSchedule,
    Piecewise,
    RMSprop,
    Sgd,
    SparseCategoricalCrossentropy,
    Synthetic,
    TFRecord,
    service_workers,
)


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
    metrics: Any = None  # {name: {_target_: a tf_keras metric class, its arguments}}: checked by schema_check.py
    callbacks: Any = None  # {name: {_target_: a tf_keras callback class, its arguments}}: the same
    logger: Any = None  # {name: its keys}, names of LOGGERS: checked by schema_check.py


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
    for option, schema in LOGGERS.items():
        store.store(group="schema/logger", name=option, node=schema)


# What each built-in loss reads, by its class.
LOSS_LABELS = {defaults(schema)["_target_"]: schema.labels for schema in SCHEMAS["loss"].values()}


def labels_read(loss, data=None) -> str | None:
    """What the config's loss reads (LABELS); for a loss of the user's, class indices where data.num_classes
    counts the classes, else None: the labels themselves decide (data.labels_of)."""
    if loss.get("_target_") in LOSS_LABELS:
        return LOSS_LABELS[loss.get("_target_")]
    return "classes" if data is not None and data.get("num_classes") else None


def label(node) -> str:
    """How results and summaries name a model or dataset: its name, else its builder's or loader's
    _target_, else (a saved model) its path."""
    return node.get("name") or node.get("_target_") or str(node.get("path"))


register()  # on import, as Hydra's structured configs are: the YAML options extend these
