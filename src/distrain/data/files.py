"""Data in files, read without TensorFlow: TFRecord shards of tf.train.Example records (data=tfrecord)
and folders of images in class subfolders (data=images). The launcher scans them before any task
starts: the files there are, how many examples they hold (from the TFRecord record headers alone, no
decoding), the classes, and one example's shape; bad files are one line naming them. What it finds
is kept beside the run (data.json), so that the tasks, which stream the files (task/input_pipeline.py), read
none of it again.
"""
import functools
import glob
import io
import mmap
import os
import struct
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from distrain.common.errors import ConfigError

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif")  # what tf.io.decode_image reads
TEXT_KEY = "image/class/text"  # a record's class name (Model Garden's and TF-Slim's layout)
PNG, JPEG, GIF, BMP = b"\x89PNG", b"\xff\xd8\xff", b"GIF8", b"BM"


@dataclass
class FileData:
    """What a run's data files hold, as the launcher found them (data.json)."""
    kind: str  # tfrecord or images
    train_files: list  # sorted; images: one file per example
    test_files: list
    train_examples: int
    test_examples: int
    num_classes: int
    shape: list  # [H, W, C] after decoding (and resizing to data.image_size)
    encoded: bool = True  # tfrecord: an encoded image (PNG, JPEG, ...), else raw uint8 pixels
    train_labels: list = field(default_factory=list)  # images: the class index of each file
    test_labels: list = field(default_factory=list)
    class_names: list = field(default_factory=list)  # images: the class folders, in Keras's (sorted) order
    how: str = ""  # how it was found, for the run's log line
    labelled: bool = True  # False: inputs alone (predict's new data), labels read as 0

    def to_json(self) -> dict:
        return asdict(self)


def not_one_class(counted: int, where: str) -> int:
    """The classes counted from labels (one more than the largest), unless that is one: labels that are
    all 0 make a model of one output, which no class-index loss can train."""
    if counted == 1:
        raise ConfigError(f"{where} are all 0: one class, and a classifier needs two or more: set "
                          "data.num_classes=K (the classes there are), or check that the labels were read right")
    return counted


# ---- TFRecord files -------------------------------------------------------------------------------------

HEADER = struct.Struct("<Q")  # a record's length; its CRC (4 bytes) follows, then the data and the data's CRC


def tfrecord_lengths(path: Path):
    """The length of each record of a TFRecord file, from the record headers alone (each record is a
    uint64 length, its CRC, the data, the data's CRC), hopped over in the file mapped into memory (no
    system call per record: a million records in about a second). A file that is not one, or is cut short,
    is a ConfigError naming it."""
    size = os.path.getsize(path)
    if not size:
        return
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        at = 0
        while at < size:
            if at + 12 > size:
                raise ConfigError(f"{path} is cut short (a record header at byte {at} of {size}): it is not a whole "
                                  "TFRecord file; write it again")
            (length,) = HEADER.unpack_from(mapped, at)
            if at + 16 + length > size:
                raise ConfigError(f"{path} is not a TFRecord file, or is cut short (a record of {length} bytes at "
                                  f"byte {at} of {size}): give files written by tf.io.TFRecordWriter")
            yield length
            at += 16 + length


@functools.lru_cache(maxsize=4)
def record_ends(paths: tuple) -> np.ndarray:
    """Where each file's records end, counted over the files in order (the records of TFRecord files,
    from their headers): counted once per process."""
    return np.cumsum([sum(1 for _ in tfrecord_lengths(Path(p))) for p in paths], dtype=np.int64)


def tfrecord_records(path: Path):
    """Each record's bytes."""
    with open(path, "rb") as f:
        for length in tfrecord_lengths(path):
            f.seek(12, 1)
            yield f.read(length)
            f.seek(4, 1)


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        value |= (byte & 0x7F) << shift
        at, shift = at + 1, shift + 7
        if not byte & 0x80:
            return value, at


def _fields(data: bytes):
    """(field number, value) of a protocol buffer message: bytes for length-delimited fields, ints else."""
    at = 0
    while at < len(data):
        tag, at = _varint(data, at)
        number, kind = tag >> 3, tag & 7
        if kind == 0:
            value, at = _varint(data, at)
        elif kind == 2:
            length, at = _varint(data, at)
            value, at = data[at:at + length], at + length
        elif kind == 5:
            value, at = data[at:at + 4], at + 4
        elif kind == 1:
            value, at = data[at:at + 8], at + 8
        else:
            raise ValueError(f"wire type {kind}")
        yield number, value


def parse_example(record: bytes) -> dict:
    """A tf.train.Example's features: {key: ("bytes", [values]) | ("int64", [values]) | ("float", n)}."""
    features = {}
    for number, message in _fields(record):
        if number != 1:
            continue
        for entry_number, entry in _fields(message):  # Features: map<string, Feature> feature = 1
            if entry_number != 1:
                continue
            key, feature = "", b""
            for n, value in _fields(entry):
                key, feature = (value.decode(), feature) if n == 1 else (key, value if n == 2 else feature)
            for kind, values in _fields(feature):
                if kind == 1:  # BytesList
                    features[key] = ("bytes", [v for field, v in _fields(values) if field == 1])
                elif kind == 3:  # Int64List, packed or not
                    ints = []
                    for _, v in _fields(values):
                        if isinstance(v, bytes):
                            at = 0
                            while at < len(v):
                                x, at = _varint(v, at)
                                ints.append(x - (1 << 64) if x >= 1 << 63 else x)
                        else:
                            ints.append(v - (1 << 64) if v >= 1 << 63 else v)
                    features[key] = ("int64", ints)
                elif kind == 2:
                    features[key] = ("float", values)
    return features


def image_format(data: bytes) -> str | None:
    for magic, name in ((PNG, "PNG"), (JPEG, "JPEG"), (GIF, "GIF"), (BMP, "BMP")):
        if data.startswith(magic):
            return name
    return None


def image_shape(data: bytes, where: str) -> list:
    """[H, W, C] of an encoded image, from its header (Pillow); a ConfigError where it does not decode."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as image:
            bands = len(image.getbands())
            return [image.height, image.width, 1 if bands == 1 or image.mode in ("L", "P", "1") else 3]
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise ConfigError(f"{where} does not decode as an image ({exc}): replace it, or drop it") from None


def patterns(value) -> list:
    """data.train_files or data.test_files as a list of glob patterns."""
    return [value] if isinstance(value, str) else list(value or [])


def match(value, key: str) -> list:
    """The files the glob patterns match, sorted; a pattern that matches none is a ConfigError naming it."""
    if not patterns(value):
        raise ConfigError(f"data=tfrecord needs {key}: set e.g. {key}='data/train-*.tfrecord'")
    found = []
    for pattern in patterns(value):
        hits = sorted(os.path.abspath(p) for p in glob.glob(os.path.expanduser(pattern)) if os.path.isfile(p))
        if not hits:
            raise ConfigError(f"{key}: no file matches {pattern} (from {os.getcwd()}): fix the pattern, or give an "
                              "absolute path")
        found += hits
    return sorted(set(found))


def scan_tfrecords(data, train: bool = True) -> FileData:
    """train=False: the test split alone (evaluate's and predict's), whose records may hold no label."""
    started = time.perf_counter()
    train_files = match(data.train_files, "data.train_files") if train else []
    test = match(data.test_files, "data.test_files")
    counts = {path: sum(1 for _ in tfrecord_lengths(Path(path))) for path in train_files + test}
    for key, split in (("data.train_files", train_files), ("data.test_files", test)):
        if (split or key == "data.test_files") and not sum(counts[p] for p in split):
            raise ConfigError(f"{key} hold no record: give files that hold examples")
    first_file = next(p for p in train_files + test if counts[p])
    first = parse_example(next(tfrecord_records(Path(first_file))))
    where = f"the first record of {first_file}"
    labelled = train or data.label_key in first
    for key, kind in ((data.image_key, "bytes"), (data.label_key, "int64"))[:2 if labelled else 1]:
        if key not in first or first[key][0] != kind:
            has = ", ".join(f"{k} ({v[0]})" for k, v in sorted(first.items())) or "none"
            setting = "data.image_key" if kind == "bytes" else "data.label_key"
            raise ConfigError(f"{where} has no {kind} feature {key} (it has {has}): set {setting} to the key "
                              "your records use")
    image = first[data.image_key][1][0]
    encoded = image_format(image) is not None
    if encoded:
        shape = image_shape(image, where)
    else:  # raw uint8 pixels: their shape must be given
        if not data.image_size or not data.channels:
            raise ConfigError(f"{where}: {data.image_key} is not a PNG, JPEG, GIF or BMP image ({len(image)} bytes): "
                              "for raw uint8 pixels set data.image_size=[H,W] and data.channels")
        shape = [*data.image_size, data.channels]
        if len(image) != shape[0] * shape[1] * shape[2]:
            raise ConfigError(f"{where}: {data.image_key} holds {len(image)} raw bytes, not H x W x C = "
                              f"{shape[0] * shape[1] * shape[2]} (data.image_size={list(data.image_size)}, "
                              f"data.channels={data.channels}): fix those, or give encoded images")
    if data.image_size:
        shape[:2] = list(data.image_size)
    if data.channels:
        shape[2] = data.channels
    how = (f"{len(train_files)} training file(s), {len(test)} test file(s); examples counted from the record "
           "headers without decoding" + ("" if labelled else f"; no label ({data.label_key}): inputs alone"))
    names = list(data.class_names or [])
    classes = data.num_classes or len(names)
    if not classes and not labelled:
        raise ConfigError(f"{where} has no label, and data.num_classes is not set: set it (the model's outputs)")
    texts = labelled and not names and first.get(TEXT_KEY, ("",))[0] == "bytes"  # (the records name their classes)
    if not classes or texts:  # one stated pass over the labels (and their names)
        largest, named = _labels(train_files + test, data.label_key, texts)
        classes = classes or not_one_class(largest + 1, f"the labels ({data.label_key}) of every record")
        names = [named.get(i, str(i)) for i in range(classes)] if texts else names
        how += f"; {classes} classes" + (f" named by {TEXT_KEY}" if texts else "") + \
            ", read in one pass over every record (set data.num_classes and data.class_names to skip it)"
    how += f" ({time.perf_counter() - started:.1f} s)"
    return FileData("tfrecord", train_files, test, sum(counts[p] for p in train_files), sum(counts[p] for p in test),
                    classes, shape, encoded, how=how, labelled=labelled, class_names=names)


def _labels(paths: list, label_key: str, texts: bool) -> tuple[int, dict]:
    """(The largest label of the records, and where they name their classes (texts) each label's name); two
    names for a label are a ConfigError naming both."""
    largest, named = -1, {}
    for path in paths:
        for record in tfrecord_records(Path(path)):
            example = parse_example(record)
            label = example[label_key][1][0]
            largest = max(largest, label)
            if texts and TEXT_KEY in example:
                name = example[TEXT_KEY][1][0].decode(errors="replace")
                if named.setdefault(label, name) != name:
                    raise ConfigError(f"{path}: label {label} is named both {named[label]} and {name} ({TEXT_KEY}): "
                                      "give each label one name")
    return largest, named


# ---- image folders --------------------------------------------------------------------------------------

def _class_folders(split: Path) -> dict:
    folders = sorted(p.name for p in split.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not folders:
        raise ConfigError(f"{split} has no class folders: lay the images out as {split}/<class>/<image>.png")
    found = {}
    for name in folders:
        files = sorted(str(p) for p in (split / name).rglob("*") if p.suffix.lower() in IMAGE_EXTENSIONS
                       and p.is_file())
        if not files:
            raise ConfigError(f"class folder {split / name} holds no image ({', '.join(IMAGE_EXTENSIONS)}): add its "
                              "images, or remove the folder")
        found[name] = files
    return found


def _known(found: dict, names: list, split: Path, by: str | None) -> None:
    """Each class folder found is one of the names (by: what names them, data.class_names or the training
    folder; None: the folders themselves), else a ConfigError naming it."""
    unknown = [name for name in found if name not in names]
    if unknown and by:
        raise ConfigError(f"the class folder {split / unknown[0]} is not a class of {by} ({', '.join(names)}): "
                          f"rename or remove it{', or add it to data.class_names' if by == 'data.class_names' else ''}")


def scan_images(data, seed: int, train: bool = True, known: list | None = None) -> FileData:
    """train=False: the test split alone (evaluate's and predict's): test/<class>/ images, their classes
    matched by name to `known` (the trained model's, where it names them); else every image under test/ or
    data.path, at any depth, as inputs alone."""
    started = time.perf_counter()
    root = Path(data.path or "").expanduser().absolute()  # (absolute: tasks read these paths wherever they run)
    if not data.path or not root.is_dir():
        raise ConfigError(f"data.path={data.path} is not a directory: point it at a folder holding train/<class>/ "
                          "(and test/<class>/) image folders")
    if not train:
        return _test_images(data, root, known, started)
    if not (root / "train").is_dir():
        raise ConfigError(f"{root} has no train/ folder: lay the images out as {root}/train/<class>/<image>.png")
    train = _class_folders(root / "train")
    names = list(data.class_names or train)  # (the labels' order: data.class_names', else the folders' sorted)
    _known(train, names, root / "train", "data.class_names" if data.class_names else None)
    if (root / "test").is_dir():
        test = _class_folders(root / "test")  # (some of the classes, or all: a test set of some is fair)
        _known(test, list(data.class_names or train), root / "test",
               "data.class_names" if data.class_names else str(root / "train"))
        split = lambda files: (sorted(files), [])
    elif data.test_split:
        import numpy as np

        rng = np.random.default_rng(seed)

        def split(files):  # a seeded fraction of each class
            order = rng.permutation(len(files))
            held = max(1, round(len(files) * data.test_split))
            return [files[i] for i in sorted(order[held:])], [files[i] for i in sorted(order[:held])]
        test = None
    else:
        raise ConfigError(f"{root} has no test/ folder: add {root}/test/<class>/ images, or set "
                          "data.test_split=0.2 to hold out a fraction of train/")
    train_files, train_labels, test_files, test_labels = [], [], [], []
    for index, name in enumerate(names):
        kept, held = split(train.get(name, []))
        train_files += kept
        train_labels += [index] * len(kept)
        held = test.get(name, []) if test is not None else held
        test_files += held
        test_labels += [index] * len(held)
    if data.num_classes and data.num_classes < len(names):
        raise ConfigError(f"{root} has {len(names)} class folders but data.num_classes={data.num_classes}: set "
                          f"data.num_classes={len(names)}, or null")
    shape = _image_shape(data, train_files + test_files)
    how = (f"{len(names)} class folders, {len(train_files)} training and {len(test_files)} test image(s)"
           + ("" if test is not None else f" (data.test_split={data.test_split} of train/)")
           + f" ({time.perf_counter() - started:.1f} s)")
    return FileData("images", train_files, test_files, len(train_files), len(test_files),
                    data.num_classes or len(names), shape, train_labels=train_labels, test_labels=test_labels,
                    class_names=names, how=how)


def _image_shape(data, paths: list) -> list:
    """[H, W, C] of the images, as the pipeline gives them: every image alike, unless data.image_size
    resizes them (their headers read, no decoding)."""
    first = Path(paths[0])
    shape = image_shape(first.read_bytes(), str(first))
    if not data.image_size:
        for path in paths:
            with open(path, "rb") as f:  # the header alone
                other = image_shape(f.read(65536), path)
            if other[:2] != shape[:2]:
                raise ConfigError(f"images differ in size ({first} is {shape[0]}x{shape[1]}, {path} is "
                                  f"{other[0]}x{other[1]}): set data.image_size=[H,W] to resize them all")
    else:
        shape[:2] = list(data.image_size)
    if data.channels:
        shape[2] = data.channels
    return shape


def _test_images(data, root: Path, known: list | None, started: float) -> FileData:
    """The test split of an image folder alone: test/<class>/ images, labelled by their folder's name (the
    model's class of that name where it names its classes, else the folders' sorted order); else every image
    under test/ (or the folder itself), at any depth, sorted: inputs alone."""
    top = root / "test" if (root / "test").is_dir() else root
    folders = sorted(p for p in top.iterdir() if p.is_dir() and not p.name.startswith("."))
    loose = [p for p in top.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS]
    labelled = top == root / "test" and bool(folders) and not loose
    if labelled:
        found = _class_folders(top)
        given = list(data.class_names or known or [])
        names = given or list(found)
        unknown = [name for name in found if name not in names]
        if unknown:
            raise ConfigError(f"the class folder {top / unknown[0]} names a class the model does not know (it knows "
                              f"{', '.join(names)}): remove it, or rename it to one of those")
        paths = [path for name in found for path in found[name]]
        labels = [names.index(name) for name in found for _ in found[name]]
        how = f"{len(found)} class folders of {top}, {len(paths)} test image(s), " + (
            f"matched by name to the classes of {'data.class_names' if data.class_names else 'the model'}" if given
            else f"classes by position: the model names none, so its classes 0, 1, ... are taken to be the folders "
                 f"in sorted order ({', '.join(names)}); set data.class_names=[...] to its classes in label order "
                 "to match them by name")
    else:
        paths = sorted(str(p) for p in top.rglob("*") if p.suffix.lower() in IMAGE_EXTENSIONS and p.is_file()
                       and not any(part.startswith(".") for part in p.relative_to(top).parts))
        if not paths:
            raise ConfigError(f"{top} holds no image ({', '.join(IMAGE_EXTENSIONS)}): point data.path at a folder "
                              "of images")
        labels, names = [0] * len(paths), list(data.class_names or known or [])
        how = f"{len(paths)} image(s) under {top}, at any depth, in the order of their paths: inputs alone"
    if not data.num_classes and not names:
        raise ConfigError(f"{top}: the number of classes is not known: set data.num_classes (the model's outputs)")
    return FileData("images", [], paths, 0, len(paths), data.num_classes or len(names), _image_shape(data, paths),
                    test_labels=labels, class_names=names, labelled=labelled,
                    how=f"{how} ({time.perf_counter() - started:.1f} s)")


def scan(data, seed: int, train: bool = True, known: list | None = None) -> FileData:
    """The data files of data=tfrecord or data=images, checked. train=False: the test split alone
    (scan_tfrecords, scan_images)."""
    if data.source == "tfrecord":
        return scan_tfrecords(data, train)
    return scan_images(data, seed, train, known)


def from_json(content: dict) -> FileData:
    return FileData(**content)
