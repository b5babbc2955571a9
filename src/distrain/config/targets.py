"""What a `_target_` takes: the argument names of the class or function a config node names, read from
its signature (as hydra-zen's `builds()` reads one to derive a config), and the check that each node
gives its class only those. It runs in the task, which imports TensorFlow anyway: reading a tf_keras
class's signature in the launcher would cost it TensorFlow's import, about 4 s, on every run."""
import difflib
import inspect
import logging

from hydra.utils import get_object

from distrain.common.errors import ConfigError
from distrain.config.schema import OWN
from distrain.config.schema_check import ENTRIES, shown, split

# Keyword arguments a Keras base class takes through **kwargs and checks itself (tf_keras, tensorflow).
CHECKED_BY_ITSELF = ("tf_keras.", "keras.", "tensorflow.")


def takes(target: str) -> set[str] | None:
    """The keyword arguments of the class or function `target` names; None: any (a **kwargs that
    nothing checks), or a target that cannot be imported (then instantiating it says why)."""
    logger = logging.getLogger("hydra.utils")  # (which logs an error for a target it cannot find)
    quiet, logger.disabled = logger.disabled, True
    try:
        found = get_object(target)
    except Exception:  # noqa: BLE001 - instantiate() reports a target that cannot be found
        return None
    finally:
        logger.disabled = quiet
    if not inspect.isclass(found):
        return _named(found, open_ends=True)
    names, last = set(), found
    for klass in found.__mro__:  # a class's **kwargs go on to its base's __init__ (super().__init__(**kwargs))
        init = klass.__dict__.get("__init__")
        if init is None or klass is object:
            continue
        more = _named(init)
        if more is None:
            return None
        names |= more
        if not _has_kwargs(init):
            return names
        last = klass
    # **kwargs up to object: Keras's own bases check them (the legacy `lr` of optimizers, say)
    return names if last.__module__.startswith(CHECKED_BY_ITSELF) else None


def _named(function, open_ends: bool = False) -> set[str] | None:
    """The names a function takes by keyword; None where that cannot be read, or (open_ends) where it
    takes **kwargs too."""
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature
        return None
    if open_ends and _has_kwargs(function):
        return None
    return {p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)} - {"self"}


def _has_kwargs(function) -> bool:
    return any(p.kind == p.VAR_KEYWORD for p in inspect.signature(function).parameters.values())


# What distrain itself gives each group's class, beside the node's keys (never the user's mistake).
GIVEN = {"model": {"input_shape", "num_classes"}, "optimizer": {"learning_rate"},
         "schedule": {"initial_learning_rate"}, "loss": {"reduction"}}


def check_arguments(cfg) -> None:
    """Every argument a node gives its class, the class takes; else a ConfigError naming the argument,
    the class, what the class takes and the closest of those (a typo)."""
    for group in OWN:
        node = cfg[group]
        if node.get("_target_"):
            check(group, node._target_, split(group, node)[2])
    for group in ENTRIES:
        for name, entry in (cfg.get(group) or {}).items():
            if isinstance(entry, str):  # metrics' `auto`
                continue
            check(f"{group}.{name}", entry._target_, {k: v for k, v in entry.items() if k != "_target_"})


def check(key: str, target: str, arguments: dict) -> None:
    """Each of `arguments` is one the class or function `target` names takes; else a ConfigError."""
    names = takes(target)
    if names is None:
        return
    for argument, value in arguments.items():
        if argument in names:
            continue
        listed = ", ".join(sorted(names - GIVEN.get(key, set()))) or "none"
        close = difflib.get_close_matches(argument, sorted(names), n=1, cutoff=0.6)
        fix = f"set {key}.{close[0]}={shown(value)} instead" if close else \
            f"drop {key}.{argument}, or name a class that takes it"
        raise ConfigError(f"{key}.{argument} is not an argument of {target} (it takes {listed}): {fix}")
