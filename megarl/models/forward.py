"""Run this rank's GPTModel chunks over micro-batches with megatron's pipeline schedules.

One entry point for every layout (PP=1, PP>1, VPP): `run_microbatches`. Logits stay vocab-parallel
(each TP rank holds a slice of the padded vocabulary); `vocab_parallel_log_probs` masks the padding
columns so they never take probability mass.

`run_microbatches(..., at="index")` hands the loss only the outputs at the positions it reads (the
response tokens): the output head runs on those hidden states alone, so neither the LM head's matmuls
nor the [tokens, vocab] logits and their gradient are spent on prompt positions. Without sequence or
context parallelism the selection happens before the head; with them (each rank holds a slice of the
sequence there) the head runs everywhere and the positions are picked from its output.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch

# loss_fn(microbatch, vocab_parallel_logits) -> (scalar to backpropagate, dict of values to collect)
LossFn = Callable[[dict[str, torch.Tensor], torch.Tensor], tuple[torch.Tensor, dict[str, Any]]]


def _padded_columns(logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """True for this TP rank's logit columns that are vocabulary padding (beyond `vocab_size`)."""
    from megatron.core import parallel_state

    local = logits.shape[-1]
    first = parallel_state.get_tensor_model_parallel_rank() * local
    return torch.arange(first, first + local, device=logits.device) >= vocab_size


def vocab_parallel_log_probs(logits: torch.Tensor, labels: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """log p(label) from vocab-parallel logits [b, s, V/tp]; padded vocabulary columns are excluded."""
    from megatron.core import tensor_parallel

    padded = _padded_columns(logits, vocab_size)
    # masked_fill also copies: megatron's cross entropy overwrites its input with exp(logits).
    logits = logits.float().masked_fill(padded, float("-inf"))
    return -tensor_parallel.vocab_parallel_cross_entropy(logits, labels)


def gather_logits(logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Full-vocabulary logits [b, s, vocab_size] from vocab-parallel ones (TP collective)."""
    from megatron.core import tensor_parallel

    return tensor_parallel.gather_from_tensor_model_parallel_region(logits)[..., :vocab_size]


def vocab_parallel_entropy(logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Entropy of softmax(logits) from vocab-parallel logits [..., V/tp], differentiable, without ever
    gathering the vocabulary: three TP all-reduces (max, sum of exp, sum of exp·logit)."""
    import torch.distributed as dist
    from megatron.core import parallel_state, tensor_parallel

    padded = _padded_columns(logits, vocab_size)
    logits = logits.float().masked_fill(padded, float("-inf"))
    shift = logits.detach().max(dim=-1, keepdim=True).values
    dist.all_reduce(shift, op=dist.ReduceOp.MAX, group=parallel_state.get_tensor_model_parallel_group())
    exp = torch.exp(logits - shift)
    # H = log Z - sum(p·z) with Z = sum exp(z - m); the reductions are identity in backward, which is
    # right because every TP rank computes the same loss from the reduced values.
    total = tensor_parallel.reduce_from_tensor_model_parallel_region(exp.sum(dim=-1))
    weighted = (exp * logits.masked_fill(padded, 0.0)).sum(dim=-1)
    weighted = tensor_parallel.reduce_from_tensor_model_parallel_region(weighted)
    return shift.squeeze(-1) + torch.log(total) - weighted / total


@torch.no_grad()
def vocab_parallel_sum_pi_squared(logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Σ_v softmax(logits)_v² from vocab-parallel logits [..., V/tp] (the squared norm of each token's
    distribution, which the optimal token baseline weighs by), without gathering the vocabulary."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    group = parallel_state.get_tensor_model_parallel_group()
    logits = logits.float().masked_fill(_padded_columns(logits, vocab_size), float("-inf"))
    shift = logits.max(dim=-1, keepdim=True).values
    dist.all_reduce(shift, op=dist.ReduceOp.MAX, group=group)
    exp = torch.exp(logits - shift)
    sums = torch.stack([exp.sum(dim=-1), (exp * exp).sum(dim=-1)])
    dist.all_reduce(sums, group=group)
    return sums[1] / (sums[0] * sums[0])


def select_positions(output: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Rows of output [b, s, ...] at flat positions `index` (any shape) into b·s -> [*index.shape, ...]."""
    flat = output.reshape(-1, *output.shape[2:])
    return flat[index.reshape(-1)].reshape(*index.shape, *output.shape[2:])


def _head_before_selection(gpt) -> torch.nn.Module | None:
    """The output head of a last-stage GPTModel chunk where hidden states can be picked before it:
    no sequence or context parallelism, which would leave each rank a slice of the sequence there."""
    from megatron.core import parallel_state

    if gpt.config.sequence_parallel or parallel_state.get_context_parallel_world_size() > 1:
        return None
    return gpt.output_layer


def _select_hidden(index: torch.Tensor, _head, args, kwargs):
    """forward pre-hook of the output head: its hidden states [s, b, h] at flat positions `index` into
    b·s, as [len(index), 1, h] (the head and GPTModel's [s, b] -> [b, s] transpose keep that order)."""
    hidden = args[0]
    s, b = hidden.shape[:2]
    flat = index.reshape(-1)
    picked = hidden.reshape(s * b, *hidden.shape[2:])[(flat % s) * b + flat // s].unsqueeze(1)
    return (picked, *args[1:]), kwargs


def _model_output(model, batch: dict, at: str | None, **inputs) -> torch.Tensor:
    """model(**inputs); on the last pipeline stage with `at`, only the outputs at batch[at] (flat
    positions into b·s) as [*batch[at].shape, ...]."""
    from megatron.core.utils import unwrap_model

    gpt = unwrap_model(model)
    if at is None or not gpt.post_process:
        return model(**inputs)
    index = batch[at]
    head = _head_before_selection(gpt)
    if head is None:
        return select_positions(model(**inputs), index)
    hook = head.register_forward_pre_hook(partial(_select_hidden, index), with_kwargs=True)
    try:
        output = model(**inputs)  # [1, len(index), ...]
    finally:
        hook.remove()
    return output.reshape(*index.shape, *output.shape[2:])


def _forward_step(loss_fn: LossFn, at: str | None, routes, data_iterator, model):
    batch = next(data_iterator)
    if routes is not None:  # MoE routing replay: this micro-batch's routes (none: routed live)
        routes.replay(batch.get("routes"))
    tokens = batch["input_ids"]
    positions = batch.get("position_ids")
    if positions is None:
        positions = torch.arange(tokens.shape[1], device=tokens.device).expand_as(tokens)
    kwargs = {}
    if "cu_seqlens" in batch:  # packed sequences in THD layout (see megarl.workers.sequences)
        from megatron.core.packed_seq_params import PackedSeqParams

        cu, longest = batch["cu_seqlens"], int((batch["cu_seqlens"][1:] - batch["cu_seqlens"][:-1]).max())
        kwargs["packed_seq_params"] = PackedSeqParams(
            qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=longest, max_seqlen_kv=longest
        )
    output = _model_output(
        model,
        batch,
        at,
        input_ids=tokens,
        position_ids=positions,
        attention_mask=batch.get("attention_mask"),
        **kwargs,
    )
    if routes is not None and routes.recording:
        batch["recorded_routes"] = routes.recorded()  # this rank's tokens and MoE layers
    return output, partial(_loss, loss_fn, batch)


def _loss(loss_fn: LossFn, batch: dict[str, torch.Tensor], output: torch.Tensor):
    return loss_fn(batch, output)


def run_microbatches(
    chunks: list[torch.nn.Module],
    microbatches: list[dict[str, torch.Tensor]],
    loss_fn: LossFn,
    forward_only: bool,
    at: str | None = None,
    routes=None,
) -> list[dict[str, Any]]:
    """Forward (and backward unless forward_only) over `microbatches` of equal shape. `loss_fn` gets
    the model's output [b, s, ...], or with `at` (a micro-batch key of flat positions into b·s, any
    shape) only the outputs there, [*mb[at].shape, ...], computed at those positions alone.

    `routes` (a megarl.models.moe_replay.ModelRoutes of these chunks): each micro-batch's forward replays
    its mb["routes"] (routes live without), and when recording leaves what the routers chose in
    mb["recorded_routes"].

    Returns the dicts `loss_fn` produced, one per micro-batch, on the last pipeline stage (empty
    elsewhere). The schedule divides each backpropagated scalar by len(microbatches).
    """
    from megatron.core.pipeline_parallel import get_forward_backward_func

    batch, seq = microbatches[0]["input_ids"].shape
    iterators = [iter(microbatches) for _ in chunks]
    return get_forward_backward_func()(
        forward_step_func=partial(_forward_step, loss_fn, at, routes),
        data_iterator=iterators if len(chunks) > 1 else iterators[0],
        model=chunks if len(chunks) > 1 else chunks[0],
        num_microbatches=len(microbatches),
        seq_length=seq,
        micro_batch_size=batch,
        forward_only=forward_only,
    )
