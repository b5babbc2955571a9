"""What `distrain predict` writes (commands.predict_run), whole or not at all: .npz (the outputs as
Keras's predict() gives them, and each example's index), .csv (a row per example: its index, source and
outputs, with the class and probabilities of a classifier's), .tfrecord (an Example per input). A
classifier's class names, where the data or the trained model names them, are the CSV's classes and
columns, and are kept beside the indices of the other two. Runs in the command's process, after the
outputs are computed."""
import csv
import io
from pathlib import Path

import numpy as np

from distrain.common import storage


def write(out: Path, outputs, data, probabilities: bool) -> None:
    """The outputs (float32, one row per test example of `data`, in order) into `out`, by its suffix;
    probabilities: whether a classifier's outputs are probabilities already (else logits)."""
    index = np.arange(len(outputs))
    classes = data.labels == "classes" and outputs.ndim == 2 and outputs.shape[1] == data.classes > 1
    names = list(data.class_names or []) if classes else []  # (the data's, else the trained model's)
    if out.suffix == ".npz":  # the outputs by index, the names beside them
        buffer = io.BytesIO()
        np.savez(buffer, predictions=outputs, index=index, **({"class_names": np.array(names)} if names else {}))
        storage.write_atomic(out, buffer.getvalue())
    elif out.suffix == ".tfrecord":
        from distrain.task import records

        records.write_outputs(out, index, sources(data), outputs, names)
    else:
        shown = outputs if probabilities or not classes else softmax(outputs)
        storage.write_atomic(out, _csv(index, sources(data), shown, classes, names))


def softmax(logits):
    """Probabilities of a classifier's logits (as tf.nn.softmax gives them), in float32."""
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    return (e / e.sum(axis=1, keepdims=True)).astype(np.float32)


def sources(data) -> list:
    """Where each test example came from: an image's path, a TFRecord file and record, or an array's row."""
    found = getattr(data, "found", None)
    if found is None:
        return [f"row {i}" for i in range(data.test_examples)]
    if found.kind == "images":
        return list(found.test_files)
    from distrain.data.files import record_ends

    ends = record_ends(tuple(found.test_files))
    return [f"{path}#{i}" for path, n in zip(found.test_files, np.diff(ends, prepend=0)) for i in range(n)]


def _csv(index, where: list, outputs, classes: bool, names) -> str:
    text = io.StringIO()
    writer = csv.writer(text)
    if classes:
        names = list(names or range(outputs.shape[1]))
        writer.writerow(["index", "source", "class", *(f"p_{n}" for n in names)])
        for i, w, row in zip(index, where, outputs):
            writer.writerow([i, w, names[int(np.argmax(row))], *(f"{p:.6g}" for p in row)])
    else:
        flat = outputs.reshape(len(outputs), -1)
        writer.writerow(["index", "source", *(f"output_{j}" for j in range(flat.shape[1]))])
        for i, w, row in zip(index, where, flat):
            writer.writerow([i, w, *(f"{v:.6g}" for v in row)])
    return text.getvalue()
