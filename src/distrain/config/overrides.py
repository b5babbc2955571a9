"""Hydra's command-line overrides (`cluster.workers=2`, `+key=v`, `~key`, `trainer.epochs=1,2`), read here
alone and with Hydra's own parser, so that every part of distrain reads one the way Hydra does: the key
each names, its value as text, the jobs a sweep of them makes, and the keys a sweep varies.

Runs in the launcher, the sweep's callbacks and sweeper, and evaluate's and predict's command; no
TensorFlow. Parsing is a few milliseconds (Hydra's grammar is built once per process)."""
import functools
import itertools

from hydra.core.override_parser.overrides_parser import OverridesParser


@functools.cache
def _parser() -> OverridesParser:
    return OverridesParser.create()


def parse(overrides: list) -> list:
    """Hydra's Override of each (raises Hydra's OverrideParseException where one is malformed)."""
    return _parser().parse_overrides(list(overrides))


def keys_of(overrides: list) -> list[str]:
    """The key each override names ("cluster.workers" of "+cluster.workers=2"), in order."""
    return [split(override)[0] for override in overrides]


def split(override: str) -> tuple[str, str]:
    """("cluster.workers", "2") from "cluster.workers=2"; Hydra's escapes undone ("/gpu\\:7" is /gpu:7).
    One Hydra cannot parse (a label only, never an error here) is split at its first "="."""
    try:
        parsed = parse([override])[0]
        value = parsed.value()
        return parsed.key_or_group, value if isinstance(value, str) else parsed.get_value_element_as_str()
    except Exception:  # noqa: BLE001 - the text as it is
        key, _, value = override.partition("=")
        return key.lstrip("+~"), value


def combinations(overrides: list) -> tuple[list[list], list]:
    """(Each combination of the overrides' a,b values, as Hydra's basic sweeper makes its jobs; the keys
    they vary.)"""
    parsed = parse(overrides)
    choices = [list(o.sweep_string_iterator()) if o.is_sweep_override() else [o.input_line] for o in parsed]
    jobs = [[f"{o.get_key_element()}={v}" if o.is_sweep_override() else v for o, v in zip(parsed, values)]
            for values in itertools.product(*choices)]
    return jobs, [o.key_or_group for o in parsed if o.is_sweep_override()]


def swept_keys(overrides: list) -> set[str]:
    """The keys that sweep overrides (a,b; range(); choice()) vary; none where one cannot be parsed."""
    try:
        return {o.key_or_group for o in parse(overrides) if o.is_sweep_override()}
    except Exception:  # noqa: BLE001 - a label only: never fail a job over it
        return set()
