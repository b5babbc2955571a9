"""What a task tells its launcher through its output, written and read here alone: the line saying
the task is up, and the line saying why it failed (which the launcher sends on to stderr)."""
import os

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
