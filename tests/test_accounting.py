"""Where a run's time and memory go: the time split and what binds the run, each task's peak memory,
the profiler switch (stalls and `distrain stacks`: test_multiworker's hung-task test)."""
import json
import math
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tensorflow as tf

from distrain.common.errors import ConfigError
from distrain.launcher import memory
from distrain.report import timesplit
from distrain.task import input_pipeline
from distrain.task.training import train

from helpers import RUN_TIMEOUT, TRAIN_PY, assert_nothing_left, make_cfg, small

BUNDLED = ["data.source=bundled", "trainer.verbose=0", "trainer.save_model=false"]


# ---- the split's arithmetic ---------------------------------------------------------------------------

def test_shares_sum_to_one_and_the_bound_is_the_largest():
    split = timesplit.shares(10.0, 3.0, 1.0)
    assert split == {"input": 0.3, "compute": 0.6, "communication": 0.1}
    assert sum(split.values()) == pytest.approx(1.0) and timesplit.bound(split) == "compute"
    assert timesplit.bound(timesplit.shares(10.0, 6.0, 1.0)) == "input"
    assert timesplit.bound(timesplit.shares(10.0, 1.0, 6.0)) == "communication"
    # Clock noise never makes a share negative or the sum more than 1.
    assert timesplit.shares(1.0, 0.8, 0.5) == {"input": 0.8, "compute": 0.0, "communication": 0.2}


def test_the_whole_runs_split_weighs_the_epochs_after_the_first_by_their_seconds():
    history = {"time_input": [0.9, 0.5, 0.1], "time_compute": [0.1, 0.5, 0.9], "time_communication": [0, 0, 0]}
    split = timesplit.overall(history, [100.0, 1.0, 3.0])  # the first (tracing) is left out
    assert split == {"input": pytest.approx(0.2), "compute": pytest.approx(0.8), "communication": 0.0}
    assert timesplit.overall(history, [1.0, 1.0, 1.0]) != split  # control: the weights count
    assert timesplit.overall({}, [1.0]) == {}


def test_the_verdict_names_the_bound_and_a_fix_that_fits_the_data():
    files = make_cfg("data=tfrecord", "data.train_files=x", "data.test_files=y").data
    said = timesplit.verdict({"time_split": {"input": 0.6, "compute": 0.4, "communication": 0.0}, "bound": "input",
                              "input_examples_per_sec": 1234.0}, files)
    assert said.startswith("input-bound: waiting for the next batch takes 60% of the training time (the input "
                           "pipeline alone delivers 1,234 examples/s)")
    assert "data.cache=memory" in said and "write-tfrecords encoding=raw" in said
    images = make_cfg("data=images", "data.path=x").data  # (no shards: the raw encoding is for TFRecord files)
    assert "encoding=raw" not in timesplit.input_fix(images) and "data.cache=memory" in timesplit.input_fix(images)
    assert "data.cache" not in timesplit.verdict({"time_split": {"compute": 0.9}, "bound": "compute"}, files)
    busy = timesplit.verdict({"time_split": {"compute": 0.9}, "bound": "compute", "input_cpu_share": 0.25}, files)
    assert "; the input pipeline takes 25% as much CPU time as training, on the same cores; decoding" in busy
    reducing = timesplit.verdict({"time_split": {"communication": 0.6}, "bound": "communication"}, files)
    assert "trainer.accumulate_steps=N (one all-reduce per N batches" in reducing
    assert "accumulate_steps" not in timesplit.verdict({"time_split": {"communication": 0.6}, "bound": "communication",
                                                        "num_ps": 1}, files)  # (refused under parameter servers)
    capped = {"time_split": {"input": 0.6}, "bound": "input", "input_examples_per_sec": 3000.0,
              "steps_examples_per_sec": 8000.0}  # (the input alone slower than the steps: what would feed them)
    assert timesplit.verdict(capped, files).endswith("; or the tf.data service: 3 data worker(s) on machines like "
                                                     "this one would feed them (data.service, docs/data_in_files.md)")
    served = make_cfg("data=tfrecord", "data.train_files=x", "data.test_files=y", "data.service.workers=2").data
    assert timesplit.verdict(capped, served).endswith("; 6 data workers on machines of their own would feed them "
                                                      "(data.service.address)")  # (2 deliver 3,000 examples/s)
    assert timesplit.cpu_share(2e-5, [9.0, 1.0, 1.0], 1000, 0) == pytest.approx(0.02)  # first epoch left out
    assert timesplit.cpu_share(2e-5, [1.0, 1.0], 1000, ps=1) is None  # the coordinator computes no step


# ---- measured in runs ---------------------------------------------------------------------------------

@pytest.mark.slow
def test_the_in_memory_default_is_compute_bound_and_profiles_the_steps_asked_for(tmp_path, capsys):
    results, _ = train(make_cfg(*BUNDLED, "trainer.epochs=2", "trainer.steps_per_epoch=24", "trainer.profile=[28,30]",
                                "trainer.verbose=2"), tmp_path)
    split = results["time_split"]
    assert set(split) == {"input", "compute", "communication"} and sum(split.values()) == pytest.approx(1, abs=1e-3)
    assert results["bound"] == "compute" and split["compute"] > 0.5, split
    assert split["communication"] < 0.1  # one device: nothing to all-reduce
    assert len(results["history"]["time_input"]) == 2
    assert results["input_examples_per_sec"] > results["examples_per_sec"]  # the pipeline keeps ahead
    assert 0 < results["input_cpu_share"] < 0.15  # gathering arrays in memory costs little CPU
    # The profiler: a trace of global steps 28-30 (the second epoch's calls cut there), where TensorBoard reads it.
    traces = list((tmp_path / "tensorboard" / "train" / "plugins" / "profile").glob("*/*.xplane.pb"))
    assert len(traces) == 1 and traces[0].stat().st_size > 0
    assert "profile of global steps 28-30 written to" in capsys.readouterr().out


def test_a_profile_after_the_last_step_is_refused_before_training(tmp_path):
    with pytest.raises(ConfigError, match=r"trainer.profile=\[4, 6000\] ends after the run's last global step \(16\)"):
        train(small("trainer.profile=[4,6000]"), tmp_path)


@pytest.mark.slow
def test_the_in_memory_default_is_compute_bound_at_one_epoch_too(tmp_path, capsys):
    """One epoch: its tracing is no part of the steps' time (measured inside the training function)."""
    results, _ = train(make_cfg(*BUNDLED, "trainer.epochs=1", "trainer.steps_per_epoch=24"), tmp_path)
    assert results["bound"] == "compute" and results["time_split"]["compute"] > 0.5, results["time_split"]
    assert results["steps_examples_per_sec"] > results["examples_per_sec"]  # (the epoch's wall holds the tracing)
    assert results["input_examples_per_sec"] > results["steps_examples_per_sec"]


@pytest.mark.slow
@pytest.mark.parametrize("epochs", [1, 3])
def test_an_input_pipeline_costly_in_cpu_is_input_bound_with_the_factor(tmp_path, monkeypatch, capsys, epochs):
    """Each batch costs the pipeline about 2e9 multiply-adds of CPU (many times the mlp's step on any machine;
    no wait): the run says input, at one epoch as at several, with what each part delivers and the factor.
    The cost is paid in the training loop's call for the next batch, on one thread (no parallel map, no
    prefetch after it, one intra-op thread), so it never competes with the steps for the cores: with it
    spread over every core, the steps slowed by it took half the time under a busy neighbour, and the run
    could be said compute-bound. (The line for either case is checked. Control: the tests above, the
    same data without the cost, say compute.)"""
    train_split = input_pipeline.ArraySource.train
    heavy = tf.random.stateless_normal([1024, 1024], seed=[1, 2])
    inline = tf.data.Options()
    inline.threading.max_intra_op_parallelism = 1
    inline.experimental_optimization.map_parallelization = False
    inline.experimental_optimization.inject_prefetch = False

    def costly(self, *args, **kwargs):
        work = lambda x, y: (x + 0.0 * tf.cast(tf.reduce_sum(heavy @ heavy @ heavy), x.dtype), y)
        return train_split(self, *args, **kwargs).map(work).with_options(inline)
    monkeypatch.setattr(input_pipeline.ArraySource, "train", costly)
    results, _ = train(make_cfg(*BUNDLED, "model=mlp", f"trainer.epochs={epochs}", "trainer.steps_per_epoch=12",
                                "trainer.verbose=0"), tmp_path)
    assert results["bound"] == "input", results["time_split"]
    said = timesplit.verdict(results, make_cfg(*BUNDLED).data)
    alone, steps = results["input_examples_per_sec"], results["steps_examples_per_sec"]
    if alone < steps:  # (the pipeline alone slower than the steps: the factor a fix could give)
        assert said == (f"input-bound: the input pipeline alone delivers {alone:,.0f} examples/s, the steps compute "
                        f"{steps:,.0f} (on the same cores): an input that kept up would give at most "
                        f"{steps / alone:.1f}x; the tf.data service: {math.ceil(steps / alone)} data worker(s) on "
                        "machines like this one would feed them (data.service, docs/data_in_files.md)")
    else:  # (the steps slowed as much by the pipeline's CPU on the shared cores: the wait is what is said)
        assert said == (f"input-bound: waiting for the next batch takes {results['time_split']['input']:.0%} of the "
                        f"training time (the input pipeline alone delivers {alone:,.0f} examples/s)")


@pytest.mark.slow
def test_accounting_off_records_no_split(tmp_path):
    results, _ = train(small("trainer.time_split=false"), tmp_path)
    assert results["time_split"] == {} and results["bound"] == "" and results["input_examples_per_sec"] is None
    assert not any(name.startswith("time_") for name in results["history"])
    assert train(small(), tmp_path / "on")[0]["bound"]  # control: on by default


# ---- memory -------------------------------------------------------------------------------------------

def test_peak_memory_is_the_kernels_own():
    peak, now = memory.resident_mib(os.getpid())
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # (Linux: kB)
    assert peak == pytest.approx(own, rel=0.05) and 0 < now <= peak
    assert memory.resident_mib(2 ** 22 + 1) is None  # control: no such process


def test_cpu_time_is_the_kernels_own_and_adds_up_over_a_task_s_lives():
    own = sum(os.times()[:2])  # (this process's user and system time)
    assert memory.cpu_seconds(os.getpid()) == pytest.approx(own, abs=0.05)
    assert memory.cpu_seconds(2 ** 22 + 1) is None  # control: no such process
    watch = memory.Watch()
    watch.started()
    watch.look(os.getpid())
    first = watch.cpu
    watch.started()  # restarted: its earlier life's CPU kept, the new one's added
    watch.look(os.getpid())
    assert first > 0 and watch.cpu >= 2 * first


def test_a_sigkill_is_out_of_memory_only_when_the_kernel_counted_one(monkeypatch):
    counts = iter([5, 6, 6])
    monkeypatch.setattr(memory, "oom_kills", lambda: next(counts))
    watch = memory.Watch()
    watch.started()
    watch.peak, watch.last = 2048.0, 1900.0
    assert watch.killed_for_memory(-9)  # the count went up: 5 -> 6
    assert "ran out of memory: the kernel killed it (its peak resident memory 2,048 MiB" in watch.why_killed("worker-1")
    watch.started()  # 6
    monkeypatch.setattr(memory, "oom_kills", lambda: 6)
    assert not watch.killed_for_memory(-9) and not watch.killed_for_memory(1)  # controls: no new count; no SIGKILL


@pytest.fixture
def memory_cgroup():
    """A memory cgroup of 200 MiB (cgroup v2 or v1), removed after the test; skipped where none can be made."""
    v2 = Path("/sys/fs/cgroup")
    base, limit = (v2, "memory.max") if (v2 / "cgroup.controllers").exists() else (v2 / "memory",
                                                                                   "memory.limit_in_bytes")
    group = base / f"distrain-test-{os.getpid()}"
    try:
        group.mkdir()
        (group / limit).write_text(str(200 * 2 ** 20))
    except OSError as exc:
        pytest.skip(f"no memory cgroup can be made here ({exc}): run as root on Linux")
    yield group
    for _ in range(50):  # (its processes gone: then it can go)
        try:
            group.rmdir()
            break
        except OSError:
            time.sleep(0.1)


@pytest.mark.slow
def test_a_task_the_kernel_kills_for_memory_is_said_to_be_out_of_memory(tmp_path, memory_cgroup):
    """The run in a 200 MiB cgroup: its training task grows past it (the cgroup is charged the pages it
    is first to use: about 330 MiB for the launcher and the task together) and the kernel kills it.
    (Control: a SIGKILL without the kernel's count going up is no memory, test above.)"""
    run_dir = tmp_path / "run"
    proc = subprocess.run([sys.executable, str(TRAIN_PY), f"hydra.run.dir={run_dir}", "data.source=bundled",
                           "trainer.epochs=1", "trainer.verbose=0", "cluster.max_restarts=0"],
                          capture_output=True, text=True, timeout=RUN_TIMEOUT, cwd=tmp_path,
                          preexec_fn=lambda: (memory_cgroup / "cgroup.procs").write_text(str(os.getpid())))
    assert proc.returncode != 0
    said = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert said and said[0].startswith("error: task train ran out of memory: the kernel killed it"), proc.stderr[-2000:]
    assert json.loads((run_dir / "status.json").read_text())["error"].startswith("task train ran out of memory")
    assert_nothing_left(run_dir)


def test_stacks_of_a_run_that_ended_or_of_no_run_is_one_line(tmp_path, capsys, monkeypatch):
    from distrain.launcher import stalls

    assert stalls.main([str(tmp_path)]) == 2
    assert f"error: {tmp_path} holds no distrain run (no config.yaml)" in capsys.readouterr().err
    (tmp_path / "config.yaml").write_text("trainer: {}\n")
    (tmp_path / "status.json").write_text(json.dumps({"status": "ok", "exit_status": 0}))
    assert stalls.main([str(tmp_path)]) == 2
    assert f"error: the run in {tmp_path} has ended (ok): stacks are of a run still going" in capsys.readouterr().err
    (tmp_path / "status.json").write_text(json.dumps({"status": "running"}))  # its launcher killed: none answers
    (tmp_path / "logs").mkdir()
    monkeypatch.setattr(stalls, "WAIT_SECONDS", 0.3)
    assert stalls.main([str(tmp_path)]) == 2
    assert "no launcher answered for the run in" in capsys.readouterr().err
    assert not (tmp_path / "logs" / stalls.REQUEST).exists()  # its request taken back


def test_where_a_task_waits_is_said_by_what_it_waits_for():
    """A one-process run's step has no peers to wait for; a synchronous worker's does (the control), and a
    coordinator waits for the workers' steps."""
    from distrain.launcher import stalls

    dump = ('Current thread 0x00007f (most recent call first):\n'
            '  File "/site/distrain/task/runners.py", line 160 in run\n'
            '  File "/site/distrain/task/training.py", line 380 in train_epoch\n'
            '  File "/site/distrain/task/main.py", line 40 in main\n')
    assert stalls.where(dump, "none") == "is in a training step"
    assert stalls.where(dump, "workers") == \
        "waits in a training step (the gradients' all-reduce, waiting for its peers)"
    assert stalls.where(dump, "ps") == "is waiting for the workers' steps"
    assert stalls.summary({"train": (12, dump)}, "none") == "train is in a training step at step 12"
