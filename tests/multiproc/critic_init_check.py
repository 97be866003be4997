"""Rank code for test_critic_init: a critic built from a policy LM checkpoint (one rank)."""

from __future__ import annotations

import torch

from megarl.distributed.layout import ParallelLayout
from megarl.models.build import build_model_chunks
from megarl.models.convert.hf_io import HFCheckpointReader
from megarl.models.convert.loader import load_hf_into_chunks
from megarl.models.forward import run_microbatches
from megarl.models.from_hf import ModelArchitecture


def main(argv: list[str]) -> dict:
    hf_dir = argv[0]
    arch = ModelArchitecture.from_pretrained(hf_dir).with_scalar_head()
    ParallelLayout(world_size=1).initialize()
    chunks = build_model_chunks(arch, ParallelLayout(world_size=1))
    reader = HFCheckpointReader(hf_dir)
    loaded = load_hf_into_chunks(chunks, arch, reader, tp_rank=0, tp=1)
    model = chunks[0]
    outs = run_microbatches(
        chunks,
        [{"input_ids": torch.arange(12).unsqueeze(0)}],
        lambda mb, out: (out.sum() * 0, {"shape": list(out.shape)}),
        forward_only=True,
    )
    return {
        "loaded": loaded,
        "params": len(list(model.parameters())),
        "embedding_equal": torch.equal(
            model.embedding.word_embeddings.weight[:1001], reader.get("model.embed_tokens.weight")
        ),
        "head_std": model.output_layer.weight.std().item(),
        "output_shape": outs[0]["shape"],
    }
