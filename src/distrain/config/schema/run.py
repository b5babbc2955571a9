"""How a run runs: the trainer, strategy and cluster groups' keys."""
import math
from dataclasses import dataclass
from typing import Any, List, Optional

from .keys import (
    CORES,
    FINITE_POSITIVE,
    MAX_PER_CORE,
    NOT_NEGATIVE,
    POSITIVE,
    SECONDS,
    SEED,
    Check,
    Communication,
    at_most,
    key,
    one_of,
)

# ---- trainer ----------------------------------------------------------------------------------------

@dataclass
class Trainer:
    epochs: int = key(12, "passes over the training data", POSITIVE)
    batch_size: int = key(128, "GLOBAL batch: each of N replicas gets batch_size / N", POSITIVE)
    accumulate_steps: int = key(1, "one optimizer update per this many batches, their gradients summed on each "
                                "replica and all-reduced once: the update of a batch this many times larger "
                                "(synchronous strategies)", POSITIVE, example=4)
    steps_per_epoch: Optional[int] = key(None, "global steps an epoch (null: one pass over the training data); "
                                         "for data larger than a pass should take", POSITIVE, example=1000)
    learning_rate: float = key(0.002, "the learning rate (the schedule's initial one), for "
                               "trainer.reference_batch_size under trainer.lr_scaling", FINITE_POSITIVE)
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
                           "session of the HParams dashboard; auto: on in sweeps (-m), off for single runs; "
                           "off where the logger group leaves tensorboard out",
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
    time_split: bool = key(True, "measure where the training time goes: waiting for input, computing, communicating "
                           "(results.json time_split and bound; docs/outputs.md says how)")
    profile: Optional[List[int]] = key(None, "[START,END]: a TensorFlow profiler trace of global steps START to END on "
                                       "every training task, in <run dir>/tensorboard/<task> (TensorBoard's Profile "
                                       "tab: pip install tensorboard-plugin-profile)",
                                       Check(lambda v: v is None or (len(v) == 2 and 0 <= v[0] < v[1]),
                                             "must be [START,END], two global steps with 0 <= START < END"),
                                       example="[100,120]")
    objective: str = key("test_accuracy", "the figure a sweep's Optuna search optimises: a number of results.json "
                         "(test_loss, test_<metric>, final_train_loss, examples_per_sec) or of each epoch (loss, "
                         "val_accuracy: its last value, and what a pruner watches); hparams_search=optuna sets "
                         "val_accuracy. hydra.sweeper.direction=minimize for a loss")


def update_batch(t) -> int:
    """The examples of one optimizer update: trainer.batch_size times trainer.accumulate_steps."""
    return t.batch_size * (t.get("accumulate_steps") or 1)


def lr_factor(t) -> float:
    """The factor trainer.lr_scaling puts on trainer.learning_rate for the global batch (of an update)."""
    ratio = update_batch(t) / t.reference_batch_size
    return {"none": 1.0, "linear": ratio, "sqrt": math.sqrt(ratio)}[t.lr_scaling]


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
    min_workers: Optional[int] = key(None, "multi_worker_mirrored: the fewest workers it goes on with when one is "
                                     "lost for good, from its latest checkpoint, the global batch kept (null: "
                                     "cluster.workers: such a loss ends the run)", POSITIVE, example=1)
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
    dispatcher_host: Optional[str] = key(None, "the tf.data service's dispatcher's address (data.service)",
                                         example="h5:5050")
    data_worker_hosts: List[str] = key([], "the tf.data service's data workers' addresses (data.service)")
    task_type: Optional[str] = key(None, "this task's role",
                                   one_of("chief", "worker", "ps", "dispatcher", "data_worker"), example="worker")
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
