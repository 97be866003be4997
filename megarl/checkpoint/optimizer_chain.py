"""The optimizer checkpoint's non-tensor part across expert-parallel sizes.

Megatron gives expert parameters an optimizer of their own only at EP > 1 (at EP1 they are ordinary
data-parallel parameters): an MoE model's optimizer is one megatron optimizer at EP1 and a chain of two
(dense, experts) at EP2. The tensor state (Adam moments, fp32 parameters) is keyed by the model's
parameter names (fully reshardable, no chain prefix) and loads across that change; the common part (the
param groups with their hyperparameters and Adam step, the common step) is stored per optimizer of the
chain and does not. `load_across_chains` loads the tensors into the current chain and rebuilds its
common part from the saved one: each current param group takes the saved group with the same weight-decay
and learning-rate multipliers (experts and dense parameters share those and their step).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from megarl.checkpoint.format import CheckpointError

# what identifies a param group across chains (megatron's param_group_identifier_keys less
# is_expert_parallel, which is what differs)
GROUP_KEYS = ("wd_mult", "lr_mult", "is_decoupled_lr")


def _subs(state: dict) -> list[dict]:
    """A ChainedOptimizer's state as a list of its optimizers' states (one optimizer: a list of one)."""
    if state and all(isinstance(k, int) for k in state):
        return [state[k] for k in sorted(state)]
    return [state]


def same_chain(saved_common: dict, current: dict) -> bool:
    return len(_subs(saved_common)) == len(_subs(current))


def _at(tree: Any, path: tuple) -> Any:
    for key in path:
        if not isinstance(tree, dict) or key not in tree:
            return None
        tree = tree[key]
    return tree


def _regroup(current: list[dict], loaded: list[dict] | None, saved: list[dict], role_dir: Path) -> list[dict]:
    groups = []
    for i, group in enumerate(current):
        ident = tuple(group[k] for k in GROUP_KEYS)
        matches = sorted(
            (g for g in saved if tuple(g[k] for k in GROUP_KEYS) == ident),
            key=lambda g: g["is_expert_parallel"] != group["is_expert_parallel"],
        )
        if not matches:
            raise CheckpointError(
                f"{role_dir}: the optimizer has a param group with {dict(zip(GROUP_KEYS, ident))} that the "
                "checkpoint lacks; resume with the optimizer settings it was saved with"
            )
        rebuilt = {**matches[0], "is_expert_parallel": group["is_expert_parallel"]}
        if loaded and "params" in loaded[i]:  # torch's groups: the current parameters (the distributed
            rebuilt["params"] = loaded[i]["params"]  # optimizer's groups hold none)
        groups.append(rebuilt)
    return groups


def _fill(loaded: dict, template: dict, saved: list[dict], path: tuple, role_dir: Path) -> None:
    """Set every common entry of `template` (the current optimizer's) in `loaded` from the saved chain."""
    for key, value in template.items():
        if key == "param_groups":
            found = [g for sub in saved for g in (_at(sub, (*path, key)) or [])]
            loaded[key] = _regroup(value, loaded.get(key), found, role_dir)
        elif isinstance(value, dict):
            _fill(loaded.setdefault(key, {}), value, saved, (*path, key), role_dir)
        else:
            found = next((x for sub in saved if (x := _at(sub, (*path, key))) is not None), None)
            loaded[key] = copy.deepcopy(found) if found is not None else value


def load_across_chains(sharded: dict, saved_common: dict, opt_dir: Path, role_dir: Path) -> dict:
    """dist_checkpointing.load of `sharded` (the current optimizer's sharded state dict) from `opt_dir`,
    whose common part `saved_common` was written by a chain of another length: the state for the current
    optimizer's load_state_dict."""
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.utils import extract_nonpersistent, extract_sharded_base

    _, common = extract_sharded_base(sharded)
    _, common = extract_nonpersistent(common)
    template = copy.deepcopy(common)
    state = dist_checkpointing.load(sharded, str(opt_dir))
    return rebuild_common(state, template, saved_common, role_dir)


def rebuild_common(state: dict, template: dict, saved_common: dict, role_dir: Path) -> dict:
    """`state` (a load of the current optimizer's tensors, merged with a common part of another chain)
    with every common entry of `template` (the current optimizer's) taken from `saved_common`."""
    for key in [k for k in saved_common if k not in template]:  # the saved chain's own top-level entries
        state.pop(key, None)
    saved = _subs(saved_common)
    for loaded, current in zip(_subs(state), _subs(template)):
        _fill(loaded, current, saved, (), role_dir)
    return state
