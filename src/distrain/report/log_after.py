"""`distrain log DIR... [logger.mlflow.KEY=VALUE ...]`: finished runs and sweeps into MLflow after the
fact, from what their directories hold, as tracking.py logs them live (a sweep: its parent run, then a
run nested in it per job). A run logged there already is said, not logged again. Runs in the command's
process (no TensorFlow)."""
import sys
from pathlib import Path

from distrain.common.errors import ConfigError, print_error
from distrain.common.rundir import RunDir
from distrain.config import schema
from distrain.config.overrides import split
from distrain.report.tracking import Tracked, TrackedSweep, made


def main(argv: list) -> int:
    """`distrain log DIR... [logger.mlflow.KEY=VALUE ...]`: finished runs and sweeps into MLflow, from
    what their directories hold; one already logged there is said, not logged again."""
    import yaml

    dirs, overrides = [a for a in argv if "=" not in a], [a for a in argv if "=" in a and a != "logger=mlflow"]
    if not dirs or {"-h", "--help"} & set(argv):
        print("usage: distrain log RUN_OR_SWEEP_DIR... [logger.mlflow.tracking_uri=URI logger.mlflow.experiment=NAME]",
              file=sys.stderr)
        return 2
    keys = {}
    for override in overrides:
        key, value = split(override)
        name = key.removeprefix("logger.mlflow.")
        if not key.startswith("logger.mlflow.") or name not in schema.Mlflow.__dataclass_fields__:
            print_error(f"{override} is not a key of logger.mlflow ({', '.join(schema.Mlflow.__dataclass_fields__)}):"
                        " set e.g. logger.mlflow.tracking_uri=http://127.0.0.1:5000")
            return 2
        keys[name] = yaml.safe_load(value)
    try:
        for path in map(Path, dirs):
            _log_after(path, keys)
    except ConfigError as exc:
        print_error(exc)
        return 2
    return 0


def _log_after(path: Path, keys: dict) -> None:
    run = RunDir(path)
    jobs = sorted((p.parent for p in path.glob("*/config.yaml")), key=lambda p: (len(p.name), p.name))
    if not run.config.exists() and not jobs:
        raise ConfigError(f"{path} holds no run or sweep (no config.yaml): give a run's directory "
                          "(outputs/DATE/TIME) or a sweep's (multirun/DATE/TIME)")
    if run.config.exists():
        _log_run(run, keys)
        return
    first = _with(RunDir(jobs[0]).read_config(), keys)
    parent = made(TrackedSweep, run, {**first, "sweep": {}}, "/".join(path.parts[-2:]))
    for job in jobs:
        _log_run(RunDir(job), keys, parent.state)
    if not parent.state.get("finished"):
        parent.finish()


def _with(config: dict | None, keys: dict) -> dict:
    config = dict(config or {})
    logger = dict(config.get("logger") or {})
    logger["mlflow"] = {**(logger.get("mlflow") or {}), **keys}
    return {**config, "logger": logger}


def _log_run(run: RunDir, keys: dict, parent: dict | None = None) -> None:
    status = run.read_status()
    name = f"#{status['job']}" + (f" ({status['swept']})" if status.get("swept") else "") \
        if "job" in status else "/".join(run.path.parts[-2:])
    tracked = made(Tracked, run, _with(run.read_config(), keys), name, parent)
    if tracked.state.get("finished"):
        print(f"{run}: logged already ({tracked.where()})", flush=True)
        return
    tracked.finish()
    print(f"{run}: {tracked.where()}", flush=True)
