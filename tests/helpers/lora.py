"""PEFT adapters for the LoRA tests, made by `peft` itself on the transformers model."""

from __future__ import annotations

from pathlib import Path

# a mixed choice on purpose: k and gate left out, so the fused linears carry some projections only
MIXED_TARGETS = ["q_proj", "v_proj", "o_proj", "up_proj", "down_proj"]


def make_peft_adapter(
    base_dir: str | Path,
    out_dir: str | Path,
    targets: list[str] | None = None,
    r: int = 4,
    alpha: int = 8,
    seed: int = 3,
) -> Path:
    """A PEFT LoRA adapter with random A and B (init_lora_weights=False) for the model at `base_dir`."""
    import peft
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    torch.manual_seed(seed)
    config = peft.LoraConfig(
        r=r, lora_alpha=alpha, target_modules=targets or MIXED_TARGETS, init_lora_weights=False
    )
    peft.get_peft_model(model, config).save_pretrained(out_dir)
    return Path(out_dir)
