"""Rank code for test_cpu_shims: for each CPU shim, the megatron call that fails without it.

Run under torchrun with 2 ranks. For every shim: remove it, run its check (expect an exception),
re-apply it, run the check again (expect success). Rank 0 reports {shim: [failed_without, ok_with]}.
"""

from __future__ import annotations

import tempfile

import torch
import torch.distributed as dist

from megarl.distributed import cpu_shims
from megarl.distributed.layout import ParallelLayout
from megarl.models.build import build_model_chunks
from megarl.models.forward import run_microbatches
from megarl.models.from_hf import ModelArchitecture

ARCH = ModelArchitecture.from_hf_config(
    {
        "model_type": "llama",
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
        "vocab_size": 300,
    }
)

MOE_ARCH = ModelArchitecture.from_hf_config(
    {
        **ARCH.hf_config,
        "model_type": "qwen3_moe",
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "norm_topk_prob": True,
    }
)


def _model(sequence_parallel: bool = False, recompute: bool = False):
    layout = ParallelLayout(world_size=2, tp=2, sequence_parallel=sequence_parallel)
    layout.initialize()
    return build_model_chunks(ARCH, layout, recompute=recompute)


def check_current_device():
    _model()


def check_rng():
    from megatron.core import tensor_parallel

    ParallelLayout(world_size=2, tp=2).initialize(seed=7)
    with tensor_parallel.get_cuda_rng_tracker().fork():
        torch.rand(1)
    # activation recomputation (gradient checkpointing) saves and restores the generator states
    x = torch.ones(3, requires_grad=True)
    tensor_parallel.checkpoint(lambda t: (t * 2).sum(), False, x).backward()


def check_cuda_literal():
    chunks = _model()
    batch = [{"input_ids": torch.zeros(1, 8, dtype=torch.long)}]
    run_microbatches(chunks, batch, lambda mb, logits: (logits.sum(), {}), forward_only=True)


def check_cuda_sync():
    from megatron.core import dist_checkpointing

    chunks = _model()
    with tempfile.TemporaryDirectory() as tmp:
        path = [tmp]
        dist.broadcast_object_list(path)
        dist_checkpointing.save({"model": chunks[0].sharded_state_dict()}, path[0])
        dist.barrier()


def check_cuda_type_str():
    from megatron.core.optimizer.clip_grads import clip_grad_by_total_norm_fp32

    param = torch.nn.Parameter(torch.ones(4))
    param.grad = torch.ones(4)
    clip_grad_by_total_norm_fp32([param], max_norm=1.0, total_norm=2.0)


def check_sp_norm():
    _model(sequence_parallel=True)


def check_recompute_mask():
    chunks = _model(recompute=True)
    # SdpaDotProductAttention needs no mask; its fallback (megatron's own attention, taken e.g. for
    # attention dropout in training) rebuilds the causal mask during the recomputed forward
    for module in chunks[0].modules():
        if type(module).__name__ == "SdpaDotProductAttention":
            module.attention_dropout.p = 0.1
    batch = [{"input_ids": torch.zeros(1, 8, dtype=torch.long)}]
    run_microbatches(chunks, batch, lambda mb, logits: (logits.sum(), {}), forward_only=False)


def check_moe_dtoh_stream():
    layout = ParallelLayout(world_size=2, ep=2)
    layout.initialize()
    build_model_chunks(MOE_ARCH, layout)  # the dispatcher's constructor makes the CUDA stream


def check_moe_router_gemm():
    layout = ParallelLayout(world_size=2, ep=2)
    layout.initialize()
    chunks = build_model_chunks(MOE_ARCH, layout)
    batch = [{"input_ids": torch.arange(8).unsqueeze(0)}]
    run_microbatches(chunks, batch, lambda mb, logits: (logits.sum(), {}), forward_only=False)


def check_uneven_split():
    # With TP and EP (> 2 ranks) the dispatcher gathers each rank's routed tokens over TP in uneven
    # splits and reduce-scatters them back: megatron's calls, on rank r's r + 1 tokens
    from megatron.core.tensor_parallel import mappings

    ParallelLayout(world_size=2, tp=2).initialize()
    rank, splits = dist.get_rank(), [1, 2]
    tokens = torch.full((rank + 1, 4), float(rank), requires_grad=True)
    gathered = mappings.gather_from_sequence_parallel_region(tokens, output_split_sizes=splits)
    assert gathered.tolist() == [[0.0] * 4, [1.0] * 4, [1.0] * 4]
    back = mappings.reduce_scatter_to_sequence_parallel_region(gathered, input_split_sizes=splits)
    assert torch.equal(back, 2 * tokens.detach())
    back.sum().backward()  # the gather's backward: the uneven reduce-scatter
    assert torch.equal(tokens.grad, torch.full_like(tokens, 2.0))


CHECKS = {
    "current_device": check_current_device,
    "rng": check_rng,
    "cuda_literal": check_cuda_literal,
    "cuda_sync": check_cuda_sync,
    "cuda_type_str": check_cuda_type_str,
    "sp_norm": check_sp_norm,
    "recompute_mask": check_recompute_mask,
    "moe_dtoh_stream": check_moe_dtoh_stream,
    "moe_router_gemm": check_moe_router_gemm,
    "uneven_split": check_uneven_split,
}


def _outcome(check) -> tuple[bool, str]:
    try:
        check()
        ok = True, ""
    except Exception as e:  # the point is to observe the failure
        ok = False, f"{type(e).__name__}: {str(e)[:160]}"
    # Ranks must stay in step: both must have failed or succeeded before the next collective.
    flags = torch.tensor([int(ok[0])])
    dist.all_reduce(flags, op=dist.ReduceOp.MIN)
    return bool(flags.item()), ok[1]


def main(argv: list[str]) -> dict:
    assert set(CHECKS) == set(cpu_shims.SHIMS), "every shim needs a check"
    results = {}
    for name, check in CHECKS.items():
        cpu_shims.remove_cpu_shim(name)
        ok_without, error = _outcome(check)
        cpu_shims.apply_cpu_shims()
        ok_with, error_with = _outcome(check)
        results[name] = {
            "ok_without": ok_without,
            "error_without": error,
            "ok_with": ok_with,
            "error_with": error_with,
        }
        ParallelLayout.destroy()
    return results
