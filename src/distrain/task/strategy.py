"""Strategy name -> tf.distribute strategy, and the device set-up that must precede it."""
import tensorflow as tf

from distrain.common import cpu as cpu_lib
from distrain.common import private
from distrain.common.errors import ConfigError
from distrain.config.schema import MWMS, PS, StrategyName
from distrain.config.validate import UNSHARDABLE, missing_device


def configure_devices(strategy_cfg, gpus=None) -> None:
    """Settings the runtime accepts only before it starts: call first thing in a process.
    gpus: the physical GPUs (TensorFlow's list by default; a test passes its own)."""
    n = strategy_cfg.get("cpu_virtual_devices", 0)
    try:
        for gpu in tf.config.list_physical_devices("GPU") if gpus is None else gpus:
            tf.config.experimental.set_memory_growth(gpu, True)  # share the card instead of grabbing it
        if n > 1:
            cpu = tf.config.list_physical_devices("CPU")[0]
            tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * n)
    except RuntimeError:  # the runtime already started in this process: fine if it matches
        if n > 1 and len(tf.config.list_logical_devices("CPU")) != n:
            raise ConfigError(f"strategy.cpu_virtual_devices={n} cannot be applied: TensorFlow already "
                              "started in this process; run each training in a fresh process") from None


def _canonical(device: str) -> str:
    try:
        spec = tf.DeviceSpec.from_string(device)
    except (ValueError, TypeError):
        raise ConfigError(f"device {device!r} is not a device name: write e.g. /cpu:0 or /gpu:1") from None
    return f"/{(spec.device_type or 'CPU').lower()}:{spec.device_index or 0}"


def local_devices() -> list[str]:
    return [_canonical(d.name) for d in tf.config.list_logical_devices() if d.device_type in ("CPU", "GPU")]


def _checked(devices, have: list[str] | None = None) -> list[str]:
    have = local_devices() if have is None else have
    for device in map(_canonical, devices):
        if device not in have:
            raise ConfigError(missing_device(device, have))
    return [_canonical(d) for d in devices]


def compute_devices(strategy_cfg, have: list[str] | None = None) -> list[str]:
    """Replica devices: the explicit list, else the virtual CPUs asked for, else every GPU, else the CPU.
    have: this machine's devices (/cpu:0, /gpu:0, ...; TensorFlow's list by default, a test passes its own)."""
    have = local_devices() if have is None else have
    if strategy_cfg.get("devices"):
        return _checked(strategy_cfg.devices, have)
    kind = "/cpu" if strategy_cfg.get("cpu_virtual_devices", 0) > 1 else "/gpu"
    return [d for d in have if d.startswith(kind)] or ["/cpu:0"]


def precision_policy(setting, gpus: list[tuple] | None = None, cpu: set[str] | None = None,
                     sharded: bool = False) -> tuple[str, str]:
    """The Keras dtype policy for trainer.mixed_precision (false, true or auto), and why.
    gpus: each GPU's compute capability, e.g. (8, 0); cpu: the CPU's feature flags. By default this
    machine's; a test passes its own. sharded: strategy.variable_partitioner is on (true is refused
    then, config.check_trainer)."""
    gpus = gpu_capabilities() if gpus is None else gpus
    cpu = cpu_lib.flags() if cpu is None else cpu
    if setting is False:
        return "float32", "trainer.mixed_precision=false"
    if sharded:
        return "float32", f"trainer.mixed_precision={str(setting).lower()}: {UNSHARDABLE}"
    if gpus:  # float16 needs loss scaling; tensor cores (compute capability 7.0 and up) make it fast
        if setting is True or min(gpus) >= (7, 0):
            return "mixed_float16", f"trainer.mixed_precision={str(setting).lower()}, GPUs of compute capability " \
                   + ", ".join(f"{a}.{b}" for a, b in gpus)
        return "float32", f"trainer.mixed_precision=auto: a GPU of compute capability {min(gpus)[0]}.{min(gpus)[1]} " \
               "has no tensor cores"
    native = [flag for flag in cpu_lib.NATIVE_BFLOAT16 if flag in cpu]
    if setting is True or native:
        return "mixed_bfloat16", f"trainer.mixed_precision={str(setting).lower()}, " + \
            (f"the CPU has native bfloat16 ({', '.join(native)})" if native else "the CPU emulates bfloat16 (slow)")
    return "float32", "trainer.mixed_precision=auto: the CPU has no native bfloat16 (AVX512_BF16 or AMX)"


def gpu_capabilities() -> list[tuple]:
    return [tuple(tf.config.experimental.get_device_details(gpu).get("compute_capability") or (0, 0))
            for gpu in tf.config.list_physical_devices("GPU")]


def gpu_peak_mib() -> dict:
    """Each GPU's peak memory in this process, in MiB, by device ({} without GPUs)."""
    return {f"GPU:{i}": round(tf.config.experimental.get_memory_info(f"GPU:{i}")["peak"] / 2 ** 20, 1)
            for i in range(len(tf.config.list_logical_devices("GPU")))}


def make_strategy(strategy_cfg, context=None, peer_timeout: float | None = None) -> tf.distribute.Strategy:
    """Cluster strategies take this task's place in the cluster from its context (context.RunContext).
    peer_timeout: seconds after which a multi-worker mirrored peer that stopped answering fails the run."""
    name = strategy_cfg.name
    if name == StrategyName.default:
        return tf.distribute.get_strategy()
    if name == StrategyName.one_device:
        return tf.distribute.OneDeviceStrategy(_checked([strategy_cfg.device])[0])
    if name == StrategyName.mirrored:
        return tf.distribute.MirroredStrategy(compute_devices(strategy_cfg))
    if name == StrategyName.central_storage:
        return tf.distribute.experimental.CentralStorageStrategy(
            compute_devices(strategy_cfg), parameter_device=_checked([strategy_cfg.parameter_device])[0])
    if name == MWMS:
        resolver = context.resolver()
        if peer_timeout:
            watch_heartbeats(resolver.cluster_spec(), peer_timeout)
        implementation = getattr(tf.distribute.experimental.CommunicationImplementation,
                                 strategy_cfg.communication.upper())
        return tf.distribute.MultiWorkerMirroredStrategy(
            resolver,
            communication_options=tf.distribute.experimental.CommunicationOptions(implementation=implementation))
    if name == PS:
        partitioner = None
        if strategy_cfg.variable_partitioner:
            partitioner = tf.distribute.experimental.partitioners.MinSizePartitioner(
                min_shard_bytes=strategy_cfg.min_shard_bytes, max_shards=strategy_cfg.max_shards or context.topology.ps)
        return tf.distribute.ParameterServerStrategy(context.resolver(), variable_partitioner=partitioner)
    raise ConfigError(f"strategy={name} is unknown: use one of the options that --help lists")


def watch_heartbeats(cluster_spec, seconds: float) -> None:
    """The coordination service that MultiWorkerMirroredStrategy starts, set up as it does but with
    our heartbeat timeout: a worker that stops answering (hung, frozen, cut off) aborts the
    collectives of the others after that long. TensorFlow has no public setting for it; the strategy
    keeps a service configured before it is built."""
    coordination_config_pb2, multi_worker_util = private.get("coordination_config"), private.get("multi_worker_util")
    context = private.get("eager_context")

    jobs = [coordination_config_pb2.CoordinatedJob(name=job, num_tasks=cluster_spec.num_tasks(job))
            for job in ("chief", "worker") if job in cluster_spec.jobs]
    context.context().configure_coordination_service(
        service_type="standalone", service_leader=multi_worker_util.coordination_leader(cluster_spec),
        coordinated_jobs=jobs, heartbeat_timeout_in_ms=int(seconds * 1000))


def replica_devices(strategy) -> list[str]:
    """The devices the replicas run on (the default strategy does not say: it is TensorFlow's pick)."""
    try:
        return list(strategy.extended.worker_devices)
    except RuntimeError:
        return [next((d for d in local_devices() if d.startswith("/gpu")), "/cpu:0")]
