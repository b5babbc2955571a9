"""The test suite's work, this checkout's against another's, measured back to back: the CPU-s of every
process each `make test` command runs (a cgroup's accounting), and the ratio.

    python benchmarks/suite_ratio.py OTHER_CHECKOUT [--other-first] [-- PYTEST ARGS]    (as root, Linux)

Both run with this checkout's .venv (the other tree's own modules first on the path), on this machine as
it is: a ratio measured here is the figure for this machine, and says nothing of another kind's. A
shared host drifts: run the pair again in the other order (--other-first) before trusting a ratio.
"""
import argparse
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from suite_cpu import MAKE_TEST  # (beside this file: `make test`'s command)

ROOT = Path(__file__).resolve().parents[1]
class Accounted:
    """A cgroup (v1's cpuacct, else v2's) whose processes' CPU is counted: usage() in CPU-s."""

    def __init__(self, name: str):
        v1 = Path("/sys/fs/cgroup/cpuacct")
        self.path, self.v1 = (v1 if v1.is_dir() else Path("/sys/fs/cgroup")) / name, v1.is_dir()
        self.path.mkdir()

    def join(self) -> None:  # (in the child, before it execs: everything it starts is counted)
        (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def usage(self) -> float:
        if self.v1:
            return int((self.path / "cpuacct.usage").read_text()) / 1e9
        stat = dict(line.split() for line in (self.path / "cpu.stat").read_text().splitlines())
        return int(stat["usage_usec"]) / 1e6

    def remove(self) -> None:
        for _ in range(50):  # (its last processes may still be exiting)
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.2)


def suite(tree: Path, args: list, log: Path) -> tuple:
    """(CPU-s, wall seconds, pytest's last line) of the suite of `tree`."""
    group = Accounted(f"suite-ratio-{os.getpid()}-{tree.name}")
    python = ROOT / ".venv" / "bin" / "python"
    command = shlex.join(map(str, [python, *MAKE_TEST, "-p", "no:cacheprovider", *args]))
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    started = time.monotonic()
    with open(log, "w") as out:
        subprocess.run(["sh", "-c", f"exec {command}"],
                       cwd=tree, env=env, stdout=out, stderr=subprocess.STDOUT, preexec_fn=group.join)
    wall = time.monotonic() - started
    time.sleep(2)
    cpu = group.usage()
    group.remove()
    return cpu, wall, log.read_text().strip().splitlines()[-1]


def minutes(seconds: float) -> str:
    """M:SS.s (whole minutes: 419.7 s is 6:59.7)."""
    whole, rest = divmod(round(seconds, 1), 60)
    return f"{whole:.0f}:{rest:04.1f}"


def fail(line: str) -> None:
    print(f"error: {line}", file=sys.stderr)
    sys.exit(2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("other", type=Path, help="the other checkout (its tests and src/)")
    parser.add_argument("--other-first", action="store_true")
    parser.add_argument("pytest_args", nargs="*", help="after --: what the suite's command adds (e.g. a module)")
    a = parser.parse_args()
    if os.geteuid() != 0 or not sys.platform.startswith("linux"):
        fail("needs root on Linux (a cgroup that counts the suite's processes): run it as root")
    if not (a.other / "tests").is_dir() or not (a.other / "src" / "distrain").is_dir():
        fail(f"{a.other} is no distrain checkout (no tests/ and src/distrain/): give one's directory")
    logs = Path(tempfile.mkdtemp(prefix="suite-ratio-"))  # (kept: each suite's whole log, for its failures)
    trees = [a.other.resolve(), ROOT] if a.other_first else [ROOT, a.other.resolve()]
    found = {}
    for n, tree in enumerate(trees):
        found[tree] = suite(tree, a.pytest_args, logs / f"{n}.log")
        cpu, wall, last = found[tree]
        print(f"{tree}: {cpu:.0f} CPU-s, {minutes(wall)} ({last}; log {logs / f'{n}.log'})", flush=True)
    (mine, _, _), (theirs, _, _) = found[ROOT], found[a.other.resolve()]
    print(f"this checkout / {a.other}: {mine / theirs:.2f} in CPU-s")


if __name__ == "__main__":
    main()
