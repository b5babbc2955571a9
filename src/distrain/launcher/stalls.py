"""The launcher's view of where its tasks are: each task's Python stacks (all threads) and the global step
it reached (common/stacks.py, in the task, answers), written into its log when the launcher finds the run
stalled (a training task's step stands still for half of cluster.peer_timeout: before TensorFlow's own
timeout restarts or stops it), and on demand by `distrain stacks RUN_DIR` for a run that is still going.
A task that does not answer within a second (frozen, stopped, or gone) is the one that stopped answering.

Runs in the launcher (supervisor.run_tasks looks each time round its loop) and in `distrain stacks`.
"""
import logging
import os
import re
import signal
import sys
import time
from pathlib import Path

from distrain.common.errors import print_error
from distrain.common.storage import write_atomic

ANSWER_SECONDS = 1.0  # for the tasks' dumps
WAIT_SECONDS = 10.0  # `distrain stacks`: for the launcher's answer (it looks every 0.1 s)
REQUEST, ANSWER = ".stacks-request", "stacks.txt"  # `distrain stacks`: in the run directory's logs/
log = logging.getLogger("distrain")
USAGE = "distrain stacks RUN_DIR   (the Python stacks and step of each task of a running run)"


def is_dump(line: str) -> bool:
    """A line of a stacks dump in a task's log (faulthandler's frames: "line N in f", where a Python
    traceback says "line N, in f"), or of its header."""
    return bool(re.match(r'  File ".*", line \d+ in |(Current thread|Thread) 0x|--- Python stacks at |\(no answer',
                         line))


def step_of(position: Path) -> int | None:
    try:
        return int(position.read_text())
    except (OSError, ValueError):
        return None


def dump(tasks: list) -> dict:
    """Ask every live task for its stacks; {task name: (its step, its stacks, or "" where it did not
    answer within ANSWER_SECONDS)}."""
    asked = {}
    for task in tasks:
        if task.proc and task.proc.poll() is None and task.stacks_path:
            Path(task.stacks_path).write_text("")
            try:
                os.kill(task.proc.pid, signal.SIGUSR1)
            except ProcessLookupError:
                continue
            asked[task.name] = task
    deadline = time.monotonic() + ANSWER_SECONDS
    while time.monotonic() < deadline and not all(_read(t.stacks_path) for t in asked.values()):
        time.sleep(0.05)
    time.sleep(0.1)  # (the last lines of a dump under way)
    return {name: (step_of(task.position_path), _read(task.stacks_path)) for name, task in asked.items()}


def _read(path) -> str:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return ""


def where(stacks: str, peers: str) -> str:
    """Where the main thread of a dump waits, in words: the innermost frame of distrain's own code. peers:
    what the task's steps wait for besides its own work: "workers" (synchronous peers: the all-reduces), "ps"
    (a coordinator: the workers' steps) or "none" (one process)."""
    threads = re.split(r"\n(?=(?:Current thread|Thread) 0x)", stacks)
    task_main = re.escape(os.path.join("task", "main.py"))
    main = next((t for t in threads if re.search(rf'{re.escape(os.sep)}{task_main}", line \d+ in main', t)), threads[0])
    frames = re.findall(r'File "([^"]+)", line (\d+) in (\S+)', main)
    ours = [(Path(f).name, line, func) for f, line, func in frames if f"{os.sep}distrain{os.sep}" in f]
    if not ours:
        return f"is in {frames[0][2]}" if frames else "is somewhere without a Python frame"
    name, line, func = ours[0]  # (faulthandler lists the most recent call first)
    if name == "runners.py" and func == "run":
        return {"workers": "waits in a training step (the gradients' all-reduce, waiting for its peers)",
                "ps": "is waiting for the workers' steps"}.get(peers, "is in a training step")
    if name == "runners.py" and func == "across_workers":
        return "waits in the epoch's all-reduce of the metric sums (waiting for its peers)" if peers == "workers" \
            else "is summing the epoch's metrics"
    if name == "checkpoints.py":
        return "is saving a checkpoint"
    if name == "training.py" and func in ("keras_evaluate", "on_a_copy"):
        return "is evaluating"
    if name == "main.py" and func == "serve":
        return "serves (a ps or worker server)"
    return f"is in {func} ({name}:{line})"


def summary(found: dict, peers: str) -> str:
    """One line: what each task does (peers: as where() takes it), the ones that did not answer first."""
    at = lambda step: f" at step {step}" if step is not None else ""
    silent = [f"{name} stopped answering{at(step)}" for name, (step, stacks) in found.items() if not stacks.strip()]
    busy = [f"{name} {where(stacks, peers)}{at(step)}" for name, (step, stacks) in found.items()
            if stacks.strip()]
    return "; ".join(silent + busy)


def record(found: dict, logs: dict, why: str) -> str:
    """Each task's stacks into its log (logs: name -> a writer of bytes), under a header saying why."""
    stamp = time.strftime("%H:%M:%S")
    for name, (step, stacks) in found.items():
        header = f"--- Python stacks at {stamp} ({why}), step {step if step is not None else 'unknown'} ---\n"
        logs[name]((header + (stacks or "(no answer: the process is stopped, frozen or gone)\n")).encode())
    return stamp


def standing_still(task) -> float:
    """The time of a task's training's last step where that step stands still for longer than its
    stall_after (and was not reported yet), else 0. task: a supervisor.TaskProcess."""
    try:
        moved = task.position_path.stat().st_mtime
    except (AttributeError, FileNotFoundError):  # not training (yet, or any more)
        return 0.0
    if task.stall_after and moved != task.stall_seen and time.time() - moved > task.stall_after:
        return moved
    return 0.0


def _log_writer(path: Path):
    """A writer of the launcher's lines (the stacks) into a task's log."""
    def write(data: bytes) -> None:
        try:
            with open(path, "ab") as log_file:
                log_file.write(data)
        except OSError as exc:
            log.warning("cannot write %s (%s)", path, exc.strerror or exc)
    return write


def look(tasks: list, run) -> None:
    """Every task's stacks into its log, and a line saying where each is, when a training task's step
    stands still, or when `distrain stacks` asks (then into logs/stacks.txt as well). The launcher looks
    each time round its loop (supervisor.run_tasks)."""
    still = [(task, moved) for task in tasks if (moved := standing_still(task))]  # (supervisor.TaskProcess)
    asked = (run.logs / REQUEST).exists()
    if not still and not asked:
        return
    for task, moved in still:
        task.stall_seen = moved
    why = "asked by distrain stacks" if asked else \
        f"no training step for {still[0][0].stall_after:g} s: half of cluster.peer_timeout"
    found = dump(tasks)
    stamp = record(found, {t.name: _log_writer(t.log_path) for t in tasks}, why)
    peers = "ps" if any(t.task and t.task.type == "ps" for t in tasks) else "workers" if len(tasks) > 1 else "none"
    said = summary(found, peers)
    if asked:
        text = [f"{stamp}: {said}", ""] + [f"--- {name} (step {step}) ---\n{stack or '(no answer)'}"
                                           for name, (step, stack) in found.items()]
        write_atomic(run.logs / ANSWER, "\n".join(text) + "\n")
    else:
        for task in tasks:
            task.end_line()
        log.warning("stalled: %s (their Python stacks are in their logs)", said)


# ---- `distrain stacks RUN_DIR` -------------------------------------------------------------------------

def main(argv: list) -> int:
    """Ask a running run's launcher for every task's stacks, and print them."""
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    from distrain.common.rundir import RunDir

    run = RunDir(Path(argv[0]))
    if not run.config.exists():
        print_error(f"{argv[0]} holds no distrain run (no config.yaml): give the run directory (outputs/DATE/TIME)")
        return 2
    state = run.ended()
    if state not in (None, "running"):
        print_error(f"the run in {argv[0]} has ended ({state}): stacks are of a run still going; its logs are in "
                    f"{run.logs}")
        return 2
    request, answer = run.logs / REQUEST, run.logs / ANSWER
    answer.unlink(missing_ok=True)
    request.write_text(str(os.getpid()))
    deadline = time.monotonic() + WAIT_SECONDS
    while time.monotonic() < deadline and not answer.exists():
        time.sleep(0.1)
    request.unlink(missing_ok=True)
    if not answer.exists():
        print_error(f"no launcher answered for the run in {argv[0]} within {WAIT_SECONDS:g} s: it is not running "
                    "(killed?), or runs on another machine: run distrain stacks there")
        return 2
    sys.stdout.write(answer.read_text())
    return 0
