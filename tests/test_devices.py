"""Device choices that depend on GPUs, kept honest on a CPU machine: the logic is driven with fake
device lists (no GPU with TensorFlow is available to this project's machines)."""
import pytest
import tensorflow as tf
from omegaconf import OmegaConf

from distrain.common import cpu as cpu_lib
from distrain.common.errors import ConfigError
from distrain.config.validate import UNSHARDABLE, check_devices_present
from distrain.task import strategy as strategy_lib
from distrain.task.strategy import compute_devices, configure_devices, precision_policy

GPU_BOX = ["/cpu:0", "/gpu:0", "/gpu:1"]


def node(**keys):
    return OmegaConf.create({"name": "mirrored", "cpu_virtual_devices": 0, "devices": None, **keys})


@pytest.mark.parametrize("setting, gpus, cpu, policy", [
    (False, [(8, 0)], {"avx512_bf16"}, "float32"),                  # off is off, whatever the hardware
    ("auto", [(8, 0), (8, 6)], set(), "mixed_float16"),            # tensor cores
    ("auto", [(8, 0), (6, 1)], set(), "float32"),                  # one card without: the slowest decides
    (True, [(6, 1)], set(), "mixed_float16"),                      # asked for: given, though slow
    ("auto", [], {"avx512f", "avx512_bf16"}, "mixed_bfloat16"),    # native bfloat16 on the CPU
    ("auto", [], {"amx_bf16", "amx_tile"}, "mixed_bfloat16"),
    ("auto", [], {"avx512f", "avx2"}, "float32"),                  # emulated bfloat16 would be slower
    (True, [], {"avx2"}, "mixed_bfloat16"),
])
def test_precision_follows_the_hardware(setting, gpus, cpu, policy):
    chosen, why = precision_policy(setting, gpus, cpu)
    assert chosen == policy
    assert why.startswith("trainer.mixed_precision=")


def test_sharded_variables_train_in_float32_where_auto_would_pick_16_bits():
    """Keras cannot autocast a variable strategy.variable_partitioner shards (true is refused up front)."""
    assert precision_policy("auto", [], {"avx512_bf16"}, sharded=True) == ("float32", f"trainer.mixed_precision=auto: "
                                                                           f"{UNSHARDABLE}")
    assert precision_policy("auto", [(8, 0)], set(), sharded=True)[0] == "float32"
    assert precision_policy("auto", [], {"avx512_bf16"}, sharded=False)[0] == "mixed_bfloat16"  # the control


def test_this_machine_is_read():
    """The flags come from the real CPU (Linux): a parse that always found nothing would turn auto off."""
    flags = cpu_lib.flags()
    assert {"fpu", "sse2"} <= flags
    expected = "mixed_bfloat16" if {"avx512_bf16", "amx_bf16"} & flags else "float32"
    assert precision_policy("auto", gpus=[])[0] == expected
    assert strategy_lib.gpu_capabilities() == []  # no GPU here: the lists above are the GPU cases


@pytest.mark.parametrize("setting, env, cpu, machine, gpu, value, because", [
    ("auto", {}, {"avx2", "fma"}, "x86_64", False, "1", "TensorFlow leaves them off"),  # AVX2-only EPYC
    ("auto", {}, {"avx512f", "avx512_bf16"}, "x86_64", False, "1", "TensorFlow's default on this CPU (avx512_bf16)"),
    ("auto", {}, {"avx2", "amx_tile"}, "x86_64", False, "1", "(amx_tile)"),
    ("auto", {}, {"avx2"}, "aarch64", False, None, "TensorFlow's default on a aarch64 CPU"),
    ("auto", {}, {"avx2"}, "x86_64", True, None, "TensorFlow's default on a machine with GPUs"),
    (False, {}, {"avx512_bf16"}, "x86_64", False, "0", "trainer.onednn=false"),       # off is off, anywhere
    (True, {}, {"avx2"}, "aarch64", True, "1", "trainer.onednn=true"),
    (True, {cpu_lib.ONEDNN: "0"}, {"avx2"}, "x86_64", False, "0", "in the environment, which wins"),  # theirs
    ("auto", {cpu_lib.ONEDNN: "1"}, {"avx2"}, "aarch64", False, "1", "in the environment, which wins"),
])
def test_onednn_is_chosen_before_tensorflow_starts(setting, env, cpu, machine, gpu, value, because):
    chosen, why = cpu_lib.onednn_choice(setting, env, cpu, machine, gpu)
    assert chosen == value and because in why


@pytest.mark.parametrize("keys, devices", [
    ({}, ["/gpu:0", "/gpu:1"]),                                    # every GPU
    ({"devices": ["/GPU:1"]}, ["/gpu:1"]),                          # named, in any spelling
    ({"devices": ["/gpu:1", "/cpu:0"]}, ["/gpu:1", "/cpu:0"]),
    ({"cpu_virtual_devices": 2}, ["/cpu:0"]),                       # the CPUs asked for (one here)
])
def test_replica_devices_on_a_machine_with_gpus(keys, devices):
    assert compute_devices(node(**keys), have=GPU_BOX) == devices


def test_replica_devices_without_gpus_and_a_missing_one():
    assert compute_devices(node(), have=["/cpu:0"]) == ["/cpu:0"]
    with pytest.raises(ConfigError, match=r"device /gpu:2 is not on this machine \(it has /cpu:0, /gpu:0, /gpu:1\)"):
        compute_devices(node(devices=["/gpu:0", "/gpu:2"]), have=GPU_BOX)


def test_every_gpu_gets_memory_growth(monkeypatch):
    grown = []
    monkeypatch.setattr(tf.config.experimental, "set_memory_growth", lambda gpu, on: grown.append((gpu, on)))
    configure_devices(node(), gpus=["GPU:0", "GPU:1"])
    assert grown == [("GPU:0", True), ("GPU:1", True)]
    configure_devices(node(), gpus=[])  # control: no GPU, no call
    assert len(grown) == 2


@pytest.mark.parametrize("keys, missing", [
    ({"devices": ["/gpu:0"]}, "/gpu:0"),
    ({"devices": ["/job:localhost/replica:0/task:0/device:GPU:1"]}, "/gpu:1"),  # TensorFlow's long spelling
    ({"devices": ["/cpu:0", "/CPU:2"], "cpu_virtual_devices": 2}, "/cpu:2"),  # past the CPUs asked for
    ({"parameter_device": "/device:GPU:3"}, "/gpu:3"),
    ({"device": "/gpu:7"}, "/gpu:7"),
    ({"devices": ["/cpu:0", "/cpu:1"], "cpu_virtual_devices": 2}, None),  # present: the control
    ({"device": "banana"}, None),  # a name only TensorFlow reads: the task says what is wrong with it
])
def test_a_device_this_machine_lacks_is_found_before_tensorflow_starts(monkeypatch, keys, missing):
    """config.check_devices_present, which the launcher runs: on a machine with no GPU driver loaded, a
    GPU named is surely missing, so is a CPU past strategy.cpu_virtual_devices."""
    monkeypatch.setattr(cpu_lib, "has_gpu", lambda: False)
    if missing is None:
        check_devices_present(node(**keys))
        return
    with pytest.raises(ConfigError, match=f"device {missing} is not on this machine"):
        check_devices_present(node(**keys))
    monkeypatch.setattr(cpu_lib, "has_gpu", lambda: True)  # GPUs present: the task checks, with TensorFlow's list
    if "gpu" in missing:
        check_devices_present(node(**keys))
