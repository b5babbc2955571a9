"""Where a run's training time goes: waiting for the next batch (input), the steps themselves (compute),
and the gradients' all-reduce with the wait for the slowest peer, or under parameter servers the time
the workers and the coordinator wait for each other (communication). Measured inside the training
function with tf.timestamp() ops ordered by control dependencies (runners.make_train_steps), and the
input pipeline's own rate by reading it alone for a moment after training (read_alone); the bound is
what would speed the run up most if it were free, from the rates of the input alone and of the steps.
docs/outputs.md says how each is measured and what it costs. (No TensorFlow imported here: the launcher
reads it.)"""
import math
import time

PARTS = ("input", "compute", "communication")
INPUT_CPU_SAID = 0.15  # an input pipeline's CPU time, against training's, worth a word in the closing line


def shares(wall: float, waited: float, communicated: float) -> dict:
    """The fractions of `wall` seconds spent waiting for input, communicating, and computing (the rest:
    the steps, and the loop around them), each in [0, 1], summing to 1."""
    wall = float(wall)
    if wall <= 0:
        return dict.fromkeys(PARTS, 0.0) | {"compute": 1.0}
    waited, communicated = min(max(float(waited), 0.0) / wall, 1.0), max(float(communicated), 0.0) / wall
    communicated = min(communicated, 1.0 - waited)
    return {"input": round(waited, 4), "compute": round(1.0 - waited - communicated, 4),
            "communication": round(communicated, 4)}


def steady(per_epoch: list) -> list:
    """The epochs after the first (its tracing and warm-up are no part of a steady step), or the one
    there is: what examples/s, the time split and the CPU share are measured over."""
    return per_epoch[1:] or per_epoch


def overall(history: dict, epoch_seconds: list[float]) -> dict:
    """The split of the whole training from each epoch's (history's time_<part>), weighted by the epochs'
    seconds, over the epochs after the first (its tracing is no part of a steady step) as examples/s is."""
    per_epoch = [dict(zip(PARTS, values)) for values in zip(*(history.get(f"time_{p}", []) for p in PARTS))]
    timed = steady(list(zip(per_epoch, epoch_seconds)))
    total = sum(seconds for _, seconds in timed)
    if not timed or total <= 0:
        return {}
    return {p: round(sum(split[p] * seconds for split, seconds in timed) / total, 4) for p in PARTS}


def cpu_share(input_per_example: float | None, epoch_cpu: list[float], examples_per_epoch: float,
              ps: int) -> float | None:
    """The CPU time the input pipeline takes (read alone) against the CPU time training takes, per example,
    in the epochs after the first: on the same cores, what the input takes from the steps. None where it
    was not measured, or under parameter servers (the coordinator that measures it computes no step)."""
    timed = steady(epoch_cpu)
    if not input_per_example or not timed or ps or sum(timed) <= 0:
        return None
    return round(input_per_example / (sum(timed) / (examples_per_epoch * len(timed))), 4)


def steps_rate(history: dict, examples_per_epoch: int) -> float | None:
    """Examples per second the steps computed at, from their own seconds (time_steps_seconds: measured inside
    the training function, the input's waits and the all-reduce left out), over the epochs after the first:
    on cores the input pipeline shares, a little below what the steps alone reach. None where not measured."""
    timed = steady(history.get("time_steps_seconds") or [])
    return round(examples_per_epoch * len(timed) / sum(timed), 1) if timed and sum(timed) > 0 else None


def bound(split: dict, input_rate: float | None = None, steps_rate: float | None = None) -> str:
    """What binds the run, as what would speed it up most if it were free: the largest part of the steps'
    time where that is input or communication; else the slower of the input pipeline alone and the steps
    (their rates, where both were measured: on shared cores an input that never keeps the steps waiting can
    still be what holds them back); else compute."""
    if not split:
        return ""
    largest = max(PARTS, key=lambda p: split.get(p, 0.0))
    if largest != "compute" or not (input_rate and steps_rate):
        return largest  # (the steps wait for the input most of the time: it binds, whatever the rates)
    return "input" if input_rate < steps_rate else "compute"


def read_alone(dataset, seconds: float, batches: int = 1000) -> tuple:
    """(Examples per second an input pipeline delivers alone, the CPU seconds it takes per example: this
    process's, every thread's), reading for up to `seconds` (or `batches` batches) after its first batch
    (its start-up: opening files, filling the shuffle buffer); (None, None) if it gave no batch."""
    iterator, examples, elapsed = iter(dataset), 0, 0.0
    try:
        next(iterator)
        start, cpu, read = time.perf_counter(), time.process_time(), 0
        while read < batches and time.perf_counter() - start < seconds:
            examples += len(next(iterator)[-1])  # (the labels of an (images, labels) batch)
            read += 1
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    except StopIteration:
        pass
    return (examples / elapsed, cpu / examples) if elapsed > 0 and examples else (None, None)


def probe_seconds(train_seconds: float) -> float:
    """How long read_alone reads: 1% of the training time, from 0.05 s (a short run pays little; the
    figures of 0.05 s and 0.2 s reads agree within their run-to-run spread, measured) to 5 s."""
    return min(max(0.01 * train_seconds, 0.05), 5.0)


def verdict(results: dict, data_cfg=None) -> str:
    """The closing line's word on what binds the run, with a fix where one exists."""
    split, what = results.get("time_split") or {}, results.get("bound")
    if not what:
        return ""
    share = f"{split[what]:.0%} of the training time"
    alone, steps = results.get("input_examples_per_sec"), results.get("steps_examples_per_sec")
    if what == "input" and alone and steps and alone < steps:  # (the input caps the run; the steps cap a fix)
        fix = input_fix(data_cfg)
        return (f"input-bound: the input pipeline alone delivers {alone:,.0f} examples/s, the steps compute "
                f"{steps:,.0f} (on the same cores): an input that kept up would give at most {steps / alone:.1f}x"
                f"{fix}{service_fix(alone, steps, data_cfg, bool(fix))}")
    if what == "input":
        return f"input-bound: waiting for the next batch takes {share}" + (
            f" (the input pipeline alone delivers {alone:,.0f} examples/s)" if alone else "") + input_fix(data_cfg)
    if what == "communication":
        if results.get("num_ps"):
            return (f"communication-bound: workers and the coordinator wait for each other {share}: raise "
                    "trainer.steps_per_execution (more steps per scheduled function), or use fewer workers")
        return (f"communication-bound: the gradients' all-reduce and the wait for the slowest worker take {share}: "
                "a larger trainer.batch_size all-reduces less often per example, as does trainer.accumulate_steps=N "
                "(one all-reduce per N batches, without a larger batch in memory); on one machine fewer workers, "
                "or strategy=mirrored")
    line = f"compute-bound: the steps take {share}" + (
        f" (they compute {steps:,.0f} examples/s; the input pipeline alone delivers {alone:,.0f})"
        if alone and steps else "")
    taken = results.get("input_cpu_share")
    if taken and taken >= INPUT_CPU_SAID:  # the input competes with the steps for the same cores
        line += (f"; the input pipeline takes {taken:.0%} as much CPU time as training, on the same cores"
                 f"{input_fix(data_cfg)}")
    return line


def service_fix(alone: float, steps: float, data_cfg, other: bool = False) -> str:
    """The data workers of the tf.data service that would feed steps of `steps` examples/s, where one
    delivers `alone` (the input pipeline measured alone: in the trainer, or through the run's service);
    `other`: a fix of the data itself was said before it."""
    if data_cfg is None:
        return ""
    service = data_cfg.get("service") or {}
    now = service.get("workers") or 0
    workers = math.ceil(steps / alone * max(now, 1))
    if now:
        return f"; {workers} data workers on machines of their own would feed them (data.service.address)"
    return (f"; {'or ' if other else ''}the tf.data service: {workers} data worker(s) on machines like this one "
            "would feed them (data.service, docs/data_in_files.md)")


def input_fix(data_cfg) -> str:
    """What speeds up an input pipeline of this data."""
    if data_cfg is None:
        return ""
    source = data_cfg.get("source")
    if source in ("tfrecord", "images") and not data_cfg.get("cache"):
        raw = ", and shards written by `distrain write-tfrecords encoding=raw` hold pixels that need no decoding" \
            if source == "tfrecord" else ""
        return ("; decoding the images every epoch is the usual cost: data.cache=memory (or a directory) decodes "
                f"them once{raw}")
    if source in ("tfrecord", "images"):
        return "; the first epoch decodes into data.cache: the epochs after it read the cache"
    if source == "loader":
        return "; a data loader of your own: return the arrays it reads, decoded"
    return ""
