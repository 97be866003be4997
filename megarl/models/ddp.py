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

import weakref

import torch

from megarl.distributed.layout import ParallelLayout

# the wrappers made here: released at the layout's teardown (ParallelLayout.on_destroy)
_wrapped: weakref.WeakSet = weakref.WeakSet()


def release_wrappers() -> None:
    """Let every DDP wrapper made here be freed. Megatron's DDP keeps its parameters' gradient
    accumulators (C++ autograd nodes) whose hooks hold the wrapper: a cycle through C++ that Python's
    collector cannot see (a graph a module keeps from its last forward, such as megatron's MoE dispatcher's
    `probs`, keeps the accumulators alive), which kept each wrapped model, and the gloo groups it holds (3
    threads each), alive for the life of the process. The hooks go: a released wrapper reduces no
    gradients, so call this only when its layout is gone."""
    for ddp in list(_wrapped):
        for (
            accumulator
        ) in ddp.grad_accs:  # megatron keeps no handles: reach the node's hook dict via a new one
            hooks = accumulator.register_hook(_no_hook).hooks_dict_ref()
            if hooks is not None:
                hooks.clear()
        ddp.grad_accs.clear()
    _wrapped.clear()


def _no_hook(*_) -> None:
    return None


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
    _wrapped.update(wrapped)
    ParallelLayout.on_destroy(release_wrappers)
    config.no_sync_func = wrapped[0].no_sync if len(wrapped) == 1 else [w.no_sync for w in wrapped]
    config.finalize_model_grads_func = finalize_model_grads
    return wrapped
