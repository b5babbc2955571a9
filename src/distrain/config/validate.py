"""Checks on the composed config that need no TensorFlow, so bad input fails in a second: each key
against its schema (schema/), then the checks that relate several keys."""
import importlib.machinery
import importlib.util
import os
import re
import sys
import sysconfig
import traceback
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from distrain.common import cpu
from distrain.common.errors import ConfigError
from distrain.common.rundir import RunDir
from distrain.common.topology import Topology
from distrain.config import schema, schema_check
from distrain.config.overrides import keys_of
from distrain.config.schema import StrategyName

# ${distrain.mul:a,b} in a config: a times b, e.g. a global batch that grows with the workers
# (trainer.batch_size: ${distrain.mul:128,${cluster.workers}}) for weak-scaling sweeps.
OmegaConf.register_new_resolver("distrain.mul", lambda a, b: a * b, replace=True)


def configured_replicas(strategy: DictConfig, topology: Topology):
    """Replicas implied by the config alone, or None when it depends on the GPUs present."""
    if strategy.name in (StrategyName.default, StrategyName.one_device) or topology.parameter_servers:
        return 1
    if topology.clustered:
        # one replica per worker on CPUs; GPUs (or a cluster from TF_CONFIG) are counted by the task
        return topology.workers if topology.local and not strategy.get("devices") else None
    if strategy.get("devices"):
        return len(strategy.devices)
    if strategy.get("cpu_virtual_devices", 0) > 1:
        return strategy.cpu_virtual_devices
    return None  # one replica per GPU present: the task checks once it sees the devices


def validate(cfg: DictConfig, model_code: bool = True) -> DictConfig:
    """The checked config (resolved, values of their schema's types), or a one-line ConfigError.
    model_code=False: the model's builder need not be importable (a run's SavedModel holds the model)."""
    cfg = _renamed(schema_check.check(cfg))
    for group in schema.OWN:
        if cfg[group].get("_target_") and (model_code or group != "model"):
            check_importable(f"{group}._target_", cfg[group]._target_)
    for group in ("metrics", "callbacks"):
        for name, entry in (cfg.get(group) or {}).items():
            if entry != "auto":
                check_importable(f"{group}.{name}._target_", entry._target_)
    check_data(cfg)
    check_loggers(cfg)
    check_monitors(cfg)
    check_metrics_fit_loss(cfg)
    check_trainer(cfg)
    topology = Topology.of(cfg)
    check_devices(cfg.strategy, cfg.trainer.jit_compile, topology.parameter_servers)
    check_service(cfg)
    if cfg.cluster.name == "local":
        check_local_cluster(cfg, topology)
    if not cfg.trainer.resume:  # (a run resumed at another size splits its global batch unevenly where need be)
        check_batch_divides(cfg.trainer.batch_size, configured_replicas(cfg.strategy, topology))
    check_devices_present(cfg.strategy)
    return cfg


def check_loggers(cfg) -> None:
    """A logger's library is installed (MLflow is an extra)."""
    if "mlflow" in cfg.logger and importlib.util.find_spec("mlflow") is None:
        raise ConfigError('logger=mlflow needs MLflow, which is not installed: pip install -e ".[mlflow]" '
                          "(or pip install mlflow), or choose another logger")


def check_data(cfg) -> None:
    """The data source holds the named dataset, has what it needs, and holds out what validation reads."""
    data = cfg.data
    # A source that does not hold the named dataset would train on one thing and report another.
    if data.source == "bundled" and data.name != "mnist":
        raise ConfigError(f"data.source=bundled holds MNIST digits, not {data.name}: "
                          f"set data=mnist, or another data.source for data={data.name}")
    if data.source != "loader" and (data.source == "synthetic") != (data.name == "synthetic"):
        raise ConfigError(f"data.source={data.source} does not fit data={data.name}: "
                          "set data=synthetic for synthetic data, else drop the data.source override")
    if data.source == "idx" and not data.path:
        raise ConfigError("data.source=idx needs data.path: set data.path=/dir/with/idx-files")
    if data.source == "npz" and not data.path:
        raise ConfigError("data=npz needs data.path: set data.path=mydata.npz (arrays x_train, y_train, x_test, "
                          "y_test)")
    split = data.get("validation_split")
    if split and data.source == "tfrecord":
        raise ConfigError(f"data.validation_split={split} holds out rows of arrays, not TFRecord records: write a "
                          "validation set as data.test_files, or drop data.validation_split")
    if split and data.source == "images":
        raise ConfigError(f"data.validation_split={split} holds out rows of arrays, not images: set data.test_split="
                          f"{split} to hold out part of train/ as the test data (which trainer.validate_every "
                          "evaluates on), or drop data.validation_split")
    if split and not cfg.trainer.validate_every:
        raise ConfigError(f"data.validation_split={split} holds out validation data, which only validation reads: "
                          "set trainer.validate_every=1 (or every N epochs), or drop data.validation_split")


# Keras wraps a variable in an AutoCastVariable under mixed precision, which takes no ShardedVariable.
UNSHARDABLE = "Keras's mixed precision cannot cast the variables strategy.variable_partitioner shards"


def check_trainer(cfg) -> None:
    """The schedule's warm-up, a model to go on training, the checkpoints' directory, the precision,
    accumulation."""
    t = cfg.trainer
    if t.get("accumulate_steps", 1) > 1 and cfg.strategy.name == StrategyName.parameter_server:
        raise ConfigError(f"trainer.accumulate_steps={t.accumulate_steps} applies to synchronous strategies: under "
                          "parameter servers each worker applies its own steps as it goes (asynchronous SGD), so no "
                          "global batch is there to accumulate; drop it, or raise trainer.batch_size")
    if t.mixed_precision is True and cfg.strategy.get("variable_partitioner"):
        raise ConfigError(f"trainer.mixed_precision=true cannot work with strategy.variable_partitioner=true "
                          f"({UNSHARDABLE}): set trainer.mixed_precision=auto (float32 then), or "
                          "strategy.variable_partitioner=false")
    if cfg.schedule.warmup_steps and cfg.schedule.warmup_epochs:
        raise ConfigError(f"schedule.warmup_steps={cfg.schedule.warmup_steps} and schedule.warmup_epochs="
                          f"{cfg.schedule.warmup_epochs} are both set: set one of them, the other 0")
    if cfg.model.get("path") and not Path(cfg.model.path).exists():
        raise ConfigError(f"model.path={cfg.model.path} does not exist: point it at a .keras file or a SavedModel "
                          "directory (a run's saved_model)")
    if t.checkpoint_dir:  # found at once, not after the first epoch of training
        directory = Path(t.checkpoint_dir)
        blocker = next((p for p in (directory, *directory.parents) if p.exists() and not p.is_dir()), None)
        if blocker:
            raise ConfigError(f"trainer.checkpoint_dir={t.checkpoint_dir} " + ("is a file" if blocker == directory
                              else f"lies under {blocker}, a file") + ": set trainer.checkpoint_dir to a "
                              "directory, or null for <run dir>/checkpoints")


def check_devices(strategy: DictConfig, jit_compile: bool, parameter_servers: bool) -> None:
    """strategy.devices names each device once, and XLA only where it can compile the step."""
    if jit_compile and parameter_servers:
        raise ConfigError("trainer.jit_compile=true cannot work under strategy=parameter_server: XLA cannot compile a "
                          "step whose variables live on ps tasks (TensorFlow's known XLA issue): set "
                          "trainer.jit_compile=false, or use strategy=multi_worker_mirrored")
    devices = strategy.get("devices")
    cpus = [d for d in devices or [] if "cpu" in d.lower()] or range(strategy.get("cpu_virtual_devices", 0))
    if jit_compile and len(cpus) > 1:
        raise ConfigError(f"trainer.jit_compile=true cannot work on several CPU devices under strategy="
                          f"{strategy.name}: TensorFlow's XLA runs every CPU replica on one device (plain Keras "
                          "fails the same way): set trainer.jit_compile=false (XLA is for GPUs)")
    if devices is not None and len(devices) == 0:
        raise ConfigError("strategy.devices=[] names no device: set e.g. 'strategy.devices=[/cpu:0,/cpu:1]', "
                          "or strategy.devices=null for every device")
    if devices and len(set(devices)) != len(devices):
        twice = next(d for d in devices if devices.count(d) > 1)
        raise ConfigError(f"strategy.devices=[{','.join(devices)}] names {twice} twice: set e.g. "
                          "'strategy.devices=[/cpu:0,/cpu:1]', each device once")


def check_local_cluster(cfg, topology: Topology) -> None:
    """A local cluster has its ps task, an evaluator has checkpoints, and the tasks fit the cores."""
    c = cfg.cluster
    if c.evaluator and not cfg.trainer.save_model:
        raise ConfigError("cluster.evaluator=true evaluates the checkpoints that trainer.save_model=true "
                          "writes: set trainer.save_model=true")
    if topology.parameter_servers and c.ps < 1:
        raise ConfigError("strategy=parameter_server needs at least one ps task: set cluster.ps=1")
    if c.get("min_workers") is not None:
        if cfg.strategy.name != StrategyName.multi_worker_mirrored:
            why = "parameter-server workers leave and rejoin by themselves" if topology.parameter_servers else \
                f"strategy={cfg.strategy.name} is one process, which has no workers to lose"
            raise ConfigError(f"cluster.min_workers={c.min_workers} applies to strategy=multi_worker_mirrored ({why}): "
                              "drop it")
        if c.min_workers > c.workers:
            raise ConfigError(f"cluster.min_workers={c.min_workers} is above cluster.workers={c.workers}: set it "
                              f"from 1 to {c.workers}")
    served = schema.service_workers(cfg.data)
    served += 1 if served else 0  # (and their dispatcher)
    tasks = topology.workers + topology.ps + served
    if tasks > schema.MAX_PER_CORE * schema.CORES:
        service = f" and data.service.workers={served - 1}" if served else ""
        raise ConfigError(f"cluster.workers={c.workers} with cluster.ps={c.ps}{service} is {tasks} tasks, more than "
                          f"{schema.MAX_PER_CORE} per core on this machine's {schema.CORES} cores: "
                          f"set fewer, e.g. cluster.workers={schema.CORES}")


def check_service(cfg) -> None:
    """The tf.data service: started here (data.service.workers, on a local cluster), or named."""
    service = cfg.data.get("service")
    if not service or not service.workers:
        return
    if service.address:
        raise ConfigError(f"data.service.workers={service.workers} starts a service and data.service.address names "
                          "one that runs: set one of them")
    if cfg.cluster.name not in ("local", "slurm"):  # (Slurm: its last ranks, as it does an evaluator)
        listed = "cluster.dispatcher_host and cluster.data_worker_hosts" if cfg.cluster.name == "manual" else \
            "dispatcher and data_worker tasks in the cluster"
        raise ConfigError(f"data.service.workers={service.workers} starts the service's tasks on this machine "
                          f"(cluster=local); with cluster={cfg.cluster.name}, list {listed}, or start them: "
                          "set data.service.address=grpc://host:port (docs/data_in_files.md)")


# /cpu:0, /GPU:1, /device:GPU:1, /job:localhost/replica:0/task:0/device:CPU:0: the names TensorFlow reads.
DEVICE = re.compile(r"(?:/job:\w+)?(?:/replica:\d+)?(?:/task:\d+)?/?(?:device:)?(cpu|gpu):(\d+)", re.IGNORECASE)


def missing_device(device: str, have: list[str]) -> str:
    return (f"device {device} is not on this machine (it has {', '.join(have)}): pick from those, or set "
            "strategy.cpu_virtual_devices=N for N CPU devices")


def check_devices_present(strategy: DictConfig) -> None:
    """A device the config names that this machine surely lacks, found before TensorFlow starts (seconds
    sooner): a GPU where no NVIDIA driver lists one, a CPU beyond strategy.cpu_virtual_devices. Where
    GPUs are present, and for names this does not read, the task checks with TensorFlow's own list."""
    if cpu.has_gpu():
        return
    have = [f"/cpu:{i}" for i in range(max(1, strategy.get("cpu_virtual_devices") or 0))]
    for name in [strategy.get("device"), strategy.get("parameter_device"), *(strategy.get("devices") or [])]:
        found = DEVICE.fullmatch(name or "")
        device = found and f"/{found[1].lower()}:{int(found[2])}"  # as TensorFlow names it
        if device and device not in have:
            raise ConfigError(missing_device(device, have))


# Metrics that read integer class labels, and the option of metrics that fits each other kind of labels.
CLASS_INDEX_METRICS = ("tf_keras.metrics.SparseCategoricalAccuracy", "tf_keras.metrics.SparseTopKCategoricalAccuracy",
                       "tf_keras.metrics.SparseCategoricalCrossentropy")
FITTING = {"one_hot": "categorical", "binary": "binary", "values": "regression"}


def check_metrics_fit_loss(cfg) -> None:
    """A metric of class indices beside a built-in loss of other labels would measure nonsense silently;
    data in files holds class indices, which a loss of other labels cannot read."""
    loss, labels = cfg.loss.get("name") or cfg.loss._target_, schema.labels_read(cfg.loss, cfg.data)
    for name, entry in (cfg.get("metrics") or {}).items():
        if labels in FITTING and entry != "auto" and entry.get("_target_") in CLASS_INDEX_METRICS:
            raise ConfigError(f"metrics.{name} ({entry._target_}) reads integer class labels, but loss={loss} reads "
                              f"other labels: set metrics={FITTING[labels]}, or remove it with ~metrics.{name}")
    if cfg.data.source in schema.FILE_SOURCES and labels not in (None, "classes"):
        raise ConfigError(f"data={cfg.data.source} holds integer class labels, which loss={loss} does not read: use "
                          "loss=sparse_categorical_crossentropy with data in files (other labels: data=npz or a loader "
                          "of your own)")


def metric_names(cfg) -> list:
    """The metrics a run logs: its entries, but for an `auto` accuracy that the loss's labels have none of."""
    labels = schema.labels_read(cfg.loss, cfg.data)
    return [name for name, entry in (cfg.get("metrics") or {}).items()
            if not (entry == "auto" and labels and schema.ACCURACY[labels] is None)]


def figures(cfg) -> tuple[list, list]:
    """(The numbers a run's results.json holds at its end, the figures it logs at each epoch's end: the
    loss, each metric and, validating, their val_*): what trainer.objective and a callback may name."""
    names = metric_names(cfg)
    at_end = ["test_loss", *(f"test_{name}" for name in names), "final_train_loss", "examples_per_sec",
              "steps_per_sec", "train_seconds"]
    per_epoch = ["loss", *names]
    return at_end, per_epoch + ([f"val_{name}" for name in per_epoch] if cfg.trainer.validate_every else [])


def check_objective(cfg, per_epoch: bool = False) -> None:
    """trainer.objective names a figure every run gives (a sweep's job: what it returns; a per-epoch
    figure's last value); per_epoch: one it gives at each epoch's end (what a pruner watches)."""
    at_end, each_epoch = figures(cfg)
    objective = cfg.trainer.objective
    if objective in each_epoch or (objective in at_end and not per_epoch):
        return
    if objective.startswith("val_") and objective[4:] in each_epoch:
        raise ConfigError(f"trainer.objective={objective} is a validation figure, which only validation gives: set "
                          "trainer.validate_every=1 (and data.validation_split=0.1 to hold out validation data)")
    if objective in at_end:
        raise ConfigError(f"trainer.objective={objective} is measured once, at the run's end, but a pruner watches "
                          f"a figure of every epoch: set trainer.objective to one of {', '.join(each_epoch)}")
    raise ConfigError(f"trainer.objective={objective} is not a figure of a run: set it to one of "
                      f"{', '.join([*each_epoch, *([] if per_epoch else at_end)])}")


def check_monitors(cfg) -> None:
    """A callback watching a quantity the run never logs would never act (Keras only warns, every epoch)."""
    logged = figures(cfg)[1]
    for name, entry in (cfg.get("callbacks") or {}).items():
        monitor = entry.get("monitor")
        if monitor is None or monitor in logged:
            continue
        if monitor.startswith("val_") and monitor[4:] in logged:
            raise ConfigError(f"callbacks.{name} monitors {monitor}, which only validation gives: set "
                              "trainer.validate_every=1 (or every N epochs)")
        raise ConfigError(f"callbacks.{name} monitors {monitor}, which the run does not log (it logs "
                          f"{', '.join(logged)}): set callbacks.{name}.monitor to one of them")


def check_importable(key: str, target: str) -> None:
    """The top module of a builder or loader can be found from here (this directory, PYTHONPATH, the
    installed packages) without importing it: a typo fails now, not once every task has started."""
    top = target.split(".")[0]
    if not importable(target):
        raise ConfigError(f"{key}={target}: there is no module {top} in this directory ({os.getcwd()}) or on "
                          f"PYTHONPATH: run from the directory that holds {top}.py, or add its directory to PYTHONPATH")


def importable(target: str) -> bool:
    """Whether the top module of `target` can be found from here, without importing it."""
    top = target.split(".")[0]
    return importlib.util.find_spec(top) is not None or \
        importlib.machinery.PathFinder.find_spec(top, [os.getcwd()]) is not None


def instantiate(key: str, node, fix: str, **kwargs):
    """hydra.utils.instantiate(node, **kwargs): a user's builder or loader, called with the node's other
    keys as plain Python values. Its failure is a ConfigError naming `key`, the cause and `fix`."""
    import hydra
    from hydra.errors import InstantiationException

    try:
        return hydra.utils.instantiate(node, **kwargs, _convert_="all")
    except InstantiationException as exc:
        mine = users_line(exc)  # (raised in the user's own code: where, which is what to fix)
        raise ConfigError(f"{key}={node._target_} failed ({reason(exc, node._target_)}"
                          f"{f', at {mine}' if mine else ''}): {'fix it there' if mine else fix}") from None


def instantiate_as(key: str, node, kind: type, fix: str, wrong: str, drop=(), **kwargs):
    """instantiate() of the node without its `drop` keys (distrain's, not the class's), which must give a
    `kind`: else a ConfigError, "KEY=TARGET returned TYPE, not WRONG"."""
    made = instantiate(key, OmegaConf.masked_copy(node, [k for k in node if k not in drop]), fix, **kwargs)
    if not isinstance(made, kind):
        raise ConfigError(f"{key}={node._target_} returned {type(made).__name__}, not {wrong}")
    return made


def root_cause(exc: BaseException) -> BaseException:
    while exc.__cause__ is not None:
        exc = exc.__cause__
    return exc


def reason(exc: BaseException, target: str = "") -> str:
    """The root cause of an exception, in one line: a builder's own error, or what `target` lacks."""
    exc = root_cause(exc)
    module, _, name = target.rpartition(".")
    if isinstance(exc, ImportError) and module:
        try:
            found = importlib.import_module(module)
        except ImportError:
            pass
        else:  # Hydra's message ("No module named 'mod.name'; 'mod' is not a package") hides this
            return f"module {module} ({found.__file__}) has no {name}"
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"[:300]


def users_line(exc: BaseException) -> str:
    """Where the root cause of exc was raised in the user's own code ("FILE:LINE in FUNCTION"), or ""."""
    paths = sysconfig.get_paths()  # Python's own code, and distrain's; installed packages: any *-packages path
    not_theirs = ("<", paths["stdlib"], paths["platstdlib"], str(Path(__file__).parents[1]))  # (distrain/)
    own = [frame for frame in traceback.extract_tb(root_cause(exc).__traceback__)
           if not frame.filename.startswith(not_theirs) and f"-packages{os.sep}" not in frame.filename]
    return f"{own[-1].filename}:{own[-1].lineno} in {own[-1].name}" if own else ""


_told = set()  # deprecation notices already printed by this process


MOVED = {"distrain.model.cnn": "distrain.task.model.cnn", "distrain.model.mlp": "distrain.task.model.mlp"}


def _renamed(cfg: DictConfig) -> DictConfig:
    """Old spellings still work: the built-in builders' names of runs made before they moved to
    distrain.task.model (a run's config.yaml, evaluated or resumed), and, with a notice,
    strategy.steps_per_schedule (parameter servers), which is trainer.steps_per_execution."""
    if cfg.model.get("_target_") in MOVED:
        cfg.model._target_ = MOVED[cfg.model._target_]
    old = cfg.strategy.get("steps_per_schedule")
    if old is None:
        return cfg
    if "steps_per_schedule" not in _told:
        _told.add("steps_per_schedule")
        print(f"warning: strategy.steps_per_schedule is deprecated: write trainer.steps_per_execution={old} "
              "instead (it means the same)", file=sys.stderr, flush=True)
    return OmegaConf.merge(cfg, {"trainer": {"steps_per_execution": old}, "strategy": {"steps_per_schedule": None}})


def check_batch_divides(batch_size: int, replicas) -> None:
    if replicas and batch_size % replicas:
        lower = batch_size - batch_size % replicas
        raise ConfigError(f"trainer.batch_size={batch_size} is the global batch and must divide evenly "
                          f"over {replicas} replicas: set trainer.batch_size={lower or replicas} "
                          f"or {lower + replicas}")


# What a resumed run may change: train longer, show more or less, on another number of workers or
# replicas (the global batch kept: trainer.batch_size may not change).
RESUME_MAY_CHANGE = ("trainer.epochs", "trainer.verbose", "trainer.resume", "trainer.keep_checkpoints",
                     "cluster.workers", "strategy.devices", "strategy.cpu_virtual_devices")


def resumed(cfg: DictConfig, run_dir: Path, overrides: list) -> DictConfig:
    """trainer.resume=true: the config of the run in run_dir, which is authoritative; this command's
    overrides may only raise the epochs, change verbosity or the number of workers or replicas
    (RESUME_MAY_CHANGE), and one that contradicts the run is an error. Also checks that there is a
    checkpoint to resume from.

    trainer.resume=auto (a task that an orchestrator may restart): the same if there is a checkpoint
    (the run's config.yaml authoritative if it has one, else this command's), else a new run."""
    saved_path = RunDir(run_dir).config
    saved = OmegaConf.load(saved_path) if saved_path.exists() else None
    if cfg.trainer.resume == "auto":
        if not RunDir(run_dir, saved or cfg).has_checkpoint():
            return OmegaConf.merge(cfg, {"trainer": {"resume": False}})
        if saved is None:
            return OmegaConf.merge(cfg, {"trainer": {"resume": True}})
    if saved is None:
        raise ConfigError(f"trainer.resume=true but {run_dir} holds no earlier run (no config.yaml): "
                          "set hydra.run.dir to the run directory to resume, e.g. outputs/DATE/TIME")
    check_same_run(cfg, saved, saved_path, overrides)
    merged = OmegaConf.merge(saved, {"trainer": {"resume": True}})
    for key in keys_of(overrides):
        if key in RESUME_MAY_CHANGE:
            OmegaConf.update(merged, key, OmegaConf.select(cfg, key))
    if not RunDir(run_dir, merged).has_checkpoint():
        raise ConfigError(f"trainer.resume=true but {RunDir(run_dir, merged).checkpoints} holds no checkpoint to "
                          "resume from: resume a run that saved one (trainer.save_model=true), or drop trainer.resume")
    return merged


def check_same_run(cfg: DictConfig, saved: DictConfig, saved_path: Path, overrides: list) -> None:
    """A ConfigError if one of this command's overrides contradicts the run whose config, `saved`, is at
    saved_path (but for the keys a resume may change)."""
    for override, key in zip(overrides, keys_of(overrides)):
        if key.startswith("hydra") or key in RESUME_MAY_CHANGE:
            continue
        mine, theirs = OmegaConf.select(cfg, key), OmegaConf.select(saved, key)
        if isinstance(mine, DictConfig):  # a group choice such as model=mlp: compare the options' names
            mine, theirs = schema.label(mine), schema.label(theirs) if isinstance(theirs, DictConfig) else theirs
        if mine != theirs:
            raise ConfigError(f"{override} contradicts the run being resumed, which has {theirs!r} there "
                              f"({saved_path}): drop the override, or start a new run without trainer.resume")

