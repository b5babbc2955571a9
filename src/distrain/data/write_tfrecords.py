"""`distrain write-tfrecords [overrides] out=DIR [shards=N] [encoding=png|raw]`: any array source (bundled,
keras, idx, npz, a loader, synthetic) written as TFRecord shards in the layout data=tfrecord reads, so that
data can move from memory to files in one command:

    distrain write-tfrecords data=npz data.path=mydata.npz out=data shards=16
    python train.py data=tfrecord 'data.train_files=data/train-*' 'data.test_files=data/test-*'

Each record is a tf.train.Example: image/encoded (PNG; with encoding=raw the uint8 pixels themselves,
larger files but no decoding: the fastest to stream), image/class/label (int64), image/class/text (the
class's name, where data.class_names names them), image/height, image/width, image/channels; uint8 images
as they are, float images in [0, 1] scaled to 0-255.
"""
import contextlib
import os
import shutil
import sys
import tempfile
from pathlib import Path

from distrain.common import storage
from distrain.common.errors import ConfigError, fail, print_error
from distrain.config.schema import FILE_SOURCES

USAGE = ("distrain write-tfrecords [--config-dir DIR] [data=... overrides] out=DIR [shards=N] [encoding=png|raw]   "
         "(e.g. data=npz data.path=x.npz out=data)")
OPTIONS = ("out", "shards", "encoding")


def write(images, labels, out_dir: Path, split: str, shards: int, raw: bool = False, names=None) -> list[Path]:
    """The images (N, H, W, C) and labels as `shards` files out_dir/{split}-00000-of-0000N.tfrecord
    (task/records.py writes them, with TensorFlow)."""
    from distrain.task import records

    return records.write_shards(images, labels, out_dir, split, shards, raw, names)


@contextlib.contextmanager
def tensorflow_lines_to(out: Path, name: str = "write-tfrecords.log"):
    """TensorFlow's own lines (its C++ start-up: oneDNN, CUDA probes) into OUT/<name>, not
    the terminal, as a run keeps them in its logs/; this command's lines, Python's, still reach stderr.
    Where nothing was written (bad input), the log goes too."""
    log = tempfile.NamedTemporaryFile(prefix=f"{Path(name).stem}-", suffix=".log", delete=False)
    terminal, python_stderr = os.dup(2), sys.stderr
    os.dup2(log.fileno(), 2)
    sys.stderr = os.fdopen(os.dup(terminal), "w", buffering=1)
    try:
        yield
    finally:
        sys.stderr.close()
        sys.stderr = python_stderr
        os.dup2(terminal, 2)
        os.close(terminal)
        log.close()
        if out.is_dir():
            shutil.move(log.name, out / name)
        else:
            os.unlink(log.name)


def main(argv: list, compose, help: bool = False) -> int:
    """The command: argv its key=value arguments, compose(overrides) the run's config of the others (as
    cli.py composes a run's, --config-dir included); help: print the usage."""
    options = dict(a.split("=", 1) for a in argv if a.split("=", 1)[0] in OPTIONS)
    overrides = [a for a in argv if a.split("=", 1)[0] not in OPTIONS]
    if help:
        print("usage: " + USAGE)
        return 0
    if "out" not in options:
        print_error("write-tfrecords needs out=DIR, the directory to write the shards to: set it, as in " + USAGE)
        return 2
    try:
        shards = int(options.get("shards", 8))
        if shards < 1:
            raise ValueError
    except ValueError:
        print_error(f"shards={options['shards']} must be a positive integer: set e.g. shards=16")
        return 2
    if options.get("encoding", "png") not in ("png", "raw"):
        print_error(f"encoding={options['encoding']} is not png or raw: set encoding=png (smaller files) or raw "
                    "(no decoding)")
        return 2
    out = Path(options["out"])
    if why := storage.cannot_write_in(out):  # (now, not once every shard is encoded)
        print_error(f"out={out}: {why}: name a directory where you can write")
        return 2
    raw = options.get("encoding") == "raw"
    with tensorflow_lines_to(out):
        return _write(compose(overrides), out, shards, raw)


def _write(cfg, out: Path, shards: int, raw: bool) -> int:
    from distrain.config.validate import validate
    from distrain.data import arrays

    try:
        cfg = validate(cfg)
        if cfg.data.source in FILE_SOURCES:
            raise ConfigError(f"data={cfg.data.name} is in files already: write-tfrecords takes an array source "
                              "(bundled, keras, idx, npz, a loader, synthetic)")
        arrays.settle_source(cfg)
        (x_train, y_train), (x_test, y_test) = arrays.load(cfg.data, cfg.trainer.seed)
    except ConfigError as exc:
        return fail(exc)
    for split, (x, y) in (("train", (x_train, y_train)), ("test", (x_test, y_test))):
        paths = write(x, y, out, split, min(shards, len(y)), raw, cfg.data.get("class_names"))
        print(f"{split}: {len(y)} examples in {len(paths)} file(s) {out / split}-*.tfrecord", flush=True)
    size = f" data.image_size=[{x_train.shape[1]},{x_train.shape[2]}] data.channels={x_train.shape[3]}" if raw else ""
    print(f"train on them: python train.py data=tfrecord 'data.train_files={out}/train-*' "
          f"'data.test_files={out}/test-*'{size}", flush=True)
    return 0
