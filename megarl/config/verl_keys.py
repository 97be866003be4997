"""verl's trainer-config vocabulary (`ppo_trainer.yaml`, `ppo_megatron_trainer.yaml`) in megarl's keys.

`VERL_KEYS` is the table: verl key → megarl key (+ a value transform where the units or spellings
differ) → note; keys with no megarl meaning map to None and their note says why (one warning line each
when given). megarl.config.verl_translate rewrites the user's settings with it before the schema checks them;
docs/verl-migration.md prints the same table (tests/unit/config/test_verl_keys.py keeps the
two equal). Batch sizes need no conversion: verl's and megarl's are in the same units (prompts for
train_batch_size and ppo_mini_batch_size, which both multiply by rollout.n; sequences per data-parallel
rank for the micro-batch sizes).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from megarl.errors import MegarlError

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

DROP = object()  # a transform's answer: this value sets nothing in megarl (verl's "unset" spelling)


class Rejected(MegarlError):
    """A verl value megarl cannot honour; the message says why and what to write instead."""


@dataclass(frozen=True)
class VerlKey:
    verl: str  # dotted verl key; a "*" matches any rest of the key
    # the megarl key it sets; None = no meaning in megarl (accepted, one warning line with the note)
    megarl: str | None
    note: str = ""
    transform: Callable[[Any], Any] | None = None  # verl value -> megarl value (or DROP, or Rejected)
    # "set": sets megarl; "same": megarl has ONE key where verl has one per role, so the value must
    # equal what the tree sets there (else a conflict error), and sets nothing itself
    kind: str = "set"


def _lower(v: Any) -> Any:
    return v.lower() if isinstance(v, str) else v


def _optimizer(v: Any) -> Any:
    # verl's FSDP default "AdamW" (torch) and its Megatron default "adam" (megatron-core's Adam, whose weight
    # decay is decoupled) are both megarl's adamw
    name = str(v).lower()
    return "adamw" if name in ("adamw", "adam") else name


def _not_none(v: Any) -> Any:
    return DROP if v is None else v


def _warmup_steps(v: Any) -> Any:
    return DROP if v is None or (isinstance(v, int) and v < 0) else v  # verl: -1 = use the ratio


def _save_freq(v: Any) -> Any:
    return -1 if isinstance(v, int) and v <= 0 else v  # verl saves nothing at ≤ 0; megarl's 0 = at the end


def _test_freq(v: Any) -> Any:
    return 0 if isinstance(v, int) and v <= 0 else v


def _loggers(v: Any) -> Any:
    names = v if isinstance(v, list) else [v]
    return ["jsonl" if n == "file" else n for n in names]  # verl's file logger writes jsonl


def _greedy_if_false(v: Any) -> Any:
    return 0.0 if v is False else DROP


def _resume_mode(v: Any) -> Any:
    if v in ("auto", "disable"):
        return v
    return DROP  # resume_path: trainer.resume_from_path carries the path


def _zero_only(what: str) -> Callable[[Any], Any]:
    def check(v: Any) -> Any:
        if v:
            raise Rejected(what)
        return DROP

    return check


def _m(verl: str, megarl: str, note: str = "", transform: Callable[[Any], Any] | None = None) -> VerlKey:
    return VerlKey(verl, megarl, note, transform)


def _same(verl: str, megarl: str, note: str) -> VerlKey:
    return VerlKey(verl, megarl, note, kind="same")


def _x(verl: str, note: str) -> VerlKey:
    return VerlKey(verl, None, note)


def _reject_nonzero(verl: str, megarl_note: str, why: str) -> VerlKey:
    return VerlKey(verl, None, megarl_note, _zero_only(why))


A = "actor_rollout_ref.actor"
RO = "actor_rollout_ref.rollout"
REF = "actor_rollout_ref.ref"
MOD = "actor_rollout_ref.model"

_FSDP = "megarl trains with Megatron, not FSDP"
_PROFILE = "megarl's profiler is trainer.profile_steps / trainer.profile_ranks (torch.profiler)"
_ENGINE = "vLLM engine setting megarl does not expose; the engine's defaults apply"
_PADDING = (
    "megarl packs sequences without padding when actor.max_tokens_per_micro_batch is set (verl's "
    "use_dynamic_bsz + ppo_max_token_len_per_gpu); otherwise micro-batches are right-padded"
)
_LORA = "megarl trains full weights (no LoRA)"
_CKPT = "a megarl checkpoint always holds weights, optimizer, scheduler and RNG (trainer.save_every)"
_DYN = "only with use_dynamic_bsz=true: then it is the token budget per micro-batch"


def _optim(verl: str, role: str) -> list[VerlKey]:
    o = f"{role}.optimizer"
    return [
        _m(f"{verl}.lr", f"{o}.lr"),
        _m(f"{verl}.weight_decay", f"{o}.weight_decay"),
        _m(f"{verl}.betas", f"{o}.betas"),
        _m(f"{verl}.clip_grad", f"{o}.clip_grad"),
        _m(f"{verl}.min_lr", f"{o}.min_lr", "verl's Megatron optimizer"),
        _m(
            f"{verl}.optimizer",
            f"{o}.name",
            "AdamW (FSDP) and adam (Megatron: decoupled weight decay) → adamw",
            _optimizer,
        ),
        _m(
            f"{verl}.lr_warmup_steps",
            f"{o}.lr_warmup_steps",
            "-1 (verl: use the ratio) sets nothing",
            _warmup_steps,
        ),
        _m(f"{verl}.lr_scheduler_type", f"{o}.lr_decay_style", "constant | cosine", _lower),
        _m(
            f"{verl}.warmup_style", f"{o}.lr_decay_style", "verl's older name of lr_scheduler_type", _not_none
        ),
        _m(f"{verl}.lr_decay_style", f"{o}.lr_decay_style", "verl's Megatron optimizer", _lower),
        _x(
            f"{verl}.lr_warmup_steps_ratio", f"a fraction of the total steps; set {o}.lr_warmup_steps (steps)"
        ),
        _x(f"{verl}.min_lr_ratio", f"a fraction of lr; set {o}.min_lr (an absolute rate)"),
        _x(f"{verl}.total_training_steps", "set by verl's trainer itself; megarl's is trainer.total_steps"),
        _x(f"{verl}.num_cycles", "megarl's cosine decays over one half cycle (verl's default 0.5)"),
        _x(f"{verl}.optimizer_impl", "megarl uses megatron-core's optimizer"),
        _x(
            f"{verl}.override_optimizer_config",
            "megarl uses megatron-core's optimizer; set its keys under optimizer",
        ),
        _x(f"{verl}.lr_warmup_init", "megarl's warm-up starts at 0"),
        _x(f"{verl}.lr_decay_steps", "megarl decays over the run's total steps"),
        _x(f"{verl}.weight_decay_incr_style", "megarl's weight decay is constant"),
        _x(f"{verl}.lr_wsd_decay_style", "megarl has no WSD schedule"),
        _x(f"{verl}.lr_wsd_decay_steps", "megarl has no WSD schedule"),
        _x(f"{verl}.use_checkpoint_opt_param_scheduler", "megarl's checkpoints always hold the LR schedule"),
    ]


def _megatron(verl: str, role: str) -> list[VerlKey]:
    p = f"{role}.parallel"
    keys = [
        _m(f"{verl}.tensor_model_parallel_size", f"{p}.tp"),
        _m(f"{verl}.pipeline_model_parallel_size", f"{p}.pp"),
        _m(f"{verl}.virtual_pipeline_model_parallel_size", f"{p}.vpp"),
        _m(f"{verl}.context_parallel_size", f"{p}.cp"),
        _m(f"{verl}.expert_model_parallel_size", f"{p}.ep"),
        _m(
            f"{verl}.sequence_parallel",
            f"{p}.sequence_parallel",
            "verl's default is true; megarl's false (needs tp > 1)",
        ),
        _m(f"{verl}.param_offload", f"{role}.offload_params"),
        _x(f"{verl}.expert_tensor_parallel_size", "megarl's experts use the dense layers' TP"),
        _x(f"{verl}.use_dist_checkpointing", "megarl converts HF weights itself (megarl convert)"),
        _x(f"{verl}.dist_checkpointing_path", "megarl converts HF weights itself (megarl convert)"),
        _x(f"{verl}.dist_checkpointing_prefix", "megarl converts HF weights itself (megarl convert)"),
        _x(f"{verl}.seed", "megarl seeds every role from trainer.seed"),
        _x(f"{verl}.override_ddp_config*", "megarl's DDP settings are fixed"),
        _x(f"{verl}.override_transformer_config*", "megarl builds the transformer config from the HF config"),
        _x(f"{verl}.override_mcore_model_config*", "megarl builds the model config from the HF config"),
        _x(f"{verl}.use_mbridge", "megarl converts HF weights with its own name maps"),
        _x(f"{verl}.vanilla_mbridge", "megarl converts HF weights with its own name maps"),
        _x(f"{verl}.use_remove_padding", _PADDING),
        _x(f"{verl}.forward_only", "set by verl itself"),
        _x(f"{verl}.dtype", "megarl's dtype is model.dtype"),
    ]
    if role in ("actor", "critic"):
        keys += [
            _m(f"{verl}.grad_offload", f"{role}.offload_grads"),
            _m(f"{verl}.optimizer_offload", f"{role}.offload_optimizer"),
            _m(f"{verl}.use_distributed_optimizer", f"{role}.optimizer.use_distributed_optimizer"),
        ]
    else:
        keys += [
            _x(f"{verl}.{k}", f"megarl's {role} is not trained (no optimizer)")
            for k in ("grad_offload", "optimizer_offload", "use_distributed_optimizer")
        ]
    return keys


def _ref_megatron() -> list[VerlKey]:
    why = "megarl's colocated reference runs with the actor's layout"
    keys = [
        _same(f"{REF}.megatron.{size}", f"actor.parallel.{short}", why)
        for size, short in (
            ("tensor_model_parallel_size", "tp"),
            ("pipeline_model_parallel_size", "pp"),
            ("virtual_pipeline_model_parallel_size", "vpp"),
            ("context_parallel_size", "cp"),
            ("expert_model_parallel_size", "ep"),
            ("sequence_parallel", "sequence_parallel"),
        )
    ]
    rest = [
        k
        for k in _megatron(f"{REF}.megatron", "ref")
        if k.megarl is None or k.megarl.endswith("offload_params")
    ]
    return keys + rest


def _fsdp(verl: str, role: str) -> list[VerlKey]:
    keys = [_m(f"{verl}.param_offload", f"{role}.offload_params")]
    if role != "ref":
        keys.append(_m(f"{verl}.optimizer_offload", f"{role}.offload_optimizer"))
    return keys + [_x(f"{verl}.*", _FSDP)]


def _sampling(verl: str, megarl: str) -> list[VerlKey]:
    return [
        _m(f"{verl}.n", f"{megarl}.n"),
        _m(f"{verl}.temperature", f"{megarl}.temperature"),
        _m(f"{verl}.top_p", f"{megarl}.top_p"),
        _m(f"{verl}.top_k", f"{megarl}.top_k"),
        _m(
            f"{verl}.do_sample",
            f"{megarl}.temperature",
            "false → temperature 0 (greedy); true sets nothing",
            _greedy_if_false,
        ),
    ]


def _dynamic_bsz(verl: str) -> list[VerlKey]:
    return [_x(f"{verl}.use_dynamic_bsz", "see ppo_max_token_len_per_gpu")]


VERL_KEYS: tuple[VerlKey, ...] = (
    # --- the policy model
    _m(f"{MOD}.path", "model.path"),
    _m(f"{MOD}.tokenizer_path", "model.tokenizer_path"),
    _m(f"{MOD}.trust_remote_code", "model.trust_remote_code"),
    _m(
        f"{MOD}.enable_gradient_checkpointing",
        "model.gradient_checkpointing",
        "verl's default is true, megarl's false; megarl's applies to every trained role",
    ),
    _x(f"{MOD}.use_remove_padding", _PADDING),
    _x(f"{MOD}.use_fused_kernels", "megarl's log-prob and entropy kernels are chosen by the device"),
    _x(f"{MOD}.fused_kernel_options*", "megarl's log-prob and entropy kernels are chosen by the device"),
    _x(f"{MOD}.use_liger", "megarl runs megatron-core's layers"),
    _x(f"{MOD}.use_shm", "megarl reads the checkpoint from model.path"),
    _x(f"{MOD}.hf_config_path", "megarl reads config.json from model.path"),
    _x(f"{MOD}.external_lib", "megarl supports its decoder families without extra libraries"),
    _x(f"{MOD}.override_config*", "megarl builds the model from config.json as it is"),
    _x(f"{MOD}.custom_chat_template", "megarl uses the tokenizer's chat template"),
    _x(
        f"{MOD}.enable_activation_offload", "megarl saves activation memory with model.gradient_checkpointing"
    ),
    _x(f"{MOD}.tiled_mlp*", "megarl runs megatron-core's MLP"),
    _x(f"{MOD}.mtp*", "megarl has no multi-token prediction"),
    _reject_nonzero(f"{MOD}.lora_rank", _LORA, "megarl trains full weights (no LoRA); remove lora_rank"),
    _x(f"{MOD}.lora_alpha", _LORA),
    _x(f"{MOD}.lora_adapter_path", _LORA),
    _x(f"{MOD}.target_modules", _LORA),
    _x(f"{MOD}.exclude_modules", _LORA),
    _x(f"{MOD}.lora*", _LORA),
    _x(f"{MOD}.freeze_moe_router", "megarl trains every parameter"),
    _x(
        "actor_rollout_ref.hybrid_engine",
        "megarl's rollout always shares the actor's devices (3D-HybridEngine)",
    ),
    _m(
        "actor_rollout_ref.nccl_timeout",
        "trainer.worker_timeout_s",
        "seconds; verl's default 600, megarl's 1800",
    ),
    # --- the actor
    _m(
        f"{A}.ppo_mini_batch_size",
        "algorithm.ppo_mini_batch_size",
        "prompts per optimizer step, ×rollout.n in both",
    ),
    _m(f"{A}.ppo_micro_batch_size_per_gpu", "actor.micro_batch_size", "sequences per data-parallel rank"),
    _x(f"{A}.ppo_micro_batch_size", "verl's deprecated global size; set ppo_micro_batch_size_per_gpu"),
    _m(f"{A}.ppo_max_token_len_per_gpu", "actor.max_tokens_per_micro_batch", _DYN),
    *_dynamic_bsz(A),
    _m(f"{A}.ppo_epochs", "algorithm.ppo_epochs"),
    _m(
        f"{A}.clip_ratio",
        "algorithm.clip_ratio_low",
        "and algorithm.clip_ratio_high: each where clip_ratio_low / clip_ratio_high is not given",
        _not_none,
    ),
    _m(f"{A}.clip_ratio_low", "algorithm.clip_ratio_low", "", _not_none),
    _m(f"{A}.clip_ratio_high", "algorithm.clip_ratio_high", "", _not_none),
    _m(f"{A}.clip_ratio_c", "algorithm.clip_ratio_c"),
    _m(f"{A}.loss_agg_mode", "algorithm.loss_agg_mode"),
    _m(f"{A}.entropy_coeff", "algorithm.entropy_coeff"),
    _m(f"{A}.use_kl_loss", "algorithm.use_kl_loss"),
    _m(f"{A}.kl_loss_coef", "algorithm.kl_loss_coef"),
    _m(f"{A}.kl_loss_type", "algorithm.kl_loss_type"),
    _m(f"{A}.policy_loss.loss_mode", "algorithm.policy_loss"),
    *[
        _m(f"{A}.policy_loss.{k}", f"algorithm.policy_loss_params.{k}")
        for k in ("clip_cov_ratio", "clip_cov_lb", "clip_cov_ub", "kl_cov_ratio", "ppo_kl_coef")
    ],
    _m(f"{A}.tau_pos", "algorithm.policy_loss_params.tau_pos", "sapo"),
    _m(f"{A}.tau_neg", "algorithm.policy_loss_params.tau_neg", "sapo"),
    _m(f"{A}.grad_clip", "actor.optimizer.clip_grad", "verl's older name of optim.clip_grad"),
    *_optim(f"{A}.optim", "actor"),
    *_fsdp(f"{A}.fsdp_config", "actor"),
    *_megatron(f"{A}.megatron", "actor"),
    _x(
        f"{A}.ulysses_sequence_parallel_size",
        "megarl splits long sequences with actor.parallel.cp (Megatron context parallelism)",
    ),
    _x(f"{A}.strategy", "megarl trains with Megatron"),
    _x(f"{A}.rollout_n", "set by verl from rollout.n"),
    _x(f"{A}.shuffle", "megarl's mini-batches take the step's rollouts in order"),
    _x(f"{A}.data_loader_seed", "megarl seeds from trainer.seed"),
    _x(f"{A}.use_torch_compile", "megarl does not torch.compile the trainer"),
    _x(f"{A}.use_fused_kernels", "megarl's log-prob and entropy kernels are chosen by the device"),
    _x(f"{A}.use_remove_padding", _PADDING),
    _x(f"{A}.freeze_vision_tower", "megarl trains text decoders"),
    _x(f"{A}.calculate_entropy", "megarl always logs actor/entropy"),
    _x(f"{A}.loss_scale_factor", "megarl's loss normalisation is algorithm.loss_agg_mode"),
    _x(f"{A}.use_prefix_grouper", "megarl has no prefix grouping"),
    _x(f"{A}.calculate_sum_pi_squared", "megarl computes Σπ² when algorithm.adv_estimator needs it"),
    _x(f"{A}.sum_pi_squared_checkpointing", "megarl computes Σπ² when algorithm.adv_estimator needs it"),
    _x(f"{A}.entropy_from_logits_with_chunking", "megarl's entropy kernel is chosen by the device"),
    _x(f"{A}.entropy_checkpointing", "megarl's entropy kernel is chosen by the device"),
    _x(f"{A}.checkpoint.*", _CKPT),
    _x(f"{A}.profiler.*", _PROFILE),
    _x(f"{A}.router_replay.*", "megarl has no MoE router replay"),
    _x(f"{A}.load_weight", "megarl always loads model.path"),
    _x(f"{A}.nccl_timeout", "see actor_rollout_ref.nccl_timeout"),
    # --- the reference
    _m(
        f"{REF}.log_prob_micro_batch_size_per_gpu", "ref.micro_batch_size", "sequences per data-parallel rank"
    ),
    _x(
        f"{REF}.log_prob_micro_batch_size",
        "verl's deprecated global size; set log_prob_micro_batch_size_per_gpu",
    ),
    _m(
        f"{REF}.log_prob_max_token_len_per_gpu",
        "ref.max_tokens_per_micro_batch",
        "only with log_prob_use_dynamic_bsz=true",
    ),
    _x(f"{REF}.log_prob_use_dynamic_bsz", "see log_prob_max_token_len_per_gpu"),
    *_fsdp(f"{REF}.fsdp_config", "ref"),
    *_ref_megatron(),
    _x(f"{REF}.strategy", "megarl runs the reference on Megatron"),
    _x(f"{REF}.rollout_n", "set by verl from rollout.n"),
    _x(f"{REF}.use_torch_compile", "megarl does not torch.compile the reference"),
    _x(f"{REF}.ulysses_sequence_parallel_size", "the reference runs with the actor's layout"),
    _x(f"{REF}.entropy_from_logits_with_chunking", "megarl's entropy kernel is chosen by the device"),
    _x(f"{REF}.entropy_checkpointing", "megarl's entropy kernel is chosen by the device"),
    _x(f"{REF}.profiler.*", _PROFILE),
    _x(f"{REF}.router_replay.*", "megarl has no MoE router replay"),
    _x(f"{REF}.load_weight", "megarl always loads model.path"),
    # --- the rollout
    _m(f"{RO}.name", "rollout.engine", "megarl offers vllm"),
    *_sampling(RO, "rollout"),
    *_sampling(f"{RO}.val_kwargs", "rollout.val"),
    _m(f"{RO}.tensor_model_parallel_size", "rollout.tp", "verl's default is 2, megarl's 1"),
    _m(f"{RO}.gpu_memory_utilization", "rollout.gpu_memory_utilization"),
    _m(f"{RO}.max_num_seqs", "rollout.max_num_seqs"),
    _m(f"{RO}.enforce_eager", "rollout.enforce_eager"),
    _m(f"{RO}.calculate_log_probs", "rollout.calculate_log_probs"),
    _m(
        f"{RO}.response_length",
        "rollout.max_tokens",
        "verl's default is data.max_response_length, as megarl's",
    ),
    _m(
        f"{RO}.checkpoint_engine.update_weights_bucket_megabytes",
        "rollout.reshard_bucket_mib",
        "verl's default 2048, megarl's 256",
    ),
    _x(f"{RO}.mode", "megarl's engine runs inside the actor's processes (no sync/async server mode)"),
    _x(f"{RO}.prompt_length", "megarl's is data.max_prompt_length"),
    _x(f"{RO}.dtype", "megarl's engine runs in model.dtype"),
    _x(
        f"{RO}.log_prob_micro_batch_size_per_gpu",
        "megarl computes the old log-probs in the actor's micro-batches (actor.micro_batch_size) or fuses them into the update (algorithm.old_log_prob)",
    ),
    _x(
        f"{RO}.log_prob_micro_batch_size",
        "megarl computes the old log-probs in the actor's micro-batches (actor.micro_batch_size)",
    ),
    _x(f"{RO}.log_prob_use_dynamic_bsz", "megarl computes the old log-probs in the actor's micro-batches"),
    _x(
        f"{RO}.log_prob_max_token_len_per_gpu",
        "megarl computes the old log-probs in the actor's micro-batches",
    ),
    _x(f"{RO}.ignore_eos", "megarl's samples end at EOS (rollout.stop_token_ids adds more)"),
    _x(f"{RO}.free_cache_engine", "megarl's hybrid engine frees the KV cache after every generation"),
    _x(f"{RO}.load_format", "megarl's engine gets the actor's weights by resharding"),
    _x(f"{RO}.layered_summon", "megarl's engine gets the actor's weights by resharding"),
    _x(
        f"{RO}.checkpoint_engine.*",
        "megarl's engine gets the actor's weights by resharding (rollout.reshard_bucket_mib)",
    ),
    _x(f"{RO}.data_parallel_size", "megarl's engine replicas follow the actor's data-parallel size"),
    _x(f"{RO}.expert_parallel_size", "megarl's engine uses rollout.tp only"),
    _x(f"{RO}.pipeline_model_parallel_size", "megarl's engine uses rollout.tp only"),
    _x(f"{RO}.over_sample_rate", "megarl waits for every sample"),
    _x(f"{RO}.multi_stage_wake_up", "megarl's hybrid engine wakes the engine in one stage"),
    _x(f"{RO}.engine_kwargs*", _ENGINE),
    *[
        _x(f"{RO}.{k}", _ENGINE)
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
    _x(f"{RO}.multi_turn.*", "megarl's rollout config has no multi-turn / tool settings"),
    _x(f"{RO}.agent.*", "megarl's rollout config has no agent loop"),
    _x(f"{RO}.trace.*", "megarl has no rollout tracing; validation responses: trainer.validation_data_dir"),
    _x(f"{RO}.skip_rollout", "megarl always generates"),
    _x(f"{RO}.skip_dump_dir", "megarl always generates"),
    _x(f"{RO}.enable_rollout_routing_replay", "megarl has no MoE router replay"),
    _x(f"{RO}.profiler.*", _PROFILE),
    _x(f"{RO}.prometheus.*", "megarl exports no Prometheus metrics"),
    _x(f"{RO}.mtp", "megarl has no multi-token prediction"),
    _x(f"{RO}.layer_name_map.*", "megarl converts weights with its own name maps"),
    # --- the critic
    _m("critic.enable", "critic.enable", "null = on for adv_estimator=gae, in both"),
    _m("critic.model.path", "critic.model_path"),
    _m("critic.ppo_micro_batch_size_per_gpu", "critic.micro_batch_size", "sequences per data-parallel rank"),
    _x("critic.ppo_micro_batch_size", "verl's deprecated global size; set ppo_micro_batch_size_per_gpu"),
    _m("critic.ppo_max_token_len_per_gpu", "critic.max_tokens_per_micro_batch", _DYN),
    *_dynamic_bsz("critic"),
    _m("critic.cliprange_value", "algorithm.value_clip"),
    _m("critic.grad_clip", "critic.optimizer.clip_grad", "verl's older name of optim.clip_grad"),
    _same(
        "critic.ppo_mini_batch_size",
        "algorithm.ppo_mini_batch_size",
        "megarl's actor and critic share one mini-batch size",
    ),
    _same("critic.ppo_epochs", "algorithm.ppo_epochs", "megarl's actor and critic share ppo_epochs"),
    _same("critic.loss_agg_mode", "algorithm.loss_agg_mode", "megarl's actor and critic share loss_agg_mode"),
    _same(
        "critic.model.enable_gradient_checkpointing",
        "model.gradient_checkpointing",
        "megarl's applies to every trained role",
    ),
    *_optim("critic.optim", "critic"),
    *_fsdp("critic.model.fsdp_config", "critic"),
    *_megatron("critic.megatron", "critic"),
    _x("critic.forward_micro_batch_size*", "megarl's value forward uses critic.micro_batch_size"),
    _x(
        "critic.forward_max_token_len_per_gpu",
        "megarl's value forward uses critic.max_tokens_per_micro_batch",
    ),
    _x("critic.model.tokenizer_path", "the critic uses the policy's tokenizer"),
    _x("critic.model.use_remove_padding", _PADDING),
    _x("critic.model.trust_remote_code", "megarl's is model.trust_remote_code"),
    _x("critic.model.external_lib", "megarl supports its decoder families without extra libraries"),
    _x("critic.model.override_config*", "megarl builds the model from config.json as it is"),
    _x("critic.model.use_shm", "megarl reads the checkpoint from its path"),
    _x(
        "critic.model.enable_activation_offload",
        "megarl saves activation memory with model.gradient_checkpointing",
    ),
    _x("critic.model.tiled_mlp*", "megarl runs megatron-core's MLP"),
    _reject_nonzero(
        "critic.model.lora_rank", _LORA, "megarl trains full weights (no LoRA); remove lora_rank"
    ),
    _x("critic.model.lora*", _LORA),
    _x("critic.model.target_modules", _LORA),
    _x("critic.model.freeze_moe_router", "megarl trains every parameter"),
    _x("critic.ulysses_sequence_parallel_size", "megarl splits long sequences with critic.parallel.cp"),
    _x("critic.strategy", "megarl trains with Megatron"),
    _x("critic.rollout_n", "set by verl from rollout.n"),
    _x("critic.shuffle", "megarl's mini-batches take the step's rollouts in order"),
    _x("critic.data_loader_seed", "megarl seeds from trainer.seed"),
    _x("critic.checkpoint.*", _CKPT),
    _x("critic.profiler.*", _PROFILE),
    _x("critic.load_weight", "megarl always loads the critic's model"),
    _x("critic.nccl_timeout", "megarl's is trainer.worker_timeout_s"),
    # --- data
    _m("data.train_files", "data.train_files", "a path or a list, as in verl"),
    _m("data.val_files", "data.val_files", "a path or a list, as in verl"),
    _m("data.prompt_key", "data.prompt_key"),
    _m("data.max_prompt_length", "data.max_prompt_length"),
    _m("data.max_response_length", "data.max_response_length"),
    _m("data.train_batch_size", "data.train_batch_size", "prompts per step, as in verl"),
    _m("data.val_batch_size", "data.val_batch_size"),
    _m("data.shuffle", "data.shuffle"),
    _m("data.seed", "data.seed", "null (verl: trainer's seed) sets nothing", _not_none),
    _m(
        "data.filter_overlong_prompts",
        "data.filter_overlong_prompts",
        "verl's default is false (then an overlong prompt is an error, as verl's truncation=error), megarl's true",
    ),
    _x(
        "data.truncation",
        "megarl never truncates a prompt: an overlong one is dropped (data.filter_overlong_prompts=true) or stops the run (false, verl's truncation=error)",
    ),
    _x("data.reward_fn_key", "megarl picks the rule reward by the row's data_source column"),
    _x("data.return_raw_chat", "megarl renders chat prompts itself (data.apply_chat_template)"),
    _x("data.return_raw_input_ids", "megarl tokenises prompts itself"),
    _x("data.return_full_prompt", "megarl tokenises prompts itself"),
    _x("data.tokenizer", "megarl's tokenizer is model.tokenizer_path"),
    _x("data.use_shm", "megarl reads data files from their paths"),
    _x("data.train_max_samples", "megarl reads the whole file; trainer.total_steps limits a run"),
    _x("data.val_max_samples", "megarl evaluates on the whole of data.val_files"),
    _x("data.dataloader_num_workers", "megarl's data loading runs on the driver"),
    _x("data.validation_shuffle", "megarl evaluates in file order"),
    _x("data.filter_overlong_prompts_workers", "megarl's length filter runs on the driver"),
    _x("data.tool_config_path", "megarl's rollout config has no tool settings"),
    _x("data.image_key", "megarl trains text models"),
    _x("data.video_key", "megarl trains text models"),
    _x("data.image_patch_size", "megarl trains text models"),
    _x("data.return_multi_modal_inputs", "megarl trains text models"),
    _x("data.trust_remote_code", "megarl's is model.trust_remote_code"),
    _x("data.custom_cls.*", "megarl reads parquet/jsonl in verl's schema with its own dataset"),
    _x("data.sampler.*", "megarl shuffles with data.shuffle / data.seed"),
    _x("data.datagen.*", "megarl has no dynamic data generation"),
    _x("data.apply_chat_template_kwargs*", "megarl applies the tokenizer's chat template as it is"),
    # --- reward
    _m("custom_reward_function.path", "reward.function.path"),
    _m("custom_reward_function.name", "reward.function.name"),
    _m("reward_model.enable", "reward.enable"),
    _m("reward_model.model.path", "reward.model_path"),
    _m("reward_model.micro_batch_size_per_gpu", "reward.micro_batch_size"),
    _m("reward_model.max_length", "reward.max_length", "hf backend; null sets nothing", _not_none),
    _m("reward_model.overlong_buffer.enable", "reward.overlong_buffer.enable", "verl's DAPO recipe"),
    _m("reward_model.overlong_buffer.len", "reward.overlong_buffer.len", "verl's DAPO recipe"),
    _m(
        "reward_model.overlong_buffer.penalty_factor",
        "reward.overlong_buffer.penalty_factor",
        "verl's DAPO recipe",
    ),
    *_megatron("reward_model.megatron", "reward"),
    _x("reward_model.micro_batch_size", "verl's deprecated global size; set micro_batch_size_per_gpu"),
    _x(
        "reward_model.reward_manager",
        "megarl scores every row with reward.function or the rule reward of its data_source; DAPO's overlong penalty is reward.overlong_buffer",
    ),
    _x(
        "reward_model.enable_resource_pool",
        "megarl gives the reward model its own devices with reward.devices / reward.n_devices",
    ),
    _x("reward_model.n_gpus_per_node", "megarl's is reward.n_devices"),
    _x("reward_model.nnodes", "megarl's is reward.n_devices"),
    _x("reward_model.strategy", "megarl runs the reward model on Megatron (reward.backend)"),
    _x("reward_model.model.input_tokenizer", "megarl re-tokenises only for reward.backend=hf"),
    _x("reward_model.model.*", "megarl reads the reward model from reward.model_path as it is"),
    _x("reward_model.use_dynamic_bsz", "megarl's is reward.max_tokens_per_micro_batch"),
    _x("reward_model.forward_max_token_len_per_gpu", "megarl's is reward.max_tokens_per_micro_batch"),
    _x(
        "reward_model.launch_reward_fn_async",
        "megarl's reward functions run in reward worker processes (reward.workers)",
    ),
    _x("reward_model.num_workers", "megarl's reward worker processes are reward.workers"),
    _x(
        "reward_model.use_reward_loop",
        "megarl's reward functions run in reward worker processes (reward.workers)",
    ),
    _x(
        "reward_model.reward_loop_*",
        "megarl's reward functions run in reward worker processes (reward.workers)",
    ),
    _x("reward_model.sandbox_fusion.*", "megarl has no code sandbox"),
    _x("reward_model.rollout.*", "megarl has no generative reward model"),
    _x("reward_model.ulysses_sequence_parallel_size", "megarl splits long sequences with reward.parallel.cp"),
    _x("reward_model.profiler.*", _PROFILE),
    _x("reward_model.load_weight", "megarl always loads reward.model_path"),
    _x("reward_model.nccl_timeout", "megarl's is trainer.worker_timeout_s"),
    _x(
        "reward_manager.*",
        "megarl scores every row with reward.function or the rule reward of its data_source",
    ),
    # --- algorithm
    _m(
        "algorithm.adv_estimator",
        "algorithm.adv_estimator",
        "given on the command line without algorithm.name, it also picks algorithm.name (grpo for grpo/drgrpo, else ppo)",
    ),
    _m("algorithm.gamma", "algorithm.gamma"),
    _m("algorithm.lam", "algorithm.lam"),
    _m("algorithm.norm_adv_by_std_in_grpo", "algorithm.norm_adv_by_std_in_grpo"),
    _m("algorithm.use_kl_in_reward", "algorithm.use_kl_in_reward"),
    _m("algorithm.kl_penalty", "algorithm.kl_penalty"),
    _m("algorithm.kl_ctrl.type", "algorithm.kl_ctrl"),
    _m("algorithm.kl_ctrl.kl_coef", "algorithm.kl_coef"),
    _m("algorithm.kl_ctrl.horizon", "algorithm.kl_horizon"),
    _m("algorithm.kl_ctrl.target_kl", "algorithm.kl_target"),
    _m("algorithm.use_pf_ppo", "algorithm.pf_ppo.enable"),
    _m("algorithm.pf_ppo.reweight_method", "algorithm.pf_ppo.reweight_method"),
    _m("algorithm.pf_ppo.weight_pow", "algorithm.pf_ppo.weight_pow"),
    _m("algorithm.filter_groups.enable", "algorithm.filter_groups.enable", "verl's DAPO recipe"),
    _m(
        "algorithm.filter_groups.max_num_gen_batches",
        "algorithm.filter_groups.max_num_gen_batches",
        "verl's DAPO recipe",
    ),
    _x("algorithm.filter_groups.metric", "megarl filters groups on their scores (DAPO's acc on 0/1 rewards)"),
    *[
        _m(f"algorithm.rollout_correction.{k}", f"algorithm.rollout_correction.{k}")
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
    _x(
        "algorithm.rollout_correction.loss_type",
        "megarl's bypass-mode loss is algorithm.policy_loss (vanilla = ppo_clip, reinforce)",
    ),
    # --- trainer
    _m("trainer.n_gpus_per_node", "trainer.n_devices_per_node"),
    _m("trainer.nnodes", "trainer.nnodes"),
    _m("trainer.total_epochs", "trainer.total_epochs", "verl's default 30, megarl's 1"),
    _m("trainer.total_training_steps", "trainer.total_steps"),
    _m(
        "trainer.save_freq",
        "trainer.save_every",
        "≤ 0 (never, in verl) → -1; megarl's 0 saves after the last step only",
        _save_freq,
    ),
    _m("trainer.test_freq", "trainer.eval_every", "≤ 0 → 0 (never)", _test_freq),
    _m("trainer.val_before_train", "trainer.val_before_train"),
    _m("trainer.balance_batch", "trainer.balance_batch"),
    _m("trainer.validation_data_dir", "trainer.validation_data_dir"),
    _m("trainer.logger", "logging.backends", "console, wandb, tensorboard; file → jsonl", _loggers),
    _m("trainer.project_name", "logging.project"),
    _m("trainer.experiment_name", "logging.run_name"),
    _m(
        "trainer.default_local_dir",
        "trainer.output_dir",
        "megarl's output_dir holds checkpoints/step_N (verl's global_step_N sit in default_local_dir itself), logs and metrics",
    ),
    _m(
        "trainer.resume_mode",
        "trainer.resume",
        "auto | disable; resume_path takes resume_from_path",
        _resume_mode,
    ),
    _m("trainer.resume_from_path", "trainer.resume", "", _not_none),
    _m("trainer.max_actor_ckpt_to_keep", "trainer.max_checkpoints"),
    _same(
        "trainer.max_critic_ckpt_to_keep", "trainer.max_checkpoints", "a megarl checkpoint holds every role"
    ),
    _m("global_profiler.steps", "trainer.profile_steps", "null sets nothing", _not_none),
    _reject_nonzero(
        "trainer.critic_warmup",
        "megarl updates the actor from the first step",
        "megarl has no critic warm-up (the actor updates from step 1); remove trainer.critic_warmup",
    ),
    _x("trainer.use_legacy_worker_impl", "megarl has one worker implementation"),
    _x("trainer.device", "megarl uses the machine's GPUs, else CPU processes"),
    _x("trainer.log_val_generations", "megarl writes validation responses to trainer.validation_data_dir"),
    _x("trainer.rollout_data_dir", "megarl writes validation responses to trainer.validation_data_dir"),
    _x("trainer.val_only", "megarl evaluates inside training runs (trainer.val_before_train)"),
    _x("trainer.esi_redundant_time", "megarl saves on preemption (trainer.preempt_grace_s)"),
    _x("trainer.default_hdfs_dir", "megarl writes checkpoints to trainer.output_dir"),
    _x("trainer.del_local_ckpt_after_load", "megarl keeps checkpoints (trainer.max_checkpoints)"),
    _x(
        "trainer.ray_wait_register_center_timeout",
        "megarl's worker start-up is bounded by trainer.worker_timeout_s",
    ),
    _x("global_profiler.*", _PROFILE),
    _x("ray_kwargs.*", "megarl starts (or joins, with RAY_ADDRESS) Ray itself"),
    _x("transfer_queue.*", "megarl's driver moves the batches"),
    _x("*._target_", "verl's class names"),
)

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
