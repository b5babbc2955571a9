"""The schema's engine: checks a composed config against the schema (schema/) and turns what it
refuses into one line naming the key, what it must be and a fix; lists every key for --help. No
TensorFlow here."""
import dataclasses
import difflib
from enum import Enum
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from distrain.common.errors import ConfigError
from distrain.config.schema import LOGGERS, OWN, SCHEMAS, TARGET, Root


def _kind(schema, name: str) -> str:
    """What a value of this key must be, in words."""
    meta = {f.name: f for f in dataclasses.fields(schema)}[name]
    kind, text = meta.type, str(meta.type)
    if isinstance(kind, type) and issubclass(kind, Enum):
        return "one of " + ", ".join(kind.__members__)
    if kind is Any:  # a few fixed values of several types (cluster.isolate)
        return "one of " + meta.metadata["check"].says.removeprefix("is not one of ")
    for word, says in (("List", "a list such as [a,b]"), ("bool", "true or false"), ("int", "an integer"),
                       ("float", "a number"), ("str", "text")):
        if word in text:
            return says + (" or null" if "Optional" in text else "")
    return "a value"


def _example(schema, name: str):
    """A valid value to suggest for the key, as one writes it on the command line."""
    meta = {f.name: f for f in dataclasses.fields(schema)}[name]
    value = meta.metadata.get("example")
    if value is None:
        value = meta.default if meta.default is not dataclasses.MISSING else meta.default_factory()
    if isinstance(value, Enum):
        value = value.value
    if isinstance(value, bool):
        return str(value).lower()
    return "[]" if value == [] else value


def shown(value) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, Enum):
        return value.value
    return repr(value) if isinstance(value, str) and (not value or value.strip() != value) else str(value)


def explain(exc: OmegaConfBaseException, group: str = "") -> str:
    """One line for a value or key OmegaConf refused: names the key, says what it must be, and a fix."""
    full = ".".join(p for p in (group, exc.full_key) if p) if exc.full_key else group
    schema = exc.object_type if dataclasses.is_dataclass(exc.object_type) else None
    name = full.rsplit(".", 1)[-1]
    parent_node = getattr(exc, "parent_node", None)
    if schema is None and "not in struct" in str(exc) and isinstance(parent_node, DictConfig) and "." in full:
        parent = full.rsplit(".", 1)[0]  # a key the option does not have (untyped while composing: OWN groups)
        close = _close_key(parent, parent_node, name) or _deeper_key(parent, name)
        if close:
            return f"{full} is not a key of {parent}: set e.g. {close}"
        takes = f", or add it as +{full}=... if {parent}'s _target_ takes it" if parent_node.get("_target_") else ""
        return f"{full} is not a key of {parent} (it has {', '.join(map(str, parent_node.keys()))}): drop it{takes}"
    if schema is None:
        return str(exc).splitlines()[0]
    fields = [f.name for f in dataclasses.fields(schema)]
    parent = full.rsplit(".", 1)[0] if "." in full else ""
    if name not in fields:
        close = difflib.get_close_matches(name, fields, n=1, cutoff=0.6)
        if close:
            if schema is not Root:
                example = _example(schema, close[0])
            else:  # a group: its default option
                example = next(iter(SCHEMAS[close[0]])) if close[0] in SCHEMAS else ENTRIES[close[0]][1]
            return (f"{full} is not a key of {parent or 'the config'}: "
                    f"set e.g. {parent + '.' if parent else ''}{close[0]}={example}")
        return (f"{full} is not a key of {parent or 'the config'} (it has {', '.join(fields)}): drop it, "
                "or pick another option of the group (`python train.py --help` lists them)")
    kind, example = _kind(schema, name), _example(schema, name)
    if kind.startswith("a list") and isinstance(exc.value, str):
        example = f"[{exc.value}]"  # one address given where a list of them is meant
    return f"{full}={shown(exc.value)} must be {kind}: set e.g. {full}={example}"


def _close_key(group: str, node: DictConfig, name: str) -> str:
    """`group.key=example` for a schema key of the group's node close to `name` (a typo), else ""."""
    try:
        schema = _schema_of(group, node) if group in SCHEMAS else _nested_schema(group)
    except ConfigError:
        return ""
    fields = [f.name for f in dataclasses.fields(schema)] if schema else []
    close = difflib.get_close_matches(name, fields, n=1, cutoff=0.6)
    return f"{group}.{close[0]}={_example(schema, close[0])}" if close else ""


def _nested_schema(path: str):
    """The schema of a group's nested node (`data.service`), else None."""
    group, _, name = path.partition(".")
    for schema in [*SCHEMAS.get(group, {}).values(), OWN.get(group)]:
        meta = {f.name: f for f in dataclasses.fields(schema)}.get(name) if schema else None
        if meta and dataclasses.is_dataclass(meta.type):
            return meta.type
    return None


def _deeper_key(parent: str, name: str) -> str:
    """`logger.mlflow.tracking_uri=example` (with `logger=mlflow` where that logger is not chosen) for a
    key of one of the loggers' own nodes given one level too high, else ""."""
    if parent != "logger":
        return ""
    for option, schema in LOGGERS.items():
        if name in {f.name for f in dataclasses.fields(schema)}:
            return (f"logger={option} logger.{option}.{name}={_example(schema, name)} (each logger's keys are "
                    "under its name)")
    return ""


def _defaults(schema) -> dict:
    return {f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
            for f in dataclasses.fields(schema)}


def _without_brought_along(group: str, node: dict) -> dict:
    """A node whose option's class a preset or override has replaced (`_target_` named anew): without
    the keys the option brought along at its defaults, which are not the new class's arguments."""
    option = SCHEMAS[group].get(node.get("name"))
    if option is None:
        return node
    defaults = _defaults(option)
    if node.get("_target_") == defaults.get("_target_"):
        return node
    return {k: v for k, v in node.items() if not (k in defaults and _plain(v) == _plain(defaults[k]))}


def _plain(value):
    return value.value if isinstance(value, Enum) else value


def _schema_of(group: str, node) -> type:
    name = node.get("name", "default") if isinstance(node, (dict, DictConfig)) else None
    options = SCHEMAS[group]
    if group in OWN and isinstance(node, (dict, DictConfig)):
        target = node.get("_target_")
        builtin = {_defaults(schema).get("_target_"): schema for schema in options.values()}  # cnn, mlp
        if target and target in builtin:
            return builtin[target]
        if target or "name" not in node:
            return OWN[group]
    if name not in options:
        raise ConfigError(f"{group}.name={name!r} names no {group} option: choose the option itself, "
                          f"e.g. {group}={next(iter(options))}")
    return options[name]


def split(group: str, node) -> tuple[type, dict, dict]:
    """(The node's schema, its keys that are the schema's, the arguments of its class): a node that
    names a class (`_target_`) gives it every key its schema does not have, checked against the class
    in the task (targets.check_arguments). Another node has the schema's keys alone."""
    node = _without_brought_along(group, dict(node)) if group in OWN else dict(node)
    schema = _schema_of(group, node)
    if schema is OWN.get(group):
        _check_own(group, node)
    if group not in OWN or not node.get("_target_"):
        return schema, node, {}
    fields = {f.name for f in dataclasses.fields(schema)}
    return schema, {k: v for k, v in node.items() if k in fields}, {k: v for k, v in node.items() if k not in fields}


def _check_own(group: str, node: dict) -> None:
    if group == "model" and not node.get("_target_") and not node.get("path"):
        raise ConfigError("a model option needs _target_ (its builder) or path (a saved model): set e.g. "
                          "model._target_=mymodels.small_cnn")
    if group in ("optimizer", "schedule") and not node.get("_target_"):
        raise ConfigError(f"an {group} option of your own needs _target_ (its class): set e.g. {group}._target_="
                          f"{OWN[group].__dataclass_fields__['_target_'].metadata['example']}")
    if group == "data" and not node.get("_target_"):
        raise ConfigError("a data option of your own needs _target_ (its loader): set e.g. data._target_=mydata.load, "
                          "or use data=npz data.path=FILE.npz")


def check(cfg: DictConfig) -> DictConfig:
    """The config, resolved, with every value converted to its schema's type (enums as their names).
    Raises a one-line ConfigError for a key the schema does not have, a value of the wrong type (in a
    config read from a file), or a value out of range. A user's own model or data node keeps the keys
    that are its builder's or loader's arguments as they are."""
    try:
        plain = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True, enum_to_str=True))
    except OmegaConfBaseException as exc:
        raise ConfigError(explain(exc)) from None
    roots = [f.name for f in dataclasses.fields(Root)]
    unknown = sorted(set(plain.keys()) - set(roots))
    if unknown:
        close = difflib.get_close_matches(unknown[0], roots, n=1)
        raise ConfigError(f"{unknown[0]} is not a config key: " + (f"set e.g. {close[0]}=... instead" if close
                          else "drop it (`python train.py --help` lists every key)"))
    checked = {}
    for group in SCHEMAS:
        schema, node, arguments = split(group, plain[group])
        try:
            node = OmegaConf.merge(OmegaConf.structured(schema), node)
        except OmegaConfBaseException as exc:
            raise ConfigError(explain(exc, group)) from None
        _check_ranges(schema, node, group)
        checked[group] = {**OmegaConf.to_container(node, enum_to_str=True), **arguments}
    for group, (example, _) in ENTRIES.items():
        checked[group] = check_entries(group, plain.get(group), example)
    checked["logger"] = check_loggers(plain.get("logger"))
    return OmegaConf.create(checked)


def _check_ranges(schema, node, where: str) -> None:
    """Each value of the node within its key's range, in the node's nested nodes too (data.service)."""
    for f in dataclasses.fields(schema):
        value, rule = node[f.name], f.metadata.get("check")
        if dataclasses.is_dataclass(f.type):
            _check_ranges(f.type, value, f"{where}.{f.name}")
        elif rule and value is not None and not rule.ok(value):
            raise ConfigError(f"{where}.{f.name}={shown(value)} {rule.says}: "
                              f"set e.g. {where}.{f.name}={_example(schema, f.name)}")


def check_loggers(node) -> dict:
    """The logger group: each entry one of LOGGERS by name, with its keys."""
    node = OmegaConf.create({}) if node is None else node
    if not isinstance(node, DictConfig):
        raise ConfigError(f"logger={node} names no loggers: choose them, e.g. logger=[tensorboard,mlflow]")
    checked = {}
    for name, keys in node.items():
        if name not in LOGGERS:
            close = difflib.get_close_matches(str(name), LOGGERS, n=1)
            raise ConfigError(f"logger.{name} is no logger: choose of {', '.join(LOGGERS)}" +
                              (f", e.g. logger={close[0]}" if close else ""))
        try:
            checked[name] = OmegaConf.to_container(OmegaConf.merge(OmegaConf.structured(LOGGERS[name]), keys or {}))
        except OmegaConfBaseException as exc:
            raise ConfigError(explain(exc, f"logger.{name}")) from None
    return checked


# The groups of named entries, each a _target_ and its arguments: an example of one, and the default option.
ENTRIES = {"metrics": ("tf_keras.metrics.MeanAbsoluteError", "accuracy"),
           "callbacks": ("tf_keras.callbacks.EarlyStopping", "none")}


def check_entries(group: str, node, example: str) -> dict:
    """A node of named entries (metrics, callbacks): each a _target_ (module.Class) and its arguments."""
    node = OmegaConf.create({}) if node is None else node
    if not isinstance(node, DictConfig):
        raise ConfigError(f"{group}={node} is not named entries: choose an option of {group} or name each entry, "
                          f"e.g. +{group}.mine='{{_target_: {example}}}'")
    for name, entry in node.items():
        if group == "metrics" and entry == "auto":  # Keras's "accuracy": the one the labels want (metrics.py)
            continue
        target = entry.get("_target_") if isinstance(entry, DictConfig) else None
        if not isinstance(target, str) or not TARGET.ok(target):
            raise ConfigError(f"{group}.{name} must be a _target_ (module.Class) and its arguments, not {entry}: set "
                              f"e.g. {group}.{name}._target_={example}, or remove it with ~{group}.{name}")
    return OmegaConf.to_container(node)


def describe(cfg: DictConfig) -> str:
    """Every key of the composed config: its value, type and meaning (for --help)."""
    def line(schema, name: str, value, indent: str) -> str:
        meta = {f.name: f for f in dataclasses.fields(schema)}[name]
        doc = meta.metadata.get("doc", "")
        if dataclasses.is_dataclass(meta.type):  # a nested node (data.service): its own keys, indented
            value = value or {}
            return "\n".join([f"{indent}{name}:  ({doc})"] + [line(meta.type, f.name, value.get(f.name), indent + "  ")
                                                              for f in dataclasses.fields(meta.type)])
        return f"{indent}{name}: {shown(value) if value is not None else 'null'}  ({_kind(schema, name)}) {doc}"

    lines = []
    for group in SCHEMAS:
        node = cfg.get(group)
        try:
            schema, keys, arguments = split(group, node)
        except ConfigError:
            continue
        keys = {**_defaults(schema), **keys}  # (a replaced option's keys are gone: the new class's defaults)
        lines.append(f"{group}:")
        lines += [line(schema, f.name, keys.get(f.name), "  ") for f in dataclasses.fields(schema)]
        lines += [f"  {k}: {shown(v)}  argument of {node.get('_target_')}" for k, v in arguments.items()]
    for name, keys in (cfg.get("logger") or {}).items():
        if name in LOGGERS:
            lines.append(f"logger.{name}:  ({LOGGERS[name].__doc__ or 'its keys'})".replace("(None)", ""))
            lines += [line(LOGGERS[name], f.name, keys.get(f.name), "  ") for f in dataclasses.fields(LOGGERS[name])]
    for group in ENTRIES:
        lines.append(f"{group}:  (named entries: a tf_keras class each, and its arguments)")
        for name, entry in (cfg.get(group) or {}).items():
            lines.append(f"  {name}: {OmegaConf.to_container(entry) if isinstance(entry, DictConfig) else entry}")
    return "\n".join(lines)
