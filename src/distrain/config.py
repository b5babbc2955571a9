"""Checks on the composed config that need no TensorFlow, so bad input fails in a second."""
import math
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

STRATEGIES = ("default", "one_device", "mirrored", "central_storage",
              "multi_worker_mirrored", "parameter_server")
MODELS = ("cnn", "mlp")
DATA_SOURCES = ("auto", "bundled", "keras", "idx", "synthetic")
OPTIMIZERS = ("adam", "sgd")
CLUSTER_STRATEGIES = ("multi_worker_mirrored", "parameter_server")


# ${distrain.mul:a,b} in a config: a times b, e.g. a global batch that grows with the workers
# (trainer.batch_size: ${distrain.mul:128,${cluster.workers}}) for weak-scaling sweeps.
OmegaConf.register_new_resolver("distrain.mul", lambda a, b: a * b, replace=True)


class ConfigError(Exception):
    """Bad input: the message is one line naming the problem and the fix."""


class Diverged(ConfigError):
    """The loss became NaN or infinite: training stops there, since going on cannot help."""


def _positive_int(value, key):
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{key}={value!r} must be a positive integer: set e.g. {key}=1")


def _choice(value, key, options):
    if value not in options:
        raise ConfigError(f"{key}={value!r} is not one of {', '.join(options)}: set e.g. {key}={options[0]}")


def configured_replicas(strategy: DictConfig, cluster: DictConfig):
    """Replicas implied by the config alone, or None when it depends on the GPUs present."""
    if strategy.name in ("default", "one_device", "parameter_server"):
        return 1
    if strategy.name == "multi_worker_mirrored":
        # one replica per worker on CPUs; GPUs (or a cluster from TF_CONFIG) are counted by the task
        return cluster.workers if cluster.name == "local" and not strategy.get("devices") else None
    if strategy.get("devices"):
        return len(strategy.devices)
    if strategy.get("cpu_virtual_devices", 0) > 1:
        return strategy.cpu_virtual_devices
    return None  # one replica per GPU present: the task checks once it sees the devices


def validate(cfg: DictConfig) -> None:
    t = cfg.trainer
    _choice(cfg.strategy.name, "strategy", STRATEGIES)
    _choice(cfg.model.name, "model", MODELS)
    _choice(cfg.data.source, "data.source", DATA_SOURCES)
    _choice(cfg.optimizer, "optimizer", OPTIMIZERS)
    for key in ("epochs", "batch_size", "steps_per_execution"):
        _positive_int(t[key], f"trainer.{key}")
    if t.checkpoint_every_steps != 0:
        _positive_int(t.checkpoint_every_steps, "trainer.checkpoint_every_steps")
    if isinstance(t.learning_rate, bool) or not isinstance(t.learning_rate, (int, float)) \
            or not math.isfinite(t.learning_rate) or t.learning_rate <= 0:
        raise ConfigError(f"trainer.learning_rate={t.learning_rate!r} must be a finite positive number: "
                          "set e.g. trainer.learning_rate=0.001")
    vdev = cfg.strategy.get("cpu_virtual_devices", 0)
    if isinstance(vdev, bool) or not isinstance(vdev, int) or vdev < 0:
        raise ConfigError(f"strategy.cpu_virtual_devices={vdev!r} must be 0 (off) or a positive "
                          "integer: set e.g. strategy.cpu_virtual_devices=2")
    devices = cfg.strategy.get("devices")
    if devices is not None and (isinstance(devices, str) or len(devices) == 0):
        raise ConfigError(f"strategy.devices={devices!r} must be a list of devices: "
                          "set e.g. 'strategy.devices=[/cpu:0,/cpu:1]'")
    # A source that does not hold the named dataset would train on one thing and report another.
    if cfg.data.source == "bundled" and cfg.data.name != "mnist":
        raise ConfigError(f"data.source=bundled holds MNIST digits, not {cfg.data.name}: "
                          f"set data=mnist, or another data.source for data={cfg.data.name}")
    if (cfg.data.source == "synthetic") != (cfg.data.name == "synthetic"):
        raise ConfigError(f"data.source={cfg.data.source} does not fit data={cfg.data.name}: "
                          "set data=synthetic for synthetic data, else drop the data.source override")
    if cfg.data.source == "idx" and not cfg.data.path:
        raise ConfigError("data.source=idx needs data.path: set data.path=/dir/with/idx-files")
    if cfg.data.source == "synthetic":
        _positive_int(cfg.data.train_examples, "data.train_examples")
        _positive_int(cfg.data.test_examples, "data.test_examples")
    if cfg.strategy.name == "multi_worker_mirrored":
        _choice(cfg.strategy.communication, "strategy.communication", ("auto", "ring", "nccl"))
    if cfg.strategy.name == "parameter_server":
        _positive_int(cfg.strategy.steps_per_schedule, "strategy.steps_per_schedule")
    if cfg.cluster.name == "local":
        _positive_int(cfg.cluster.workers, "cluster.workers")
        if cfg.cluster.ps < 0:
            raise ConfigError(f"cluster.ps={cfg.cluster.ps} must be 0 or more: set e.g. cluster.ps=1")
        if cfg.cluster.threads_per_worker is not None:
            _positive_int(cfg.cluster.threads_per_worker, "cluster.threads_per_worker")
        if cfg.cluster.isolate not in ("auto", True, False):
            raise ConfigError(f"cluster.isolate={cfg.cluster.isolate!r} must be auto, true or false: "
                              "set cluster.isolate=auto")
        if isinstance(cfg.cluster.max_restarts, bool) or not isinstance(cfg.cluster.max_restarts, int) \
                or cfg.cluster.max_restarts < 0:
            raise ConfigError(f"cluster.max_restarts={cfg.cluster.max_restarts!r} must be 0 or more: "
                              "set e.g. cluster.max_restarts=3")
        if cfg.cluster.startup_timeout <= 0:
            raise ConfigError(f"cluster.startup_timeout={cfg.cluster.startup_timeout} must be positive: "
                              "set e.g. cluster.startup_timeout=60")
        if cfg.cluster.evaluator and not t.save_model:
            raise ConfigError("cluster.evaluator=true evaluates the checkpoints that trainer.save_model=true "
                              "writes: set trainer.save_model=true")
        if cfg.strategy.name == "parameter_server" and cfg.cluster.ps < 1:
            raise ConfigError("strategy=parameter_server needs at least one ps task: set cluster.ps=1")
    check_batch_divides(t.batch_size, configured_replicas(cfg.strategy, cfg.cluster))


def check_batch_divides(batch_size: int, replicas) -> None:
    if replicas and batch_size % replicas:
        lower = batch_size - batch_size % replicas
        raise ConfigError(f"trainer.batch_size={batch_size} is the global batch and must divide evenly "
                          f"over {replicas} replicas: set trainer.batch_size={lower or replicas} "
                          f"or {lower + replicas}")


# What a resumed run may change: train longer, show more or less.
RESUME_MAY_CHANGE = ("trainer.epochs", "trainer.verbose", "trainer.resume")


def resumed(cfg: DictConfig, run_dir: Path, overrides: list) -> DictConfig:
    """trainer.resume=true: the config of the run in run_dir, which is authoritative; this command's
    overrides may only raise the epochs (or change verbosity), and one that contradicts the run is
    an error. Also checks that there is a checkpoint to resume from."""
    saved_path = Path(run_dir) / "config.yaml"
    if not saved_path.exists():
        raise ConfigError(f"trainer.resume=true but {run_dir} holds no earlier run (no config.yaml): "
                          "set hydra.run.dir to the run directory to resume, e.g. outputs/DATE/TIME")
    saved = OmegaConf.load(saved_path)
    changes = {}
    for override in overrides:
        key = override.split("=", 1)[0].lstrip("+~")
        if key.startswith("hydra"):
            continue
        if key in RESUME_MAY_CHANGE:
            changes[key] = OmegaConf.select(cfg, key)
            continue
        mine, theirs = OmegaConf.select(cfg, key), OmegaConf.select(saved, key)
        if isinstance(mine, DictConfig):  # a group choice such as model=mlp: compare the options' names
            mine, theirs = mine.get("name"), theirs.get("name") if isinstance(theirs, DictConfig) else theirs
        if mine != theirs:
            raise ConfigError(f"{override} contradicts the run being resumed, which has {theirs!r} there "
                              f"({saved_path}): drop the override, or start a new run without trainer.resume")
    merged = OmegaConf.merge(saved, {"trainer": {"resume": True}})
    for key, value in changes.items():
        OmegaConf.update(merged, key, value)
    directory = Path(merged.trainer.checkpoint_dir or Path(run_dir) / "checkpoints")
    if not (directory / "checkpoint").exists():
        raise ConfigError(f"trainer.resume=true but {directory} holds no checkpoint to resume from: "
                          "resume a run that saved one (trainer.save_model=true), or drop trainer.resume")
    return merged
