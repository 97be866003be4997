"""The resolved spec of one role: what a worker needs from the config, decided once, nothing more.

    spec = role_spec(cfg, "actor")          # model, layout, batching, offload, optimizer, loss, rollout
    ActorWorker(spec)

Workers receive a `RoleSpec`, never the whole `MegarlConfig`. Every rule that ties one role's settings
to another's lives here: the reference shares the actor's offload directory and (unless `ref.devices`
and `ref.parallel` give it its own; `MegarlConfig.parallel_of`/`world_size`) its layout and devices; the
critic starts from the policy checkpoint unless it names its own; activation recomputation applies only
to trained roles; a mini-batch is `ppo_mini_batch_size × rollout.n` sequences.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace

from megarl.config.schema import (
    AlgorithmConfig,
    FSDPConfig,
    LoraConfig,
    MegarlConfig,
    OptimizerConfig,
    ParallelConfig,
    RolloutConfig,
)
from megarl.config.schema_moe import MoeRouterConfig
from megarl.config.validate import resolve_auto

ROLE_NAMES = ("actor", "ref", "critic", "reward")


@dataclass(frozen=True)
class ModelSpec:
    """The Hugging Face checkpoint a role loads, and how it is built."""

    path: str
    dtype: str  # "fp32" | "bf16" | "fp16"
    make_vocab_size_divisible_by: int
    tokenizer_path: str  # the policy's tokenizer (the checkpoint's own unless model.tokenizer_path is set)
    trust_remote_code: bool = False


@dataclass(frozen=True)
class OffloadSpec:
    """What a role moves off the compute device while idle or generating, and where to."""

    params: bool = False
    grads: bool = False
    optimizer: bool = False
    dir: str | None = None  # None = host memory; else one file per offload under this directory


@dataclass(frozen=True)
class RolloutSpec:
    """What the actor's rollout engine needs: the policy checkpoint, the engine and sampling settings,
    the prompt/response lengths and the sampling seed (rollout.seed, else trainer.seed). Multi-turn
    rollouts read `rollout.multi_turn` and `rollout.agent` (megarl.agentic)."""

    model: ModelSpec
    rollout: RolloutConfig
    max_prompt_length: int
    max_response_length: int
    seed: int
    # async_training.partial_rollout (a separate pool's engines take new weights mid-generation)
    partial_rollout: bool = False
    # the actor's adapters when they are synced alone (actor.lora, sync adapter): the engine runs with
    # LoRA enabled and serves the adapter `VLLMRollout.load_adapter` hands it; None = no LoRA in the engine
    lora: LoraConfig | None = None
    # actor.router_replay.mode=R3: the engine records each token's routed experts (Col.ROUTED_EXPERTS) and
    # runs without prefix caching (megarl.rollout.vllm_moe)
    return_routes: bool = False


@dataclass(frozen=True)
class RoleSpec:
    """One role's resolved settings. `optimizer is None` means the role is frozen (reference, reward)."""

    role: str  # "actor" | "ref" | "critic" | "reward"
    model: ModelSpec
    parallel: ParallelConfig
    n_devices: int  # processes of the role's worker group
    micro_batch_size: int
    max_tokens_per_micro_batch: int | None
    offload: OffloadSpec
    # log-probs are of softmax(logits / temperature), the distribution rollouts sample from (verl's rule;
    # top-k/top-p are not applied): the actor's and the reference's are rollout.temperature, others 1
    temperature: float = 1.0
    recompute: bool = False  # activation recomputation (model.gradient_checkpointing, trained roles only)
    optimizer: OptimizerConfig | None = None
    total_steps: int = 1  # optimizer steps of the LR schedule
    mini_batch_size: int = 0  # sequences per optimizer step over all DP ranks (ppo_mini_batch_size × n)
    epochs: int = 1  # passes over each batch (algorithm.ppo_epochs)
    algorithm: AlgorithmConfig | None = None  # the loss settings of a trained role
    rollout: RolloutSpec | None = None  # the actor's generation engine
    seed: int = 42  # trainer.seed: weights the role builds fresh (a critic's value head) are drawn from it
    backend: str = "megatron"  # "megatron" | "fsdp" (megarl.fsdp): what runs the model
    fsdp: FSDPConfig = field(default_factory=FSDPConfig)  # how the fsdp backend shards it
    # the trained role's adapters (<role>.lora with rank > 0); None = full training, and always for the
    # frozen roles (with actor LoRA the reference is the actor with its adapters off)
    lora: LoraConfig | None = None
    # MoE routing replay (actor.router_replay.mode; the reference follows the actor): "disabled" routes
    # every forward live; otherwise the role's forwards replay the batch's routed_experts
    router_replay: str = "disabled"
    # the MoE router's aux/z losses of a trained role (<role>.moe; None fields: the checkpoint's)
    moe: MoeRouterConfig = field(default_factory=MoeRouterConfig)

    @property
    def trainable(self) -> bool:
        return self.optimizer is not None


def rollout_spec(cfg: MegarlConfig) -> RolloutSpec:
    """The actor's rollout engine settings."""
    r = cfg.rollout
    return RolloutSpec(
        model=_model_spec(cfg, cfg.model.path),
        rollout=copy.deepcopy(r),
        max_prompt_length=cfg.data.max_prompt_length,
        max_response_length=cfg.data.max_response_length,
        seed=cfg.trainer.seed if r.seed is None else r.seed,
        partial_rollout=cfg.async_training.partial_rollout,
        lora=_engine_lora(cfg),
        return_routes=cfg.actor.router_replay.mode == "R3",
    )


def _engine_lora(cfg: MegarlConfig) -> LoraConfig | None:
    """The actor's LoRA settings where the engine serves its adapter (lora.sync resolved to adapter)."""
    from megarl.config.lora_checks import resolve_lora_sync

    lora = cfg.actor.lora
    if lora.rank == 0 or resolve_lora_sync(lora)[0] != "adapter":
        return None
    return copy.deepcopy(lora)


def role_spec(cfg: MegarlConfig, role: str, total_steps: int | None = None) -> RoleSpec:
    """The resolved spec of `role` ("actor", "ref", "critic" or "reward"). `total_steps` (the trainer's
    count when trainer.total_steps is unset) sets the LR schedule length of trained roles."""
    if role not in ROLE_NAMES:
        raise ValueError(f"unknown role {role!r}; expected one of {', '.join(ROLE_NAMES)}")
    actor = cfg.actor
    if role == "ref":  # the actor's offload dir; its layout and devices: the schema's parallel_of/world_size
        section = cfg.ref
        offload = OffloadSpec(params=cfg.ref.offload_params, dir=actor.offload_dir)
    else:
        section = getattr(cfg, role)
        offload = OffloadSpec(
            params=section.offload_params,
            grads=getattr(section, "offload_grads", False),
            optimizer=getattr(section, "offload_optimizer", False),
            dir=section.offload_dir,
        )
    trained = role in ("actor", "critic")
    spec = RoleSpec(
        role=role,
        model=_model_spec(cfg, _model_path(cfg, role)),
        parallel=copy.deepcopy(cfg.parallel_of(role)),  # the schema owns "the reference shares the actor's"
        n_devices=cfg.world_size(role),
        micro_batch_size=section.micro_batch_size,
        max_tokens_per_micro_batch=section.max_tokens_per_micro_batch,
        offload=offload,
        temperature=_sampling_temperature(cfg) if role in ("actor", "ref") else 1.0,
        seed=cfg.trainer.seed,
        backend=cfg.backend_of(role) if role != "reward" else "megatron",
        fsdp=copy.deepcopy(section.fsdp) if role != "reward" else FSDPConfig(),
        router_replay=cfg.actor.router_replay.mode if role in ("actor", "ref") else "disabled",
    )
    if not trained:
        return spec
    algo = cfg.algorithm
    return replace(
        spec,
        recompute=cfg.model.gradient_checkpointing,
        optimizer=copy.deepcopy(section.optimizer),
        total_steps=total_steps or cfg.trainer.total_steps or 1,
        mini_batch_size=algo.ppo_mini_batch_size * cfg.rollout.n,
        epochs=algo.ppo_epochs,
        moe=copy.deepcopy(section.moe),
        # auto fields decided, also for configs built in Python (a no-op for a resolved one)
        algorithm=copy.deepcopy(resolve_auto(cfg).algorithm),
        rollout=rollout_spec(cfg) if role == "actor" else None,
        lora=copy.deepcopy(section.lora) if section.lora.rank > 0 else None,
    )


def _sampling_temperature(cfg: MegarlConfig) -> float:
    """rollout.temperature, or 1 when rollouts are greedy (there is no distribution to match)."""
    return cfg.rollout.temperature if cfg.rollout.temperature > 0 else 1.0


def _model_path(cfg: MegarlConfig, role: str) -> str:
    if role == "reward":
        if not cfg.reward.model_path:
            raise ValueError("reward.model_path is not set: the reward model needs an HF checkpoint")
        return cfg.reward.model_path
    path = (cfg.critic.model_path if role == "critic" else None) or cfg.model.path
    if not path:
        raise ValueError(f"model.path is not set: the {role} role needs an HF checkpoint")
    return path


def _model_spec(cfg: MegarlConfig, path: str | None) -> ModelSpec:
    m = cfg.model
    return ModelSpec(
        path=path,
        dtype=m.dtype,
        make_vocab_size_divisible_by=m.make_vocab_size_divisible_by,
        tokenizer_path=m.tokenizer_path or m.path,
        trust_remote_code=m.trust_remote_code,
    )
