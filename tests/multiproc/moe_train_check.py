"""Rank code for test_moe_train (4 ranks): three AdamW steps of a tiny Qwen2-MoE on one batch at EP1, EP2
(without and with the distributed optimizer) and TP2 x EP2 (+SP): megatron's DDP and optimizer over the
expert-data-parallel groups, the all-to-all dispatcher over gloo. argv: the HF checkpoint dir. Returns
{layout: {"losses": [...], "grad_norms": [...]}, "router_losses": {...}}: the router gradients without and
with the aux/z losses at EP2 and the logged losses beside ones computed from transformers' router logits."""

from __future__ import annotations

import torch
import torch.distributed as dist

from megarl.config.schema import OptimizerConfig
from megarl.distributed.layout import ParallelLayout
from megarl.models.build import build_model_chunks
from megarl.models.convert.hf_io import HFCheckpointReader
from megarl.models.convert.loader import load_hf_into_chunks
from megarl.models.ddp import wrap_ddp
from megarl.models.forward import run_microbatches, vocab_parallel_log_probs
from megarl.models.from_hf import ModelArchitecture

LAYOUTS = {
    "ep1": (1, 1, False),
    "ep2": (1, 2, False),
    "ep2-distopt": (1, 2, True),
    "tp2ep2sp-distopt": (2, 2, True),
}


def _train(arch, hf: str, tokens: torch.Tensor, tp: int, ep: int, distributed: bool) -> dict:
    from megatron.core import parallel_state as ps

    from megarl.models.optimizer import build_optimizer

    layout = ParallelLayout(world_size=dist.get_world_size(), tp=tp, ep=ep, sequence_parallel=tp > 1)
    layout.initialize()
    chunks = build_model_chunks(arch, layout)
    load_hf_into_chunks(chunks, arch, HFCheckpointReader(hf), ps.get_tensor_model_parallel_rank(), tp)
    chunks = wrap_ddp(chunks, use_distributed_optimizer=distributed)
    optimizer = build_optimizer(chunks, OptimizerConfig(lr=1e-3, use_distributed_optimizer=distributed), 3)
    dp, rank = layout.dp, ps.get_data_parallel_rank()
    mine = tokens[rank * len(tokens) // dp : (rank + 1) * len(tokens) // dp]
    batch = [{"input_ids": t[None, :-1], "labels": t[None, 1:]} for t in mine]

    def loss(mb, out):
        token_mean = -vocab_parallel_log_probs(out, mb["labels"], arch.vocab_size).mean()
        return token_mean, {"loss": token_mean.detach().clone()}  # the schedule scales its input in place

    losses, norms = [], []
    for _ in range(3):
        optimizer.zero_grad()
        outs = run_microbatches(chunks, batch, loss, forward_only=False)
        mean = torch.stack([o["loss"] for o in outs]).mean()
        dist.all_reduce(mean, group=ps.get_data_parallel_group())
        losses.append(mean.item() / dp)
        norms.append(optimizer.step()["grad_norm"])
    layout.destroy()
    return {"losses": losses, "grad_norms": norms}


AUX, Z = 0.1, 0.01  # the router loss coefficients of router_losses


def _router_grads(arch, hf: str, tokens: torch.Tensor) -> tuple[list[torch.Tensor], dict]:
    """One forward-backward at EP2 (DP4, one sequence per rank): the routers' gradients and the logged
    router losses."""
    from megatron.core import parallel_state as ps

    from megarl.models.moe_metrics import router_loss_metrics

    layout = ParallelLayout(world_size=dist.get_world_size(), ep=2)
    layout.initialize()
    chunks = build_model_chunks(arch, layout)
    load_hf_into_chunks(chunks, arch, HFCheckpointReader(hf), 0, 1)
    chunks = wrap_ddp(chunks, use_distributed_optimizer=False)
    mine = tokens[ps.get_data_parallel_rank()]
    batch = [{"input_ids": mine[None, :-1], "labels": mine[None, 1:]}]

    def loss(mb, out):
        token_mean = -vocab_parallel_log_probs(out, mb["labels"], arch.vocab_size).mean()
        return token_mean, {}

    run_microbatches(chunks, batch, loss, forward_only=False)
    grads = [p.main_grad.clone() for n, p in chunks[0].named_parameters() if n.endswith("router.weight")]
    logged = router_loss_metrics(arch.num_layers, len(batch))
    layout.destroy()
    return grads, logged


def _hf_router_losses(hf: str, tokens: torch.Tensor, topk: int) -> dict:
    """megatron's per-layer load-balancing loss (E · Σ_e f_e P_e, f over T·topk routed slots) and z-loss
    (mean logsumexp² of the logits), from transformers' router logits: the mean over layers and sequences."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32)
    aux, z = [], []
    with torch.no_grad():
        for seq in tokens:
            for logits in model(seq[None, :-1], output_router_logits=True).router_logits:
                probs = torch.softmax(logits.double(), dim=-1)
                tokens_per_expert = (
                    torch.zeros_like(probs).scatter(1, probs.topk(topk, dim=-1).indices, 1).sum(0)
                )
                n, experts = probs.shape
                aux.append(experts * (tokens_per_expert * probs.sum(0)).sum() / (n * n * topk))
                z.append(torch.logsumexp(logits.double(), dim=-1).pow(2).mean())
    return {"moe_aux_loss": torch.stack(aux).mean().item(), "moe_z_loss": torch.stack(z).mean().item()}


def router_losses(arch, hf: str, tokens: torch.Tensor) -> dict:
    off, logged_off = _router_grads(arch.with_router_losses(0.0, None, "none"), hf, tokens)
    on, logged = _router_grads(arch.with_router_losses(AUX, Z, "aux_loss"), hf, tokens)
    change = max(((a - b).norm() / b.norm()).item() for a, b in zip(on, off))
    return {
        "router_grad_change": change,
        "logged_without": logged_off,
        "logged": logged,
        "reference": _hf_router_losses(hf, tokens, arch.moe_topk),
    }


def main(argv: list[str]) -> dict:
    (hf,) = argv
    arch = ModelArchitecture.from_pretrained(hf)
    tokens = torch.randint(0, arch.vocab_size, (4, 17), generator=torch.Generator().manual_seed(0))
    runs = {name: _train(arch, hf, tokens, *sizes) for name, sizes in LAYOUTS.items()}
    return {**runs, "router_losses": router_losses(arch, hf, tokens)}
