"""The named option vocabularies of megarl's config (`megarl.config.schema`): each a Literal whose values
the config loader checks and whose implementation accepts exactly those names."""

from __future__ import annotations

from typing import Literal

# The option names below equal what their implementation accepts (megarl.algorithms, models.dtypes,
# workers.reward_hf); tests/unit/config/test_vocabulary.py keeps each pair equal.
Dtype = Literal["fp32", "bf16", "fp16"]
LrDecayStyle = Literal["constant", "cosine", "linear"]
OptimizerName = Literal["adamw", "adam", "sgd"]
AlgorithmName = Literal["ppo", "grpo", "sft", "dpo", "ipo", "kto", "orpo", "simpo", "rm"]
AdvEstimator = Literal[
    "gae",
    "grpo",
    "drgrpo",
    "rloo",
    "reinforce_plus_plus",
    "reinforce_plus_plus_baseline",
    "remax",
    "grpo_passk",
    "opo",
    "gpg",
    "optimal_token_baseline",
]
KlEstimator = Literal[
    "k1",
    "k2",
    "k3",
    "low_var_kl",
    "kl",
    "mse",
    "abs",
    "k1+",
    "k2+",
    "k3+",
    "low_var_kl+",
    "kl+",
    "mse+",
    "abs+",
]
KlController = Literal["fixed", "adaptive"]
OldLogProb = Literal["recompute", "fused"]
LossAggMode = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
PolicyLoss = Literal["vanilla", "gspo", "cispo", "sapo", "gpg", "reinforce", "geo_mean", "clip_cov", "kl_cov"]
IsLevel = Literal["token", "sequence"]
# the first three megarl's (and verl 0.6's) names; the rest verl 0.9's divergence names (rollout_correction.py)
RsLevel = Literal[
    "token",
    "sequence",
    "geometric",
    "token_k1",
    "seq_sum_k1",
    "seq_mean_k1",
    "token_k2",
    "token_k3",
    "seq_sum_k2",
    "seq_sum_k3",
    "seq_mean_k2",
    "seq_mean_k3",
    "seq_max_k2",
    "seq_max_k3",
]
PfPpoReweight = Literal["pow", "max_min", "max_random"]
RolloutEngine = Literal["vllm"]
RolloutPlacement = Literal["colocated", "separate"]  # where the engines run (megarl.trainer.rollout_pool)
# rollout.agent.default_agent_loop (megarl.agentic): verl's names for the first two
AgentLoop = Literal["single_turn_agent", "tool_agent", "env_agent", "openai_agent"]
ToolCallFormat = Literal["hermes"]  # rollout.multi_turn.format: how tool calls are written (verl's default)
TruncateSide = Literal["left", "right", "middle"]  # rollout.multi_turn.tool_response_truncate_side
OnStale = Literal["drop", "wait"]  # what async training does with a group past async_training.max_staleness
RewardBackend = Literal["megatron", "hf", "fsdp"]
RoleBackend = Literal["megatron", "fsdp"]  # what trains/runs a policy or value model (megarl.fsdp)
RewardKind = Literal["classifier", "embedding_similarity"]
Launcher = Literal["ray", "torchrun"]
# the model_type values (a checkpoint's config.json) whose Megatron model megarl builds: megarl.models.from_hf.FAMILIES
ModelType = Literal["llama", "mistral", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe"]
LoggingBackend = Literal["console", "jsonl", "tensorboard", "wandb"]
LoraSync = Literal["auto", "adapter", "merged"]  # <role>.lora.sync: how the engine gets the adapted policy
LoraInit = Literal["kaiming", "xavier"]  # <role>.lora.init_A: lora_A's initialisation
RouterReplayMode = Literal["disabled", "R2", "R3"]  # actor.router_replay.mode (verl's names)
# <role>.moe.load_balancing_type: megatron's moe_router_load_balancing_type (verl passes it through)
MoeLoadBalancing = Literal["aux_loss", "seq_aux_loss", "global_aux_loss", "none"]
