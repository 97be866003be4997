"""The pieces of megarl.config.verl_keys' table: what an entry is (`VerlKey`), how a verl value becomes a
megarl one (the transforms; `DROP` = sets nothing, `Rejected` = megarl cannot honour it), the entry
constructors (`maps`, `same_as`, `ignored`, `reject_nonzero`), the notes several entries share, and the
families of keys verl repeats per role (optimizer, megatron, fsdp, sampling, dynamic batching)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from megarl.errors import MegarlError

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


def lower(v: Any) -> Any:
    return v.lower() if isinstance(v, str) else v


def optimizer(v: Any) -> Any:
    # verl's FSDP default "AdamW" (torch) and its Megatron default "adam" (megatron-core's Adam, whose weight
    # decay is decoupled) are both megarl's adamw
    name = str(v).lower()
    return "adamw" if name in ("adamw", "adam") else name


def not_none(v: Any) -> Any:
    return DROP if v is None else v


def warmup_steps(v: Any) -> Any:
    return DROP if v is None or (isinstance(v, int) and v < 0) else v  # verl: -1 = use the ratio


def save_freq(v: Any) -> Any:
    return -1 if isinstance(v, int) and v <= 0 else v  # verl saves nothing at ≤ 0; megarl's 0 = at the end


def test_freq(v: Any) -> Any:
    return 0 if isinstance(v, int) and v <= 0 else v


def loggers(v: Any) -> Any:
    names = v if isinstance(v, list) else [v]
    return ["jsonl" if n == "file" else n for n in names]  # verl's file logger writes jsonl


def greedy_if_false(v: Any) -> Any:
    return 0.0 if v is False else DROP


def resume_mode(v: Any) -> Any:
    if v in ("auto", "disable"):
        return v
    return DROP  # resume_path: trainer.resume_from_path carries the path


def zero_only(what: str) -> Callable[[Any], Any]:
    def check(v: Any) -> Any:
        if v:
            raise Rejected(what)
        return DROP

    return check


def only(allowed: Any, why: str) -> Callable[[Any], Any]:
    def check(v: Any) -> Any:
        if v != allowed:
            raise Rejected(why)
        return DROP

    return check


def maps(verl: str, megarl: str, note: str = "", transform: Callable[[Any], Any] | None = None) -> VerlKey:
    return VerlKey(verl, megarl, note, transform)


def same_as(verl: str, megarl: str, note: str) -> VerlKey:
    return VerlKey(verl, megarl, note, kind="same")


def ignored(verl: str, note: str) -> VerlKey:
    return VerlKey(verl, None, note)


def reject_nonzero(verl: str, megarl_note: str, why: str) -> VerlKey:
    return VerlKey(verl, None, megarl_note, zero_only(why))


A = "actor_rollout_ref.actor"
RO = "actor_rollout_ref.rollout"
REF = "actor_rollout_ref.ref"
MOD = "actor_rollout_ref.model"

FSDP = "an FSDP setting megarl's fsdp backend does not expose (torch's defaults apply)"
PROFILE = "megarl's profiler is trainer.profile_steps / trainer.profile_ranks (torch.profiler)"
ENGINE = "vLLM engine setting megarl does not expose; the engine's defaults apply"
PADDING = (
    "megarl packs sequences without padding when actor.max_tokens_per_micro_batch is set (verl's "
    "use_dynamic_bsz + ppo_max_token_len_per_gpu); otherwise micro-batches are right-padded"
)
CKPT = "a megarl checkpoint always holds weights, optimizer, scheduler and RNG (trainer.save_every)"
DYN = "only with use_dynamic_bsz=true: then it is the token budget per micro-batch"


def optim(verl: str, role: str) -> list[VerlKey]:
    o = f"{role}.optimizer"
    return [
        maps(f"{verl}.lr", f"{o}.lr"),
        maps(f"{verl}.weight_decay", f"{o}.weight_decay"),
        maps(f"{verl}.betas", f"{o}.betas"),
        maps(f"{verl}.clip_grad", f"{o}.clip_grad"),
        maps(f"{verl}.min_lr", f"{o}.min_lr", "verl's Megatron optimizer"),
        maps(
            f"{verl}.optimizer",
            f"{o}.name",
            "AdamW (FSDP) and adam (Megatron: decoupled weight decay) → adamw",
            optimizer,
        ),
        maps(
            f"{verl}.lr_warmup_steps",
            f"{o}.lr_warmup_steps",
            "-1 (verl: use the ratio) sets nothing",
            warmup_steps,
        ),
        maps(f"{verl}.lr_scheduler_type", f"{o}.lr_decay_style", "constant | cosine", lower),
        maps(
            f"{verl}.warmup_style", f"{o}.lr_decay_style", "verl's older name of lr_scheduler_type", not_none
        ),
        maps(f"{verl}.lr_decay_style", f"{o}.lr_decay_style", "verl's Megatron optimizer", lower),
        ignored(
            f"{verl}.lr_warmup_steps_ratio", f"a fraction of the total steps; set {o}.lr_warmup_steps (steps)"
        ),
        ignored(f"{verl}.min_lr_ratio", f"a fraction of lr; set {o}.min_lr (an absolute rate)"),
        ignored(
            f"{verl}.total_training_steps", "set by verl's trainer itself; megarl's is trainer.total_steps"
        ),
        ignored(f"{verl}.num_cycles", "megarl's cosine decays over one half cycle (verl's default 0.5)"),
        ignored(f"{verl}.optimizer_impl", "megarl uses megatron-core's optimizer"),
        ignored(
            f"{verl}.override_optimizer_config",
            "megarl uses megatron-core's optimizer; set its keys under optimizer",
        ),
        ignored(f"{verl}.lr_warmup_init", "megarl's warm-up starts at 0"),
        ignored(f"{verl}.lr_decay_steps", "megarl decays over the run's total steps"),
        ignored(f"{verl}.weight_decay_incr_style", "megarl's weight decay is constant"),
        ignored(f"{verl}.lr_wsd_decay_style", "megarl has no WSD schedule"),
        ignored(f"{verl}.lr_wsd_decay_steps", "megarl has no WSD schedule"),
        ignored(
            f"{verl}.use_checkpoint_opt_param_scheduler", "megarl's checkpoints always hold the LR schedule"
        ),
    ]


MOE_ROUTER = "MoE models; verl's default load balancing is none, megarl's the checkpoint's"


def megatron(verl: str, role: str) -> list[VerlKey]:
    p = f"{role}.parallel"
    keys = [
        maps(f"{verl}.tensor_model_parallel_size", f"{p}.tp"),
        maps(f"{verl}.pipeline_model_parallel_size", f"{p}.pp"),
        maps(f"{verl}.virtual_pipeline_model_parallel_size", f"{p}.vpp"),
        maps(f"{verl}.context_parallel_size", f"{p}.cp"),
        maps(f"{verl}.expert_model_parallel_size", f"{p}.ep"),
        maps(
            f"{verl}.sequence_parallel",
            f"{p}.sequence_parallel",
            "verl's default is true; megarl's false (needs tp > 1)",
        ),
        maps(f"{verl}.param_offload", f"{role}.offload_params"),
        ignored(f"{verl}.expert_tensor_parallel_size", "megarl's experts use the dense layers' TP"),
        ignored(f"{verl}.use_dist_checkpointing", "megarl converts HF weights itself (megarl convert)"),
        ignored(f"{verl}.dist_checkpointing_path", "megarl converts HF weights itself (megarl convert)"),
        ignored(f"{verl}.dist_checkpointing_prefix", "megarl converts HF weights itself (megarl convert)"),
        ignored(f"{verl}.seed", "megarl seeds every role from trainer.seed"),
        ignored(f"{verl}.override_ddp_config*", "megarl's DDP settings are fixed"),
        ignored(
            f"{verl}.override_transformer_config*", "megarl builds the transformer config from the HF config"
        ),
        ignored(f"{verl}.override_mcore_model_config*", "megarl builds the model config from the HF config"),
        ignored(f"{verl}.use_mbridge", "megarl converts HF weights with its own name maps"),
        ignored(f"{verl}.vanilla_mbridge", "megarl converts HF weights with its own name maps"),
        ignored(f"{verl}.use_remove_padding", PADDING),
        ignored(f"{verl}.forward_only", "set by verl itself"),
        ignored(f"{verl}.dtype", "megarl's dtype is model.dtype"),
    ]
    if role in ("actor", "critic"):
        keys += [
            maps(f"{verl}.grad_offload", f"{role}.offload_grads"),
            maps(f"{verl}.optimizer_offload", f"{role}.offload_optimizer"),
            maps(f"{verl}.use_distributed_optimizer", f"{role}.optimizer.use_distributed_optimizer"),
            *(
                maps(f"{verl}.override_transformer_config.{name}", f"{role}.moe.{short}", MOE_ROUTER)
                for name, short in (
                    ("moe_aux_loss_coeff", "aux_loss_coeff"),
                    ("moe_z_loss_coeff", "z_loss_coeff"),
                    ("moe_router_load_balancing_type", "load_balancing_type"),
                )
            ),
        ]
    else:
        keys += [
            ignored(f"{verl}.{k}", f"megarl's {role} is not trained (no optimizer)")
            for k in ("grad_offload", "optimizer_offload", "use_distributed_optimizer")
        ]
    return keys


def ref_megatron() -> list[VerlKey]:
    why = "megarl's colocated reference runs with the actor's layout"
    keys = [
        same_as(f"{REF}.megatron.{size}", f"actor.parallel.{short}", why)
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
        for k in megatron(f"{REF}.megatron", "ref")
        if k.megarl is None or k.megarl.endswith("offload_params")
    ]
    return keys + rest


def strategy(v: Any) -> Any:
    """verl's `strategy`: fsdp / fsdp2 (megarl's FSDP backend is FSDP2's fully_shard) or megatron."""
    name = str(v).lower()
    if name in ("fsdp", "fsdp2"):
        return "fsdp"
    if name == "megatron":
        return name
    raise Rejected(f"strategy={v!r} is not one megarl runs; use fsdp, fsdp2 or megatron")


def fsdp(verl: str, role: str) -> list[VerlKey]:
    keys = [
        maps(f"{verl}.param_offload", f"{role}.offload_params"),
        maps(f"{verl}.reshard_after_forward", f"{role}.fsdp.reshard_after_forward"),
        maps(f"{verl}.offload_policy", f"{role}.fsdp.offload_policy"),
        maps(
            f"{verl}.wrap_policy.transformer_layer_cls_to_wrap",
            f"{role}.fsdp.wrap_classes",
            transform=not_none,
        ),
    ]
    if role != "ref":
        keys.append(maps(f"{verl}.optimizer_offload", f"{role}.offload_optimizer"))
    return keys + [ignored(f"{verl}.*", FSDP)]


def sampling(verl: str, megarl: str) -> list[VerlKey]:
    return [
        maps(f"{verl}.n", f"{megarl}.n"),
        maps(f"{verl}.temperature", f"{megarl}.temperature"),
        maps(f"{verl}.top_p", f"{megarl}.top_p"),
        maps(f"{verl}.top_k", f"{megarl}.top_k"),
        maps(
            f"{verl}.do_sample",
            f"{megarl}.temperature",
            "false → temperature 0 (greedy); true sets nothing",
            greedy_if_false,
        ),
    ]


def dynamic_bsz(verl: str) -> list[VerlKey]:
    return [ignored(f"{verl}.use_dynamic_bsz", "see ppo_max_token_len_per_gpu")]


# verl's canonical_lora target names: megarl's are PEFT's
CANONICAL_TARGETS = {
    "linear_q": "q_proj",
    "linear_k": "k_proj",
    "linear_v": "v_proj",
    "linear_fc1_gate": "gate_proj",
    "linear_fc1_up": "up_proj",
}


def lora_targets(v: Any) -> Any:
    if v is None or v == []:  # verl's Megatron LoRA: [] (with exclude_modules) = every linear but those
        return DROP
    return [CANONICAL_TARGETS.get(n, n) for n in ([v] if isinstance(v, str) else v)]


def lora_type(v: Any) -> Any:
    if v in ("lora", "canonical_lora"):
        return DROP
    raise Rejected("megarl's LoRA is plain LoRA on the text decoder (no DoRA, no vision LoRA); use lora")


def lora_init_a(v: Any) -> Any:
    return "xavier" if v == "xavier" else "kaiming"  # Megatron-Bridge: kaiming_uniform unless xavier


def lora_merge(v: Any) -> Any:
    return "merged" if v else DROP  # verl's false (separate adapters): megarl's auto


def lora(model: str, role: str) -> list[VerlKey]:
    """verl's LoRA keys of a role's model: its FSDP backend's flat ones (lora_rank, ...) and its Megatron
    backend's `lora` section; both set <role>.lora."""
    k = f"{role}.lora"
    targets = "canonical names (linear_q, linear_fc1_up, ...) → q_proj, up_proj, ...; [] → all-linear"
    keys = [
        maps(f"{model}.lora_rank", f"{k}.rank", "verl's FSDP LoRA; 0 = off in both"),
        maps(f"{model}.lora_alpha", f"{k}.alpha", "verl's FSDP default 16, megarl's 32"),
        maps(f"{model}.target_modules", f"{k}.target_modules", "verl's FSDP LoRA", lora_targets),
        maps(f"{model}.lora.rank", f"{k}.rank", "verl's Megatron LoRA; 0 = off in both"),
        maps(f"{model}.lora.alpha", f"{k}.alpha"),
        maps(f"{model}.lora.dropout", f"{k}.dropout"),
        maps(f"{model}.lora.target_modules", f"{k}.target_modules", targets, lora_targets),
        maps(f"{model}.lora.exclude_modules", f"{k}.exclude_modules", "", not_none),
        maps(f"{model}.lora.adapter_path", f"{k}.adapter_path", "a PEFT adapter directory", not_none),
        maps(
            f"{model}.lora.lora_A_init_method",
            f"{k}.init_A",
            "xavier → xavier, any other → kaiming (Megatron-Bridge's rule); verl's default xavier, megarl's kaiming",
            lora_init_a,
        ),
        VerlKey(
            f"{model}.lora.type",
            None,
            "lora and canonical_lora both: megarl's adapters are always per HF projection (canonical LoRA); "
            "dora and vlm_lora are refused",
            lora_type,
        ),
        VerlKey(
            f"{model}.lora.lora_B_init_method",
            None,
            "zero only: megarl's lora_B starts at 0; other methods are refused",
            only(
                "zero", "megarl's lora_B starts at zero (a new adapter leaves the model unchanged); use zero"
            ),
        ),
        VerlKey(
            f"{model}.lora.dropout_position",
            None,
            "pre only: megarl's dropout is on the adapter's input; post is refused",
            only("pre", "megarl's dropout is on the adapter's input (PEFT's); use pre"),
        ),
        ignored(f"{model}.lora.dtype", "megarl's adapters are in model.dtype (verl's null)"),
        ignored(
            f"{model}.lora.a2a_experimental",
            "megarl's adapters need no communication beyond their linear's (a Megatron-Bridge option)",
        ),
        ignored(f"{model}.lora.freeze_vision_*", "megarl trains text decoders"),
        ignored(f"{model}.lora.freeze_language_model", "megarl freezes the base weights of a LoRA role"),
    ]
    if role == "actor":
        keys += [
            maps(f"{model}.exclude_modules", f"{k}.exclude_modules", "verl's FSDP LoRA", not_none),
            maps(f"{model}.lora_adapter_path", f"{k}.adapter_path", "verl's FSDP LoRA", not_none),
            maps(
                f"{model}.lora.merge",
                f"{k}.sync",
                "true → merged (into the base weights, synced as those); false → auto (adapters where the engine can)",
                lora_merge,
            ),
        ]
    return keys
