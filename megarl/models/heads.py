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


# A fresh head (a critic or reward model started from a language model) is drawn from its own generator:
# the same on every rank — it is replicated over TP and DP, and megatron's DDP broadcasts nothing — and in
# every run. Drawn from the process's default generator it changed from run to run (seen: a reward
# model's held-out accuracy before training 0.45 to 0.53 on the same checkpoint).
HEAD_SEED = 1234


class ScalarHead(_megatron_module()):
    def __init__(self, config) -> None:
        super().__init__(config)
        self.weight = torch.nn.Parameter(torch.empty(1, config.hidden_size, dtype=config.params_dtype))
        with torch.no_grad():
            generator = torch.Generator(device=self.weight.device).manual_seed(HEAD_SEED)
            self.weight.normal_(0.0, config.init_method_std, generator=generator)

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
