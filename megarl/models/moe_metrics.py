"""The MoE routers' auxiliary losses as training metrics.

On every training forward megatron's routers add each layer's load-balancing loss and z-loss (divided by
their coefficients) into megatron's layer-wise tracker (moe_utils.get_moe_layer_wise_logging_tracker);
`router_loss_metrics` reads them after an optimizer step, as megatron's training loop does
(track_moe_metrics), with gloo-safe reductions (gloo has no AVG): per loss, the mean over the layers and
the micro-batches, averaged over the data-parallel ranks.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

# megatron's tracker names -> megarl's metric names (under <role>/)
METRIC_NAMES = {
    "load_balancing_loss": "moe_aux_loss",
    "seq_load_balancing_loss": "moe_seq_aux_loss",
    "global_load_balancing_loss": "moe_global_aux_loss",
    "z_loss": "moe_z_loss",
}


def router_loss_metrics(num_layers: int, num_microbatches: int) -> dict[str, float]:
    """Collective over the role's ranks: the router losses tracked since the last call (then cleared);
    {} when no loss is on (load balancing "none", no z-loss)."""
    from megatron.core import parallel_state as ps
    from megatron.core.transformer.moe.moe_utils import (
        clear_aux_losses_tracker,
        get_moe_layer_wise_logging_tracker,
    )

    tracker = get_moe_layer_wise_logging_tracker()
    out = {}
    for name in sorted(tracker):
        entry = tracker[name]
        if not entry["values"].any():  # not tracked since the last call (an earlier model's loss)
            continue
        values = entry["values"].detach().double() / num_microbatches
        dist.all_reduce(values, group=ps.get_pipeline_model_parallel_group())  # each stage: its layers
        if entry.get("reduce_group") is not None:  # a load-balancing loss: the sum of the ranks' parts
            dist.all_reduce(values, group=entry["reduce_group"])
            over = None if entry.get("reduce_group_has_dp") else ps.get_data_parallel_group()
        else:  # z-loss: each rank's mean over its tokens
            over = ps.get_tensor_and_data_parallel_group()
        if over is not None:
            dist.all_reduce(values, group=over)
            values /= dist.get_world_size(over)
        out[METRIC_NAMES.get(name, f"moe_{name}")] = float(torch.sum(values)) / num_layers
    clear_aux_losses_tracker()
    return out
