"""pytest's hooks and the fixtures every test gets; the helpers tests import are in helpers.py."""
import atexit
import gc
import os
import sys

import pytest

import distrain  # noqa: F401  (sets TF_USE_LEGACY_KERAS before any TensorFlow import)


@pytest.fixture(scope="session", autouse=True)
def two_virtual_cpus():
    """Split this process's CPU into 2 logical devices before TensorFlow's runtime starts, once."""
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    tf.config.threading.set_inter_op_parallelism_threads(2)


# TensorFlow 2.21 destroys a tf.data iterator that a tf.function has read only once its autotuning
# thread wakes up, up to 60 s later, and holds the GIL meanwhile (measured: 2-15 s stalls in the tests'
# teardowns, and 33-38 s ones inside other tests, where garbage collection got to an old run's iterator).
# The product never destroys one (runners.KEPT; a task ends with os._exit); the tests do as it does.

def pytest_sessionstart(session):
    """This process ends as a task does (os._exit), without destroying what the tests kept."""
    atexit.register(_end_now, session)


def _end_now(session) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(int(session.exitstatus))


# Collections here are rare: most of what this process makes lives on (the kept runs above), and a full
# collection passes over all of it (0.1 s each at the default thresholds, 2% of the docs' tests).
gc.set_threshold(20_000, 20, 20)


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    """What a test leaves stays: runners.KEPT keeps each run's runner, as in the product, and garbage
    collection passes over the rest from then on (an old run's objects hold iterators in cycles)."""
    gc.freeze()


@pytest.fixture(autouse=True)
def fresh_collective_keys():
    """In-process tests build several MirroredStrategy objects in one process (the product builds one
    per process); TensorFlow's own tests give each its own collective key range the same way."""
    import tensorflow as tf

    tf.distribute.MirroredStrategy._collective_key_base += 10_000


# The test modules, longest first (seconds under `make test`, 2 pytest-xdist workers, on the faster
# kind of machine; the slower kind takes about 1.7 times as long). `make test` runs whole modules in
# either worker (--dist loadscope, so a module's shared runs and test_slurm's one Slurm stay in one
# worker) and hands a worker the next module as it nears the end of its last: longest first, both
# workers end about together.
LONGEST_FIRST = ["test_docs_run",  # 280 s
                 "test_multiworker",  # 100 s
                 "test_resume",  # 90 s
                 "test_sweep",  # 70 s
                 "test_slurm",  # 70 s
                 "test_bad_input",  # 55 s
                 "test_tracking",  # 55 s (alone)
                 "test_files",  # 40 s
                 "test_cli",  # 30 s
                 "test_own_model",  # 26 s
                 "test_inference",  # 25 s
                 "test_task",  # 23 s
                 "test_training",  # 21 s
                 "test_storage",  # 20 s
                 "test_cluster",  # 11 s
                 "test_accounting",  # 11 s
                 "test_optimizer"]  # 8 s; the others take seconds


@pytest.hookimpl(trylast=True)  # (after -m and -k have chosen)
def pytest_collection_modifyitems(config, items):
    def rank(item):
        module = item.path.stem
        return LONGEST_FIRST.index(module) if module in LONGEST_FIRST else len(LONGEST_FIRST)
    items.sort(key=rank)  # stable: the tests of a module keep their order
    # A document whose commands test_docs_run runs (and composes, where it cannot run one) needs no test_docs
    # composing them first; make test-fast, without the runs, keeps test_docs's.
    run = {item.callspec.params["doc"] for item in items
           if item.originalname == "test_every_command_of_the_docs_runs_as_it_says"}
    composed = [item for item in items if item.originalname == "test_every_command_of_the_docs_composes_and_checks"
                and item.callspec.params["doc"] in run]
    if composed:
        config.hook.pytest_deselected(items=composed)
        items[:] = [item for item in items if item not in composed]
