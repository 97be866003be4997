"""Build the GPTModel chunks this rank owns: Transformer Engine layers on GPU, plain torch on CPU."""

from __future__ import annotations

import torch

from megarl.config.schema import padded_vocab_size
from megarl.distributed.layout import ParallelLayout
from megarl.distributed.platform import platform
from megarl.models.cpu_gemm import install_cpu_gemm
from megarl.models.from_hf import ModelArchitecture
from megarl.models.heads import attach_scalar_head
from megarl.models.rotary import install_fused_rope


def layer_spec(arch: ModelArchitecture, use_te: bool | None = None):
    from megatron.core.models.gpt import gpt_layer_specs

    if use_te is None:
        use_te = platform().transformer_engine
    if use_te:
        return gpt_layer_specs.get_gpt_layer_with_transformer_engine_spec(qk_layernorm=arch.qk_norm)
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    from megarl.models.rms_norm import RMSNorm
    from megarl.models.sdpa_attention import SdpaDotProductAttention
    from megarl.models.swiglu import SwiGLU

    spec = gpt_layer_specs.get_gpt_layer_local_spec(qk_layernorm=arch.qk_norm, normalization="RMSNorm")
    layer, attention = spec.submodules, spec.submodules.self_attention.submodules
    attention.core_attention = SdpaDotProductAttention  # fused on CPU
    layer.mlp.submodules.activation_func = SwiGLU  # no concatenation in its backward
    for owner, name in (
        (layer, "input_layernorm"),
        (layer, "pre_mlp_layernorm"),
        (attention, "q_layernorm"),
        (attention, "k_layernorm"),
    ):
        if getattr(owner, name) is WrappedTorchNorm:  # torch's norm (apex's, where installed, stays)
            setattr(owner, name, RMSNorm)  # a shorter backward on CPU
    return spec


def attends_packed_thd(chunks: list[torch.nn.Module]) -> bool:
    """Whether these chunks attend packed sequences in THD layout (cu_seqlens, no mask): Transformer
    Engine's attention, or megarl's SDPA attention in every layer; otherwise (attention dropout on CPU)
    a packed micro-batch needs a block-causal mask over its whole row."""
    if platform().transformer_engine:
        return True
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    from megarl.models.sdpa_attention import SdpaDotProductAttention

    cores = [m for chunk in chunks for m in chunk.modules() if isinstance(m, DotProductAttention)]
    return all(isinstance(m, SdpaDotProductAttention) and m.handles_packed for m in cores)


def uses_spec_activation(spec) -> bool:
    """Whether the MLP applies the spec's activation module (megarl's SwiGLU) to the whole fc1 output:
    megatron reads that from `config.use_te_activation_func` (a misnomer here: no Transformer Engine)."""
    return spec.submodules.mlp.submodules.activation_func is not None


def build_model_chunks(
    arch: ModelArchitecture,
    layout: ParallelLayout,
    dtype: str = "fp32",
    make_vocab_size_divisible_by: int = 128,
    padded_vocab: int | None = None,
    recompute: bool = False,
) -> list[torch.nn.Module]:
    """The GPTModel chunks (one per virtual pipeline stage) of this rank; megatron must be initialised."""
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel

    config = arch.transformer_config(layout, dtype, recompute)
    spec = layer_spec(arch)
    config.use_te_activation_func = uses_spec_activation(spec)
    config.apply_rope_fusion = install_fused_rope(config)  # megarl's torch kernel where TE has none
    install_cpu_gemm()  # OpenBLAS for the linear layers where it beats torch's MKL (AMD CPUs)
    vocab = padded_vocab or padded_vocab_size(arch.vocab_size, make_vocab_size_divisible_by, layout.tp)
    chunks = []
    for vp_stage in range(layout.vpp or 1):
        stage = vp_stage if layout.vpp else None
        model = GPTModel(
            config=config,
            transformer_layer_spec=spec,
            pre_process=parallel_state.is_pipeline_first_stage(ignore_virtual=False, vp_stage=stage),
            post_process=parallel_state.is_pipeline_last_stage(ignore_virtual=False, vp_stage=stage),
            vp_stage=stage,
            **arch.gpt_model_kwargs(vocab),
        )
        if arch.head == "scalar" and model.post_process:
            attach_scalar_head(model)
        chunks.append(model.to(dtype=config.params_dtype))
    return chunks
