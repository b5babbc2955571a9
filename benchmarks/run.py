"""The benchmark suite: distrain against plain Keras and against its own settings, measured side by side.

    python benchmarks/run.py [--rounds 5] [--epochs 4] [--only overhead,...,ceiling,decode]

Never timed tests: this prints ratios measured in one run. Each round runs every configuration of a
section back to back, in alternating order (A B, then B A), so drift on a shared machine hits both
sides of a ratio alike; a ratio is computed per round, and the median is reported with the range.
Every run is a fresh process on the bundled digits, pinned to the same cores (--cores). Throughput
is examples/s over the epochs after the first (tracing, warm-up), as train.py reports it.

Writes benchmarks/results/benchmarks.json (every sample) and benchmarks/results/benchmarks.md (the
table benchmarks/README.md quotes, with the machine and its CPU features named).
"""
import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
TRAIN, PLAIN, CEILING = HERE.parent / "train.py", HERE / "plain_keras.py", HERE / "ceiling.py"
FASHION = Path("/usr/share/datasets/fashion-mnist")
QUIET = ["trainer.verbose=0", "trainer.save_model=false"]
# Where distrain is compared with plain Keras for its own cost, both run oneDNN's kernels (the cpu
# section compares each out of the box).
ONEDNN, PLAIN_ONEDNN = "trainer.onednn=true", {"TF_ENABLE_ONEDNN_OPTS": "1"}
SECTIONS = ("overhead", "settings", "cpu", "threads", "pipeline", "startup", "accuracy", "scaling", "ps_data",
            "files", "ceiling", "decode", "predict", "service")


class Failed(Exception):
    """A benchmarked command failed: its output says why."""


class Bench:
    def __init__(self, opts):
        self.opts, self.cores = opts, opts.cores
        self.workdir = Path(tempfile.mkdtemp(prefix="distrain-bench-"))
        self.rows, self.samples = [], {}

    def _run(self, argv: list, timeout: float = 1200, watch=None, cores=None, env=None) -> tuple[str, float]:
        """Output and wall-clock seconds of a command, pinned to `cores` (default: --cores)."""
        env = {**os.environ, **(env or {}), "DISTRAIN_STARTED": str(time.time())}
        pin = cores or self.cores
        start = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                preexec_fn=lambda: os.sched_setaffinity(0, pin))
        if watch:
            watch(proc)
        out, _ = proc.communicate(timeout=timeout)
        wall = time.perf_counter() - start
        if proc.returncode:
            raise Failed(f"benchmark run failed: {' '.join(map(str, argv))}\n{out[-3000:]}")
        return out, wall

    def train(self, *args, watch=None, cores=None, env=None) -> dict:
        """results.json of `python train.py ARGS` (quiet, bundled digits), with its wall-clock seconds."""
        run_dir = Path(tempfile.mkdtemp(dir=self.workdir))
        data = [] if any(a.startswith("data=") for a in args) else ["data.source=bundled"]
        _, wall = self._run([sys.executable, str(TRAIN), f"hydra.run.dir={run_dir}", *QUIET, *data, *args],
                            watch=watch and (lambda proc: watch(proc, run_dir)), cores=cores, env=env)
        results = json.loads((run_dir / "results.json").read_text())
        return {**results, "wall_seconds": wall, "run_dir": str(run_dir)}

    def plain(self, *args, cores=None, env=None) -> dict:
        out, wall = self._run([sys.executable, str(PLAIN), f"--epochs={self.opts.epochs}", *args], cores=cores, env=env)
        return {**json.loads(out.strip().splitlines()[-1]), "wall_seconds": wall}

    def ceiling(self, *args, cores=None) -> dict:
        """ceiling.py's median examples/s for the config of `train.py ARGS`."""
        out, wall = self._run([sys.executable, str(CEILING), "--rounds", "3", "--seconds", "4", *args], cores=cores)
        return {**json.loads(out.strip().splitlines()[-1]), "test_accuracy": float("nan"), "wall_seconds": wall}

    def rounds(self, name: str, configs: dict, rounds: int | None = None) -> dict:
        """label -> list of results, one per round; every label once per round, order alternating."""
        rounds = rounds or self.opts.rounds
        got = {label: [] for label in configs}
        for r in range(rounds):
            for label in (list(configs) if r % 2 == 0 else list(configs)[::-1]):
                got[label].append(configs[label]())
                res = got[label][-1]
                print(f"  {name} round {r + 1}/{rounds}  {label:<44} {res['examples_per_sec']:8.0f} examples/s  "
                      f"test accuracy {res['test_accuracy']:.4f}", flush=True)
        self.samples[name] = {label: [strip(s) for s in runs] for label, runs in got.items()}
        return got

    def row(self, section: str, measure: str, values: list | float | str, unit: str = "", target: str = "",
            met: bool | None = None) -> None:
        if isinstance(values, list):
            shown = f"{statistics.median(values):.2f}{unit} ({min(values):.2f}-{max(values):.2f})"
            value = statistics.median(values)
        else:
            shown, value = (f"{values:.2f}{unit}" if isinstance(values, float) else values), values
        verdict = "" if met is None else ("yes" if met else "**no**")
        self.rows.append({"section": section, "measure": measure, "value": value, "shown": shown,
                          "samples": values if isinstance(values, list) else None, "target": target, "met": verdict})
        print(f"{section:<10} {measure:<62} {shown:<26} {target} {verdict}", flush=True)


def strip(results: dict) -> dict:
    keep = ("examples_per_sec", "steps_per_sec", "test_accuracy", "train_seconds", "seconds_to_first_step",
            "wall_seconds", "epoch_seconds", "precision_policy", "onednn", "steps_per_execution", "time_split",
            "input_examples_per_sec")
    return {k: results[k] for k in keep if k in results}


def ratios(a: list, b: list, key: str = "examples_per_sec") -> list:
    return [x[key] / y[key] for x, y in zip(a, b)]


def overhead(b: Bench) -> None:
    """train.py strategy=default against plain Model.fit: same model, data, batch, optimizer, float32.
    The two run at the same time, one core each, swapping cores every round: whatever else the machine
    does then slows both alike."""
    if len(b.cores) < 2:
        raise Failed("the overhead section runs its pair side by side: it needs 2 cores (--cores 0,1)")
    e, cores = f"trainer.epochs={b.opts.epochs}", sorted(b.cores)[:2]
    mine, plain = [], []
    for r in range(b.opts.rounds):
        a, c = ({cores[0]}, {cores[1]}) if r % 2 == 0 else ({cores[1]}, {cores[0]})
        with ThreadPoolExecutor(2) as pool:
            ours = pool.submit(b.train, e, "trainer.mixed_precision=false", ONEDNN, cores=a)
            theirs = pool.submit(b.plain, cores=c, env=PLAIN_ONEDNN)
            mine.append(ours.result())
            plain.append(theirs.result())
        print(f"  overhead round {r + 1}/{b.opts.rounds}  distrain {mine[-1]['examples_per_sec']:6.0f} examples/s "
              f"(core {min(a)}), plain Keras {plain[-1]['examples_per_sec']:6.0f} (core {min(c)})", flush=True)
    b.samples["overhead"] = {"distrain": [strip(r) for r in mine], "plain Keras": [strip(r) for r in plain]}
    per_round = ratios(mine, plain)
    b.row("overhead", "examples/s: distrain / plain Keras fit, side by side, 1 core each", per_round, "",
          ">= 0.98", statistics.median(per_round) >= 0.98)
    if len(per_round) >= 2:  # a pair of rounds has each program once on each core: the cores' difference cancels
        pairs = [(per_round[i] * per_round[i + 1]) ** 0.5 for i in range(0, len(per_round) - 1, 2)]
        b.row("overhead", "the same, per pair of rounds (cores swapped; geometric mean)", pairs, "", ">= 0.98",
              statistics.median(pairs) >= 0.98)
    b.row("overhead", "test accuracy: distrain - plain Keras fit (points)",
          [100 * (x["test_accuracy"] - y["test_accuracy"]) for x, y in zip(mine, plain)])


def ceiling(b: Bench) -> None:
    """The default run against the machine's compute ceiling for its model and batch, and what the time
    accounting (trainer.time_split) costs: on / off, interleaved.

    The ceiling (ceiling.py) is forward, backward and the optimizer on one resident batch in a
    tf.function loop: no input pipeline, no metrics, the same model, global batch and precision."""
    # Fashion-MNIST where it is installed: the default run's model, batch and precision, with epochs of 468
    # steps (the bundled digits' 62 time too short a window for a few percent)
    data = ["data=fashion_mnist"] if (FASHION / "train-images-idx3-ubyte.gz").exists() else ["data.source=bundled"]
    e = "trainer.epochs=3"
    got = b.rounds("ceiling", {
        "default run": lambda: b.train(e, *data),
        "default run, trainer.time_split=false": lambda: b.train(e, *data, "trainer.time_split=false"),
        "compute ceiling (ceiling.py)": lambda: b.ceiling(*data),
    })
    default, off = got["default run"], got["default run, trainer.time_split=false"]
    top = got["compute ceiling (ceiling.py)"]
    b.row("ceiling", "examples/s: the default run / the compute ceiling", ratios(default, top), "", ">= 0.95",
          statistics.median(ratios(default, top)) >= 0.95)
    b.row("ceiling", "examples/s: time accounting on / off (its cost)", ratios(default, off), "", ">= 0.97",
          statistics.median(ratios(default, off)) >= 0.97)
    for part in ("input", "compute", "communication"):
        b.row("ceiling", f"the default run's time split: {part}", [r["time_split"][part] for r in default])


def decode(b: Bench) -> None:
    """Fashion-MNIST (60,000 images) from PNG TFRecord shards against the same images in memory: the first
    epoch (every image decoded), and the epochs after it with data.cache=memory; what the PNG pipeline
    delivers alone, and where the PNG run's time goes."""
    if not (FASHION / "train-images-idx3-ubyte.gz").exists():
        b.row("decode", "PNG shards of 60,000 images", f"not measured (no {FASHION}: apt-get install "
              "dataset-fashion-mnist)")
        return
    shards = b.workdir / "fashion-png"
    b._run([sys.executable, str(TRAIN), "write-tfrecords", "data=fashion_mnist", f"out={shards}", "shards=8"])
    png = ["data=tfrecord", f"data.train_files={shards}/train-*", f"data.test_files={shards}/test-*",
           "data.num_classes=10"]
    e = "trainer.epochs=3"
    got = b.rounds("decode", {
        "arrays in memory (data=fashion_mnist)": lambda: b.train(e, "data=fashion_mnist"),
        "PNG shards": lambda: b.train(e, *png),
        "PNG shards, data.cache=memory": lambda: b.train(e, *png, "data.cache=memory"),
    }, rounds=max(1, b.opts.rounds - 2))
    arrays, streamed, cached = (got[k] for k in got)
    first = [a["epoch_seconds"][0] / p["epoch_seconds"][0] for a, p in zip(arrays, streamed)]
    b.row("decode", "PNG shards / arrays, examples/s of the first epoch (decoding every image)", first, "",
          ">= 0.85", statistics.median(first) >= 0.85)
    # The cap where decoding shares the cores with the steps: 1 / (1 + decode CPU / step CPU), per example: the
    # PNG pipeline's read alone, and the in-memory run's (its epochs' CPU: input_cpu_per_example / input_cpu_share).
    caps = [1 / (1 + p["input_cpu_per_example"] * a["input_cpu_share"] / a["input_cpu_per_example"])
            for a, p in zip(arrays, streamed)]
    b.row("decode", "the cap on shared cores: 1 / (1 + decode CPU / step CPU, per example)", caps)
    below = [c - f for f, c in zip(first, caps)]
    b.row("decode", "the cap - PNG shards' first epoch / arrays", below, "", "<= 0.05",
          statistics.median(below) <= 0.05)
    b.row("decode", "PNG shards with data.cache=memory / arrays, examples/s after the first epoch",
          ratios(cached, arrays), "", ">= 0.97", statistics.median(ratios(cached, arrays)) >= 0.97)
    b.row("decode", "PNG shards: the input pipeline alone (input_examples_per_sec) / arrays' training examples/s",
          [p["input_examples_per_sec"] / a["examples_per_sec"] for a, p in zip(arrays, streamed)], "x")
    b.row("decode", "PNG shards: the share of time waiting for input", [p["time_split"]["input"] for p in streamed])
    b.row("decode", "arrays in memory: the share of time waiting for input", [a["time_split"]["input"] for a in arrays])


def service(b: Bench) -> None:
    """The tf.data service on this machine (data.service.workers): its dispatcher and data workers against
    the pipeline in the trainer, on the digits in memory and as PNG shards; 2 data workers against 1."""
    out = b.workdir / "service-shards"
    b._run([sys.executable, str(TRAIN), "write-tfrecords", "data.source=bundled", f"out={out}", "shards=8"])
    png = ["data=tfrecord", f"data.train_files={out}/train-*", f"data.test_files={out}/test-*", "data.num_classes=10"]
    e = f"trainer.epochs={b.opts.epochs}"
    got = b.rounds("service", {
        "arrays, in the trainer": lambda: b.train(e),
        "arrays, the service (1 data worker)": lambda: b.train(e, "data.service.workers=1"),
        "PNG shards, in the trainer": lambda: b.train(e, *png),
        "PNG shards, the service (1 data worker)": lambda: b.train(e, *png, "data.service.workers=1"),
        "PNG shards, the service (2 data workers)": lambda: b.train(e, *png, "data.service.workers=2"),
    })
    arrays, served, files, one, two = (got[k] for k in got)
    b.row("service", "arrays: the service (1 data worker) / in the trainer, examples/s", ratios(served, arrays))
    b.row("service", "PNG shards: the service (1 data worker) / in the trainer, examples/s", ratios(one, files))
    b.row("service", "PNG shards, the first epoch: the service (1 data worker) / in the trainer",
          [f["epoch_seconds"][0] / o["epoch_seconds"][0] for f, o in zip(files, one)])
    b.row("service", "PNG shards: 2 data workers / 1, examples/s", ratios(two, one))
    b.row("service", "PNG shards: 2 data workers / 1, what the service delivers alone (input_examples_per_sec)",
          ratios(two, one, "input_examples_per_sec"))


PLAIN_PREDICT = """
import json, sys, time
import numpy as np, tf_keras as keras
model = keras.models.load_model(sys.argv[1], compile=False)
with np.load(sys.argv[2]) as f:
    x = f["x"]
model.predict(x[:256], batch_size=128, verbose=0)  # (traced before the clock starts, as distrain's is not)
start = time.perf_counter()
model.predict(x, batch_size=128, verbose=0)
print(json.dumps({"examples_per_sec": len(x) / (time.perf_counter() - start)}))
"""


def write_arrays(images: Path, floats: Path, data: list) -> None:
    """The training split of `train.py DATA` as the test split of an .npz at `images` (distrain predict's
    input), and as float arrays for plain Keras at `floats`."""
    import numpy as np

    sys.path[:0] = [str(SRC), str(HERE.parent / "tests")]
    from distrain.data import arrays

    from helpers import make_cfg

    (x, y), _ = arrays.load(make_cfg(*data).data, 42)
    np.savez(images, x_train=x[:10], y_train=y[:10], x_test=x, y_test=y)
    np.savez(floats, x=x.astype("float32")[..., None] / 255.0)


def predict(b: Bench) -> None:
    """`distrain predict` on a trained run's model against plain Keras `predict` on the same arrays
    (the SavedModel loaded, batch 128), and on 2 workers (multi_worker_mirrored); the examples/s each
    reports for its predictions alone, and the command's wall-clock seconds, start-up included."""
    fashion = (FASHION / "train-images-idx3-ubyte.gz").exists()
    data = ["data=fashion_mnist"] if fashion else ["data.source=bundled"]
    run = b.train("trainer.epochs=1", *data, "trainer.save_model=true")
    run_dir = Path(run["run_dir"])
    # The training split's images as the test split of an .npz (60,000 with Fashion-MNIST): a window long
    # enough that tracing the predict function is not what is measured
    arrays, images = b.workdir / "plain.npz", b.workdir / "images.npz"
    write_arrays(images, arrays, data)
    data = ["data=npz", f"data.path={images}"]
    n = iter(range(10 ** 6))

    def ours(*args) -> dict:
        out, wall = b._run([sys.executable, str(TRAIN), "predict", str(run_dir), *data, *args,
                            f"out={b.workdir / f'p{next(n)}.npz'}"])
        line = [ln for ln in out.splitlines() if ln.startswith("Predicted ")][-1]
        rate = float(line.split(" examples/s")[0].rsplit(", ", 1)[1].replace(",", ""))
        return {"examples_per_sec": rate, "wall_seconds": wall, "test_accuracy": float("nan")}

    def plain() -> dict:
        out, wall = b._run([sys.executable, "-c", PLAIN_PREDICT, str(run_dir / "saved_model"), str(arrays)])
        return {**json.loads(out.strip().splitlines()[-1]), "wall_seconds": wall, "test_accuracy": float("nan")}

    got = b.rounds("predict", {"distrain predict": ours, "plain Keras predict": plain,
                               "distrain predict, 2 workers": lambda: ours("strategy=multi_worker_mirrored",
                                                                           "cluster.workers=2")})
    one, keras_, two = (got[k] for k in got)
    b.row("predict",
          f"examples/s: distrain predict / plain Keras predict ({'Fashion-MNIST' if fashion else 'bundled digits'}"
          " training images)", ratios(one, keras_), "", ">= 0.9",
          statistics.median(ratios(one, keras_)) >= 0.9)
    b.row("predict", "examples/s: 2 workers (multi_worker_mirrored) / one process, the tasks' start-up included",
          ratios(two, one))
    b.row("predict", "wall-clock seconds of the command: one process", [r["wall_seconds"] for r in one], " s")
    b.row("predict", "wall-clock seconds of the command: 2 workers", [r["wall_seconds"] for r in two], " s")


def settings(b: Bench) -> None:
    """The trainer's speed settings, each against the default float32 loop, and XLA under plain Keras too
    (oneDNN on in every run)."""
    e = f"trainer.epochs={b.opts.epochs}", ONEDNN
    ps = ["strategy=parameter_server", "cluster.workers=2", "cluster.ps=1"]
    got = b.rounds("settings", {
        "float32, 1 step per call": lambda: b.train(*e, "trainer.mixed_precision=false",
                                                    "trainer.steps_per_execution=1"),
        "float32, 8 steps per call (default)": lambda: b.train(*e, "trainer.mixed_precision=false"),
        "mixed_precision=auto (default)": lambda: b.train(*e),
        "float32, jit_compile=true": lambda: b.train(*e, "trainer.mixed_precision=false", "trainer.jit_compile=true"),
        "plain Keras, float32": lambda: b.plain(env=PLAIN_ONEDNN),
        "plain Keras, jit_compile=True": lambda: b.plain("--jit-compile", env=PLAIN_ONEDNN),
        "parameter_server 2 workers, 1 step per call": lambda: b.train(*e, *ps, "trainer.steps_per_execution=1",
                                                                        "trainer.mixed_precision=false"),
        "parameter_server 2 workers, 8 steps per call": lambda: b.train(*e, *ps, "trainer.mixed_precision=false"),
    })
    base = got["float32, 8 steps per call (default)"]
    b.row("overhead", "examples/s: distrain / plain Keras fit, one after the other, 2 cores",
          ratios(base, got["plain Keras, float32"]), "", ">= 0.98",
          statistics.median(ratios(base, got["plain Keras, float32"])) >= 0.98)
    b.row("settings", "steps_per_execution 8 / 1 (default strategy)",
          ratios(base, got["float32, 1 step per call"]), "x")
    b.row("settings", "steps_per_execution 8 / 1 (parameter_server, 2 workers)",
          ratios(got["parameter_server 2 workers, 8 steps per call"],
                 got["parameter_server 2 workers, 1 step per call"]),
          "x")
    auto = got["mixed_precision=auto (default)"]
    b.row("settings", f"mixed_precision=auto ({auto[0]['precision_policy']}) / float32", ratios(auto, base), "x")
    b.row("settings", "mixed_precision=auto - float32: test accuracy (points)",
          [100 * (x["test_accuracy"] - y["test_accuracy"]) for x, y in zip(auto, base)])
    b.row("settings", "jit_compile=true / false, distrain", ratios(got["float32, jit_compile=true"], base), "x")
    b.row("settings", "jit_compile=True / False, plain Keras fit",
          ratios(got["plain Keras, jit_compile=True"], got["plain Keras, float32"]), "x")
    b.training_rate = max(getattr(b, "training_rate", 0),
                          *(statistics.median(r["examples_per_sec"] for r in runs) for runs in got.values()))


def pipeline(b: Bench) -> None:
    """The tf.data pipeline alone, each strategy's way of reading, against the fastest training measured."""
    os.sched_setaffinity(0, b.cores)
    sys.path.insert(0, str(SRC))
    from omegaconf import OmegaConf

    from distrain.data import arrays

    stderr = os.dup(2)
    os.dup2(os.open(os.devnull, os.O_WRONLY), 2)  # TensorFlow's start-up lines
    import tensorflow  # noqa: F401 - here, with its start-up lines hidden
    os.dup2(stderr, 2)

    from distrain.task.input_pipeline import make_dataset

    (x, y), _ = arrays.load(OmegaConf.create({"source": "bundled", "name": "mnist"}), 42)
    modes = {"global batches (default, mirrored, central_storage)": {"batch_size": 128},
             "a worker's slice of each global batch (multi_worker_mirrored, 2)": {"batch_size": 128, "part": (0, 64)},
             "a worker's own shard (parameter_server, 2 workers)": {"batch_size": 128, "shard": (2, 0)}}
    training = getattr(b, "training_rate", None)  # the fastest measured on 2 cores (settings)
    if training is None:
        training = b.train(f"trainer.epochs={b.opts.epochs}")["examples_per_sec"]
    @tensorflow.function
    def drain(iterator, batches):  # as the training step reads it: inside a tf.function, no Python per batch
        examples = tensorflow.constant(0)
        for _ in tensorflow.range(batches):
            examples += tensorflow.shape(next(iterator)[1])[0]
        return examples

    for label, kwargs in modes.items():
        rates = []
        for _ in range(b.opts.rounds):
            ds = make_dataset(x, y, seed=42, shuffle_buffer=10000, repeat=True, drop_remainder=True,
                              **kwargs).prefetch(tensorflow.data.AUTOTUNE)  # (as InputReader prefetches)
            it = iter(ds)
            drain(it, tensorflow.constant(50))  # warm-up, tracing
            start = time.perf_counter()
            examples = int(drain(it, tensorflow.constant(1000)))
            rates.append(examples / (time.perf_counter() - start))
        b.row("pipeline", f"{label}: pipeline / training examples/s", [r / training for r in rates], "x",
              ">= 20x", statistics.median(rates) / training >= 20)
    b.samples["pipeline"] = {"training_examples_per_sec": training}


def startup(b: Bench) -> None:
    """Seconds to answer --help and --cfg job, and from the command's start to the first training step."""
    for flag in (["--help"], ["--cfg", "job"]):
        walls = [b._run([sys.executable, str(TRAIN), *flag])[1] for _ in range(b.opts.rounds)]
        b.row("startup", f"`python train.py {' '.join(flag)}` seconds", walls, " s", "< 1 s",
              statistics.median(walls) < 1)
    clusters = {"default": [], "multi_worker_mirrored, 2 workers": ["strategy=multi_worker_mirrored",
                                                                    "cluster.workers=2"],
                "parameter_server, 1 ps + 2 workers": ["strategy=parameter_server", "cluster.workers=2",
                                                       "cluster.ps=1"]}
    got = b.rounds("startup", {label: (lambda a=args: b.train("trainer.epochs=1", *a)) for label,
                               args in clusters.items()},
                   rounds=max(1, b.opts.rounds // 2))
    for label, runs in got.items():
        # Where the time goes: each task's "ready" line (a server up; a strategy connected), from cluster.json.
        tasks = [json.loads((Path(r["run_dir"]) / "cluster.json").read_text())["tasks"] for r in runs
                 if (Path(r["run_dir"]) / "cluster.json").exists()]
        roles = ({"the last ps/worker server ready": ("ps", "worker"), "the coordinator's strategy ready": ("chief",)}
                 if label.startswith("parameter_server") else {"every worker's strategy ready": ("worker",)})
        for role, kinds in roles.items():
            ready = [max(t["seconds_to_ready"] for t in ts if t["type"] in kinds) for ts in tasks
                     if any(t["type"] in kinds for t in ts)]
            if ready:
                b.row("startup", f"seconds to {role}: {label}", ready, " s")
        b.row("startup", f"seconds to the first training step: {label}", [r["seconds_to_first_step"] for r in runs],
              " s")


def accuracy(b: Bench) -> None:
    """Training seconds until the test accuracy reaches the target: one run, resumed epoch by epoch (resume is
    exact, so this is the run an uninterrupted one would be), evaluated after each epoch."""
    def reach(target: float, args: list, label: str, most: int = 30) -> None:
        run_dir = Path(tempfile.mkdtemp(dir=b.workdir))
        for epoch in range(1, most + 1):
            more = ["trainer.resume=true"] if epoch > 1 else []
            b._run([sys.executable, str(TRAIN), f"hydra.run.dir={run_dir}", "trainer.verbose=0", *args,
                    f"trainer.epochs={epoch}", *more])
            results = json.loads((run_dir / "results.json").read_text())
            print(f"  accuracy {label}: epoch {epoch}, {results['train_seconds']:.1f} s, "
                  f"test accuracy {results['test_accuracy']:.4f}", flush=True)
            if results["test_accuracy"] >= target:
                b.row("accuracy", f"training seconds to {100 * target:.1f}% test accuracy: {label}",
                      float(results["train_seconds"]), " s", f"epoch {epoch}")
                return
        b.row("accuracy", f"training seconds to {100 * target:.1f}% test accuracy: {label}", f"not in {most} epochs")

    reach(0.975, ["data.source=bundled"], "bundled digits (8,000), defaults")
    cache = Path(os.environ.get("KERAS_HOME", Path.home() / ".keras")) / "datasets" / "mnist.npz"
    if cache.exists():
        reach(0.99, ["data.source=keras"], "full MNIST (60,000), defaults")
    else:
        b.row("accuracy", "training seconds to 99.0% test accuracy: full MNIST", f"not measured (no {cache})")
    fashion = Path("/usr/share/datasets/fashion-mnist")  # real 60,000-image data where full MNIST is not at hand
    if fashion.exists():
        reach(0.90, ["data=fashion_mnist"], "Fashion-MNIST (60,000), defaults")
    else:
        b.row("accuracy", "training seconds to 90.0% test accuracy: Fashion-MNIST",
              "not measured (apt-get install dataset-fashion-mnist)")


def scaling(b: Bench) -> None:
    """benchmarks/scaling.py, whose rounds run the sync, async and ceiling configurations side by side."""
    out = b.workdir / "scaling.json"
    b._run([sys.executable, str(HERE / "scaling.py"), f"--rounds={b.opts.rounds}", f"--out={out}"], timeout=7200)
    found = json.loads(out.read_text())["ratios"]
    b.samples["scaling"] = found
    for name, values in found.items():
        target = {"sync efficiency, 2 workers vs 2 x 1 worker": 0.85,
                  "async speed-up, 2 workers vs 1 worker": 1.6}.get(name)
        b.row("scaling", name, values, "", f">= {target}" if target else "",
              statistics.median(values) >= target if target else None)


def ps_data(b: Bench) -> None:
    """How parameter-server workers get their data, in start-up and worker memory: 8,000 examples (bundled
    digits) against 60,000 (Fashion-MNIST) from IDX files and from a Keras cache."""
    if not (FASHION / "train-images-idx3-ubyte.gz").exists():
        b.row("ps_data", "parameter_server with 60,000 examples", f"not measured (no {FASHION}: "
              "apt-get install dataset-fashion-mnist)")
        return

    def watch(proc, run_dir: Path) -> None:  # the workers' peak memory, read while they run
        peak = {}

        def poll():
            while proc.poll() is None:
                try:
                    for task in json.loads((run_dir / "cluster.json").read_text())["tasks"]:
                        if task["name"].startswith("worker") and task.get("pid"):
                            status = Path(f"/proc/{task['pid']}/status").read_text()
                            kb = int(re.search(r"VmHWM:\s+(\d+)", status).group(1))
                            peak[task["name"]] = max(peak.get(task["name"], 0), kb)
                except (OSError, ValueError, KeyError, AttributeError):
                    pass
                time.sleep(0.2)
            (run_dir / "worker_peak_kb.json").write_text(json.dumps(peak))

        import threading
        threading.Thread(target=poll, daemon=True).start()

    # The same 60,000 examples loaded from a Keras cache (data.source=keras): not files the workers could
    # read, so a local cluster writes them to temporary IDX files once.
    keras_home = b.workdir / "keras_home"
    shutil.copytree(FASHION, keras_home / "datasets" / "fashion-mnist", dirs_exist_ok=True)
    ps = ["strategy=parameter_server", "cluster.workers=2", "cluster.ps=1", "trainer.epochs=1"]
    got = b.rounds("ps_data", {
        "8,000 examples (bundled digits)": lambda: b.train(*ps, watch=watch),
        "60,000 examples (Fashion-MNIST IDX files)": lambda: b.train(*ps, "data=fashion_mnist", watch=watch),
        "60,000 examples (Fashion-MNIST from a Keras cache)": lambda: b.train(
            *ps, "data=fashion_mnist", "data.source=keras", watch=watch, env={"KERAS_HOME": str(keras_home)})},
        rounds=max(1, b.opts.rounds // 2))
    for label, runs in got.items():
        time.sleep(0.5)
        peaks = [max(json.loads((Path(r["run_dir"]) / "worker_peak_kb.json").read_text()).values()) / 1024
                 for r in runs]
        b.row("ps_data", f"{label}: seconds to the first step", [r["seconds_to_first_step"] for r in runs], " s")
        b.row("ps_data", f"{label}: a worker's peak memory", peaks, " MiB")


def peak_memory(proc, run_dir: Path) -> None:
    """Watches a run for the peak resident memory (VmHWM) of each of its processes' descendants (the
    training task), written to <run_dir>/peak_kb.json when it ends."""
    import threading

    def descendants(root: int) -> list:
        children, found = {}, []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rpartition(")")[2].split()
                children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
            except (OSError, ValueError, IndexError):
                pass
        todo = [root]
        while todo:
            pid = todo.pop()
            found.append(pid)
            todo += children.get(pid, [])
        return found[1:]

    def poll():
        peak = {}
        while proc.poll() is None:
            for pid in descendants(proc.pid):
                try:
                    kb = int(re.search(r"VmHWM:\s+(\d+)", Path(f"/proc/{pid}/status").read_text()).group(1))
                    peak[str(pid)] = max(peak.get(str(pid), 0), kb)
                except (OSError, AttributeError):
                    pass
            time.sleep(0.2)
        (run_dir / "peak_kb.json").write_text(json.dumps(peak))

    threading.Thread(target=poll, daemon=True).start()


def files(b: Bench) -> None:
    """Data in files: TFRecord shards and an image folder against the same digits in memory (throughput),
    and a task's peak memory and first step with 64,000 records against 1.2 million."""
    out = b.workdir / "shards"
    b._run([sys.executable, str(TRAIN), "write-tfrecords", "data.source=bundled", f"out={out}", "shards=8"])
    folder = b.workdir / "folder"
    import numpy as np
    from PIL import Image

    with np.load(SRC / "distrain" / "data" / "mnist-10k.npz") as f:
        images, labels = f["images"], f["labels"]
    order = np.random.default_rng(42).permutation(len(labels))  # as data.source=bundled splits them
    for n, i in enumerate(order):
        path = folder / ("train" if n < 8000 else "test") / f"{labels[i]}" / f"{i}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(images[i]).save(path)
    e = f"trainer.epochs={b.opts.epochs}"
    raw = b.workdir / "raw"
    b._run([sys.executable, str(TRAIN), "write-tfrecords", "data.source=bundled", f"out={raw}", "shards=8",
            "encoding=raw"])
    tfrecord = ["data=tfrecord", f"data.train_files={out}/train-*", f"data.test_files={out}/test-*",
                "data.num_classes=10"]
    raw_records = ["data=tfrecord", f"data.train_files={raw}/train-*", f"data.test_files={raw}/test-*",
                   "data.num_classes=10", "data.image_size=[28,28]", "data.channels=1"]
    got = b.rounds("files", {
        "arrays in memory (data.source=bundled)": lambda: b.train(e),
        "TFRecord shards, 8 files (data=tfrecord)": lambda: b.train(e, *tfrecord),
        "TFRecord shards of raw pixels, 8 files": lambda: b.train(e, *raw_records),
        "image folder, 10,000 PNGs (data=images)": lambda: b.train(e, "data=images", f"data.path={folder}")})
    arrays = got["arrays in memory (data.source=bundled)"]
    for label in list(got)[1:]:
        b.row("files", f"default, cnn, batch 128: {label.split(' (')[0]} / arrays, examples/s",
              ratios(got[label], arrays), "x", ">= 0.9", statistics.median(ratios(got[label], arrays)) >= 0.9)
    # Memory: the same 8,000 records copied 8 and 150 times; 200 steps either way (a set epoch length).
    many = {}
    for copies in (8, 150):
        where = b.workdir / f"copies{copies}"
        where.mkdir()
        for c in range(copies):
            for shard in out.glob("train-*"):
                os.link(shard, where / f"{c:03d}-{shard.name}")
        many[copies] = ["data=tfrecord", f"data.train_files={where}/*", f"data.test_files={out}/test-*",
                        "data.num_classes=10", "trainer.epochs=2", "trainer.steps_per_epoch=100"]
    got = b.rounds("files_memory", {
        f"{8 * 8000:,} records": lambda: b.train(*many[8], watch=peak_memory),
        f"{150 * 8000:,} records": lambda: b.train(*many[150], watch=peak_memory)}, rounds=max(1, b.opts.rounds // 2))
    for label, runs in got.items():
        time.sleep(0.5)
        peaks = [max(json.loads((Path(r["run_dir"]) / "peak_kb.json").read_text()).values()) / 1024 for r in runs]
        b.row("files", f"{label}: the task's peak memory", peaks, " MiB")
        b.row("files", f"{label}: seconds to the first step (the launcher's scan included)",
              [r["seconds_to_first_step"] for r in runs], " s")


def cpu(b: Bench) -> None:
    """This CPU's speed settings: distrain and plain Keras fit out of the box, each setting on its own, and
    oneDNN on against off under every kind of strategy (float32 unless said)."""
    e, f32 = f"trainer.epochs={b.opts.epochs}", "trainer.mixed_precision=false"
    on, off = "trainer.onednn=true", "trainer.onednn=false"
    strategies = {"default": [], "mirrored, 2 virtual CPUs": ["strategy=mirrored", "strategy.cpu_virtual_devices=2"],
                  "multi_worker_mirrored, 2 workers": ["strategy=multi_worker_mirrored", "cluster.workers=2"],
                  "parameter_server, 1 ps + 2 workers": ["strategy=parameter_server", "cluster.workers=2",
                                                          "cluster.ps=1"]}
    configs = {"distrain, defaults": lambda: b.train(e), "plain Keras fit, defaults": lambda: b.plain(),
               "oneDNN on, 1 step per call": lambda: b.train(e, f32, on, "trainer.steps_per_execution=1"),
               "oneDNN on, mixed_bfloat16": lambda: b.train(e, on, "trainer.mixed_precision=true")}
    for name, args in strategies.items():
        configs[f"{name}, oneDNN on"] = lambda a=args: b.train(e, f32, on, *a)
        configs[f"{name}, oneDNN off"] = lambda a=args: b.train(e, f32, off, *a)
    got = b.rounds("cpu", configs)
    ours, plain = got["distrain, defaults"], got["plain Keras fit, defaults"]
    b.row("cpu", f"out of the box ({ours[0]['precision_policy']}, oneDNN {'on' if ours[0].get('onednn') else 'off'}): "
          "distrain / plain Keras fit", ratios(ours, plain), "x")
    b.row("cpu", "out of the box: test accuracy, distrain - plain Keras fit (points)", points(ours, plain))
    for name in strategies:
        b.row("cpu", f"oneDNN on / off: {name}", ratios(got[f"{name}, oneDNN on"], got[f"{name}, oneDNN off"]), "x")
        b.row("cpu", f"oneDNN on - off: test accuracy, {name} (points)",
              points(got[f"{name}, oneDNN on"], got[f"{name}, oneDNN off"]))
    base = got["default, oneDNN on"]
    b.row("cpu", "steps_per_execution 8 / 1 (oneDNN on)", ratios(base, got["oneDNN on, 1 step per call"]), "x")
    b.row("cpu", "mixed_bfloat16 / float32 (oneDNN on)", ratios(got["oneDNN on, mixed_bfloat16"], base), "x")
    b.row("cpu", "mixed_bfloat16 - float32: test accuracy (points)", points(got["oneDNN on, mixed_bfloat16"], base))


def threads(b: Bench) -> None:
    """TensorFlow's thread pools: its default (as many intra-op threads as cores) against one per process,
    for one process and for a local cluster's workers (the launcher splits the cores among them)."""
    e = f"trainer.epochs={b.opts.epochs}", "trainer.mixed_precision=false"
    n = len(b.cores)
    mwms = ["strategy=multi_worker_mirrored", "cluster.workers=2"]
    ps = ["strategy=parameter_server", "cluster.workers=2", "cluster.ps=1"]
    got = b.rounds("threads", {
        f"default strategy, {n} intra-op threads (TensorFlow's default)": lambda: b.train(*e),
        "default strategy, 1 intra-op thread": lambda: b.train(*e, env={"TF_NUM_INTRAOP_THREADS": "1"}),
        f"multi_worker_mirrored 2 workers, {max(1, n // 2)} thread(s) each (default)": lambda: b.train(*e, *mwms),
        f"multi_worker_mirrored 2 workers, {n} threads each": lambda: b.train(*e, *mwms,
                                                                              f"cluster.threads_per_worker={n}"),
        f"parameter_server 2 workers, {max(1, n // 2)} thread(s) each (default)": lambda: b.train(*e, *ps),
        f"parameter_server 2 workers, {n} threads each": lambda: b.train(*e, *ps, f"cluster.threads_per_worker={n}"),
    })
    labels = list(got)
    for default, other in ((labels[0], labels[1]), (labels[2], labels[3]), (labels[4], labels[5])):
        b.row("threads", f"{default} / {other.split(', ', 1)[1]}", ratios(got[default], got[other]), "x")


def points(a: list, b: list) -> list:
    return [100 * (x["test_accuracy"] - y["test_accuracy"]) for x, y in zip(a, b)]


def cpu_features() -> str:
    """What decides the fastest settings: AVX-512, native bfloat16, AMX, and TensorFlow's own oneDNN default."""
    # distrain's own reading (distrain.common.cpu, standard library only), in a process of its own: importing
    # the package sets environment variables, which every run this process starts would inherit.
    out = subprocess.run([sys.executable, "-c", "import json; from distrain.common import cpu; "
                          "print(json.dumps([sorted(cpu.flags()), cpu.ONEDNN_DEFAULT_ON]))"],
                         capture_output=True, text=True, check=True, env={**os.environ, "PYTHONPATH": str(SRC)}).stdout
    flags, default_on = map(set, json.loads(out))
    have = lambda *names: "yes" if flags & set(names) else "no"
    return (f"AVX-512 {have('avx512f')}, AVX512_BF16 {have('avx512_bf16')}, AMX {have('amx_tile', 'amx_bf16')}, "
            f"TensorFlow's oneDNN default {'on' if flags & default_on else 'off'}")


def machine() -> str:
    model = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
                 platform.processor())
    return (f"{model} ({cpu_features()}), {len(os.sched_getaffinity(0))} cores, Linux {platform.release()}, "
            f"Python {platform.python_version()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=4, help="epochs of the throughput runs (the first is not timed)")
    parser.add_argument("--only", default=",".join(SECTIONS), help="comma-separated sections: " + ", ".join(SECTIONS))
    parser.add_argument("--cores", default=None, help="cores every run is pinned to, e.g. 0,1 (default: all)")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    opts = parser.parse_args()
    opts.cores = set(map(int, opts.cores.split(","))) if opts.cores else os.sched_getaffinity(0)
    unknown = set(opts.only.split(",")) - set(SECTIONS)
    if unknown:
        sys.exit(f"error: --only {','.join(sorted(unknown))} names no section: choose from {', '.join(SECTIONS)}")
    if os.environ.pop("TF_ENABLE_ONEDNN_OPTS", None) is not None:  # it would win over every run's own setting
        print("note: TF_ENABLE_ONEDNN_OPTS ignored: the runs set oneDNN themselves (trainer.onednn)", flush=True)
    b = Bench(opts)
    print(f"machine: {machine()}; {opts.rounds} rounds; runs pinned to cores {sorted(opts.cores)}", flush=True)
    started = time.time()
    try:
        for section in SECTIONS:
            if section in opts.only.split(","):
                print(f"== {section}: {globals()[section].__doc__.split(chr(10))[0]}", flush=True)
                globals()[section](b)
    except Failed as exc:
        sys.exit(f"error: {exc}")
    finally:
        shutil.rmtree(b.workdir, ignore_errors=True)  # the runs' directories; the samples are kept below
    opts.out.mkdir(parents=True, exist_ok=True)
    report = {"machine": machine(), "rounds": opts.rounds, "epochs": opts.epochs, "cores": sorted(opts.cores),
              "date": time.strftime("%Y-%m-%d"), "minutes": round((time.time() - started) / 60, 1),
              "rows": b.rows, "samples": b.samples}
    (opts.out / "benchmarks.json").write_text(json.dumps(report, indent=2) + "\n")
    lines = [f"Measured on {machine()}, {report['date']}: median of {opts.rounds} rounds (range), "
             f"ratios per round; {opts.epochs} epochs per throughput run.", "",
             "| section | measure | median (range) | target | met |", "|---|---|---|---|---|"]
    lines += [f"| {r['section']} | {r['measure']} | {r['shown']} | {r['target']} | {r['met']} |" for r in b.rows]
    (opts.out / "benchmarks.md").write_text("\n".join(lines) + "\n")
    print(f"\nwrote {opts.out / 'benchmarks.json'} and {opts.out / 'benchmarks.md'}")


if __name__ == "__main__":
    main()
