"""Build the GPTModel chunks this rank owns from the platform's layer spec provider (`models/backends.py`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from megarl.config.schema import padded_vocab_size
from megarl.distributed.layout import ParallelLayout
from megarl.distributed.platform import platform
from megarl.models.from_hf import ModelArchitecture
from megarl.models.heads import attach_scalar_head

if TYPE_CHECKING:
    from megarl.models.backends import LayerSpecProvider


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


def build_model_chunks(
    arch: ModelArchitecture,
    layout: ParallelLayout,
    dtype: str = "fp32",
    make_vocab_size_divisible_by: int = 128,
    padded_vocab: int | None = None,
    recompute: bool = False,
    layers: LayerSpecProvider | None = None,
) -> list[torch.nn.Module]:
    """The GPTModel chunks (one per virtual pipeline stage) of this rank, built from `layers` (default:
    the platform's, `spec_provider()`); megatron must be initialised."""
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel

    from megarl.models.backends import spec_provider

    layers = layers or spec_provider()
    config = arch.transformer_config(layout, dtype, recompute)
    layers.configure(config)
    spec = layers.layer_spec(arch)
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
        layers.adopt_output_layer(model)
        if arch.head == "scalar" and model.post_process:
            attach_scalar_head(model)
        chunks.append(model.to(dtype=config.params_dtype))
    return chunks
