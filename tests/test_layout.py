"""The house's rule, by path: only modules under src/distrain/task/ import TensorFlow when imported. The
launcher side, the reports and what both sides use stay free of it, so `--help`, the launcher and its
supervisor start in a fraction of a second and a sweep's process never holds TensorFlow's threads."""
import ast
import subprocess
import sys
from pathlib import Path

from helpers import ROOT

PACKAGE = ROOT / "src" / "distrain"
TENSORFLOW = {"tensorflow", "tf_keras", "keras"}
TASK_SIDE = "task"  # the one folder whose modules may import TensorFlow at import time


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
