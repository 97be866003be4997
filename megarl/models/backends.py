"""The layers a model is built from, chosen once per process from the platform (megatron-core's backend
spec providers).

megatron-core assembles a transformer layer from a `BackendSpecProvider`: which column/row-parallel
linear, norm, core attention and activation classes a backend uses. megarl has two:

- `TransformerEngineSpecProvider` where Transformer Engine can be built (GPU): megatron's own TE layer
  spec, unchanged;
- `TorchSpecProvider` elsewhere (CPU, or a GPU without TE): megatron's local layer spec with megarl's
  modules — SDPA core attention, SwiGLU over the whole fc1 output, megatron-signature RMSNorm (with the
  shorter backward on CPU), and the Column/RowParallelLinear that multiply through OpenBLAS where
  `openblas_chosen()` (output layer included) — plus megarl's RoPE kernels.

`spec_provider()` picks one from the platform; `build_model_chunks` builds with it, or with the provider
it is given. Building a model patches nothing process-wide.
"""

from __future__ import annotations

import functools
from typing import Protocol

import torch
from megatron.core.extensions.transformer_engine_spec_provider import TESpecProvider
from megatron.core.fusions.fused_bias_dropout import get_bias_dropout_add
from megatron.core.models.backends import BackendSpecProvider, LocalSpecProvider
from megatron.core.models.gpt.gpt_layer_specs import (
    get_gpt_layer_with_transformer_engine_spec,
    get_mlp_module_spec_for_backend,
)
from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
from megatron.core.transformer.attention import SelfAttention, SelfAttentionSubmodules
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.identity_op import IdentityOp
from megatron.core.transformer.mlp import MLPSubmodules
from megatron.core.transformer.moe.experts import SequentialMLP
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.transformer.transformer_layer import TransformerLayer, TransformerLayerSubmodules

from megarl.distributed.platform import platform
from megarl.models.cpu_gemm import openblas_chosen
from megarl.models.from_hf import ModelArchitecture
from megarl.models.openblas_linear import OpenBlasColumnParallelLinear, OpenBlasRowParallelLinear
from megarl.models.rms_norm import CPURMSNorm, RMSNorm
from megarl.models.rotary import fill_megatron_rope_slots, rope_fusion_applies
from megarl.models.sdpa_attention import SdpaDotProductAttention
from megarl.models.swiglu import SwiGLU


class LayerSpecProvider(BackendSpecProvider, Protocol):
    """A backend spec provider that also assembles megarl's GPT layer and finishes the model around it."""

    gemm: str  # what the linear layers multiply with, for reports: "openblas" or "torch"

    def layer_spec(self, arch: ModelArchitecture) -> ModuleSpec:
        """The transformer layer spec of `arch`."""
        ...

    def configure(self, config: TransformerConfig) -> None:
        """Set the config fields through which megatron uses this backend's modules."""
        ...

    def adopt_output_layer(self, model: torch.nn.Module) -> None:
        """Give a built GPTModel's output layer (built by GPTModel itself, not from the spec) this
        backend's linear class."""
        ...


class TorchSpecProvider(LocalSpecProvider):
    """megatron's local (plain torch) layers with megarl's modules; `cpu_kernels`: the norm's shorter
    CPU backward; `openblas`: linear layers multiplying through OpenBLAS (fp32 CPU tensors)."""

    def __init__(self, cpu_kernels: bool = True, openblas: bool = False) -> None:
        self.cpu_kernels, self.openblas = cpu_kernels, openblas
        self.gemm = "openblas" if openblas else "torch"

    def column_parallel_linear(self) -> type:
        return OpenBlasColumnParallelLinear if self.openblas else ColumnParallelLinear

    def row_parallel_linear(self) -> type:
        return OpenBlasRowParallelLinear if self.openblas else RowParallelLinear

    def layer_norm(self, rms_norm: bool = False, for_qk: bool = False) -> type:
        if rms_norm:
            return CPURMSNorm if self.cpu_kernels else RMSNorm
        return super().layer_norm(rms_norm, for_qk)

    def core_attention(self) -> type:
        return SdpaDotProductAttention  # fused; megatron's materialises the scores

    def activation_func(self) -> type:
        return SwiGLU  # no concatenation in its backward

    def grouped_mlp_modules(self, moe_use_grouped_gemm: bool, moe_use_legacy_grouped_gemm: bool):
        # MoE experts: megatron's SequentialMLP (one MLP per local expert) of this backend's linears;
        # GroupedMLP needs the grouped_gemm CUDA package
        return SequentialMLP, MLPSubmodules(
            linear_fc1=self.column_parallel_linear(), linear_fc2=self.row_parallel_linear()
        )

    def layer_spec(self, arch: ModelArchitecture) -> ModuleSpec:
        return local_layer_spec(self, arch.qk_norm, arch.num_experts)

    def configure(self, config: TransformerConfig) -> None:
        # megatron applies the spec's activation module to the whole fc1 output only with this flag
        # (a misnomer here: no Transformer Engine is used)
        config.use_te_activation_func = True
        config.apply_rope_fusion = rope_fusion_applies(config)  # megarl's kernels where TE has none

    def adopt_output_layer(self, model: torch.nn.Module) -> None:
        # Swapping the built layer's class keeps its parameters, tied weight and buffers: the OpenBLAS
        # class is megatron's with only `_forward_impl` changed.
        layer = getattr(model, "output_layer", None)
        if type(layer) is ColumnParallelLinear:
            layer.__class__ = self.column_parallel_linear()


class TransformerEngineSpecProvider(TESpecProvider):
    """Transformer Engine's layers: megatron's TE layer spec (megatron assembles it from its
    TESpecProvider), with megatron's own settings."""

    gemm = "torch"  # not megarl's OpenBLAS

    def layer_spec(self, arch: ModelArchitecture) -> ModuleSpec:
        # MoE experts as SequentialMLP (per-expert TE linears): the parameter names of the CPU path
        return get_gpt_layer_with_transformer_engine_spec(
            num_experts=arch.num_experts or None, moe_grouped_gemm=False, qk_layernorm=arch.qk_norm
        )

    def configure(self, config: TransformerConfig) -> None:
        pass

    def adopt_output_layer(self, model: torch.nn.Module) -> None:
        pass


def local_layer_spec(backend: BackendSpecProvider, qk_norm: bool, num_experts: int = 0) -> ModuleSpec:
    """megatron's `get_gpt_layer_local_spec(num_experts=num_experts or None, qk_layernorm=qk_norm,
    normalization="RMSNorm")` (no MLA) assembled from `backend` (megatron's function always uses its own
    LocalSpecProvider), the MLP applying the backend's activation module where it has one; `num_experts`
    > 0: a mixture-of-experts MLP."""
    norm = backend.layer_norm(rms_norm=True, for_qk=False)
    qk_layernorm = backend.layer_norm(rms_norm=True, for_qk=True) if qk_norm else IdentityOp
    return ModuleSpec(
        module=TransformerLayer,
        submodules=TransformerLayerSubmodules(
            input_layernorm=norm,
            self_attention=ModuleSpec(
                module=SelfAttention,
                params={"attn_mask_type": AttnMaskType.causal},
                submodules=SelfAttentionSubmodules(
                    linear_qkv=backend.column_parallel_linear(),
                    core_attention=backend.core_attention(),
                    linear_proj=backend.row_parallel_linear(),
                    q_layernorm=qk_layernorm,
                    k_layernorm=qk_layernorm,
                ),
            ),
            self_attn_bda=get_bias_dropout_add,
            pre_mlp_layernorm=norm,
            mlp=get_mlp_module_spec_for_backend(
                backend=backend, num_experts=num_experts or None, use_te_activation_func=True
            ),
            mlp_bda=get_bias_dropout_add,
            sharded_state_dict_keys_map={
                "input_layernorm.": "self_attention.linear_qkv.layer_norm_",
                "pre_mlp_layernorm.": "mlp.linear_fc1.layer_norm_",
            },
        ),
    )


@functools.cache
def spec_provider() -> LayerSpecProvider:
    """This process's layers, chosen once from the platform: Transformer Engine's where it can be built,
    megarl's torch layers otherwise. Choosing these also puts megarl's RoPE kernels in megatron's
    fused-RoPE slots, the one place megatron reads a RoPE kernel from (`models/rotary.py` says why)."""
    if platform().transformer_engine:
        return TransformerEngineSpecProvider()
    fill_megatron_rope_slots()
    return TorchSpecProvider(cpu_kernels=not platform().is_cuda, openblas=openblas_chosen())
