"""The docs' commands, run: every command of README.md, docs/*.md and the examples' READMEs is run as
the reader runs it, in the document's order, from the directory the document runs it from, with
the files its other blocks lay out (test_docs composes and checks each one; this runs them). What
each says it does is checked: its exit status, the files it leaves, the line it prints; and the
README's range for examples/digits8x8, at full length. (The other examples' tables are one run each,
no range: test_task trains those examples at full length and checks them loosely.)

Trainings run short: the test adds epochs of 2 steps, 3 epochs (4 at most where the command names more), a run
directory of its own where the command names none, and nothing else. The reader's own files that
the docs name without showing (mydata.npz, rows.npz, an image folder) are made here, small. A
command not run is in NOT_RUN (or test_docs.NOT_HERE), matched on its text, with the reason; one of
NOT_RUN is composed and checked instead, as test_docs does. (So where this runs a document, `make test`
leaves out test_docs's composing of it: conftest. `make test-fast` keeps that.)
A command whose comment says `# needs: apt-get install PACKAGE` gets the package first, as the reader
does (where that cannot be done: not run, with the reason, and a warning).

Each command runs in this process (helpers.here); one-process runs fork their task from the launcher's
fork server, which this process keeps from one command to the next, as a sweep's jobs do
(forkserver.shared): a short run takes about 2.5 s, not 6."""
import glob
import json
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
from sybil import Sybil
from sybil.parsers.markdown import CodeBlockParser

from distrain import cli
from distrain.data import write_tfrecords

from helpers import ROOT, MlflowServer, here
from test_docs import DOCS, NEEDS_ELSEWHERE, NOT_HERE, READERS_MODULES, check, commands, distrain_args, lay_out

pytestmark = pytest.mark.slow

# Commands composed and checked (test_docs) but not run here, and why: what they hold.
NOT_RUN = {
    "cluster=tf_config": "its tasks are on other machines (test_cluster runs TF_CONFIG clusters on loopback)",
    "cluster=manual": "its tasks are on other machines (test_cluster runs manual clusters on loopback)",
    "cluster=slurm": "needs a Slurm allocation (test_slurm runs it on a local Slurm)",
    "data.source=keras": "downloads MNIST; tests never use the network",
    "/gpu:": "names a GPU, which no machine of this project has",
    "RUN_DIR": "a usage line",
    "...": "a fragment: the reader's data and model go where the dots are",
}


def install(package: str) -> str:
    """What a command's `# needs: apt-get install PACKAGE` asks, done as the reader does it: "" once the
    Debian package is installed, else why it cannot be here (the command is then not run, and said so)."""
    if not shutil.which("dpkg-query"):
        return f"needs Debian's {package}, and this system has no Debian packages"
    listed = subprocess.run(["dpkg-query", "-W", "-f=${Status}", package], capture_output=True, text=True)
    if listed.stdout.endswith(" installed"):
        return ""
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        return f"needs Debian's {package}, which only root with apt-get can install"
    try:  # (bounded: a registry out of reach is a command not run, not a hang)
        done = subprocess.run(["apt-get", "install", "-y", "-q", "--no-install-recommends", package],
                              capture_output=True, text=True, timeout=180,
                              env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    except subprocess.TimeoutExpired:
        return f"apt-get install {package} took over 180 s"
    return "" if done.returncode == 0 else f"apt-get install {package} failed: {done.stderr.strip()[-200:]}"


# What the test adds to a training: epochs of 2 steps, 3 of them (at most 4 where the command
# names more: a resume that trains longer still does), and a run directory of its own where the
# command names none.
STEPS = "trainer.steps_per_epoch=2"
# The directories the docs name for the reader's last run and sweep (test_docs.NEEDS_ELSEWHERE):
# here the last the document's commands made.
LAST_RUN, LAST_SWEEP = "outputs/DATE/TIME", "multirun/DATE/TIME"
MLFLOW_URI = "http://127.0.0.1:5000"  # the docs' `mlflow server`: here the test's, on a port of its own


def readers_files(where: Path) -> None:
    """The reader's own data the docs name without showing it, small: MNIST-like images in an .npz
    (mydata.npz), rows of features with a value each (rows.npz), an image folder by class (data/flowers),
    other digits as TFRecord shards (new/), and new inputs without labels (new.npz, new_images/)."""
    from PIL import Image

    rng = np.random.default_rng(0)
    with np.load(ROOT / "src" / "distrain" / "data" / "mnist-10k.npz") as bundled:
        rows = rng.permutation(len(bundled["labels"]))[:640]  # (the file is in label order)
        x, y = bundled["images"][rows], bundled["labels"][rows]
    np.savez(where / "mydata.npz", x_train=x[:512], y_train=y[:512], x_test=x[512:], y_test=y[512:])
    features = rng.normal(size=(640, 8)).astype("float32")
    values = features @ rng.normal(size=8).astype("float32")
    np.savez(where / "rows.npz", x_train=features[:512], y_train=values[:512], x_test=features[512:],
             y_test=values[512:])
    for split, rows in (("train", slice(0, 512)), ("test", slice(512, 640))):  # other data, as TFRecord shards
        write_tfrecords.write(x[rows, ..., None], y[rows], where / "new", split, 2)
    np.savez(where / "new.npz", x=x[512:576])  # new inputs, no labels: an array and a folder of images
    for i, image in enumerate(x[576:588]):
        folder = where / "new_images" / ("" if i < 6 else "more")
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image).save(folder / f"{i:02d}.png")
    for split, count in (("train", 12), ("test", 4)):
        for name in ("daisy", "tulips"):
            folder = where / "data" / "flowers" / split / name
            folder.mkdir(parents=True)
            for i in range(count):
                Image.fromarray(rng.integers(0, 255, (72, 80, 3), dtype=np.uint8)).save(folder / f"{i}.png")


# Each command run (in its directory relative to the reader's project): where, and the run and sweep
# directories it made. A document that holds it too (docs/clusters.md repeats the README's) reuses those.
ALREADY: dict = {}


def expand(word: str, cwd: Path) -> list:
    """A shell word's paths, as the reader's shell expands a pattern that matches (else the word)."""
    found = sorted(glob.glob(word, root_dir=cwd)) if glob.has_magic(word) else []
    return found or [word]


class Reader:
    """A reader going through one document: runs its commands in order, each in-process, and says
    what did not hold."""

    def __init__(self, doc: str, home: Path, project: Path):
        self.doc, self.home, self.project = doc, home, project
        self.runs, self.sweeps, self.problems, self.ran, self.not_run = [], [], [], [], []
        self.server = None  # an `mlflow server` the document starts (stop(): at its end)

    def stop(self) -> None:
        if self.server:
            self.server.stop()

    def shell(self, example) -> None:
        self.run_block(example.parsed, example.line)

    def config(self, example) -> None:
        """A config file or module the docs show, laid out where the reader keeps it; the command its
        comment names (`# conf/experiment/x.yaml: distrain --config-dir conf experiment=x`), run."""
        lay_out(example.parsed, self.home)
        self.run_block("\n".join(re.findall(r"^\s*#.*?: ((?:distrain|python \S*train\.py) .*)$", example.parsed, re.M)),
                       example.line)

    def run_block(self, block: str, at: int) -> None:
        """The block's commands, in order, from the document's directory (a `cd` moves on from there)."""
        cwd = self.home
        needs = {" ".join(next(commands(line))): package  # (the line of a command that needs a package)
                 for line, package in re.findall(r"^(.+?)#\s*needs: apt-get install (\S+)", block, re.M)}
        for words in commands(block):
            line = " ".join(words)
            words = [w for word in map(self.substitute, words) for w in expand(word, cwd)]
            if words[0] == "cd":
                cwd = cwd / words[1]
                continue
            if words[:2] == ["mlflow", "server"]:  # the reader's tracking server: one of the test's, on its own port
                self.server = self.server or MlflowServer(Path(tempfile.mkdtemp(dir=self.project))).start()
                self.ran.append((at, line))
                continue
            args = distrain_args(words)
            why = next((why for marker, why in NOT_RUN.items() if marker in line), None)
            why = why or (install(needs[line]) if line in needs else None)
            if why and line in needs:
                warnings.warn(f"{self.doc}:{at}: {line} not run: {why}", stacklevel=1)
            if args is None:
                if words[0] not in NOT_HERE:
                    self.problems.append(f"{self.doc}:{at}: {line}\n    neither distrain's nor in test_docs.NOT_HERE")
                self.not_run.append((at, line, why or NOT_HERE.get(words[0], "unknown")))
                continue
            if why:  # composed and checked instead, as test_docs does (where it names nothing of elsewhere)
                said = "" if any(marker in line for marker in NEEDS_ELSEWHERE) else check(args, cwd)
                if said:
                    self.problems.append(f"{self.doc}:{at}: {line} (not run: {why})\n    {said}")
                self.not_run.append((at, line, why))
                continue
            key = (str(cwd.relative_to(self.project)), line)
            if key in ALREADY:  # (the same command in the same directory, in a document run before)
                where, runs, sweeps = ALREADY[key]
                self.runs += runs
                self.sweeps += sweeps
                self.not_run.append((at, line, f"the same command as {where}, run there"))
                continue
            started, made = time.monotonic(), (len(self.runs), len(self.sweeps))
            said = self.run(args, cwd)
            self.ran.append((at, f"{line} ({time.monotonic() - started:.1f} s)"))
            if said:
                self.problems.append(f"{self.doc}:{at}: {line}\n    {said}")
            else:
                ALREADY[key] = (f"{self.doc}:{at}", self.runs[made[0]:], self.sweeps[made[1]:])

    def transcript(self, example) -> None:
        """`$ command`, then the error line it prints: run, the line and exit status 2 checked."""
        for command, said in re.findall(r"^\$ (.+)\n((?:(?!\$ ).*\n?)*)", example.parsed, re.M):
            expected = [line for line in said.splitlines() if line.startswith("error: ")][0]
            code, out, err = self.main(distrain_args(shlex.split(command, comments=True)), self.home)
            pattern = ".*".join(map(re.escape, expected.split("...")))
            self.ran.append((example.line, command))
            if code != 2 or not re.fullmatch(pattern, err.strip()):
                self.problems.append(f"{self.doc}:{example.line}: {command}\n    exit {code}, said {err.strip()!r}, "
                                     f"not {expected!r}")

    def main(self, args: list, cwd: Path) -> tuple[int, str, str]:
        return here(cwd, args, {"KERAS_HOME": str(self.project / "keras_home")})

    def substitute(self, word: str) -> str:
        """The reader's last run and sweep where the docs name them."""
        word = word.replace(MLFLOW_URI, self.server.uri) if self.server else word
        word = word.replace(LAST_RUN, str(self.runs[-1])) if self.runs else word
        return word.replace(LAST_SWEEP, str(self.sweeps[-1])) if self.sweeps else word

    def run(self, args: list, cwd: Path) -> str:
        """Run one command, shortened; what did not hold ("" if all did)."""
        command = args[0] if args and args[0] in ("write-tfrecords", "evaluate", "predict", "summarize", "log") \
            else None
        flags, overrides = cli._flags_first(args[1:] if command else args)
        sweep = bool({"-m", "--multirun"} & set(flags)) or any(map(_sweeps, overrides))
        if {"--help", "-h", "--cfg", "-c"} & set(flags):
            code, out, err = self.main(args, cwd)
            shown = "trainer.epochs" in out or "trainer:\n  epochs:" in out
            return "" if code == 0 and shown else f"exit {code}, printed {out[-300:]!r} {err[-300:]!r}"
        if command is None:  # a training: short
            epochs = [int(o.split("=")[1]) for o in overrides if o.startswith("trainer.epochs=")]
            args = [*args, STEPS, f"trainer.epochs={min(epochs[-1], 4) if epochs else 3}"]
            named = [o for o in overrides if o.startswith("hydra.sweep.dir=" if sweep else "hydra.run.dir=")]
            where = cwd / (named[-1].split("=", 1)[1] if named else
                           f"{'multirun/sweep' if sweep else 'outputs/run'}-{len(self.sweeps if sweep else self.runs)}")
            if not named:
                args.append(f"hydra.{'sweep' if sweep else 'run'}.dir={where.relative_to(cwd)}")
            (self.sweeps if sweep else self.runs).append(where)
        code, out, err = self.main(args, cwd)
        if code != 0:
            return f"exit {code}: {(err or out).strip().splitlines()[-3:]}"
        if command is None:
            return self.check_sweep(where) if sweep else self.check_run(where, out)
        return ""

    def check_run(self, run_dir: Path, out: str) -> str:
        status = json.loads((run_dir / "status.json").read_text())
        missing = [name for name in RUN_LEAVES if not (run_dir / name).exists()]
        if status["status"] != "ok" or missing or "Test " not in out:
            return f"status {status['status']}, missing {missing}"
        return ""

    def check_sweep(self, sweep_dir: Path) -> str:
        jobs = [json.loads(p.read_text())["status"] for p in sorted(sweep_dir.glob("*/status.json"))]
        missing = [name for name in SWEEP_LEAVES if not (sweep_dir / name).exists()]
        return "" if jobs and set(jobs) <= {"ok", "pruned"} and not missing else f"jobs {jobs}, missing {missing}"


def _sweeps(override: str) -> bool:
    """A preset of the package that makes its command a sweep without -m (hparams_search=optuna)."""
    group, _, option = override.partition("=")
    path = Path(cli.CONFIG_DIR) / group / f"{option}.yaml"
    return "/" not in option and path.exists() and "mode: MULTIRUN" in path.read_text()


def _named(doc: str, start: str, end: str) -> list:
    """The file names (`name.ext`, `dir/`) a sentence of a document gives, from `start` to `end`."""
    text = " ".join((ROOT / doc).read_text().split())
    return re.findall(r"`([\w.-]+(?:\.\w+|/))`", text[text.index(start):text.index(end, text.index(start))])


# What the README says a run and a sweep leave (a name it adds or drops there changes the check).
RUN_LEAVES = _named("README.md", "runs in `outputs/DATE/TIME/`", "and for local clusters")
SWEEP_LEAVES = _named("README.md", "the sweep directory holds", "the table is printed")


def reader_home(tmp_path: Path, doc: str) -> Path:
    """The reader's directory for doc: a project of their own with their data (README.md, docs/), or a
    copy of the example's directory (its README runs from there). The examples are in the project too."""
    home = tmp_path / "project"
    shutil.copytree(ROOT / "examples", home / "examples", ignore=shutil.ignore_patterns("outputs", "multirun"))
    readers_files(home)
    for module in READERS_MODULES:  # (what the docs show of them, their blocks lay out over these)
        (home / f"{module}.py").write_text("")
    return home / Path(doc).parent if doc.startswith("examples/") else home


def read(reader: Reader, doc: Path) -> Reader:
    """The reader, through the document: each of its blocks in order."""
    sybil = Sybil(parsers=[CodeBlockParser("bash", reader.shell), CodeBlockParser("console", reader.transcript),
                           CodeBlockParser("yaml", reader.config), CodeBlockParser("python", reader.config)],
                  path=str(doc.parent), patterns=[doc.name])
    for example in sybil.parse(doc):
        example.evaluate()
    return reader


@pytest.mark.parametrize("doc", DOCS)
def test_every_command_of_the_docs_runs_as_it_says(doc, tmp_path):
    reader = Reader(doc, reader_home(tmp_path, doc), tmp_path / "project")
    try:
        read(reader, ROOT / doc)
    finally:
        reader.stop()
    print(f"{doc}: {len(reader.ran)} run:", *(f"  {line}: {command}" for line, command in reader.ran), sep="\n")
    print(f"{len(reader.not_run)} not run:",
          *(f"  {line}: {command} ({why})" for line, command, why in reader.not_run), sep="\n")
    assert not reader.problems, "\n".join(reader.problems)
    if doc in ("README.md", "docs/configuration.md"):
        assert len(reader.ran) >= 20  # the docs' commands were found (a parser that finds none would pass)


def test_a_command_of_the_docs_that_no_longer_holds_fails(tmp_path):
    """The control: a command that fails, one not run here with a typo, one neither distrain's nor known, and a
    transcript whose line changed are each a problem; sound commands, run and not run, are not."""
    doc = tmp_path / "doc.md"
    doc.write_text("""```bash
python train.py --cfg job trainer.seed=7
python train.py trainer.epoch=3
python train.py cluster=slurm strategy=multi_worker_mirrored
python train.py cluster=slurm trainer.epochs=0
rm -rf outputs
make test
```
```console
$ python train.py trainer.epoch=4
error: trainer.epoch is not a key of trainer: set e.g. trainer.epochs=99
```
""")
    reader = read(Reader("doc.md", reader_home(tmp_path, "README.md"), tmp_path / "project"), doc)
    assert [problem.split("\n")[0] for problem in reader.problems] == [
        "doc.md:1: python train.py trainer.epoch=3",
        "doc.md:1: python train.py cluster=slurm trainer.epochs=0 (not run: needs a Slurm allocation (test_slurm runs "
        "it on a local Slurm))",
        "doc.md:1: rm -rf outputs", "doc.md:9: python train.py trainer.epoch=4"], reader.problems
    assert "trainer.epochs=0 must be a positive integer" in reader.problems[1]
    assert [command.split(" (")[0] for _, command in reader.ran] == [
        "python train.py --cfg job trainer.seed=7", "python train.py trainer.epoch=3",
        "python train.py trainer.epoch=4"]
    assert [command for _, command, _ in reader.not_run] == [
        "python train.py cluster=slurm strategy=multi_worker_mirrored",
        "python train.py cluster=slurm trainer.epochs=0", "rm -rf outputs", "make test"]


def test_the_figure_the_readme_gives_for_the_example_holds(tmp_path):
    """The README's range for examples/digits8x8 in float32, from the example's own command at full length
    (12 epochs: 1,437 images, seconds), with the precision the README names."""
    text = " ".join((ROOT / "README.md").read_text().split())
    low, high = map(float, re.search(r"It reaches ([\d.]+)-([\d.]+)% test accuracy under every strategy in "
                                     r"float32 \(`trainer.mixed_precision=false`", text).groups())
    home = reader_home(tmp_path, "examples/digits8x8/README.md")
    reader = Reader("README.md", home, tmp_path / "project")
    code, out, err = reader.main(["--config-dir", "conf", "model=small_cnn", "data=digits",
                                  "trainer.mixed_precision=false", "hydra.run.dir=run"], home)
    assert code == 0, err[-2000:]
    accuracy = 100 * json.loads((home / "run" / "results.json").read_text())["test_accuracy"]
    assert low <= accuracy <= high, (accuracy, low, high)
