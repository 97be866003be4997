"""HF <-> megatron names and layouts for the Llama family (Llama, Mistral, Qwen2, Qwen3) and its MoE
relatives (Qwen2-MoE, Qwen3-MoE), as data.

`PARAMS` maps each megatron parameter (local layer spec names; `{i}` is the global layer index, `{e}` the
global expert index) to the HF tensors it is made of and its TP layout (ParamKind). Entries whose HF
tensors a given checkpoint does not have (biases, q/k norms, a tied lm_head, a dense MLP in a MoE model)
are simply absent from that model. Routed experts (`expert=True`) are spread over expert-parallel ranks
whole (each holds num_experts/ep of them, `local_experts.{l}` being global expert ep_rank·(num_experts/ep)
+ l) and split by their ParamKind over the expert-tensor-parallel group.
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
    expert: bool = False  # one routed expert's: split over EP by expert, over expert-TP by `kind`


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
_X = "decoder.layers.{i}.mlp.experts.local_experts.{e}."
MOE_PARAMS: dict[str, ParamMap] = {
    "decoder.layers.{i}.mlp.router.weight": ParamMap((_L + "mlp.gate.weight",), ParamKind.REPLICATED),
    _X + "linear_fc1.weight": ParamMap(
        (_L + "mlp.experts.{e}.gate_proj.weight", _L + "mlp.experts.{e}.up_proj.weight"),
        ParamKind.GATE_UP,
        "gate_up",
        expert=True,
    ),
    _X + "linear_fc2.weight": ParamMap(
        (_L + "mlp.experts.{e}.down_proj.weight",), ParamKind.ROW, expert=True
    ),
}
SHARED_EXPERT_PARAMS: dict[str, ParamMap] = {
    "decoder.layers.{i}.mlp.shared_experts.linear_fc1.weight": ParamMap(
        (_L + "mlp.shared_expert.gate_proj.weight", _L + "mlp.shared_expert.up_proj.weight"),
        ParamKind.GATE_UP,
        "gate_up",
    ),
    "decoder.layers.{i}.mlp.shared_experts.linear_fc2.weight": ParamMap(
        (_L + "mlp.shared_expert.down_proj.weight",), ParamKind.ROW
    ),
    "decoder.layers.{i}.mlp.shared_experts.gate_weight": ParamMap(
        (_L + "mlp.shared_expert_gate.weight",), ParamKind.REPLICATED
    ),
}
_DENSE_MLP = ("decoder.layers.{i}.mlp.linear_fc1.weight", "decoder.layers.{i}.mlp.linear_fc2.weight")

# Critic / reward models: megarl's ScalarHead sits where the LM head was.
SCALAR_HEAD = ParamMap(("score.weight",), ParamKind.REPLICATED)

# Transformer Engine fuses the norms into the following linear layer.
TE_ALIASES = {
    "self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",
    "mlp.linear_fc1.layer_norm_weight": "pre_mlp_layernorm.weight",
}

_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")
_EXPERT = re.compile(r"\.local_experts\.(\d+)\.")


def split_layer_name(name: str) -> tuple[str, int | None]:
    """'decoder.layers.7.mlp.linear_fc2.weight' -> ('decoder.layers.{i}.mlp.linear_fc2.weight', 7)."""
    match = _LAYER.match(name)
    if not match:
        return name, None
    suffix = TE_ALIASES.get(match.group(2), match.group(2))
    return "decoder.layers.{i}." + suffix, int(match.group(1))


def split_expert_name(template: str) -> tuple[str, int | None]:
    """'decoder.layers.{i}.mlp.experts.local_experts.5.linear_fc1.weight' -> ('...local_experts.{e}...', 5)."""
    match = _EXPERT.search(template)
    if not match:
        return template, None
    return template[: match.start()] + ".local_experts.{e}." + template[match.end() :], int(match.group(1))


def params_of(arch: ModelArchitecture) -> dict[str, ParamMap]:
    """The map entries of `arch`: the dense MLP's, or the router's and experts' (and the shared
    expert's) of a mixture-of-experts model."""
    if arch.moe is None:
        return PARAMS
    dense = {k: v for k, v in PARAMS.items() if k not in _DENSE_MLP}
    return {**dense, **MOE_PARAMS, **(SHARED_EXPERT_PARAMS if arch.moe.shared_expert_size else {})}


def param_map(name: str, arch: ModelArchitecture) -> tuple[ParamMap, list[str]]:
    """The map entry and concrete HF names for a megatron parameter name with a global layer index (and
    a global expert index)."""
    template, layer = split_layer_name(name)
    template, expert = split_expert_name(template)
    params = params_of(arch)
    if template not in params:
        raise KeyError(f"no HF mapping for megatron parameter {name!r} of a {arch.family} model")
    if template == "output_layer.weight" and arch.head == "scalar":
        return SCALAR_HEAD, list(SCALAR_HEAD.hf)
    entry = params[template]
    hf_names = [h.format(i=layer, e=expert) for h in entry.hf]
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
        for template, entry in params_of(arch).items():
            if not template.startswith("decoder.layers."):
                continue
            if template.endswith("linear_qkv.bias") and not arch.qkv_bias:
                continue
            if "_layernorm.weight" in template and "self_attention" in template and not arch.qk_norm:
                continue
            experts = range(arch.num_experts) if entry.expert else [None]
            names.extend(template.format(i=i, e=e) for e in experts)
    names.append("decoder.final_layernorm.weight")
    if not arch.tie_embeddings or arch.head == "scalar":
        names.append("output_layer.weight")
    return names


# transformers >= 5 holds a MoE layer's experts fused in memory (`mlp.experts.gate_up_proj` [E, 2I, H],
# `mlp.experts.down_proj` [E, H, I]) and writes them per expert to the checkpoint.
_FUSED_EXPERTS = {"gate_up_proj": ("gate_proj", "up_proj"), "down_proj": ("down_proj",)}
_FUSED = re.compile(r"^(.*\.mlp\.experts)\.(gate_up_proj|down_proj)$")


def checkpoint_tensors(named: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A transformers model's named tensors (parameters or their gradients) under its checkpoint names:
    fused expert tensors split per expert; others unchanged."""
    out = {}
    for name, tensor in named.items():
        match = _FUSED.match(name)
        if not match:
            out[name] = tensor
            continue
        prefix, fused = match.groups()
        for e, per_expert in enumerate(tensor):
            for part, piece in zip(_FUSED_EXPERTS[fused], per_expert.chunk(len(_FUSED_EXPERTS[fused]))):
                out[f"{prefix}.{e}.{part}.weight"] = piece
    return out
