"""What this machine's CPU offers, read without TensorFlow: its feature flags, and whether TensorFlow
runs its oneDNN kernels, which must be decided before TensorFlow starts (an environment variable)."""
import os
import platform
from pathlib import Path

from distrain.common.messages import ONEDNN_WHY

ONEDNN = "TF_ENABLE_ONEDNN_OPTS"  # TensorFlow reads it once, when it starts
# TensorFlow turns oneDNN on by itself on Linux only for CPUs with one of these (tensorflow/core/util/util.cc).
ONEDNN_DEFAULT_ON = ("avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16")
NATIVE_BFLOAT16 = ("avx512_bf16", "amx_bf16")  # CPU flags of bfloat16 arithmetic in hardware (oneDNN uses them)


def flags() -> set[str]:
    """The CPU's feature flags (Linux /proc/cpuinfo); none where that cannot be read."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((set(line.split(":", 1)[1].split()) for line in f if line.startswith("flags")), set())
    except OSError:
        return set()


def has_gpu() -> bool:
    """An NVIDIA GPU with its driver loaded (read without TensorFlow)."""
    gpus = Path("/proc/driver/nvidia/gpus")
    return gpus.is_dir() and any(gpus.iterdir())


def onednn_choice(setting, env=None, cpu: set[str] | None = None, machine: str | None = None,
                  gpu: bool | None = None) -> tuple[str | None, str]:
    """TF_ENABLE_ONEDNN_OPTS for trainer.onednn (auto, true or false): "1", "0", or None for TensorFlow's
    own default; and why. The user's own TF_ENABLE_ONEDNN_OPTS wins. By default this machine's
    environment, CPU flags, architecture and GPUs; a test passes its own."""
    env = os.environ if env is None else env
    if ONEDNN in env:
        return env[ONEDNN], f"{ONEDNN}={env[ONEDNN]} in the environment, which wins over trainer.onednn"
    if setting is not None and not isinstance(setting, str):
        return ("1", "trainer.onednn=true") if setting else ("0", "trainer.onednn=false")
    cpu = flags() if cpu is None else cpu
    machine = platform.machine() if machine is None else machine
    if machine.lower() not in ("x86_64", "amd64"):
        return None, f"trainer.onednn=auto: TensorFlow's default on a {machine} CPU"
    if has_gpu() if gpu is None else gpu:  # the model runs on the GPU; TensorFlow's default for the rest
        return None, "trainer.onednn=auto: TensorFlow's default on a machine with GPUs"
    native = [flag for flag in ONEDNN_DEFAULT_ON if flag in cpu]
    if native:
        return "1", f"trainer.onednn=auto: TensorFlow's default on this CPU ({', '.join(native)})"
    return "1", ("trainer.onednn=auto: TensorFlow leaves them off on CPUs without AVX512_VNNI, AVX512_BF16, "
                 "AVX_VNNI or AMX, where they measured 1.4-2.6x faster; trainer.onednn=false for TensorFlow's own")


def onednn_env(setting) -> dict:
    """The task's environment for trainer.onednn: the variable (unless TensorFlow's default) and the reason."""
    value, why = onednn_choice(setting)
    return {**({ONEDNN: value} if value is not None else {}), ONEDNN_WHY: why}
