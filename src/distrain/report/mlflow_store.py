"""Reaching MLflow's tracking store from the launcher: a server that takes a connection (asked before
MLflow is imported), the client, the experiment, and why a store failed in a few words. tracking.py logs
through it. No TensorFlow; MLflow is imported where a client is made (about 1 s)."""
import logging
import os
import re
from pathlib import Path

from distrain.common.errors import ConfigError, first_line


def connect(uri: str):
    """An MlflowClient of a store that answers, or a one-line ConfigError naming the URI (a server that
    refuses the connection: said before MLflow is imported, in a tenth of a second)."""
    for name, value in {"MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
                        "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
                        "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true"}.items():  # (our own line says where)
        os.environ.setdefault(name, value)  # (a server that is gone is said in seconds, not minutes)
    answers(uri)
    if uri.startswith("sqlite:///"):
        Path(uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    from mlflow.tracking import MlflowClient

    for name in ("mlflow", "alembic"):  # (after MLflow's import, which sets its own)
        logging.getLogger(name).setLevel(logging.WARNING)
    logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)  # (each retry: said once, below)

    client = MlflowClient(tracking_uri=uri)
    try:
        client.search_experiments(max_results=1)
    except Exception as exc:  # noqa: BLE001 - whatever the store raised, it cannot be used
        raise Unreachable.at(uri, short(exc)) from None
    return client


class Unreachable(ConfigError):
    """The store does not answer: bad input before a run (said in one line), a lost server once the run's
    tasks have started (a warning: Beside). why: the cause, in a few words."""

    def __init__(self, message: str, why: str):
        super().__init__(message)
        self.why = why

    @classmethod
    def at(cls, uri: str, why: str) -> "Unreachable":
        return cls(f"logger.mlflow.tracking_uri={uri} cannot be reached ({why}): start the server, or drop the key "
                   "for a store beside the runs that needs none (sqlite:///outputs/mlflow.db)", why)


def answers(uri: str) -> None:
    """An http(s) store's host takes a connection (else Unreachable, at once: MLflow's own client retries
    with back-off, seconds, before it says so)."""
    import socket
    from urllib.parse import urlsplit

    where = urlsplit(uri)
    if where.scheme not in ("http", "https") or not where.hostname:
        return
    try:
        socket.create_connection((where.hostname, where.port or (443 if where.scheme == "https" else 80)),
                                 timeout=5).close()
    except OSError as exc:
        why = exc.strerror or ("no answer within 5 s" if isinstance(exc, TimeoutError) else type(exc).__name__)
        raise Unreachable.at(uri, why) from None


def short(exc: Exception) -> str:
    """Why a store failed, in a few words: the connection's error, the HTTP status, else the error's first line."""
    text = str(exc)
    if found := re.search(r"\[Errno -?\d+\] ([^\"')(]+)", text):
        return found.group(1).strip().rstrip(".")
    if found := re.search(r"error code (\d+)", text):
        return f"it answers HTTP {found.group(1)}: is it an MLflow server?"
    return first_line(text)[:160] or type(exc).__name__


def experiment_id(client, name: str, uri: str) -> str:
    """The experiment's id, created where missing (a job side by side may create it meanwhile)."""
    from mlflow.exceptions import MlflowException

    found = client.get_experiment_by_name(name)
    if found is None:
        where = Path(uri.removeprefix("sqlite:///")).parent / "mlartifacts" if uri.startswith("sqlite:") else None
        try:
            return client.create_experiment(name, artifact_location=where.as_uri() if where else None)
        except MlflowException:
            found = client.get_experiment_by_name(name)
    if found is None or found.lifecycle_stage == "deleted":
        raise ConfigError(f"the MLflow experiment {name} is deleted: restore it (mlflow experiments restore "
                          f"--experiment-id ...), or set logger.mlflow.experiment to another name")
    return found.experiment_id
