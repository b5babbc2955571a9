"""Where a run's figures go besides its directory: the logger group's options (conf/logger/), any of
them at once (`logger=[tensorboard,mlflow]`)."""
from dataclasses import dataclass, field
from typing import Any, Dict, Optional

from .keys import key


@dataclass
class TensorBoard:
    """its keys: trainer.tensorboard (when) and trainer.profile"""


@dataclass
class Csv:
    """metrics.csv in the run directory: a row per epoch"""


@dataclass
class Mlflow:
    """an MLflow run per run, logged by the launcher of the chief; docs/tracking.md"""
    tracking_uri: Optional[str] = key(None, "MLflow's tracking server or store (null: sqlite:///outputs/mlflow.db "
                                      "beside the runs, no server needed)", example="http://127.0.0.1:5000")
    experiment: Optional[str] = key(None, "the MLflow experiment (null: <data>-<model>, e.g. mnist-cnn)",
                                    example="digits")
    run_name: Optional[str] = key(None, "the MLflow run's name (null: the run directory's, e.g. 2026-11-28/13-05-00, "
                                  "or a sweep's job number)", example="baseline")
    tags: Dict[str, Any] = field(default_factory=dict, metadata={"doc": "tags of your own on the MLflow run",
                                                                  "check": None, "example": "{team: vision}"})
    log_model: bool = key(True, "the trained model as an MLflow model (pyfunc over the SavedModel)")


LOGGERS = {"tensorboard": TensorBoard, "csv": Csv, "mlflow": Mlflow}
