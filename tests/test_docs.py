"""The docs hold: every command of README.md, docs/*.md and the examples' READMEs that runs distrain is
composed and checked as the command would check it (what `--cfg job` does: the config's keys, types,
ranges, options and the checks that relate them; a sweep's every combination), in the directory the
docs run it from, with the config files and modules the docs lay out before it. Sybil reads the
Markdown's code blocks, so a block that changes is the block tested. A command that cannot be checked
here is listed in NOT_HERE, with the reason."""
import os
import re
import shlex
import sys
from pathlib import Path

import pytest
from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException
from sybil import Sybil
from sybil.parsers.markdown import CodeBlockParser

from distrain import cli
from distrain.common.errors import ConfigError
from distrain.config.overrides import combinations
from distrain.config.validate import check_objective, validate

from helpers import ROOT

DOCS = ["README.md", *(str(p.relative_to(ROOT)) for p in sorted((ROOT / "docs").glob("*.md"))),
        *(str(p.relative_to(ROOT)) for p in sorted((ROOT / "examples").glob("*/README.md")))]
# Commands of the docs that are not distrain's, or need what this machine lacks: what they start with, why.
NOT_HERE = {
    "make": "sets up .venv and runs the suite or the default training (test_cli's quality bar runs it)",
    "pip": "installs the package (test_cli's wheel test installs it)",
    ".": "activates the environment",
    "tensorboard": "serves the dashboard (test_sweep asks a real TensorBoard server what it shows)",
    "sbatch": "submits to a Slurm cluster (test_slurm runs the sbatch scripts on a local Slurm)",
    "srun": "a Slurm job step (test_slurm)",
    "salloc": "allocates Slurm nodes (test_slurm)",
    "apt-get": "installs Debian packages",
    "export": "sets the environment for the commands after it",
    "scripts/slurm-local.sh": "brings up a local Slurm (test_slurm)",
    "mlflow": "MLflow's own command: its server (test_docs_run starts one where the docs do) or UI",
}
# Arguments that stand for the reader's own values: a command holding one is composed without it.
PLACEHOLDERS = ("...",)
# Commands whose config names what only exists after another run, or on another machine.
NEEDS_ELSEWHERE = {"outputs/DATE/TIME": "names a run directory of the reader's",
                   "multirun/DATE/TIME": "names a sweep directory of the reader's",
                   "RUN_DIR": "names a run directory of the reader's (a usage line)",
                   "/gpu:": "names a GPU, which no machine of this project has"}
# The reader's own modules that the docs name without showing (their code is the reader's): present, empty.
READERS_MODULES = ("mymodels", "mylosses", "mydata")


def commands(block: str):
    """The shell lines of a block, continuations and quotes over several lines joined, as argument lists
    (comments and the environment assignments before a command dropped)."""
    pending, variables = "", {}
    for line in block.replace("\\\n", " ").splitlines():
        pending += ("\n" if pending else "") + line
        try:  # (a shell variable is expanded, unquoted: its words split)
            words = shlex.split(re.sub(r"\$(\w+)", lambda m: variables.get(m[1], m[0]), pending), comments=True)
        except ValueError:  # a quote that closes on a later line
            continue
        pending = ""
        assignments = [w for w in words if re.fullmatch(r"[A-Z_]+=.*", w, re.S)]
        if words and assignments == words:  # VAR=value alone: a variable for the lines after it
            variables.update(w.split("=", 1) for w in words)
            continue
        while words and re.fullmatch(r"[A-Z_]+=.*", words[0], re.S):  # VAR=value command ...: its environment
            words = words[1:]
        if words:
            yield words


def distrain_args(words: list) -> list | None:
    """The arguments of a distrain command (`python train.py ...`, `python ../../train.py ...`, `distrain
    ...`), else None."""
    if words[0] == "distrain":
        return words[1:]
    if words[0] in ("python", "python3") and len(words) > 1 and words[1].endswith("train.py"):
        return words[2:]
    return None


def check(args: list, cwd: Path) -> str:
    """What is wrong with this command's config ("" where nothing is): composed and validated as the
    command would, every combination of a sweep's values."""
    args = [a for a in args if a not in PLACEHOLDERS]
    if args and args[0] in ("summarize",):
        return ""  # (a sweep directory of the reader's)
    tool = bool(args) and args[0] == "write-tfrecords"
    flags, overrides = cli._flags_first(args[1:] if tool else args)
    if tool:
        overrides = [o for o in overrides if o.split("=", 1)[0] not in ("out", "shards", "encoding")]
    if {"--help", "-h", "--hydra-help"} & set(flags):
        return ""  # (test_cli: --help answers from the composed config)
    jobs, _ = combinations(overrides)  # (the jobs a sweep of them makes)
    old = os.getcwd()
    os.chdir(cwd)
    sys.path.insert(0, str(cwd))
    try:
        for combination in jobs:
            cfg = validate(cli._compose(flags, list(combination)))
            if {"-m", "--multirun"} & set(flags):
                check_objective(cfg)
    except ConfigError as exc:  # what the command would refuse, in its own words
        return str(exc)
    except (HydraException, OmegaConfBaseException) as exc:
        return cli._error_line(exc)
    finally:
        os.chdir(old)
        sys.path.remove(str(cwd))
    return ""


def lay_out(block: str, user_dir: Path) -> None:
    """A config file or module the docs show as the reader's own (a comment line atop it names its path,
    after `# @package _global_` for a preset): written where the reader would keep it."""
    heading = [line for line in block.splitlines()[:2] if line.strip().startswith("#")]
    words = [w.rstrip(",:;") for line in heading for w in line.strip().lstrip("# ").split()]
    named = [w for w in words if w.endswith(".py") or w.endswith(".yaml") and w.startswith("conf/")]
    if named:
        path = user_dir / named[0]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(block)


def check_doc(doc: Path, user_dir: Path, here: Path) -> tuple[list, list]:
    """(Each distrain command of the document, checked: (line, command, what is wrong or ""); the
    commands left to the reader, as (line, command)), the document's own files laid out in user_dir."""
    for module in READERS_MODULES:
        (user_dir / f"{module}.py").write_text("")
    results, left = [], []

    def shell(example):
        cwd = here
        for words in commands(example.parsed):
            args = distrain_args(words)
            line = " ".join(words)
            if args is None:
                if words[0] == "cd":
                    cwd = (ROOT / words[1]) if (ROOT / words[1]).is_dir() else user_dir / words[1]
                elif words[0] not in NOT_HERE:
                    results.append((example.line, line, "neither distrain's nor in NOT_HERE"))
                continue
            if any(marker in line for marker in NEEDS_ELSEWHERE):
                left.append((example.line, line))
                continue
            where = cwd if "--config-dir" not in words or (cwd / "conf").is_dir() else user_dir
            results.append((example.line, line, check(args, where)))

    def files(example):
        lay_out(example.parsed, user_dir)

    def transcript(example):  # `$ command`, then the error line it prints (`...`: what the docs leave out)
        for command, said in re.findall(r"^\$ (.+)\n((?:(?!\$ ).*\n?)*)", example.parsed, re.M):
            args = distrain_args(shlex.split(command, comments=True))
            why = check(args, here)
            expected = [line for line in said.splitlines() if line.startswith("error: ")]
            pattern = ".*".join(map(re.escape, expected[0].removeprefix("error: ").split("..."))) if expected else ""
            ok = bool(re.fullmatch(pattern, why)) if expected else not why
            results.append((example.line, command, "" if ok else f"says {why!r}, not {said.strip()!r}"))

    sybil = Sybil(parsers=[CodeBlockParser("bash", shell), CodeBlockParser("yaml", files),
                           CodeBlockParser("python", files), CodeBlockParser("console", transcript)],
                  path=str(doc.parent), patterns=[doc.name])
    for example in sybil.parse(doc):
        example.evaluate()
    return results, left


@pytest.fixture
def reader(tmp_path, monkeypatch):
    """The reader's directory (their conf/ and modules, as the docs lay them out); never the network."""
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "keras_home"))
    (tmp_path / "project").mkdir()
    return tmp_path / "project"


@pytest.mark.parametrize("doc", DOCS)
def test_every_command_of_the_docs_composes_and_checks(doc, reader):
    here = ROOT / Path(doc).parent if doc.startswith("examples/") else reader  # an example runs from its own
    results, _ = check_doc(ROOT / doc, reader, here)
    failed = [f"{doc}:{line}: {command}\n    {why}" for line, command, why in results if why]
    assert not failed, "\n".join(failed)
    if doc in ("README.md", "docs/configuration.md"):
        assert len(results) >= 10  # the docs' commands were found (a parser that finds none would pass)


def test_a_command_of_the_docs_that_no_longer_holds_fails(reader, tmp_path):
    """The control: a typo, a key an option lost, a sweep value out of range, and a command the test does
    not know are each found; a sound command is not."""
    doc = tmp_path / "doc.md"
    doc.write_text("""```bash
python train.py trainer.epochs=3
python train.py trainer.epoch=3
distrain -m strategy=mirrored strategy.cpu_virtual_devices=2,99
rm -rf outputs
```
```yaml
# conf/model/mine.yaml
_target_: mymodels.small_cnn
```
```bash
python train.py --config-dir conf model=mine
python train.py --config-dir conf model=yours
```
```console
$ python train.py trainer.epoch=4
error: trainer.epoch is not a key of trainer: set e.g. trainer.epochs=12
$ python train.py model.dropout=1.5
error: model.dropout=1.5 must be at most 1: set e.g. model.dropout=0.5
```
""")
    results, _ = check_doc(doc, reader, reader)
    said = {command: why for _, command, why in results}
    assert said["python train.py trainer.epochs=3"] == "" and said["python train.py --config-dir conf model=mine"] == ""
    assert "trainer.epoch is not a key of trainer" in said["python train.py trainer.epoch=3"]
    assert "strategy.cpu_virtual_devices=99 must be from 0 to" in \
        said["distrain -m strategy=mirrored strategy.cpu_virtual_devices=2,99"]
    assert "neither distrain's nor in NOT_HERE" in said["rm -rf outputs"]
    said_of_yours = said["python train.py --config-dir conf model=yours"]
    assert "model=yours is not an option of model (cnn, mine, mlp)" in said_of_yours
    assert said["python train.py trainer.epoch=4"] == ""  # the transcript's line, as the command says it
    assert said["python train.py model.dropout=1.5"].startswith("says 'model.dropout=1.5 must be at least 0")
