"""Where the test suite's CPU goes: `make test`'s command, with every Python process's CPU recorded as
it ends, added up per test and per module.

    python benchmarks/suite_cpu.py [--records DIR] [PYTEST ARGS]    (with the project's .venv's python)

--records DIR keeps the records there (and given a DIR that holds some, tallies them again).

A test's CPU is what its pytest worker spent in it plus every process whose command line or working
directory names the test's tmp_path (the launchers, fork servers and tasks it started; tasks forked from
a worker's shared fork server run where their command ran). A module-scoped fixture's processes count
for its module. Not recorded: processes killed by a signal (fork servers end so, with their launcher,
as do tasks a test kills) and programs that are not Python (Slurm's daemons); the total says how much
that is. Figures of one run on a shared machine: compare trees by running both, back to back.
"""
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAKE_TEST = ["-m", "pytest", "-q", "-n", "2", "--dist", "loadscope", "--no-loadscope-reorder"]  # (the Makefile's)

RECORDER = '''
import atexit, os, sys, time
_me = {"pid": None}
def _record():
    try:
        if _me["pid"] != os.getpid():  # (a forked child: a process of its own)
            _me.update(pid=os.getpid(), tag=f"{os.getpid()}-{time.time():.6f}")
        with open(os.path.join(OUT, _me["tag"]), "w") as f:
            f.write(f"{time.process_time():.3f}\\t{os.getcwd()}\\t{' '.join(sys.argv)}\\n")
    except Exception:
        pass
atexit.register(_record)
_exit = os._exit
def _recorded_exit(code):  # tasks and the tests' processes end so
    _record()
    _exit(code)
os._exit = _recorded_exit
'''

PLUGIN = '''
import os, time
import pytest
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    started = time.process_time()
    yield
    with open(os.path.join(OUT, f"tests.{os.getpid()}"), "a") as f:
        f.write(f"{time.process_time() - started:.3f}\\t{item.nodeid}\\n")
'''


def run(out: Path, args: list) -> float:
    """The suite, recorded into out: the CPU of every process it waited for, in CPU-s."""
    code = out / "code"
    code.mkdir()
    (code / "sitecustomize.py").write_text(f"OUT = {str(out)!r}\n{RECORDER}")
    (code / "suite_cpu_plugin.py").write_text(f"OUT = {str(out)!r}\n{PLUGIN}")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(code), os.environ.get("PYTHONPATH")]))}
    before = os.times()
    subprocess.run([sys.executable, *MAKE_TEST, "-p", "suite_cpu_plugin", *args], cwd=ROOT, env=env, check=False)
    after = os.times()
    return (after.children_user + after.children_system) - (before.children_user + before.children_system)


def tally(out: Path) -> tuple:
    """{test or module fixture: CPU-s}, {kind of process: CPU-s}, the CPU-s recorded."""
    tests = {}
    for path in out.glob("tests.*"):
        for line in path.read_text().splitlines():
            cpu, node = line.split("\t")
            tests[node] = float(cpu)
    per_test = collections.Counter(tests)
    by_dir = collections.defaultdict(set)  # pytest's tmp_path: the test's name, word characters only, cut at 30
    for node in tests:
        by_dir[re.sub(r"\W", "_", node.split("::")[-1])[:30]].add(node)
    for name, nodes in list(by_dir.items()):  # tests whose names agree that far share theirs
        functions = {node.split("[")[0] for node in nodes}
        if len(nodes) == 1:
            by_dir[name] = nodes.pop()
        elif len(functions) == 1:  # one test's parameters: counted together, "test_x[*]"
            by_dir[name] = f"{functions.pop()}[*]"
            for node in nodes:
                per_test[by_dir[name]] += per_test.pop(node)
        else:  # tests of several functions (several modules, maybe): their processes' CPU apart
            by_dir[name] = f"{name}* (tests of {len(functions)} functions)"
    fixtures = {name: module for module in (ROOT / "tests").glob("test_*.py")
                for name in re.findall(r'mktemp\("(\w+)"\)', module.read_text())}
    kinds, recorded = collections.Counter(), 0.0
    for path in out.glob("[0-9]*"):
        fields = path.read_text().rstrip("\n").split("\t", 2)
        if len(fields) != 3:  # (a process killed as it wrote)
            continue
        cpu, cwd, argv = fields
        cpu, recorded = float(cpu), recorded + float(cpu)
        found = re.search(r"popen-gw\d+/(\w+?)\d+/", f"{argv} {cwd}/")
        kind = ("pytest" if argv == "-c" or re.match(r"\S*pytest/__main__", argv) else  # (an xdist worker's: "-c")
                "task forked by a fork server" if "forkserver" in argv else  # (the servers end killed)
                "task started by exec" if re.search(r"distrain[./](task|inference_task)", argv) else
                "launcher" if re.search(r"train\.py|bin/distrain\b", argv) else "other")
        kinds[kind] += cpu
        if kind == "pytest":  # (its tests' part is in per_test already)
            continue
        name = found.group(1) if found else None
        if name in by_dir:
            per_test[by_dir[name]] += cpu
        elif name in fixtures:
            per_test[f"tests/{fixtures[name].name} (module fixture {name})"] += cpu
        else:
            per_test["(not a test's)"] += cpu
    return per_test, kinds, recorded


def main() -> None:
    started, args = time.monotonic(), sys.argv[1:]
    kept = Path(args[1]) if args[:1] == ["--records"] else None  # --records DIR: keep them there
    out = kept or Path(tempfile.mkdtemp(prefix="suite-cpu-"))
    if kept and any(kept.glob("tests.*")):  # (a run's records already: tallied again)
        total = float("nan")
    else:
        out.mkdir(parents=True, exist_ok=True)
        total = run(out, args[2:] if kept else args)
    per_test, kinds, recorded = tally(out)
    if not kept:
        shutil.rmtree(out)
    print(f"\n{time.monotonic() - started:.0f} s; {total:.0f} CPU-s in the processes the suite waited for, "
          f"{recorded:.0f} of them recorded as they ended")
    print("by kind of process:", ", ".join(f"{k} {v:.0f}" for k, v in kinds.most_common()))
    modules = collections.Counter()
    for test, cpu in per_test.items():
        modules[test.split("::")[0].split(" (")[0]] += cpu
    print("\nCPU-s by module (the worker's and its processes'):")
    for module, cpu in modules.most_common():
        print(f"{cpu:8.1f}  {module}")
    print("\nthe 30 costliest tests:")
    for test, cpu in per_test.most_common(30):
        print(f"{cpu:8.1f}  {test}")


if __name__ == "__main__":
    main()
