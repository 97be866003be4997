"""MoE routing replay in the Megatron workers (`actor.router_replay`; the mechanism:
megarl.models.moe_replay).

A worker whose role replays routes holds a `ModelRoutes` over its chunks (`worker.model_routes`); every
micro-batch then replays the routes of the batch's `routed_experts` column (megarl.workers.sequences
lays them out per micro-batch) or routes live where the batch has none. A recording forward leaves each
micro-batch's live routes on this rank's tokens and MoE layers; `gathered_rows` assembles them per row
(sequence-parallel slices gathered over TP, pipeline stages' layers combined over PP) and
`routes_column` aligns them with the batch's input_ids as the column the trainer passes on.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.distributed as dist

from megarl.models.moe_replay import MISSING, ROUTE_DTYPE, rows_of_microbatch

# the old-log-prob forward's own routes under R3 ([n, P+R, L, k], as routed_experts): the trainer compares
# them with the engine's (router disagreement) and drops them
LIVE_ROUTES = "live_routed_experts"


@contextlib.contextmanager
def recording(model_routes) -> Iterator[None]:
    """The forwards inside the block keep their routers' live choices (mb["recorded_routes"])."""
    model_routes.record(True)
    try:
        yield
    finally:
        model_routes.record(False)


def gathered_rows(
    microbatches: list[dict], lengths: list[int], sequence_parallel: bool
) -> list[torch.Tensor]:
    """Each row's live routes [lengths[row], L, k] from a recording forward over `microbatches`, on every
    rank of the model replica (collective over its TP and PP groups)."""
    from megatron.core import parallel_state as ps

    rows: dict[int, torch.Tensor] = {}
    for mb in microbatches:
        routes = mb.pop("recorded_routes").to(torch.int32)  # gloo has no int16 collectives
        if sequence_parallel and ps.get_tensor_model_parallel_world_size() > 1:
            pieces = [torch.empty_like(routes) for _ in range(ps.get_tensor_model_parallel_world_size())]
            dist.all_gather(pieces, routes, group=ps.get_tensor_model_parallel_group())
            routes = torch.cat(pieces)
        if ps.get_pipeline_model_parallel_world_size() > 1:  # each stage knows its own layers (-1 elsewhere)
            dist.all_reduce(routes, op=dist.ReduceOp.MAX, group=ps.get_pipeline_model_parallel_group())
        routes = routes.to(ROUTE_DTYPE)
        rows.update(rows_of_microbatch(routes.cpu(), {k: v.cpu() for k, v in mb.items()}, lengths))
    return [rows[r] for r in range(len(lengths))]


def routes_column(rows: list[torch.Tensor], attention_mask: torch.Tensor) -> torch.Tensor:
    """Per-row routes at the real tokens -> [n, P+R, L, k] aligned with input_ids, -1 on padding."""
    n, width = attention_mask.shape
    out = torch.full((n, width, *rows[0].shape[1:]), MISSING, dtype=ROUTE_DTYPE)
    for i, routes in enumerate(rows):
        out[i][attention_mask[i].bool()] = routes.to(ROUTE_DTYPE)
    return out
