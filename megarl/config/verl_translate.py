"""Translating the user's settings from verl's keys into megarl's, with the table of
megarl.config.verl_keys: what the config loader (megarl.config.load) applies to each YAML tree and to the
override list before the schema checks them."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import typing
from dataclasses import dataclass, field
from typing import Any

from megarl.config.errors import show_value
from megarl.config.schema import MegarlConfig
from megarl.config.verl_keys import (
    DROP,
    DYNAMIC,
    EXACT,
    FALLBACK,
    MAPPED,
    RO,
    VERL_SECTIONS,
    Rejected,
    VerlKey,
    lookup,
)

__all__ = [
    "Translation",
    "command_line_rules",
    "flatten",
    "is_megarl_key",
    "translate",
    "translate_leaves",
    "verl_hint",
]


@dataclass
class Translation:
    tree: dict[str, Any]  # the megarl tree (nested)
    warnings: list[str] = field(default_factory=list)  # one line per ignored verl key
    problems: list[str] = field(default_factory=list)  # conflicts and rejected values
    sources: dict[str, str] = field(default_factory=dict)  # megarl key -> the key that set it


def verl_hint(key: str) -> str | None:
    """For a key that is neither megarl's nor verl's: the verl key it is closest to (a typo of verl's
    name), with its megarl name; None when none is close."""
    close = difflib.get_close_matches(key, list(MAPPED), n=1, cutoff=0.85)
    if not close:
        return None
    return f"verl's '{close[0]}' (megarl: {MAPPED[close[0]]})"


@functools.cache
def is_megarl_key(key: str) -> bool:
    """Whether a dotted key names a field (or a section, or an entry of a mapping field) of megarl's schema."""
    cls: Any = MegarlConfig
    for name in key.split("."):
        if cls is None:
            return False
        if typing.get_origin(cls) is dict:
            return True
        hints = typing.get_type_hints(cls) if dataclasses.is_dataclass(cls) else {}
        if name not in hints:
            return False
        tp = hints[name]
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        if dataclasses.is_dataclass(tp):
            cls = tp
        elif len(inner) == 1 and dataclasses.is_dataclass(inner[0]):
            cls = inner[0]
        elif typing.get_origin(tp) is dict:
            cls = tp
        else:
            cls = None
    return True


def flatten(tree: dict[Any, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """A nested tree as (dotted key, value) leaves; an empty mapping is a leaf."""
    leaves: list[tuple[str, Any]] = []
    for name, value in tree.items():
        key = f"{prefix}{name}"
        if isinstance(value, dict) and value:
            leaves += flatten(value, f"{key}.")
        else:
            leaves.append((key, value))
    return leaves


def translate(tree: dict[str, Any]) -> Translation:
    """Rewrite one user tree (nested; a YAML file's) from verl's keys into megarl's: see `translate_leaves`."""
    return translate_leaves(flatten(tree))


def translate_leaves(leaves: list[tuple[str, Any]]) -> Translation:
    """Rewrite one layer of settings, (dotted key, value) in order (a YAML file's, or the override list),
    from verl's keys into megarl's. megarl keys pass unchanged; a verl key the table maps sets its megarl
    key; one with no megarl meaning gives a warning line; a megarl key set twice differently (a verl key
    and its megarl twin, or two verl keys) is a problem naming both. Unknown keys pass through for the
    schema to report, except in sections only verl has."""
    out = Translation(tree={})
    flat: dict[str, Any] = {}
    for key, value in leaves:
        flat.pop(key, None)
        flat[key] = value  # a later setting of the same key wins, as in verl (hydra) and megarl
    given = set(flat)
    pending_same: list[tuple[str, VerlKey, Any]] = []
    for key, value in flat.items():
        if is_megarl_key(key):
            same_name = EXACT.get(key)
            if same_name is not None and same_name.transform is not None:
                value = same_name.transform(value)  # verl's spelling of "unset" (data.seed=null)
            if value is not DROP:
                _set(out, key, value, key)
            continue
        entry = lookup(key)
        if entry is None:
            if key.split(".")[0] in VERL_SECTIONS:
                close = difflib.get_close_matches(key, list(EXACT), n=1, cutoff=0.8)
                hint = f"did you mean '{close[0]}'? " if close else ""
                out.problems.append(
                    f"unknown key '{key}': neither a megarl key nor a verl key megarl knows; {hint}"
                    "(docs/verl-migration.md lists verl's keys and their megarl names)"
                )
            else:
                _set(out, key, value, key)  # the schema reports it, with its hints
            continue
        if key in DYNAMIC:
            switch, _ = DYNAMIC[key]
            if flat.get(switch) is not True:
                out.warnings.append(
                    f"ignoring verl's {key}={show_value(value)}: it applies only with {switch}=true"
                )
                continue
        if key in FALLBACK:
            for specific, target in FALLBACK[key]:
                if specific not in given and target not in given:
                    _try_set(out, key, value, entry, target=target)
            continue
        if entry.megarl is None:
            if entry.transform is not None:
                try:
                    entry.transform(value)
                except Rejected as e:
                    out.problems.append(f"{key}={show_value(value)}: {e}")
                    continue
            out.warnings.append(f"ignoring verl's {key}={show_value(value)}: {entry.note}")
        elif entry.kind == "same":
            pending_same.append((key, entry, value))
        else:
            _try_set(out, key, value, entry)
    for switch_key, (switch, default) in DYNAMIC.items():
        if flat.get(switch) is True and switch_key not in flat:
            entry = lookup(switch_key)
            assert entry is not None and entry.megarl is not None
            _set(out, entry.megarl, default, f"{switch}=true (verl's default {switch_key}={default})")
    for key, entry, value in pending_same:
        assert entry.megarl is not None
        if entry.megarl in out.sources:
            _set(out, entry.megarl, value, key)  # a conflict when they differ
        else:
            out.warnings.append(
                f"ignoring verl's {key}={show_value(value)}: {entry.note}; set {entry.megarl}"
            )
    return out


def command_line_rules(layer: Translation, earlier: list[dict[str, Any]]) -> list[str]:
    """verl's habits that span keys, applied to the override list's `layer` (after the `earlier` trees,
    the YAML file's): returns their note lines.

    - algorithm.adv_estimator picks the algorithm, as in verl: given without algorithm.name, it also sets
      the name of an RL config (grpo for grpo/drgrpo, else ppo), so `algorithm.adv_estimator=gae` on a
      GRPO config runs PPO instead of contradicting algorithm.name=grpo.
    - verl's FSDP actor has no tensor parallelism, but megarl's generation TP must divide the training
      TP: rollout.tensor_model_parallel_size given without any training TP sets actor.parallel.tp to it
      (unless the actor is on the fsdp backend, whose engines take any rollout.tp dividing its devices).
    """
    notes: list[str] = []
    algorithm = layer.tree.get("algorithm", {})
    if "algorithm.adv_estimator" in layer.sources and "algorithm.name" not in layer.sources:
        named = [t["algorithm"]["name"] for t in earlier if "name" in t.get("algorithm", {})]
        estimator = algorithm["adv_estimator"]
        if (named or ["ppo"])[-1] in ("ppo", "grpo") and isinstance(estimator, str):
            algorithm["name"] = "grpo" if estimator in ("grpo", "drgrpo") else "ppo"
    key = f"{RO}.tensor_model_parallel_size"
    actors = [a for t in [*earlier, layer.tree] if isinstance(a := t.get("actor"), dict)]
    fsdp_actor = [a["backend"] for a in actors if "backend" in a][-1:] == ["fsdp"]
    if (
        layer.sources.get("rollout.tp") == key
        and not fsdp_actor
        and not any("tp" in (a.get("parallel") or {}) for a in actors)
    ):
        tp = layer.tree["rollout"]["tp"]
        _set(layer, "actor.parallel.tp", tp, key)
        notes.append(
            f"{key}={tp} also sets actor.parallel.tp={tp}: megarl's generation TP must divide the training TP "
            "(verl's FSDP actor has none); set actor_rollout_ref.actor.megatron.tensor_model_parallel_size "
            "to choose another"
        )
    return notes


def _try_set(out: Translation, key: str, value: Any, entry: VerlKey, target: str | None = None) -> None:
    megarl = target or entry.megarl
    assert megarl is not None
    if entry.transform is not None:
        try:
            value = entry.transform(value)
        except Rejected as e:
            out.problems.append(f"{key}={show_value(value)}: {e}")
            return
        if value is DROP:
            return
    _set(out, megarl, value, key)


def _set(out: Translation, megarl: str, value: Any, source: str) -> None:
    node = out.tree
    *parents, leaf = megarl.split(".")
    for name in parents:
        child = node.get(name)
        if not isinstance(child, dict):
            child = node[name] = {}
        node = child
    if megarl in out.sources and out.sources[megarl] != source and node.get(leaf) != value:
        first = out.sources[megarl]
        out.problems.append(
            f"{first}={show_value(node.get(leaf))} and {source}={show_value(value)} both set {megarl}, differently; "
            "keep one of them"
        )
        return
    node[leaf] = value
    out.sources.setdefault(megarl, source)
