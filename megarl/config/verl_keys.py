"""verl's trainer-config vocabulary (`ppo_trainer.yaml`, `ppo_megatron_trainer.yaml`) in megarl's keys.

`VERL_KEYS` is the table: verl key → megarl key (+ a value transform where the units or spellings differ)
→ note; keys with no megarl meaning map to None and their note says why (one warning line each when
given). The policy roles' keys are in verl_keys_roles, the rest here; the entry type, the value transforms
and the per-role key families in verl_key_types. megarl.config.verl_translate rewrites the user's settings
with it before the schema checks them; docs/verl-migration.md prints the same table
(tests/unit/config/test_verl_keys.py keeps the two equal). Batch sizes need no conversion: verl's and
megarl's are in the same units (prompts for train_batch_size and ppo_mini_batch_size, which both multiply
by rollout.n; sequences per data-parallel rank for the micro-batch sizes).
"""

from __future__ import annotations

import fnmatch

from megarl.config.verl_key_types import (
    CKPT,
    DROP,
    DYN,
    PADDING,
    PROFILE,
    REF,
    RO,
    A,
    Rejected,
    VerlKey,
    dynamic_bsz,
    fsdp,
    ignored,
    loggers,
    lora,
    maps,
    megatron,
    not_none,
    optim,
    reject_nonzero,
    resume_mode,
    same_as,
    save_freq,
    strategy,
    test_freq,
)
from megarl.config.verl_keys_roles import ROLE_KEYS

__all__ = [
    "DROP",
    "DYNAMIC",
    "EXACT",
    "FALLBACK",
    "MAPPED",
    "RO",
    "VERL_KEYS",
    "VERL_SECTIONS",
    "Rejected",
    "VerlKey",
    "lookup",
]


RUN_KEYS: tuple[VerlKey, ...] = (
    # --- the critic
    maps("critic.enable", "critic.enable", "null = on for adv_estimator=gae, in both"),
    maps("critic.model.path", "critic.model_path"),
    maps(
        "critic.ppo_micro_batch_size_per_gpu", "critic.micro_batch_size", "sequences per data-parallel rank"
    ),
    ignored("critic.ppo_micro_batch_size", "verl's deprecated global size; set ppo_micro_batch_size_per_gpu"),
    maps("critic.ppo_max_token_len_per_gpu", "critic.max_tokens_per_micro_batch", DYN),
    *dynamic_bsz("critic"),
    maps("critic.cliprange_value", "algorithm.value_clip"),
    maps("critic.grad_clip", "critic.optimizer.clip_grad", "verl's older name of optim.clip_grad"),
    same_as(
        "critic.ppo_mini_batch_size",
        "algorithm.ppo_mini_batch_size",
        "megarl's actor and critic share one mini-batch size",
    ),
    same_as("critic.ppo_epochs", "algorithm.ppo_epochs", "megarl's actor and critic share ppo_epochs"),
    same_as(
        "critic.loss_agg_mode", "algorithm.loss_agg_mode", "megarl's actor and critic share loss_agg_mode"
    ),
    same_as(
        "critic.model.enable_gradient_checkpointing",
        "model.gradient_checkpointing",
        "megarl's applies to every trained role",
    ),
    *optim("critic.optim", "critic"),
    *fsdp("critic.model.fsdp_config", "critic"),
    *megatron("critic.megatron", "critic"),
    ignored("critic.forward_micro_batch_size*", "megarl's value forward uses critic.micro_batch_size"),
    ignored(
        "critic.forward_max_token_len_per_gpu",
        "megarl's value forward uses critic.max_tokens_per_micro_batch",
    ),
    ignored("critic.model.tokenizer_path", "the critic uses the policy's tokenizer"),
    ignored("critic.model.use_remove_padding", PADDING),
    ignored("critic.model.trust_remote_code", "megarl's is model.trust_remote_code"),
    ignored("critic.model.external_lib", "megarl supports its decoder families without extra libraries"),
    ignored("critic.model.override_config*", "megarl builds the model from config.json as it is"),
    ignored("critic.model.use_shm", "megarl reads the checkpoint from its path"),
    ignored(
        "critic.model.enable_activation_offload",
        "megarl saves activation memory with model.gradient_checkpointing",
    ),
    ignored("critic.model.tiled_mlp*", "megarl runs megatron-core's MLP"),
    *lora("critic.model", "critic"),
    ignored("critic.model.freeze_moe_router", "megarl trains every parameter"),
    ignored("critic.ulysses_sequence_parallel_size", "megarl splits long sequences with critic.parallel.cp"),
    maps("critic.strategy", "critic.backend", "fsdp and fsdp2 are megarl's fsdp backend (FSDP2)", strategy),
    ignored("critic.rollout_n", "set by verl from rollout.n"),
    ignored("critic.shuffle", "megarl's mini-batches take the step's rollouts in order"),
    ignored("critic.data_loader_seed", "megarl seeds from trainer.seed"),
    ignored("critic.checkpoint.*", CKPT),
    ignored("critic.profiler.*", PROFILE),
    ignored("critic.load_weight", "megarl always loads the critic's model"),
    ignored("critic.nccl_timeout", "megarl's is trainer.worker_timeout_s"),
    # --- data
    maps("data.train_files", "data.train_files", "a path or a list, as in verl"),
    maps("data.val_files", "data.val_files", "a path or a list, as in verl"),
    maps("data.prompt_key", "data.prompt_key"),
    maps("data.max_prompt_length", "data.max_prompt_length"),
    maps("data.max_response_length", "data.max_response_length"),
    maps("data.train_batch_size", "data.train_batch_size", "prompts per step, as in verl"),
    maps("data.val_batch_size", "data.val_batch_size"),
    maps("data.shuffle", "data.shuffle"),
    maps("data.seed", "data.seed", "null (verl: trainer's seed) sets nothing", not_none),
    maps(
        "data.filter_overlong_prompts",
        "data.filter_overlong_prompts",
        "verl's default is false (then an overlong prompt is an error, as verl's truncation=error), megarl's true",
    ),
    ignored(
        "data.truncation",
        "megarl never truncates a prompt: an overlong one is dropped (data.filter_overlong_prompts=true) or stops the run (false, verl's truncation=error)",
    ),
    ignored("data.reward_fn_key", "megarl picks the rule reward by the row's data_source column"),
    ignored("data.return_raw_chat", "megarl renders chat prompts itself (data.apply_chat_template)"),
    ignored("data.return_raw_input_ids", "megarl tokenises prompts itself"),
    ignored("data.return_full_prompt", "megarl tokenises prompts itself"),
    ignored("data.tokenizer", "megarl's tokenizer is model.tokenizer_path"),
    ignored("data.use_shm", "megarl reads data files from their paths"),
    ignored("data.train_max_samples", "megarl reads the whole file; trainer.total_steps limits a run"),
    ignored("data.val_max_samples", "megarl evaluates on the whole of data.val_files"),
    ignored("data.dataloader_num_workers", "megarl's data loading runs on the driver"),
    ignored("data.validation_shuffle", "megarl evaluates in file order"),
    ignored("data.filter_overlong_prompts_workers", "megarl's length filter runs on the driver"),
    ignored("data.tool_config_path", "megarl's rollout config has no tool settings"),
    ignored("data.image_key", "megarl trains text models"),
    ignored("data.video_key", "megarl trains text models"),
    ignored("data.image_patch_size", "megarl trains text models"),
    ignored("data.return_multi_modal_inputs", "megarl trains text models"),
    ignored("data.trust_remote_code", "megarl's is model.trust_remote_code"),
    ignored("data.custom_cls.*", "megarl reads parquet/jsonl in verl's schema with its own dataset"),
    ignored("data.sampler.*", "megarl shuffles with data.shuffle / data.seed"),
    ignored("data.datagen.*", "megarl has no dynamic data generation"),
    ignored("data.apply_chat_template_kwargs*", "megarl applies the tokenizer's chat template as it is"),
    # --- reward
    maps("custom_reward_function.path", "reward.function.path"),
    maps("custom_reward_function.name", "reward.function.name"),
    maps("reward_model.enable", "reward.enable"),
    maps("reward_model.model.path", "reward.model_path"),
    maps("reward_model.micro_batch_size_per_gpu", "reward.micro_batch_size"),
    maps("reward_model.max_length", "reward.max_length", "hf backend; null sets nothing", not_none),
    maps("reward_model.overlong_buffer.enable", "reward.overlong_buffer.enable", "verl's DAPO recipe"),
    maps("reward_model.overlong_buffer.len", "reward.overlong_buffer.len", "verl's DAPO recipe"),
    maps(
        "reward_model.overlong_buffer.penalty_factor",
        "reward.overlong_buffer.penalty_factor",
        "verl's DAPO recipe",
    ),
    *megatron("reward_model.megatron", "reward"),
    ignored("reward_model.micro_batch_size", "verl's deprecated global size; set micro_batch_size_per_gpu"),
    ignored(
        "reward_model.reward_manager",
        "megarl scores every row with reward.function or the rule reward of its data_source; DAPO's overlong penalty is reward.overlong_buffer",
    ),
    ignored(
        "reward_model.enable_resource_pool",
        "megarl gives the reward model its own devices with reward.devices / reward.n_devices",
    ),
    ignored("reward_model.n_gpus_per_node", "megarl's is reward.n_devices"),
    ignored("reward_model.nnodes", "megarl's is reward.n_devices"),
    maps("reward_model.strategy", "reward.backend", "fsdp and fsdp2: the classifier under FSDP2", strategy),
    ignored("reward_model.model.input_tokenizer", "megarl re-tokenises only for reward.backend=hf"),
    ignored("reward_model.model.*", "megarl reads the reward model from reward.model_path as it is"),
    ignored("reward_model.use_dynamic_bsz", "megarl's is reward.max_tokens_per_micro_batch"),
    ignored("reward_model.forward_max_token_len_per_gpu", "megarl's is reward.max_tokens_per_micro_batch"),
    ignored(
        "reward_model.launch_reward_fn_async",
        "megarl's reward functions run in reward worker processes (reward.workers)",
    ),
    ignored("reward_model.num_workers", "megarl's reward worker processes are reward.workers"),
    ignored(
        "reward_model.use_reward_loop",
        "megarl's reward functions run in reward worker processes (reward.workers)",
    ),
    ignored(
        "reward_model.reward_loop_*",
        "megarl's reward functions run in reward worker processes (reward.workers)",
    ),
    ignored("reward_model.sandbox_fusion.*", "megarl has no code sandbox"),
    ignored("reward_model.rollout.*", "megarl has no generative reward model"),
    ignored(
        "reward_model.ulysses_sequence_parallel_size", "megarl splits long sequences with reward.parallel.cp"
    ),
    ignored("reward_model.profiler.*", PROFILE),
    ignored("reward_model.load_weight", "megarl always loads reward.model_path"),
    ignored("reward_model.nccl_timeout", "megarl's is trainer.worker_timeout_s"),
    ignored(
        "reward_manager.*",
        "megarl scores every row with reward.function or the rule reward of its data_source",
    ),
    # --- algorithm
    maps(
        "algorithm.adv_estimator",
        "algorithm.adv_estimator",
        "given on the command line without algorithm.name, it also picks algorithm.name (grpo for grpo/drgrpo, else ppo)",
    ),
    maps("algorithm.gamma", "algorithm.gamma"),
    maps("algorithm.lam", "algorithm.lam"),
    maps("algorithm.norm_adv_by_std_in_grpo", "algorithm.norm_adv_by_std_in_grpo"),
    maps("algorithm.use_kl_in_reward", "algorithm.use_kl_in_reward"),
    maps("algorithm.kl_penalty", "algorithm.kl_penalty"),
    maps("algorithm.kl_ctrl.type", "algorithm.kl_ctrl"),
    maps("algorithm.kl_ctrl.kl_coef", "algorithm.kl_coef"),
    maps("algorithm.kl_ctrl.horizon", "algorithm.kl_horizon"),
    maps("algorithm.kl_ctrl.target_kl", "algorithm.kl_target"),
    maps("algorithm.use_pf_ppo", "algorithm.pf_ppo.enable"),
    maps("algorithm.pf_ppo.reweight_method", "algorithm.pf_ppo.reweight_method"),
    maps("algorithm.pf_ppo.weight_pow", "algorithm.pf_ppo.weight_pow"),
    maps("algorithm.filter_groups.enable", "algorithm.filter_groups.enable", "verl's DAPO recipe"),
    maps(
        "algorithm.filter_groups.max_num_gen_batches",
        "algorithm.filter_groups.max_num_gen_batches",
        "verl's DAPO recipe",
    ),
    ignored(
        "algorithm.filter_groups.metric", "megarl filters groups on their scores (DAPO's acc on 0/1 rewards)"
    ),
    *[
        maps(f"algorithm.rollout_correction.{k}", f"algorithm.rollout_correction.{k}")
        for k in (
            "rollout_is",
            "rollout_is_threshold",
            "rollout_is_batch_normalize",
            "rollout_rs",
            "rollout_rs_threshold",
            "rollout_rs_threshold_lower",
            "rollout_token_veto_threshold",
            "bypass_mode",
        )
    ],
    ignored(
        "algorithm.rollout_correction.loss_type",
        "megarl's bypass-mode loss is algorithm.policy_loss (vanilla = ppo_clip, reinforce)",
    ),
    # --- verl's one-step-off and fully-async trainers (recipe configs): megarl's async_training
    maps(
        "rollout.n_gpus_per_node",
        "rollout.n_devices",
        "the engines' own pool (rollout.placement=separate); megarl's counts the whole pool (verl's × rollout.nnodes)",
    ),
    ignored("rollout.nnodes", "megarl's rollout.n_devices counts the whole pool"),
    ignored(
        "async_training.staleness_threshold",
        "megarl bounds each sample's lag in model versions (async_training.max_staleness), not a share of samples",
    ),
    ignored(
        "async_training.trigger_parameter_sync_step", "megarl syncs the engines after every training step"
    ),
    ignored("async_training.require_batches", "megarl trains one data.train_batch_size batch per step"),
    ignored(
        "async_training.use_rollout_log_probs",
        "with async_training.max_staleness > 0 the engine's log-probs are the behaviour policy (rollout_correction)",
    ),
    ignored(
        "async_training.compute_prox_log_prob",
        "with async_training.max_staleness > 0 megarl always recomputes the proximal log-probs",
    ),
    ignored("async_training.use_trainer_do_validate", "megarl validates with the engines' pool"),
    ignored(
        "async_training.checkpoint_engine.*",
        "megarl sends each engine rank its TP shard from the training ranks (megarl.hybrid.pool_sync)",
    ),
    # --- trainer
    maps("trainer.n_gpus_per_node", "trainer.n_devices_per_node"),
    maps("trainer.nnodes", "trainer.nnodes"),
    maps("trainer.total_epochs", "trainer.total_epochs", "verl's default 30, megarl's 1"),
    maps("trainer.total_training_steps", "trainer.total_steps"),
    maps(
        "trainer.save_freq",
        "trainer.save_every",
        "≤ 0 (never, in verl) → -1; megarl's 0 saves after the last step only",
        save_freq,
    ),
    maps("trainer.test_freq", "trainer.eval_every", "≤ 0 → 0 (never)", test_freq),
    maps("trainer.val_before_train", "trainer.val_before_train"),
    maps("trainer.balance_batch", "trainer.balance_batch"),
    maps("trainer.validation_data_dir", "trainer.validation_data_dir"),
    maps("trainer.logger", "logging.backends", "console, wandb, tensorboard; file → jsonl", loggers),
    maps("trainer.project_name", "logging.project"),
    maps("trainer.experiment_name", "logging.run_name"),
    maps(
        "trainer.default_local_dir",
        "trainer.output_dir",
        "megarl's output_dir holds checkpoints/step_N (verl's global_step_N sit in default_local_dir itself), logs and metrics",
    ),
    maps(
        "trainer.resume_mode",
        "trainer.resume",
        "auto | disable; resume_path takes resume_from_path",
        resume_mode,
    ),
    maps("trainer.resume_from_path", "trainer.resume", "", not_none),
    maps("trainer.max_actor_ckpt_to_keep", "trainer.max_checkpoints"),
    same_as(
        "trainer.max_critic_ckpt_to_keep", "trainer.max_checkpoints", "a megarl checkpoint holds every role"
    ),
    maps("global_profiler.steps", "trainer.profile_steps", "null sets nothing", not_none),
    reject_nonzero(
        "trainer.critic_warmup",
        "megarl updates the actor from the first step",
        "megarl has no critic warm-up (the actor updates from step 1); remove trainer.critic_warmup",
    ),
    ignored("trainer.use_legacy_worker_impl", "megarl has one worker implementation"),
    ignored("trainer.device", "megarl uses the machine's GPUs, else CPU processes"),
    ignored(
        "trainer.log_val_generations", "megarl writes validation responses to trainer.validation_data_dir"
    ),
    ignored("trainer.rollout_data_dir", "megarl writes validation responses to trainer.validation_data_dir"),
    maps("trainer.val_only", "trainer.val_only"),
    ignored("trainer.esi_redundant_time", "megarl saves on preemption (trainer.preempt_grace_s)"),
    ignored("trainer.default_hdfs_dir", "megarl writes checkpoints to trainer.output_dir"),
    ignored("trainer.del_local_ckpt_after_load", "megarl keeps checkpoints (trainer.max_checkpoints)"),
    ignored(
        "trainer.ray_wait_register_center_timeout",
        "megarl's worker start-up is bounded by trainer.worker_timeout_s",
    ),
    ignored("global_profiler.*", PROFILE),
    ignored("ray_kwargs.*", "megarl starts (or joins, with RAY_ADDRESS) Ray itself"),
    ignored("transfer_queue.*", "megarl's driver moves the batches"),
    ignored("*._target_", "verl's class names"),
)
VERL_KEYS: tuple[VerlKey, ...] = ROLE_KEYS + RUN_KEYS

# the dynamic-batch switches: verl's token budget is read only when the switch is on
DYNAMIC = {
    f"{A}.ppo_max_token_len_per_gpu": (f"{A}.use_dynamic_bsz", 16384),
    "critic.ppo_max_token_len_per_gpu": ("critic.use_dynamic_bsz", 32768),
    f"{REF}.log_prob_max_token_len_per_gpu": (f"{REF}.log_prob_use_dynamic_bsz", 16384),
}
# verl keys that stand for others (verl reads them only where the others are unset): its targets
FALLBACK = {
    f"{A}.clip_ratio": (
        (f"{A}.clip_ratio_low", "algorithm.clip_ratio_low"),
        (f"{A}.clip_ratio_high", "algorithm.clip_ratio_high"),
    )
}

EXACT = {k.verl: k for k in VERL_KEYS if "*" not in k.verl}
_PATTERNS = [k for k in VERL_KEYS if "*" in k.verl]
MAPPED = {
    k.verl: k.megarl for k in VERL_KEYS if k.megarl is not None and "*" not in k.verl and k.verl != k.megarl
}
# sections only verl has: a key in one that the table does not know is an unknown verl key
VERL_SECTIONS = (
    "actor_rollout_ref",
    "custom_reward_function",
    "reward_model",
    "reward_manager",
    "global_profiler",
    "ray_kwargs",
    "transfer_queue",
)


def lookup(key: str) -> VerlKey | None:
    """The table's entry for a dotted verl key (exact entries before patterns); None when unknown."""
    return EXACT.get(key) or next((k for k in _PATTERNS if fnmatch.fnmatchcase(key, k.verl)), None)
