"""What the launcher and its tasks tell each other, spelled here alone: through a task's output, the
line saying it is up and the line saying why it failed (which the launcher sends on to stderr); through
the environment, the variables the launcher sets for its tasks."""
import os

# The environment a task inherits from its launcher (besides TF_CONFIG, TensorFlow's own).
STARTED = "DISTRAIN_STARTED"  # when the command (or a sweep's job) started: results.json's seconds_to_first_step
HEARTBEAT = "DISTRAIN_HEARTBEAT"  # the file whose time a task sets as it makes progress (process.Heartbeat)
SCRATCH = "DISTRAIN_SCRATCH"  # a run's directory for its tasks' temporary files (the launcher removes it)
# A local cluster's task: "1" the launcher restarts the cluster if a task dies, "0" it ends the run saying why
RESTARTS_CLUSTER = "DISTRAIN_RESTARTS_CLUSTER"
POSITION = "DISTRAIN_POSITION"  # the file where a task keeps the global step its training reached (stacks.py)
VERDICT = "DISTRAIN_VERDICT"  # the file where a pruned search's launcher writes the last epoch it let go on (trial.py)
STACKS = "DISTRAIN_STACKS"  # the file where a task dumps its Python stacks on SIGUSR1 (stacks.py)
# The tf.data service a run's local cluster runs (data.service.workers): its dispatcher, for the trainers;
# and, for each of its own tasks, which it is ({"type", "index", "address", "dispatcher"}: data_service.py)
DATA_SERVICE = "DISTRAIN_DATA_SERVICE"
SERVICE_TASK = "DISTRAIN_SERVICE_TASK"
ONEDNN_WHY = "DISTRAIN_ONEDNN_WHY"  # why the launcher chose the CPU kernels, for the task's announcement

READY = "ready at"
ERROR = "error:"


def say_ready(task) -> None:
    """`task TYPE:INDEX ready at ADDRESS (pid N)`: this task's server, or its strategy, is up."""
    print(f"task {task.type}:{task.index} {READY} {task.address} (pid {os.getpid()})", flush=True)


def is_ready(line: bytes) -> bool:
    return READY.encode() in line


def error_line(message) -> str:
    return f"{ERROR} {message}"


def is_error(line: str | bytes) -> bool:
    return line.startswith(ERROR.encode() if isinstance(line, bytes) else ERROR)
