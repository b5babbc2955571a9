"""TFRecord files, written with TensorFlow: the shards of images `distrain write-tfrecords` makes
(data/write_tfrecords.py), and the Examples `distrain predict out=F.tfrecord` writes (inference/predictions.py).
Runs in the command's process, where TensorFlow is imported for it."""
import os
from pathlib import Path

import numpy as np
import tensorflow as tf

from distrain.data.files import TEXT_KEY


def write_shards(images, labels, out_dir: Path, split: str, shards: int, raw: bool = False, names=None) -> list[Path]:
    """The images (N, H, W, C) and labels as `shards` files out_dir/{split}-00000-of-0000N.tfrecord, example i
    in shard i % shards; PNG-encoded, or raw uint8 pixels; names: each label's class name (image/class/text)."""
    if images.dtype != np.uint8:
        images = np.clip(np.round(images * 255.0), 0, 255).astype(np.uint8)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{split}-{s:05d}-of-{shards:05d}.tfrecord" for s in range(shards)]
    height, width, channels = images.shape[1:]
    for shard, path in enumerate(paths):
        with tf.io.TFRecordWriter(str(path)) as writer:
            for i in range(shard, len(labels), shards):
                encoded = images[i].tobytes() if raw else tf.io.encode_png(images[i]).numpy()
                feature = {"image/encoded": _bytes(encoded), "image/class/label": _ints(int(labels[i])),
                           "image/height": _ints(height), "image/width": _ints(width),
                           "image/channels": _ints(channels)}
                if names:
                    feature[TEXT_KEY] = _bytes(str(names[int(labels[i])]).encode())
                writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    return paths


def _bytes(value: bytes):
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))


def _ints(value: int):
    return tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))


def _floats(values):
    return tf.train.Feature(float_list=tf.train.FloatList(value=values))


def write_outputs(out: Path, index, where: list, outputs, names=()) -> None:
    """One tf.train.Example per input: its index, its source and its outputs (flattened), and a classifier's
    class names where known (`class_names`, in output order), written to a temporary name and renamed (no
    half file under `out`)."""
    tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")
    named = {"class_names": tf.train.Feature(bytes_list=tf.train.BytesList(value=[str(n).encode() for n in names]))}
    try:
        with tf.io.TFRecordWriter(str(tmp)) as writer:
            for i, w, row in zip(index, where, outputs.reshape(len(outputs), -1)):
                feature = {"index": _ints(int(i)), "source": _bytes(w.encode()), "outputs": _floats(row),
                           **(named if names else {})}
                writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
