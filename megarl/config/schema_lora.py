"""LoRA of a trained role (`actor.lora`, `critic.lora`): low-rank adapters on the decoder's projections,
the base weights frozen and out of the optimizer. The rules: megarl.config.lora_checks.

megarl's adapters are always per Hugging Face projection ("canonical" LoRA): inside megatron's fused
linear_qkv there is one (A, B) pair each for q_proj, k_proj and v_proj, inside linear_fc1 one each for
gate_proj and up_proj — what PEFT saves and vLLM serves, so adapters go to both without conversion.
verl's `lora.type: lora` (one pair per fused linear) and `canonical_lora` both mean this here.

Learning rate (verl's LoRA guide): raise it about an order of magnitude over full training (verl's 72B
example: 3e-5); too small a rank slows learning — verl reports rank 32 matching full training on a 0.5B
model and rank 128 on a 32B one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from megarl.config.options import LoraInit, LoraSync

# the names target_modules / exclude_modules take (besides patterns): the HF projections, megatron's fused
# linears by what they hold, and every one of them
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
MEGATRON_LINEARS = {
    "linear_qkv": ("q_proj", "k_proj", "v_proj"),
    "linear_proj": ("o_proj",),
    "linear_fc1": ("gate_proj", "up_proj"),
    "linear_fc2": ("down_proj",),
}
ALL_LINEAR = "all-linear"
TARGET_NAMES = (ALL_LINEAR, *PROJECTIONS, *MEGATRON_LINEARS)


def is_pattern(entry: str) -> bool:
    """Whether a target_modules / exclude_modules entry is a pattern over full module names, not a name."""
    return "*" in entry or "." in entry


@dataclass
class LoraConfig:
    # adapter rank r; 0 = LoRA off (full training). verl: model.lora_rank (FSDP) / model.lora.rank (Megatron)
    rank: int = 0
    # scaling of the adapters' output = alpha / rank (PEFT's; no rsLoRA). verl's Megatron default 32, its
    # FSDP lora_alpha's 16
    alpha: float = 32.0
    dropout: float = 0.0  # dropout on the adapters' input in training (PEFT's lora_dropout), in [0, 1)
    # which projections get adapters: HF names (q_proj k_proj v_proj o_proj gate_proj up_proj down_proj),
    # megatron's fused linears (linear_qkv = q, k, v; linear_proj = o; linear_fc1 = gate, up; linear_fc2 =
    # down), "all-linear" (all seven), or fnmatch patterns over full module names in either naming
    # (an entry with "*" or "."): "*.layers.0.*.linear_qkv", "model.layers.1[0-5].mlp.*"
    target_modules: list[str] = field(default_factory=lambda: ["all-linear"])
    exclude_modules: list[str] = field(default_factory=list)  # taken out of target_modules; same names
    # a PEFT adapter directory to start from (adapter_config.json + adapter_model.safetensors, what
    # PeftModel.save_pretrained writes); its r and lora_alpha must equal rank and alpha, and the
    # projections it holds must be among target_modules. verl: lora_adapter_path / lora.adapter_path
    adapter_path: str | None = None
    # how the rollout engine gets the policy after each update: "adapter" (only the adapter tensors, the
    # base weights synced once at start), "merged" (W + alpha/rank·B·A into the base weights, synced as in
    # full training: the changed tensors only), "auto" (adapter where the engine can, else merged with the
    # reason logged). verl's lora.merge=true is merged, false auto
    sync: LoraSync = "auto"
    check_sync: bool = False  # debug: checksums of the engine's adapters vs the trainer's at every sync
    # lora_A's initialisation (lora_B starts at 0, so a new adapter leaves the model unchanged): "kaiming"
    # (PEFT's default, kaiming_uniform a=√5) | "xavier" (xavier_uniform, verl's Megatron default)
    init_A: LoraInit = "kaiming"
