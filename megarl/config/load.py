"""Load a `MegarlConfig` from a YAML file plus `key=value` overrides, with errors a user can act on.

The schema dataclasses give the defaults; the YAML file is applied on top, then each override in order.
Every unknown key and every badly typed value is reported at once, with the key and the expected type;
then `validate` checks the cross-field rules. No omegaconf exception escapes: all become `ConfigError`.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import sys
import typing
from collections.abc import Sequence
from typing import Any, Literal

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from megarl.config.errors import ConfigError, show_value
from megarl.config.schema import MegarlConfig
from megarl.config.validate import resolve_auto, validate
from megarl.config.verl_translate import command_line_rules, flatten, translate_leaves, verl_hint

__all__ = ["ConfigError", "config_from", "config_to_yaml", "load_config", "settings_as_megarl", "validate"]

_TYPE_NAMES = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
_EXAMPLES = {int: 1, float: 1.0, bool: True, str: "text"}


def load_config(
    path: str | os.PathLike[str] | None = None, overrides: Sequence[str] = (), check_paths: bool = True
) -> MegarlConfig:
    """Build the config from the schema defaults, the YAML file at `path` and dotlist `overrides`.

    Returns a validated `MegarlConfig` whose "None = auto" fields are decided. Raises `ConfigError`
    listing every problem. `check_paths=False` skips file-existence and model-dependent checks.
    """
    return _build([] if path is None else [_read_yaml(os.fspath(path))], overrides, check_paths)


def config_from(
    source: str | os.PathLike[str] | dict[str, Any] | MegarlConfig | None,
    settings: Sequence[dict[str, Any]] = (),
    overrides: Sequence[str] = (),
    check_paths: bool = True,
) -> MegarlConfig:
    """The Python API's config: `source` (a YAML path, a dict of sections — nested, or with dotted keys
    such as {"actor.optimizer.lr": 1e-3} — or a MegarlConfig), then each tree of `settings` (what the
    controllers set), then dotlist `overrides`; checked exactly as `load_config` checks the CLI's, with
    the same messages."""
    trees = [config_tree(source)]
    return _build(trees + [_nest(tree) for tree in settings], overrides, check_paths)


def config_tree(source: str | os.PathLike[str] | dict[str, Any] | MegarlConfig | None) -> dict[str, Any]:
    """`config_from`'s source as a nested dict of sections, unchecked."""
    if source is None:
        return {}
    if isinstance(source, MegarlConfig):
        tree = OmegaConf.to_container(OmegaConf.structured(source), resolve=False)
        assert isinstance(tree, dict)
        return tree
    if isinstance(source, dict):
        return _nest(source)
    if isinstance(source, (str, os.PathLike)):
        return _read_yaml(os.fspath(source))
    raise ConfigError(
        [f"config={type(source).__name__}: pass a dict, a MegarlConfig or the path of a YAML file"]
    )


def _nest(tree: dict[str, Any]) -> dict[str, Any]:
    """{"actor.optimizer.lr": 1e-3} -> {"actor": {"optimizer": {"lr": 1e-3}}} (nested keys kept)."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        node = out
        *parents, leaf = str(key).split(".")
        for name in parents:
            node = node.setdefault(name, {})
        value = _nest(value) if isinstance(value, dict) else value
        if isinstance(value, dict) and isinstance(node.get(leaf), dict):
            value = {**node[leaf], **value}
        node[leaf] = value
    return out


def settings_as_megarl(
    path: str | os.PathLike[str] | None = None, overrides: Sequence[str] = ()
) -> dict[str, Any]:
    """What the YAML file at `path` and `overrides` set, in megarl's keys (verl's translated), as one
    nested tree without the defaults: `megarl config show --as-megarl`. Raises `ConfigError` as
    `load_config` does for keys it cannot translate."""
    trees, _, problems = _in_megarl_keys([] if path is None else [_read_yaml(os.fspath(path))], overrides)
    if problems:
        raise ConfigError(problems)
    merged: dict[str, Any] = {}
    for tree in trees:
        _merge_into(merged, tree)
    return merged


def _merge_into(into: dict[str, Any], tree: dict[str, Any]) -> None:
    for key, value in tree.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge_into(into[key], value)
        else:
            into[key] = value


def _in_megarl_keys(
    trees: list[dict[str, Any]], overrides: Sequence[str]
) -> tuple[list[dict[str, Any]], list[str], list[str]]:
    """(each tree, then the override list as one more, in megarl's keys; warning lines; problems).
    verl's keys are translated (megarl.config.verl_keys); the override list is one layer, so a verl key
    and its megarl twin both given there must agree; then `command_line_rules` apply to it."""
    problems: list[str] = []
    warnings: list[str] = []
    out: list[dict[str, Any]] = []
    for tree in trees:
        layer = translate_leaves(flatten(tree))
        out.append(layer.tree)
        warnings += layer.warnings
        problems += layer.problems
    if isinstance(overrides, str):
        overrides = [overrides]
    leaves: list[tuple[str, Any]] = []
    for item in overrides:
        parsed = _parse_override(item, problems)
        if parsed is not None:
            leaves += flatten(parsed)
    layer = translate_leaves(leaves)
    warnings += layer.warnings
    problems += layer.problems
    warnings += command_line_rules(layer, out)
    out.append(layer.tree)
    return out, list(dict.fromkeys(warnings)), problems


def _build(trees: list[dict[str, Any]], overrides: Sequence[str], check_paths: bool) -> MegarlConfig:
    trees, warnings, problems = _in_megarl_keys(trees, overrides)
    for line in warnings:
        print(f"megarl: {line}", file=sys.stderr, flush=True)
    merged = OmegaConf.structured(MegarlConfig)
    for tree in trees:
        for key, value in _leaves(tree, MegarlConfig, "", problems):
            _assign(merged, key, value, problems)
    if problems:
        raise ConfigError(problems)
    try:
        cfg = OmegaConf.to_object(merged)
    except OmegaConfBaseException as e:
        raise ConfigError([_describe_omegaconf_error(e)]) from None
    assert isinstance(cfg, MegarlConfig)
    cfg = resolve_auto(cfg)
    validate(cfg, check_paths=check_paths)
    return cfg


def config_to_yaml(cfg: MegarlConfig) -> str:
    """The full config as YAML (every field, defaults included); `load_config` reads it back unchanged."""
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def _read_yaml(path: str) -> dict[str, Any]:
    if not os.path.isfile(path):
        raise ConfigError(
            [f"config file {path} does not exist; check the path (e.g. configs/quickstart_grpo.yaml)"]
        )
    try:
        raw = OmegaConf.load(path)
    except (yaml.YAMLError, OmegaConfBaseException, OSError, UnicodeDecodeError) as e:
        raise ConfigError([f"config file {path} is not valid YAML: {_one_line(e)}; fix the syntax"]) from None
    if not isinstance(raw, DictConfig):
        raise ConfigError(
            [f"config file {path} must be a mapping of sections (model:, actor:, ...), not a list"]
        )
    tree = OmegaConf.to_container(raw, resolve=False)
    assert isinstance(tree, dict)
    return tree


def _parse_override(item: str, problems: list[str]) -> dict[str, Any] | None:
    """One `key=value` as a tree. hydra's `+key=value` and `++key=value` (add / force-add a key) are
    `key=value` here: every megarl key exists, and verl's are translated."""
    if item.startswith("~"):
        problems.append(
            f"override '{item}': hydra's ~key (delete a key) has no meaning in megarl; leave the key out, "
            "or set it to its default"
        )
        return None
    item = item.lstrip("+")
    key, sep, value = item.partition("=")
    if (
        len(value) > 3
        and value[0] == value[-1]
        and value[0] in "'\""
        and value[1] == "["
        and value[-2] == "]"
    ):
        item = f"{key}={value[1:-1]}"  # key='[a,b]' with the shell's quotes kept (a launcher's argv): a list
    if not sep or not key.strip():
        problems.append(f"override '{item}' is not key=value; write e.g. actor.parallel.tp=2")
        return None
    try:
        tree = OmegaConf.to_container(OmegaConf.from_dotlist([item]), resolve=False)
    except (yaml.YAMLError, OmegaConfBaseException, ValueError) as e:
        problems.append(
            f"override '{item}' could not be parsed ({_one_line(e)}); quote strings with special characters"
        )
        return None
    assert isinstance(tree, dict)
    return tree


def _leaves(tree: dict[Any, Any], cls: type, prefix: str, problems: list[str]) -> list[tuple[str, Any]]:
    """Flatten a user tree against the schema into (dotted key, value); report unknown keys and misplaced
    values. A lone string given for a list field becomes a one-element list."""
    hints = typing.get_type_hints(cls)
    leaves: list[tuple[str, Any]] = []
    for name, value in tree.items():
        key = f"{prefix}{name}"
        if name not in hints:
            problems.append(_unknown_key(key, str(name), list(hints), prefix))
            continue
        tp, section = hints[name], _section_type(hints[name])
        if section is not None:
            if isinstance(value, dict):
                leaves += _leaves(value, section, f"{key}.", problems)
            elif value is not None:
                subkeys = ", ".join(f.name for f in dataclasses.fields(section))
                problems.append(
                    f"{key}={show_value(value)}: {key} is a section, not a value; set its keys ({subkeys})"
                )
            elif section is not tp:  # an optional section (ref.parallel) set back to null
                leaves.append((key, None))
            continue
        if _is_list(tp) and isinstance(value, str) and not value.startswith("${"):
            value = [value]
        if typing.get_origin(tp) is dict and isinstance(value, dict):
            # One leaf per entry, so `reward.weights.rm=0.5` changes one weight and keeps the others.
            leaves += [(f"{key}.{k}", v) for k, v in value.items()]
            continue
        leaves.append((key, value))
    return leaves


def _section_type(tp: Any) -> Any:
    """The dataclass of a section field, also of an optional one (`ParallelConfig | None`); else None."""
    if dataclasses.is_dataclass(tp):
        return tp
    inner = [a for a in typing.get_args(tp) if a is not type(None)]
    return inner[0] if len(inner) == 1 and dataclasses.is_dataclass(inner[0]) else None


def _is_list(tp: Any) -> bool:
    """A list field, also an optional one (`list[str] | None`)."""
    return typing.get_origin(tp) is list or any(typing.get_origin(a) is list for a in typing.get_args(tp))


def _assign(merged: DictConfig, key: str, value: Any, problems: list[str]) -> None:
    try:
        _open_sections(merged, key)
        OmegaConf.update(merged, key, value, merge=False)
    except OmegaConfBaseException:
        tp, default = _field_of(key)
        example = default if default not in (None, []) else _example(tp)
        problems.append(
            f"{key}={show_value(value)} is invalid: expected {_type_name(tp)}; e.g. {key}={show_value(example)}"
        )


def _open_sections(merged: DictConfig, key: str) -> None:
    """An optional section on the way to `key` that is still null gets its defaults, so that
    `ref.parallel.tp=2` sets one size of a `ref.parallel` that was null."""
    cls: Any = MegarlConfig
    parts = key.split(".")
    for i, name in enumerate(parts[:-1]):
        tp = typing.get_type_hints(cls).get(name) if dataclasses.is_dataclass(cls) else None
        cls = _section_type(tp)
        if cls is None:
            return
        path = ".".join(parts[: i + 1])
        if cls is not tp and OmegaConf.select(merged, path) is None:
            OmegaConf.update(merged, path, cls(), merge=False)


# keys megarl has renamed: old name -> what to write instead
_RENAMED = {
    "algorithm.kl_estimator": (
        "algorithm.kl_penalty (the in-reward KL estimator) and algorithm.kl_loss_type (the KL loss's), "
        "with verl's names"
    ),
}


def _unknown_key(key: str, name: str, siblings: list[str], prefix: str) -> str:
    if key in _RENAMED:
        return f"unknown key '{key}' — it was split/renamed: use {_RENAMED[key]}"
    verl = verl_hint(key)
    if verl:
        return f"unknown key '{key}' — did you mean {verl}?"
    close = difflib.get_close_matches(name, siblings, n=1, cutoff=0.6)
    if close:
        return f"unknown key '{key}' — did you mean '{prefix}{close[0]}'?"
    same_name = [k for k in _all_keys(MegarlConfig) if k.rsplit(".", 1)[-1] == name][:4]
    if same_name:
        return f"unknown key '{key}' — did you mean {' or '.join(repr(k) for k in same_name)}?"
    where = f"under '{prefix[:-1]}'" if prefix else "at the top level"
    return f"unknown key '{key}' — valid keys {where}: {', '.join(siblings)}"


def _all_keys(cls: type, prefix: str = "") -> list[str]:
    keys: list[str] = []
    for name, tp in typing.get_type_hints(cls).items():  # an optional section (ref.parallel) is one key
        keys += _all_keys(tp, f"{prefix}{name}.") if dataclasses.is_dataclass(tp) else [f"{prefix}{name}"]
    return keys


def _field_of(key: str) -> tuple[Any, Any]:
    """(type hint, default value) of a dotted schema key."""
    cls: Any = MegarlConfig
    *sections, leaf = key.split(".")
    for name in sections:
        cls = typing.get_type_hints(cls)[name]
        cls = _section_type(cls) or cls
        if typing.get_origin(cls) is dict:  # an entry of a mapping field: its value type, no default
            return typing.get_args(cls)[1], None
    f = next(f for f in dataclasses.fields(cls) if f.name == leaf)
    factory = f.default_factory
    default = factory() if factory is not dataclasses.MISSING else f.default
    return typing.get_type_hints(cls)[leaf], default


def _type_name(tp: Any) -> str:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        return "one of " + ", ".join(str(a) for a in args)
    if origin is list:
        return f"a list (each item {_type_name(args[0])})"
    if origin is dict:
        return f"a mapping (each value {_type_name(args[1])})"
    if type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return f"{_type_name(rest[0])} or null"
    return _TYPE_NAMES.get(tp, getattr(tp, "__name__", str(tp)))


def _example(tp: Any) -> Any:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        return args[0]
    if origin is list:
        return [_example(args[0])]
    if origin is dict:
        return {"name": _example(args[1])}
    if type(None) in args:
        return _example(next(a for a in args if a is not type(None)))
    return _EXAMPLES.get(tp, "...")


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())


def _describe_omegaconf_error(e: OmegaConfBaseException) -> str:
    """Interpolation and resolution failures, with the key they happened at."""
    message = str(e).split("\n")[0]
    key = getattr(e, "full_key", None)
    return f"{key}: {message}; fix the ${{...}} reference or the value it points to" if key else message
