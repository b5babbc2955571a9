"""Memory and CPU per task: the kernel's own record of a task process's peak resident memory (VmHWM in
/proc/PID/status) and CPU time (/proc/PID/stat), which the launcher reads while the task runs, and
whether a task the kernel killed ran out of memory (the kernel's count of the processes it killed for
memory, /proc/vmstat oom_kill, which counts a cgroup's own limit too)."""
import os
from pathlib import Path

from distrain.launcher.restarts import how_ended

MIB = 1024  # /proc/PID/status says kB


def resident_mib(pid: int) -> tuple[float, float] | None:
    """(Peak, current) resident memory of a live process in MiB, as the kernel keeps them; None once it
    has ended (or where there is no /proc)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    values = {}
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name in ("VmHWM", "VmRSS"):
            values[name] = int(value.split()[0]) / MIB
    if "VmHWM" not in values:  # a zombie has no memory left to say
        return None
    return values["VmHWM"], values.get("VmRSS", 0.0)


def cpu_seconds(pid: int) -> float | None:
    """A live process's CPU time so far (user and system), in seconds; None once it has ended."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime: fields 14 and 15


def oom_kills() -> int | None:
    """How many processes the kernel has killed for memory since the machine started (None: unknown)."""
    try:
        for line in Path("/proc/vmstat").read_text().splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


class Watch:
    """A task process's memory as the launcher sees it: its peak over the task's life (restarts
    included) and its size at the last look; and the kernel's count of killings when it started."""

    def __init__(self):
        self.peak = self.last = 0.0
        self.kills_before, self.killed = None, False
        self.cpu_before = self.cpu_now = 0.0  # CPU-s of its earlier lives, and of this one at the last look

    def started(self) -> None:
        self.kills_before = oom_kills()
        self.cpu_before, self.cpu_now = self.cpu_before + self.cpu_now, 0.0

    def look(self, pid: int) -> None:
        found = resident_mib(pid)
        if found:
            self.peak, self.last = max(self.peak, found[0]), found[1]
        self.cpu_now = cpu_seconds(pid) or self.cpu_now

    cpu = property(lambda self: self.cpu_before + self.cpu_now)  # over its lives, to the last look

    def killed_for_memory(self, code: int | None) -> bool:
        """Whether an exit with `code` was the kernel's killing for memory: a SIGKILL while its count of
        such killings went up."""
        now = oom_kills()
        self.killed = code == -9 and None not in (now, self.kills_before) and now > self.kills_before
        return self.killed

    def why_ended(self, name: str, code: int) -> str:
        """How the task `name` ended with `code`, in words: the kernel's killing for memory, else its exit
        status or signal (restarts.how_ended)."""
        return self.why_killed(name) if self.killed_for_memory(code) else how_ended(name, code)

    def why_killed(self, name: str) -> str:
        seen = f" (its peak resident memory {self.peak:,.0f} MiB, {self.last:,.0f} MiB at the last look)" \
            if self.peak else " (before the launcher's first look at its memory)"
        return (f"task {name} ran out of memory: the kernel killed it{seen}; give it more memory, or lower "
                "trainer.batch_size or the number of tasks on this machine")


def look_at(tasks: list, looks: int) -> int:
    """Each live task's memory, every 5th call (every 0.5 s of run_tasks's loop); the calls counted."""
    if looks % 5 == 0:
        for task in tasks:
            if task.proc and task.proc.poll() is None:
                task.memory.look(task.proc.pid)
    return looks + 1
