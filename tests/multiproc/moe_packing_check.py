"""Rank code for test_moe_packing (2 ranks): a tiny Qwen2-MoE at EP2, the all-to-all token dispatcher
over gloo, forward on one packed THD micro-batch of two sequences (10 + 6 tokens, positions restarting,
cu_seqlens) and on the two sequences apart; and the names of its router modules. argv: the HF
checkpoint dir."""

from __future__ import annotations

import torch

from megarl.distributed.layout import ParallelLayout
from megarl.models.build import build_model_chunks
from megarl.models.convert.hf_io import HFCheckpointReader
from megarl.models.convert.loader import load_hf_into_chunks
from megarl.models.forward import gather_logits, run_microbatches
from megarl.models.from_hf import ROUTER_MODULE, ModelArchitecture


def main(argv: list[str]) -> dict:
    (hf,) = argv
    arch = ModelArchitecture.from_pretrained(hf)
    layout = ParallelLayout(world_size=2, ep=2)
    layout.initialize()
    chunks = build_model_chunks(arch, layout)
    load_hf_into_chunks(chunks, arch, HFCheckpointReader(hf), tp_rank=0, tp=1)
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randint(0, arch.vocab_size, (1, n), generator=g) for n in (10, 6))
    packed = {
        "input_ids": torch.cat([a, b], dim=1),
        "position_ids": torch.cat([torch.arange(10), torch.arange(6)]).unsqueeze(0),
        "cu_seqlens": torch.tensor([0, 10, 16], dtype=torch.int32),
    }

    def logits(mb, out):
        return out.sum() * 0, {"logits": gather_logits(out, arch.vocab_size).detach()}

    [together] = run_microbatches(chunks, [packed], logits, forward_only=True)
    apart = run_microbatches(chunks, [{"input_ids": a}, {"input_ids": b}], logits, forward_only=True)
    diff = (together["logits"] - torch.cat([o["logits"] for o in apart], dim=1)).abs().max()
    routers = sorted(n for n, m in chunks[0].named_modules() if type(m).__name__ == "TopKRouter")
    layout.destroy()
    return {
        "max_abs_logit_diff": diff.item(),
        "logits_abs_max": together["logits"].abs().max().item(),
        "routers": routers,
        "router_names": sorted(ROUTER_MODULE.format(i=i) for i in range(arch.num_layers)),
    }
