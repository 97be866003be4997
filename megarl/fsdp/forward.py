"""Run an FSDP role's transformers model over micro-batches: the twin of megarl.models.forward's
`run_microbatches`, with the same contract, so the workers' loss code runs unchanged on either backend.

Micro-batches are megarl's (megarl.workers.sequences): right-padded rows (causal attention alone keeps
real tokens from the padding), or packed rows whose `attention_mask` is the block-causal mask; it goes to
the model as a 4-D additive mask with the packed `position_ids`, which transformers' attention takes
for any architecture built on its masking utilities. With `at`, a forward pre-hook on the output head
keeps only the hidden states at those positions, so the head (and its [tokens, vocab] logits) runs on
the response tokens alone, as on the Megatron path.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch

from megarl.models.forward import LossFn


def _select_hidden(index: torch.Tensor, _head, args, kwargs):
    """forward pre-hook of the output head: hidden states [b, s, h] at flat positions `index` into b·s,
    as [1, len(index), h]."""
    hidden = args[0]
    picked = hidden.reshape(-1, hidden.shape[-1])[index.reshape(-1)].unsqueeze(0)
    return (picked, *args[1:]), kwargs


def _additive_mask(blocked: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """megarl's block-causal mask (True = may NOT attend) as the additive mask transformers takes."""
    return torch.zeros(blocked.shape, dtype=dtype, device=blocked.device).masked_fill(
        blocked, torch.finfo(dtype).min
    )


def model_output(
    model: torch.nn.Module, head: torch.nn.Module, mb: dict, at: str | None, dtype: torch.dtype
) -> torch.Tensor:
    """The model's output for micro-batch `mb` ([b, s, ...], or with `at` [*mb[at].shape, ...])."""
    inputs: dict[str, Any] = {"input_ids": mb["input_ids"], "position_ids": mb["position_ids"]}
    if "attention_mask" in mb:
        inputs["attention_mask"] = _additive_mask(mb["attention_mask"], dtype)
    if at is None:
        return model(**inputs).logits
    index = mb[at]
    hook = head.register_forward_pre_hook(partial(_select_hidden, index), with_kwargs=True)
    try:
        output = model(**inputs).logits  # [1, len(index), ...]
    finally:
        hook.remove()
    return output.reshape(*index.shape, *output.shape[2:])


def run_hf_microbatches(
    model: torch.nn.Module,
    head: torch.nn.Module,
    microbatches: list[dict[str, torch.Tensor]],
    loss_fn: LossFn,
    forward_only: bool,
    at: str | None = None,
    dtype: torch.dtype = torch.float32,
) -> list[dict[str, Any]]:
    """Forward (and backward unless forward_only) over `microbatches`; returns the dicts `loss_fn`
    produced, one per micro-batch. Each backpropagated scalar is divided by len(microbatches), as
    megatron's schedule does; FSDP averages the gradients over the data-parallel ranks, as megatron's
    DDP does."""
    outs = []
    for mb in microbatches:
        with torch.set_grad_enabled(not forward_only):
            output = model_output(model, head, mb, at, dtype)
            loss, values = loss_fn(mb, output)
        if not forward_only:
            (loss / len(microbatches)).backward()
        outs.append(values)
    return outs
