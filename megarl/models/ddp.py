"""Wrap model chunks in megatron's DistributedDataParallel and hook it into the pipeline schedules.

After `wrap_ddp`, a non-forward-only `run_microbatches` leaves finished gradients in `param.main_grad`:
averaged over data-parallel ranks, tied embeddings summed across the first and last PP stage, and
norm weights summed over TP where TP ranks see only part of their input (sequence parallel, q/k norms)
— megatron's own finalize_model_grads does all of it.

With `use_distributed_optimizer=True` the parameters move into one contiguous buffer per dtype and
gradients are reduce-scattered instead of all-reduced: each data-parallel rank then holds finished
gradients only for its own shard, which is what megatron's DistributedOptimizer (ZeRO-1) updates.
"""

from __future__ import annotations

import torch


def wrap_ddp(
    chunks: list[torch.nn.Module], grad_reduce_in_fp32: bool = True, use_distributed_optimizer: bool = False
) -> list[torch.nn.Module]:
    """The chunks wrapped in megatron DDP; pass `use_distributed_optimizer` the optimizer's setting."""
    from megatron.core.distributed import (
        DistributedDataParallel,
        DistributedDataParallelConfig,
        finalize_model_grads,
    )

    config = chunks[0].config
    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=grad_reduce_in_fp32,
        overlap_grad_reduce=False,
        use_distributed_optimizer=use_distributed_optimizer,
    )
    wrapped = [
        DistributedDataParallel(config=config, ddp_config=ddp_config, module=chunk, disable_bucketing=i > 0)
        for i, chunk in enumerate(chunks)
    ]
    config.no_sync_func = wrapped[0].no_sync if len(wrapped) == 1 else [w.no_sync for w in wrapped]
    config.finalize_model_grads_func = finalize_model_grads
    return wrapped
