"""verl's keys of the policy's roles (`actor_rollout_ref`: model, actor, reference, rollout) in megarl's
keys: part of megarl.config.verl_keys' table."""

from __future__ import annotations

from megarl.config.verl_key_types import (
    CKPT,
    DYN,
    ENGINE,
    MOD,
    PADDING,
    PROFILE,
    REF,
    RO,
    A,
    VerlKey,
    dynamic_bsz,
    fsdp,
    ignored,
    lora,
    maps,
    megatron,
    not_none,
    optim,
    ref_megatron,
    sampling,
    strategy,
)

ROUTE_FILES = "megarl keeps the routes in the batch (verl's files are unused there too)"

ROLE_KEYS: tuple[VerlKey, ...] = (
    # --- the policy model
    maps(f"{MOD}.path", "model.path"),
    maps(f"{MOD}.tokenizer_path", "model.tokenizer_path"),
    maps(f"{MOD}.trust_remote_code", "model.trust_remote_code"),
    maps(
        f"{MOD}.enable_gradient_checkpointing",
        "model.gradient_checkpointing",
        "verl's default is true, megarl's false; megarl's applies to every trained role",
    ),
    ignored(f"{MOD}.use_remove_padding", PADDING),
    ignored(f"{MOD}.use_fused_kernels", "megarl's log-prob and entropy kernels are chosen by the device"),
    ignored(f"{MOD}.fused_kernel_options*", "megarl's log-prob and entropy kernels are chosen by the device"),
    ignored(f"{MOD}.use_liger", "megarl runs megatron-core's layers"),
    ignored(f"{MOD}.use_shm", "megarl reads the checkpoint from model.path"),
    ignored(f"{MOD}.hf_config_path", "megarl reads config.json from model.path"),
    ignored(f"{MOD}.external_lib", "megarl supports its decoder families without extra libraries"),
    ignored(f"{MOD}.override_config*", "megarl builds the model from config.json as it is"),
    ignored(f"{MOD}.custom_chat_template", "megarl uses the tokenizer's chat template"),
    ignored(
        f"{MOD}.enable_activation_offload", "megarl saves activation memory with model.gradient_checkpointing"
    ),
    ignored(f"{MOD}.tiled_mlp*", "megarl runs megatron-core's MLP"),
    ignored(f"{MOD}.mtp*", "megarl has no multi-token prediction"),
    *lora(MOD, "actor"),
    ignored(f"{MOD}.freeze_moe_router", "megarl trains every parameter"),
    ignored(
        "actor_rollout_ref.hybrid_engine",
        "megarl's rollout always shares the actor's devices (3D-HybridEngine)",
    ),
    maps(
        "actor_rollout_ref.nccl_timeout",
        "trainer.worker_timeout_s",
        "seconds; verl's default 600, megarl's 1800",
    ),
    # --- the actor
    maps(
        f"{A}.ppo_mini_batch_size",
        "algorithm.ppo_mini_batch_size",
        "prompts per optimizer step, ×rollout.n in both",
    ),
    maps(f"{A}.ppo_micro_batch_size_per_gpu", "actor.micro_batch_size", "sequences per data-parallel rank"),
    ignored(f"{A}.ppo_micro_batch_size", "verl's deprecated global size; set ppo_micro_batch_size_per_gpu"),
    maps(f"{A}.ppo_max_token_len_per_gpu", "actor.max_tokens_per_micro_batch", DYN),
    *dynamic_bsz(A),
    maps(f"{A}.ppo_epochs", "algorithm.ppo_epochs"),
    maps(
        f"{A}.clip_ratio",
        "algorithm.clip_ratio_low",
        "and algorithm.clip_ratio_high: each where clip_ratio_low / clip_ratio_high is not given",
        not_none,
    ),
    maps(f"{A}.clip_ratio_low", "algorithm.clip_ratio_low", "", not_none),
    maps(f"{A}.clip_ratio_high", "algorithm.clip_ratio_high", "", not_none),
    maps(f"{A}.clip_ratio_c", "algorithm.clip_ratio_c"),
    maps(f"{A}.loss_agg_mode", "algorithm.loss_agg_mode"),
    maps(f"{A}.entropy_coeff", "algorithm.entropy_coeff"),
    maps(f"{A}.use_kl_loss", "algorithm.use_kl_loss"),
    maps(f"{A}.kl_loss_coef", "algorithm.kl_loss_coef"),
    maps(f"{A}.kl_loss_type", "algorithm.kl_loss_type"),
    maps(f"{A}.policy_loss.loss_mode", "algorithm.policy_loss"),
    *[
        maps(f"{A}.policy_loss.{k}", f"algorithm.policy_loss_params.{k}")
        for k in ("clip_cov_ratio", "clip_cov_lb", "clip_cov_ub", "kl_cov_ratio", "ppo_kl_coef")
    ],
    maps(f"{A}.tau_pos", "algorithm.policy_loss_params.tau_pos", "sapo"),
    maps(f"{A}.tau_neg", "algorithm.policy_loss_params.tau_neg", "sapo"),
    maps(f"{A}.grad_clip", "actor.optimizer.clip_grad", "verl's older name of optim.clip_grad"),
    *optim(f"{A}.optim", "actor"),
    *fsdp(f"{A}.fsdp_config", "actor"),
    *megatron(f"{A}.megatron", "actor"),
    ignored(
        f"{A}.ulysses_sequence_parallel_size",
        "megarl splits long sequences with actor.parallel.cp (Megatron context parallelism)",
    ),
    maps(f"{A}.strategy", "actor.backend", "fsdp and fsdp2 are megarl's fsdp backend (FSDP2)", strategy),
    ignored(f"{A}.rollout_n", "set by verl from rollout.n"),
    ignored(f"{A}.shuffle", "megarl's mini-batches take the step's rollouts in order"),
    ignored(f"{A}.data_loader_seed", "megarl seeds from trainer.seed"),
    ignored(f"{A}.use_torch_compile", "megarl does not torch.compile the trainer"),
    ignored(f"{A}.use_fused_kernels", "megarl's log-prob and entropy kernels are chosen by the device"),
    ignored(f"{A}.use_remove_padding", PADDING),
    ignored(f"{A}.freeze_vision_tower", "megarl trains text decoders"),
    ignored(f"{A}.calculate_entropy", "megarl always logs actor/entropy"),
    ignored(f"{A}.loss_scale_factor", "megarl's loss normalisation is algorithm.loss_agg_mode"),
    ignored(f"{A}.use_prefix_grouper", "megarl has no prefix grouping"),
    ignored(f"{A}.calculate_sum_pi_squared", "megarl computes Σπ² when algorithm.adv_estimator needs it"),
    ignored(f"{A}.sum_pi_squared_checkpointing", "megarl computes Σπ² when algorithm.adv_estimator needs it"),
    ignored(f"{A}.entropy_from_logits_with_chunking", "megarl's entropy kernel is chosen by the device"),
    ignored(f"{A}.entropy_checkpointing", "megarl's entropy kernel is chosen by the device"),
    ignored(f"{A}.checkpoint.*", CKPT),
    ignored(f"{A}.profiler.*", PROFILE),
    maps(f"{A}.router_replay.mode", "actor.router_replay.mode", "disabled | R2 | R3, verl's meanings"),
    ignored(f"{A}.router_replay.record_file", ROUTE_FILES),
    ignored(f"{A}.router_replay.replay_file", ROUTE_FILES),
    ignored(f"{A}.load_weight", "megarl always loads model.path"),
    ignored(f"{A}.nccl_timeout", "see actor_rollout_ref.nccl_timeout"),
    # --- the reference
    maps(
        f"{REF}.log_prob_micro_batch_size_per_gpu", "ref.micro_batch_size", "sequences per data-parallel rank"
    ),
    ignored(
        f"{REF}.log_prob_micro_batch_size",
        "verl's deprecated global size; set log_prob_micro_batch_size_per_gpu",
    ),
    maps(
        f"{REF}.log_prob_max_token_len_per_gpu",
        "ref.max_tokens_per_micro_batch",
        "only with log_prob_use_dynamic_bsz=true",
    ),
    ignored(f"{REF}.log_prob_use_dynamic_bsz", "see log_prob_max_token_len_per_gpu"),
    *fsdp(f"{REF}.fsdp_config", "ref"),
    *ref_megatron(),
    maps(f"{REF}.strategy", "ref.backend", "fsdp and fsdp2 are megarl's fsdp backend (FSDP2)", strategy),
    ignored(f"{REF}.rollout_n", "set by verl from rollout.n"),
    ignored(f"{REF}.use_torch_compile", "megarl does not torch.compile the reference"),
    ignored(f"{REF}.ulysses_sequence_parallel_size", "the reference runs with the actor's layout"),
    ignored(f"{REF}.entropy_from_logits_with_chunking", "megarl's entropy kernel is chosen by the device"),
    ignored(f"{REF}.entropy_checkpointing", "megarl's entropy kernel is chosen by the device"),
    ignored(f"{REF}.profiler.*", PROFILE),
    ignored(
        f"{REF}.router_replay.*",
        "megarl's reference replays the routes under actor.router_replay.mode (verl's reference never does)",
    ),
    ignored(f"{REF}.load_weight", "megarl always loads model.path"),
    # --- the rollout
    maps(f"{RO}.name", "rollout.engine", "megarl offers vllm"),
    *sampling(RO, "rollout"),
    *sampling(f"{RO}.val_kwargs", "rollout.val"),
    maps(f"{RO}.tensor_model_parallel_size", "rollout.tp", "verl's default is 2, megarl's 1"),
    maps(f"{RO}.gpu_memory_utilization", "rollout.gpu_memory_utilization"),
    maps(f"{RO}.max_num_seqs", "rollout.max_num_seqs"),
    maps(f"{RO}.enforce_eager", "rollout.enforce_eager"),
    maps(f"{RO}.calculate_log_probs", "rollout.calculate_log_probs"),
    maps(
        f"{RO}.response_length",
        "rollout.max_tokens",
        "verl's default is data.max_response_length, as megarl's",
    ),
    maps(
        f"{RO}.checkpoint_engine.update_weights_bucket_megabytes",
        "rollout.reshard_bucket_mib",
        "verl's default 2048, megarl's 256",
    ),
    ignored(
        f"{RO}.mode",
        "megarl's engines run in-process: inside the actor's processes, or in a pool of their own "
        "(rollout.placement=separate)",
    ),
    ignored(f"{RO}.prompt_length", "megarl's is data.max_prompt_length"),
    ignored(f"{RO}.dtype", "megarl's engine runs in model.dtype"),
    ignored(
        f"{RO}.log_prob_micro_batch_size_per_gpu",
        "megarl computes the old log-probs in the actor's micro-batches (actor.micro_batch_size) or fuses them into the update (algorithm.old_log_prob)",
    ),
    ignored(
        f"{RO}.log_prob_micro_batch_size",
        "megarl computes the old log-probs in the actor's micro-batches (actor.micro_batch_size)",
    ),
    ignored(
        f"{RO}.log_prob_use_dynamic_bsz", "megarl computes the old log-probs in the actor's micro-batches"
    ),
    ignored(
        f"{RO}.log_prob_max_token_len_per_gpu",
        "megarl computes the old log-probs in the actor's micro-batches",
    ),
    ignored(f"{RO}.ignore_eos", "megarl's samples end at EOS (rollout.stop_token_ids adds more)"),
    ignored(f"{RO}.free_cache_engine", "megarl's hybrid engine frees the KV cache after every generation"),
    ignored(f"{RO}.load_format", "megarl's engine gets the actor's weights by resharding"),
    ignored(f"{RO}.layered_summon", "megarl's engine gets the actor's weights by resharding"),
    ignored(
        f"{RO}.checkpoint_engine.*",
        "megarl's engine gets the actor's weights by resharding (rollout.reshard_bucket_mib)",
    ),
    ignored(f"{RO}.data_parallel_size", "megarl's engine replicas follow the actor's data-parallel size"),
    maps(f"{RO}.expert_parallel_size", "rollout.expert_parallel_size"),
    ignored(f"{RO}.pipeline_model_parallel_size", "megarl's engine uses rollout.tp only"),
    ignored(f"{RO}.over_sample_rate", "megarl waits for every sample"),
    ignored(f"{RO}.multi_stage_wake_up", "megarl's hybrid engine wakes the engine in one stage"),
    ignored(f"{RO}.engine_kwargs*", ENGINE),
    *[
        ignored(f"{RO}.{k}", ENGINE)
        for k in (
            "cudagraph_capture_sizes",
            "max_num_batched_tokens",
            "max_model_len",
            "enable_chunked_prefill",
            "enable_prefix_caching",
            "logprobs_mode",
            "scheduling_policy",
            "disable_log_stats",
            "skip_tokenizer_init",
            "quantization",
            "quantization_config_file",
        )
    ],
    # --- multi-turn rollouts with tools (megarl.agentic)
    *[
        maps(f"{RO}.multi_turn.{k}", f"rollout.multi_turn.{k}")
        for k in (
            "enable",
            "max_assistant_turns",
            "max_user_turns",
            "tool_config_path",
            "max_parallel_calls",
            "max_tool_response_length",
            "tool_response_truncate_side",
        )
    ],
    maps(f"{RO}.multi_turn.format", "rollout.multi_turn.format", "megarl parses hermes only"),
    ignored(
        f"{RO}.multi_turn.interaction_config_path",
        "megarl has no interaction config; an environment is rollout.multi_turn.environment",
    ),
    ignored(
        f"{RO}.multi_turn.use_inference_chat_template",
        "megarl trains on the token ids the engine generated (verl's false)",
    ),
    ignored(
        f"{RO}.multi_turn.tokenization_sanity_check_mode",
        "megarl never re-tokenises a conversation: the ids trained on are the engine's",
    ),
    ignored(f"{RO}.multi_turn.num_repeat_rollouts", "megarl samples rollout.n conversations per prompt"),
    maps(
        f"{RO}.agent.num_workers",
        "rollout.agent.num_workers",
        "verl: agent-loop processes; megarl: tool/agent threads per engine replica",
    ),
    maps(
        f"{RO}.agent.default_agent_loop",
        "rollout.agent.default_agent_loop",
        "megarl runs one loop per run (no per-row agent_name)",
    ),
    ignored(
        f"{RO}.agent.agent_loop_config_path", "megarl's loops are its own (rollout.agent.default_agent_loop)"
    ),
    ignored(f"{RO}.agent.custom_async_server.*", "megarl's engine runs in-process"),
    ignored(
        f"{RO}.trace.*", "megarl has no rollout tracing; validation responses: trainer.validation_data_dir"
    ),
    ignored(f"{RO}.skip_rollout", "megarl always generates"),
    ignored(f"{RO}.skip_dump_dir", "megarl always generates"),
    ignored(
        f"{RO}.enable_rollout_routing_replay",
        "megarl's engine returns the routes when actor.router_replay.mode=R3",
    ),
    ignored(f"{RO}.profiler.*", PROFILE),
    ignored(f"{RO}.prometheus.*", "megarl exports no Prometheus metrics"),
    ignored(f"{RO}.mtp", "megarl has no multi-token prediction"),
    ignored(f"{RO}.layer_name_map.*", "megarl converts weights with its own name maps"),
)
