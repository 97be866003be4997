"""Scalar heads: one number per token from the final hidden state (critic values, reward scores).

It replaces GPTModel's vocabulary-parallel output layer and keeps its call signature. The weight
[1, hidden] is replicated over TP; HF stores it as `score.weight` (`*ForSequenceClassification`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _megatron_module():
    from megatron.core.transformer.module import MegatronModule

    return MegatronModule


class ScalarHead(_megatron_module()):
    def __init__(self, config) -> None:
        super().__init__(config)
        self.weight = torch.nn.Parameter(torch.empty(1, config.hidden_size, dtype=config.params_dtype))
        config.init_method(self.weight)

    def forward(self, hidden: torch.Tensor, weight=None, runtime_gather_output=None):
        from megatron.core import tensor_parallel

        if self.config.sequence_parallel:
            # Every TP rank scores the whole sequence, so the backward takes its slice (no reduction).
            hidden = tensor_parallel.gather_from_sequence_parallel_region(
                hidden, tensor_parallel_output_grad=False
            )
        return F.linear(hidden, self.weight), None


def attach_scalar_head(model: torch.nn.Module) -> None:
    """Swap the LM head of a last-stage GPTModel chunk for a ScalarHead (outputs become [b, s, 1])."""
    model.output_layer = ScalarHead(model.config)
