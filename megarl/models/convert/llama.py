"""HF <-> megatron names and layouts for the Llama family (Llama, Mistral, Qwen2, Qwen3), as data.

`PARAMS` maps each megatron parameter (local layer spec names; `{i}` is the global layer index) to the
HF tensors it is made of and its TP layout (ParamKind). Entries whose HF tensors a given
checkpoint does not have (biases, q/k norms, a tied lm_head) are simply absent from that model.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from megarl.distributed.param_kind import ParamKind
from megarl.models.from_hf import ModelArchitecture


@dataclass(frozen=True)
class ParamMap:
    hf: tuple[str, ...]
    kind: ParamKind
    combine: str = "single"  # "single" | "qkv" | "gate_up": how several HF tensors become one


_L = "model.layers.{i}."
PARAMS: dict[str, ParamMap] = {
    "embedding.word_embeddings.weight": ParamMap(("model.embed_tokens.weight",), ParamKind.VOCAB),
    "decoder.final_layernorm.weight": ParamMap(("model.norm.weight",), ParamKind.REPLICATED),
    "output_layer.weight": ParamMap(("lm_head.weight",), ParamKind.VOCAB),
    "decoder.layers.{i}.input_layernorm.weight": ParamMap(
        (_L + "input_layernorm.weight",), ParamKind.REPLICATED
    ),
    "decoder.layers.{i}.self_attention.linear_qkv.weight": ParamMap(
        tuple(_L + f"self_attn.{p}_proj.weight" for p in "qkv"), ParamKind.QKV, "qkv"
    ),
    "decoder.layers.{i}.self_attention.linear_qkv.bias": ParamMap(
        tuple(_L + f"self_attn.{p}_proj.bias" for p in "qkv"), ParamKind.QKV, "qkv"
    ),
    "decoder.layers.{i}.self_attention.q_layernorm.weight": ParamMap(
        (_L + "self_attn.q_norm.weight",), ParamKind.REPLICATED
    ),
    "decoder.layers.{i}.self_attention.k_layernorm.weight": ParamMap(
        (_L + "self_attn.k_norm.weight",), ParamKind.REPLICATED
    ),
    "decoder.layers.{i}.self_attention.linear_proj.weight": ParamMap(
        (_L + "self_attn.o_proj.weight",), ParamKind.ROW
    ),
    "decoder.layers.{i}.pre_mlp_layernorm.weight": ParamMap(
        (_L + "post_attention_layernorm.weight",), ParamKind.REPLICATED
    ),
    "decoder.layers.{i}.mlp.linear_fc1.weight": ParamMap(
        (_L + "mlp.gate_proj.weight", _L + "mlp.up_proj.weight"), ParamKind.GATE_UP, "gate_up"
    ),
    "decoder.layers.{i}.mlp.linear_fc2.weight": ParamMap((_L + "mlp.down_proj.weight",), ParamKind.ROW),
}

# Critic / reward models: megarl's ScalarHead sits where the LM head was.
SCALAR_HEAD = ParamMap(("score.weight",), ParamKind.REPLICATED)

# Transformer Engine fuses the norms into the following linear layer.
TE_ALIASES = {
    "self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",
    "mlp.linear_fc1.layer_norm_weight": "pre_mlp_layernorm.weight",
}

_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")


def split_layer_name(name: str) -> tuple[str, int | None]:
    """'decoder.layers.7.mlp.linear_fc2.weight' -> ('decoder.layers.{i}.mlp.linear_fc2.weight', 7)."""
    match = _LAYER.match(name)
    if not match:
        return name, None
    suffix = TE_ALIASES.get(match.group(2), match.group(2))
    return "decoder.layers.{i}." + suffix, int(match.group(1))


def param_map(name: str, arch: ModelArchitecture) -> tuple[ParamMap, list[str]]:
    """The map entry and concrete HF names for a megatron parameter name with a global layer index."""
    template, layer = split_layer_name(name)
    if template not in PARAMS:
        raise KeyError(f"no HF mapping for megatron parameter {name!r}")
    if template == "output_layer.weight" and arch.head == "scalar":
        return SCALAR_HEAD, list(SCALAR_HEAD.hf)
    entry = PARAMS[template]
    hf_names = [h.format(i=layer) for h in entry.hf]
    if template == "output_layer.weight" and arch.tie_embeddings:
        hf_names = ["model.embed_tokens.weight"]
    return entry, hf_names


def merge(entry: ParamMap, tensors: list[torch.Tensor], arch: ModelArchitecture) -> torch.Tensor:
    """HF tensors -> the full (TP=1) megatron tensor."""
    if entry.combine == "single":
        return tensors[0]
    if entry.combine == "gate_up":
        return torch.cat(tensors, dim=0)
    q, k, v = tensors
    groups, d = arch.num_kv_heads, arch.head_dim
    per_group = arch.num_heads // groups
    rest = q.shape[1:]
    q = q.reshape(groups, per_group * d, *rest)
    k = k.reshape(groups, d, *rest)
    v = v.reshape(groups, d, *rest)
    return torch.cat([q, k, v], dim=1).reshape(-1, *rest)


def split(entry: ParamMap, full: torch.Tensor, arch: ModelArchitecture) -> list[torch.Tensor]:
    """Inverse of `merge`: the full megatron tensor -> its HF tensors (contiguous)."""
    if entry.combine == "single":
        return [full]
    if entry.combine == "gate_up":
        return [t.contiguous() for t in full.chunk(2, dim=0)]
    groups, d = arch.num_kv_heads, arch.head_dim
    per_group = arch.num_heads // groups
    rest = full.shape[1:]
    grouped = full.reshape(groups, (per_group + 2) * d, *rest)
    q, k, v = grouped.split([per_group * d, d, d], dim=1)
    return [t.reshape(-1, *rest).contiguous() for t in (q, k, v)]


def megatron_names(arch: ModelArchitecture) -> list[str]:
    """Every full-model megatron parameter name this architecture has, in HF order."""
    names = ["embedding.word_embeddings.weight"]
    for i in range(arch.num_layers):
        for template in PARAMS:
            if not template.startswith("decoder.layers."):
                continue
            if template.endswith("linear_qkv.bias") and not arch.qkv_bias:
                continue
            if "_layernorm.weight" in template and "self_attention" in template and not arch.qk_norm:
                continue
            names.append(template.format(i=i))
    names.append("decoder.final_layernorm.weight")
    if not arch.tie_embeddings or arch.head == "scalar":
        names.append("output_layer.weight")
    return names
