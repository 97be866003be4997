"""A role's transformers model, loaded from its HF checkpoint and sharded with PyTorch FSDP2.

    model = load_model(spec, head="lm")          # actor / reference: AutoModelForCausalLM
    model = load_model(spec, head="value")       # critic: AutoModelForTokenClassification, one label
    model = shard_model(model, spec, group)      # fully_shard per decoder layer, then the root

Every parameter stays an fp32 shard (Shard(0) over the role's data-parallel ranks); a bf16/fp16 role
computes in that dtype through FSDP2's mixed-precision policy, with gradients reduced in fp32. The value
head of a critic started from a causal LM checkpoint is the token-classification head transformers adds
(`score`, drawn from its `_init_weights` with trainer.seed: verl's critic is built the same way).
"""

from __future__ import annotations

from typing import Literal

import torch

from megarl.config.roles import RoleSpec
from megarl.distributed.platform import platform

Head = Literal["lm", "value"]
COMPUTE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def load_model(spec: RoleSpec, head: Head) -> torch.nn.Module:
    """The role's HF model on the compute device, fp32, with `head`; weights a checkpoint lacks (a value
    head) are drawn from trainer.seed, so every rank and every run builds the same."""
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

    model_spec = spec.model
    kwargs = {"dtype": torch.float32, "trust_remote_code": model_spec.trust_remote_code}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        if head == "lm":
            model = AutoModelForCausalLM.from_pretrained(model_spec.path, **kwargs)
        else:
            from transformers import AutoConfig

            config = AutoConfig.from_pretrained(
                model_spec.path, trust_remote_code=model_spec.trust_remote_code
            )
            # one label; no dropout before the value head (transformers' default is 0.1, verl sets 0)
            config.num_labels, config.classifier_dropout = 1, 0.0
            model = AutoModelForTokenClassification.from_pretrained(model_spec.path, config=config, **kwargs)
    model.config.use_cache = False
    return model.to(platform().device)


def decoder_layers(model: torch.nn.Module, wrap_classes: list[str] | None) -> list[torch.nn.Module]:
    """The modules FSDP wraps one by one: instances of `wrap_classes`, else of the model's
    `_no_split_modules` (transformers' own list of its decoder-layer classes)."""
    names = set(wrap_classes or getattr(model, "_no_split_modules", None) or ())
    return [m for m in model.modules() if type(m).__name__ in names]


def shard_model(model: torch.nn.Module, spec: RoleSpec, group) -> torch.nn.Module:
    """`model` sharded by FSDP2 over the process group `group` (the role's data-parallel ranks): each
    decoder layer one unit, the root (embeddings, final norm, head) another. Activation checkpointing
    when the spec recomputes; trained roles in train mode, frozen ones in eval mode without gradients."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    cfg = spec.fsdp
    layers = decoder_layers(model, cfg.wrap_classes)
    if not layers:
        classes = cfg.wrap_classes or getattr(model, "_no_split_modules", None)
        raise ValueError(
            f"{spec.role}: FSDP cannot wrap {type(model).__name__} of {spec.model.path}: no module of "
            f"{classes or 'its decoder-layer classes (the model declares no _no_split_modules)'}; name them in "
            f"{spec.role}.fsdp.wrap_classes"
        )
    if spec.recompute:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    compute = COMPUTE_DTYPES[spec.model.dtype]
    mixed = MixedPrecisionPolicy(
        param_dtype=None if compute == torch.float32 else compute, reduce_dtype=torch.float32
    )
    options = {
        "mesh": DeviceMesh.from_group(group, platform().device.type),
        "mp_policy": mixed,
        "reshard_after_forward": cfg.reshard_after_forward,
        "offload_policy": CPUOffloadPolicy() if cfg.offload_policy else OffloadPolicy(),
    }
    for layer in layers:
        fully_shard(layer, **options)
    fully_shard(model, **options)
    if spec.trainable:
        model.train()
    else:
        model.eval()
        model.requires_grad_(False)
    return model


def shard_frozen(model: torch.nn.Module, group=None) -> torch.nn.Module:
    """A frozen model (a reward model) sharded by FSDP2 over `group` (default: the whole world) for
    inference: each decoder layer one unit, then the root."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    mesh = DeviceMesh.from_group(group or dist.group.WORLD, platform().device.type)
    # a model that declares no decoder-layer classes (an encoder classifier such as BERT) is one unit
    for layer in decoder_layers(model, None):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    model.eval().requires_grad_(False)
    return model


def output_head(model: torch.nn.Module) -> torch.nn.Module:
    """The module that maps hidden states to the outputs a loss reads: the LM head, or the value head."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is None:
        head = getattr(model, "score", None) or getattr(model, "classifier", None)
    if head is None:
        raise ValueError(
            f"{type(model).__name__} has no output head megarl can find (lm_head, score, classifier)"
        )
    return head
