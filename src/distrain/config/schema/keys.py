"""The language of the schema: a key (its default, meaning, range and an example), the ranges, and the
names a config compares against (data sources, strategies)."""
import math
import os
from dataclasses import field
from enum import StrEnum
from typing import Any, Callable, NamedTuple

from distrain.common.topology import CLUSTER_STRATEGIES, MWMS, PS, StrategyName  # noqa: F401 - the schema's names

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


# streamed from files (data/files.py, task/input_pipeline.py), never loaded
FILE_SOURCES = (DataSource.tfrecord, DataSource.images)


class Communication(StrEnum):  # str() and f-strings give the name
    auto = "auto"
    ring = "ring"
    nccl = "nccl"
