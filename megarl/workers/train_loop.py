"""The mini-batch training loop of a trained role (actor, critic) on either backend: epochs × mini-batches ×
micro-batches, one optimizer step per mini-batch.

Loss normalisation: the loss of a mini-batch is defined over the WHOLE mini-batch (all micro-batches on
all data-parallel ranks), so each micro-batch computes its share with the global token/sequence counts
and is scaled back up by (micro-batches × DP size), which the schedule and DDP divide out again. Any
split — DP, micro-batch size, token budget — then gives the same loss and gradient.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from megarl.models.from_hf import ModelArchitecture
from megarl.models.moe_metrics import router_loss_metrics
from megarl.workers.model_worker import ModelWorker, from_last_stage
from megarl.workers.sequences import Sequences


@dataclass(frozen=True)
class GlobalCounts:
    """Denominators of a mini-batch loss, over all its micro-batches and data-parallel ranks."""

    num_tokens: float
    num_seqs: float  # rows
    horizon: int  # response columns R: the constant length of seq-mean-token-sum-norm
    # rows with at least one token to train on: the seq-mean modes' denominator (verl's agg_loss), so rows
    # emptied by rollout rejection do not shrink the loss of the others
    num_trained_seqs: float

    def agg(self) -> dict:
        return {"num_tokens": self.num_tokens, "num_seqs": self.num_trained_seqs, "horizon": self.horizon}


# loss_fn(micro-batch, model output at its response positions [k, R, ...], counts) -> (this micro-batch's
# share of the mini-batch loss, metrics already weighted so that summing them over micro-batches and DP
# ranks gives the mini-batch value)
TrainLossFn = Callable[[dict, torch.Tensor, GlobalCounts], tuple[torch.Tensor, dict[str, torch.Tensor]]]


def train_minibatches(
    worker: ModelWorker,
    seqs: Sequences,
    fields: dict[str, torch.Tensor],
    loss_fn: TrainLossFn,
    mini_batch_size: int,
    epochs: int,
    group: int = 1,
    at: str = "index",
) -> dict[str, float]:
    """`epochs` passes of optimizer steps of `worker` over mini-batches of `mini_batch_size` local
    sequences (`group` consecutive rows always share a micro-batch: see ModelWorker.microbatches);
    `loss_fn` gets the model's output at the micro-batch's `at` positions (the response tokens, or
    "last_index": each sequence's last token). Returns metrics averaged over the optimizer steps (every
    rank returns the same), and
    `bad_updates`: how many of them were skipped for a NaN/inf loss or gradient norm."""
    from megatron.core import parallel_state as ps

    worker.check_loaded()
    optimizer = worker.optimizer
    if optimizer is None:
        raise ValueError(f"the {worker.role} role is frozen: it has no optimizer to train with")
    n = len(seqs)
    if mini_batch_size <= 0 or n % mini_batch_size:
        raise ValueError(
            f"{worker.role}: {n} sequences on this data-parallel rank cannot be split into mini-batches of "
            f"{mini_batch_size}; make the batch a multiple of ppo_mini_batch_size × rollout.n"
        )
    dp_group = ps.get_data_parallel_group(with_context_parallel=True)
    dp_size = dist.get_world_size(dp_group)
    history: list[dict[str, float]] = []
    bad_updates = 0
    for _ in range(epochs):
        for start in range(0, n, mini_batch_size):
            rows = list(range(start, start + mini_batch_size))
            lens = [seqs.response_lens[r] for r in rows]
            counts = torch.tensor([sum(lens), len(lens), sum(n > 0 for n in lens)], dtype=torch.float64)
            dist.all_reduce(counts, group=dp_group)
            tokens, n_rows, trained = counts.tolist()
            global_counts = GlobalCounts(tokens, n_rows, seqs.response_width, trained)
            mbs = worker.microbatches(seqs, rows, fields, group)
            scale = len(mbs) * dp_size

            def scaled(mb, output, _counts=global_counts, _scale=scale):
                share, metrics = loss_fn(mb, output, _counts)
                return share * _scale, {
                    k: v.detach().double().cpu() for k, v in {"loss": share, **metrics}.items()
                }

            optimizer.zero_grad()
            outs = worker.run_microbatches(mbs, scaled, forward_only=False, at=at)
            step = optimizer.step()
            bad_updates += bool(step.pop("nonfinite"))
            metrics = _sum_over_replica(outs, dp_group, worker.layout.pp)
            metrics.update({k: float(v) for k, v in step.items() if isinstance(v, int | float | bool)})
            if isinstance(worker.arch, ModelArchitecture) and worker.arch.num_experts:  # megatron MoE
                metrics.update(router_loss_metrics(worker.arch.num_layers, len(mbs)))
            history.append(metrics)
    # a skipped update (fp16 overflow, NaN/inf) has no usable grad norm or loss: average what was measured
    merged = {}
    for key in history[0]:
        values = [h[key] for h in history if math.isfinite(h[key])]
        merged[key] = sum(values) / len(values) if values else float("nan")
    merged["bad_updates"] = float(bad_updates)
    return merged


def _sum_over_replica(outs: list[dict], dp_group, pp: int) -> dict[str, float]:
    """Sum micro-batch metrics over micro-batches and DP ranks (`*_max` ones: their max); every rank
    gets the values."""
    from megatron.core import parallel_state as ps

    names = sorted(outs[0]) if outs else None
    holder: list[Any] = [names]  # rank-local until the broadcast from the last stage
    if pp > 1:
        dist.broadcast_object_list(
            holder,
            src=ps.get_pipeline_model_parallel_last_rank(),
            group=ps.get_pipeline_model_parallel_group(),
        )
    names = holder[0]
    maxed = [name for name in names if name.endswith("_max")]  # a max, not a weighted share
    summed = [name for name in names if name not in maxed]
    out = {}
    for keys, combine, op in ((summed, sum, dist.ReduceOp.SUM), (maxed, max, dist.ReduceOp.MAX)):
        if not keys:
            continue
        totals = torch.zeros(len(keys), dtype=torch.float64)
        if ps.is_pipeline_last_stage():
            for i, name in enumerate(keys):
                totals[i] = combine(o[name].sum() if op == dist.ReduceOp.SUM else o[name].max() for o in outs)
        totals = from_last_stage(totals, pp)
        dist.all_reduce(totals, op=op, group=dp_group)
        out.update({name: totals[i].item() for i, name in enumerate(keys)})
    return out
