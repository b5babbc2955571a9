"""What a run writes to disk, and what happens when the disk is full.

Every file that another process reads (config, results, status, cluster, evaluation, summaries, plots)
is written under a temporary name and renamed into place: a reader sees all of it or none. A full disk
stops the run with one line that names the disk, what was kept and how to go on, after the files it
cut short (a checkpoint's `*_temp` directory, a `*.tmp`) are removed. No TensorFlow here: the launcher
uses it too.
"""
import errno
import logging
import os
import re
import shutil
import tempfile
from pathlib import Path

from distrain.common.errors import ConfigError

log = logging.getLogger("distrain")

FULL = (errno.ENOSPC, errno.EDQUOT)


def cannot_write_in(directory: Path) -> str:
    """Why no file can be made in `directory`, or where it is not there yet in its nearest parent that is
    (where it would be made): "" where one can. Asked before work whose end writes there."""
    there = next(p for p in [Path(directory), *Path(directory).parents] if p.exists())
    if not there.is_dir():
        return f"{there} is a file"
    try:
        tempfile.TemporaryFile(dir=there).close()
    except OSError as exc:
        return f"{there} cannot be written ({exc.strerror})"
    return ""


def write_atomic(path: Path, text: str | bytes) -> Path:
    """`text` (or bytes) into `path` atomically; an error names `path` and leaves no temporary file."""
    path = Path(path)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")  # several tasks may write the same file
    try:
        tmp.write_bytes(text.encode() if isinstance(text, str) else text)
        os.replace(tmp, path)  # readers (sweep summaries, tests, a resume) never see half a file
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise OSError(exc.errno, exc.strerror, str(path)) from exc
    return path


def is_full(exc: BaseException | None) -> bool:
    """Whether `exc`, or an error that caused it, is a full disk (or quota): Python's OSError, or
    TensorFlow's error for a file it could not write."""
    while exc is not None:
        if isinstance(exc, OSError) and exc.errno in FULL:
            return True
        if any(os.strerror(code) in str(exc) for code in FULL):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def where(exc: BaseException, default: Path) -> Path:
    """Where a failed write went: the nearest existing directory of the OSError's file, else of the first
    path in the message on a disk of this machine (TensorFlow's messages name devices, /job:..., too)."""
    paths = [exc.filename] if isinstance(exc, OSError) and exc.filename else []
    paths += [p for p in re.findall(r"(/[^\s;,'\"]+)", str(exc)) if Path("/", Path(p).parts[1]).is_dir()]
    path = Path(paths[0] if paths else default)
    while not path.is_dir() and path != path.parent:
        path = path.parent
    return path


def checkpoint_step(name: str | None) -> int | None:
    """The global step a checkpoint's name holds (ckpt-600: 600), or None."""
    found = re.fullmatch(r"ckpt-(\d+)", name or "")
    return int(found.group(1)) if found else None


def latest_checkpoint(directory: Path | None) -> str | None:
    """The newest complete checkpoint's name, from the index that tf.train.CheckpointManager writes
    last, atomically (read without TensorFlow)."""
    try:
        text = (Path(directory) / "checkpoint").read_text()
    except (OSError, TypeError):
        return None
    found = re.search(r'^model_checkpoint_path: "(.+)"', text, re.M)
    return Path(found.group(1)).name if found else None


def mount_point(path: Path) -> Path:
    path = Path(os.path.abspath(path))
    while not os.path.ismount(path):
        path = path.parent
    return path


def full_disk(exc: BaseException, path: Path, checkpoints: Path | None) -> ConfigError | None:
    """A full disk (`exc`, or an error that caused it) as the one line that says so; None for any other
    error. path: the run's directory (the line names the disk of the file that failed, else this one)."""
    return ConfigError(full_disk_line(where(exc, path), checkpoints)) if is_full(exc) else None


def full_disk_line(path: Path, checkpoints: Path | None, started: bool = True) -> str:
    """The one line for a full disk: which, what was kept (checkpoints: where the run keeps them, None
    if it keeps none), how to go on. started=False: nothing of a run was written yet (Hydra's own files)."""
    disk = f"the disk holding {path} is full (the filesystem at {mount_point(path)})"
    if not started:
        return f"{disk}: free space, or set hydra.run.dir (hydra.sweep.dir for sweeps) to a larger disk"
    latest = latest_checkpoint(checkpoints)
    if latest:
        kept, then = f"the latest complete checkpoint is {latest} (in {checkpoints})", "go on with trainer.resume=true"
    else:
        kept = "no checkpoint was completed" if checkpoints else "nothing was saved (trainer.save_model=false)"
        then = "run it again"
    return f"{disk}: {kept}; free space, or move the run to a larger disk, then {then}"


def remove_partial(*directories: Path | None) -> None:
    """Remove what writes cut short left in these directories: TensorFlow's `*_temp` checkpoint
    directories and files, and temporary files of ours (`*.tmp`, `*.tmp.png`)."""
    for directory in filter(None, directories):
        for path in sorted(Path(directory).rglob("*"), reverse=True):  # (the deepest first)
            if path.name.endswith(("_temp", ".tmp", ".tmp.png")):
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink(missing_ok=True)


_said = set()


def record(write, path: Path, *args) -> None:
    """write(path, *args) for a file the launcher keeps (status.json, cluster.json, a log line): a failure
    is said once per file, never raised, so that the run still ends cleanly and says why."""
    try:
        write(path, *args)
    except OSError as exc:
        if path not in _said:
            _said.add(path)
            log.warning("cannot write %s (%s)", path, exc.strerror or exc)
