"""The house's rule, by path: only modules under src/distrain/task/ import TensorFlow, when imported and
inside their functions alike; the few others that must are listed, each with its reason, in ELSEWHERE.
The launcher side, the reports and what both sides use stay free of it, so `--help`, the launcher and its
supervisor start in a fraction of a second and a sweep's process never holds TensorFlow's threads. Private
names of TensorFlow, tf_keras and TensorBoard are used through common/private.py alone."""
import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ROOT

PACKAGE = ROOT / "src" / "distrain"
TENSORFLOW = {"tensorflow", "tf_keras", "keras"}
TASK_SIDE = "task"  # the one folder whose modules may import TensorFlow
# The modules outside the task side that import TensorFlow inside a function, and why there.
ELSEWHERE = {
    "distrain.data.arrays": "data.source=keras loads through Keras's own downloader (tf_keras.datasets), in the "
                            "process that loads the arrays",
    "distrain.report.mlflow_model": "the MLflow model loads the SavedModel with tf_keras in MLflow's serving "
                                    "process, where distrain is not installed",
}


def module_name(path: Path, package: Path) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_at_import(tree: ast.Module, name: str, is_package: bool) -> set:
    """The modules a module's body imports as it runs (not those imported inside its functions)."""
    found, here = set(), name if is_package else name.rpartition(".")[0]
    nodes = list(tree.body)
    while nodes:
        node = nodes.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(here.split(".")[:len(here.split(".")) - node.level + 1] + ([base] if base else []))
            found |= {base} | {f"{base}.{a.name}" for a in node.names}
        nodes.extend(ast.iter_child_nodes(node))
    return found


def at_import(package: Path, banned) -> dict:
    """{module outside the task side: the chain by which importing it imports a module `banned` names}."""
    sources = {}
    for path in package.glob("**/*.py"):
        if "conf" not in path.relative_to(package).parts:
            name = module_name(path, package)
            sources[name] = imported_at_import(ast.parse(path.read_text()), name, path.name == "__init__.py")
    top = package.name
    for name in list(sources):  # importing a.b.c runs a/__init__ and a/b/__init__ first
        parts = name.split(".")
        sources[name] |= {".".join(parts[:k]) for k in range(1, len(parts))}

    def chain(name: str, seen: set) -> list | None:
        for imported in sorted(sources.get(name, ())):
            if banned(imported):
                return [name, imported]
            if imported.split(".")[0] == top and imported in sources and imported not in seen:
                seen.add(imported)
                if found := chain(imported, seen):
                    return [name, *found]
        return None

    side = f"{top}.{TASK_SIDE}"
    return {name: found for name in sources if not (name == side or name.startswith(side + "."))
            if (found := chain(name, {name}))}


def tensorflow_at_import(package: Path) -> dict:
    return at_import(package, lambda imported: imported.split(".")[0] in TENSORFLOW)


def test_no_module_outside_the_task_side_imports_tensorflow_when_imported():
    assert tensorflow_at_import(PACKAGE) == {}


def imports_anywhere(path: Path) -> set:
    """Every module a module's source imports, at any depth (inside functions and methods too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
    return found


def tensorflow_anywhere(package: Path) -> dict:
    """{module outside the task side: the TensorFlow modules it imports, at any depth}."""
    found = {}
    for path in package.glob("**/*.py"):
        parts = path.relative_to(package).parts
        if parts[0] in (TASK_SIDE, "conf"):
            continue
        names = sorted(m for m in imports_anywhere(path) if m.split(".")[0] in TENSORFLOW)
        if names:
            found[module_name(path, package)] = names
    return found


def test_no_module_outside_the_task_side_imports_tensorflow_even_inside_a_function():
    """Where a command needs TensorFlow (write-tfrecords, evaluate and predict in process) it calls the
    task side; the exceptions are ELSEWHERE's, each with its reason, and none is stale."""
    found = tensorflow_anywhere(PACKAGE)
    assert set(found) == set(ELSEWHERE), {k: v for k, v in found.items() if k not in ELSEWHERE} or set(ELSEWHERE) - set(
        found)


def test_the_check_at_any_depth_finds_an_import_inside_a_function(tmp_path):
    """The control: a launcher module importing TensorFlow inside a method is named; a task module is not."""
    package = tmp_path / "distrain"
    for folder in ("launcher", "task"):
        (package / folder).mkdir(parents=True)
    (package / "launcher" / "lazy.py").write_text("class A:\n    def f(self):\n        from tf_keras import layers\n")
    (package / "launcher" / "clean.py").write_text("def f():\n    import json\n")
    (package / "task" / "model.py").write_text("def f():\n    import tensorflow\n")
    assert tensorflow_anywhere(package) == {"distrain.launcher.lazy": ["tf_keras"]}


def test_private_names_of_tensorflow_are_used_through_one_module_and_each_still_exists():
    """common/private.py lists each with its reason; an upgrade that moves one fails here by name, and
    no other module reaches into tensorflow.python or tf_keras.src."""
    from distrain.common import private

    for name in private.PRIVATE:
        assert private.get(name) is not None, name
    reaching = {module_name(path, PACKAGE): sorted(m for m in imports_anywhere(path)
                                                   if m.startswith(("tensorflow.python", "tensorflow.compiler",
                                                                    "tf_keras.src")))
                for path in PACKAGE.glob("**/*.py")}
    assert {k: v for k, v in reaching.items() if v} == {}
    with pytest.raises(ModuleNotFoundError):  # the control: a name that moved
        private.PRIVATE["gone"] = ("tensorflow.python.no_such_module", None, "")
        try:
            private.get("gone")
        finally:
            del private.PRIVATE["gone"]


def test_no_module_outside_the_task_side_imports_it_when_imported():
    """The launcher side may run the task side's code in its own process (evaluate, predict), inside the
    functions that need it; none imports a task module as it is imported."""
    task = f"{PACKAGE.name}.{TASK_SIDE}"
    assert at_import(PACKAGE, lambda imported: imported == task or imported.startswith(task + ".")) == {}


def test_the_check_finds_a_launcher_module_that_imports_tensorflow(tmp_path):
    """The control: a launcher module that imports TensorFlow, directly or through a task module it imports
    at module level, is named with its chain; imports inside functions are not."""
    package = tmp_path / "distrain"
    for folder, text in {"launcher": "", "task": "import tensorflow as tf\n"}.items():
        (package / folder).mkdir(parents=True)
        (package / folder / "__init__.py").write_text("")
        (package / folder / "model.py").write_text(text)
    (package / "__init__.py").write_text("")
    (package / "launcher" / "direct.py").write_text("import os\nif os.environ:\n    import tensorflow\n")
    (package / "launcher" / "through.py").write_text("from ..task import model\n")
    (package / "launcher" / "lazy.py").write_text(
        "def f():\n    import tensorflow\n    from distrain.task import model\n")
    assert tensorflow_at_import(package) == {
        "distrain.launcher.direct": ["distrain.launcher.direct", "tensorflow"],
        "distrain.launcher.through": ["distrain.launcher.through", "distrain.task.model", "tensorflow"]}


def test_every_module_outside_the_task_side_imports_without_tensorflow():
    """The same rule as Python sees it, through every library imported too: every such module imported in
    one fresh interpreter leaves TensorFlow out of sys.modules."""
    names = sorted(module_name(p, PACKAGE) for p in PACKAGE.glob("**/*.py")
                   if not {"conf", TASK_SIDE} & set(p.relative_to(PACKAGE).parts))
    assert len(names) > 30 and "distrain.launcher.supervisor" in names
    out = subprocess.run([sys.executable, "-c", "import importlib, sys\nfor name in sys.argv[1:]:\n"
                          "    importlib.import_module(name)\n"
                          "print(sorted({m.split('.')[0] for m in sys.modules} & {'tensorflow', 'tf_keras', 'keras'}))",
                          *names], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]"


def named_files_missing(package: Path, root: Path) -> list:
    """Each `name.py` (or `folder/name.py`) a module's docstrings and comments name that is no file of the
    checkout: `path:line: name`."""
    files = [p.relative_to(root).as_posix() for p in root.rglob("*.py") if ".venv" not in p.parts]
    missing = []
    for path in sorted(package.rglob("*.py")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            for named in re.findall(r"(?<![\w./])[\w/]*\w\.py\b", line):
                if not any(f == named or f.endswith("/" + named) for f in files):
                    missing.append(f"{path.relative_to(root)}:{n}: {named}")
    return missing


def test_every_file_a_docstring_or_comment_names_exists():
    """A reader greps for the file a module names and finds it (the move from flat modules to folders)."""
    assert named_files_missing(PACKAGE.parent, ROOT) == []


def test_the_named_files_check_finds_a_file_that_moved(tmp_path):
    (tmp_path / "src" / "pkg").mkdir(parents=True)
    (tmp_path / "src" / "pkg" / "input_pipeline.py").write_text('"""Reads pipeline.py, input_pipeline.py."""\n')
    assert named_files_missing(tmp_path / "src", tmp_path) == ["src/pkg/input_pipeline.py:1: pipeline.py"]


def importers(root: Path, wanted) -> set:
    """The modules under root (src/: distrain and its Hydra plugins) that import, at any depth, a module
    `wanted` says yes to."""
    return {module_name(path, root / path.relative_to(root).parts[0]) for path in root.glob("**/*.py")
            if any(wanted(m) for m in imports_anywhere(path))}


PARSER = "hydra.core.override_parser.overrides_parser"  # (its types, which name a sweep's values, are not it)


def test_overrides_are_parsed_in_one_module():
    """Hydra's override parser is used by config/overrides.py alone: the launcher, the sweep's summary,
    evaluate's and predict's sweeps and the Optuna sweeper read an override one way."""
    assert importers(PACKAGE.parent, lambda m: m == PARSER) == {"distrain.config.overrides"}


def above_common(package: Path) -> dict:
    """{module of common/: the modules of the folders above it that it imports, at any depth}."""
    above = ("config", "data", "inference", "launcher", "report", "task", "cli")
    found = {module_name(path, package): sorted(m for m in imports_anywhere(path)
                                                 if m.split(".")[:2] in (["distrain", a] for a in above))
             for path in (package / "common").glob("*.py")}
    return {k: v for k, v in found.items() if v}


def test_common_imports_nothing_of_the_folders_above_it():
    """common/ is the bottom layer: both sides use it, and it uses neither (nor config, data, report)."""
    assert above_common(PACKAGE) == {}


def test_the_one_module_checks_find_another(tmp_path):
    """The controls: a second module that parses overrides is named, and so is a common module that
    imports one of report/ inside a function."""
    (tmp_path / "distrain" / "config").mkdir(parents=True)
    (tmp_path / "distrain" / "common").mkdir()
    (tmp_path / "distrain" / "config" / "overrides.py").write_text(f"from {PARSER} import OverridesParser\n")
    (tmp_path / "distrain" / "sweep.py").write_text(f"def f():\n    from {PARSER} import OverridesParser\n")
    assert importers(tmp_path, lambda m: m == PARSER) == {"distrain.config.overrides", "distrain.sweep"}
    (tmp_path / "distrain" / "common" / "rundir.py").write_text("def f():\n    from distrain.report import results\n")
    (tmp_path / "distrain" / "common" / "cpu.py").write_text("from distrain.common import storage\n")
    assert above_common(tmp_path / "distrain") == {"distrain.common.rundir": ["distrain.report"]}
