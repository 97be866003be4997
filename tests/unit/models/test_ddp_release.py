"""A model wrapped by wrap_ddp does not outlive its layout's teardown.

Megatron's DDP hooks its parameters' gradient accumulators (C++ autograd nodes) with closures over the
wrapper; a graph a module keeps from its last forward (megatron's MoE dispatcher keeps `probs`) keeps
those nodes alive, so the wrapper, its model and its layout's gloo groups (3 threads each) stayed alive
for the life of the process: a 4-rank test process had grown to ~1300 threads.
"""

from __future__ import annotations

import gc
import weakref

import torch


def _trained_wrapper():
    """A megatron module that keeps its last forward's graph (as the MoE dispatcher does), wrapped and
    stepped once under a fresh layout; returns weak references to the wrapper and the module."""
    from megatron.core.transformer.module import MegatronModule
    from megatron.core.transformer.transformer_config import TransformerConfig

    from megarl.distributed.layout import ParallelLayout
    from megarl.models.ddp import wrap_ddp

    class KeepsGraph(MegatronModule):
        def __init__(self, config) -> None:
            super().__init__(config)
            self.linear = torch.nn.Linear(4, 4)
            self.probs = None

        def forward(self, x):
            self.probs = self.linear(x).softmax(-1)
            return self.probs.square().sum()

    ParallelLayout(world_size=1).initialize()
    config = TransformerConfig(
        num_layers=1, hidden_size=4, num_attention_heads=1, use_cpu_initialization=True
    )
    (ddp,) = wrap_ddp([KeepsGraph(config)])
    ddp(torch.ones(2, 4)).backward()
    assert ddp.module.linear.weight.main_grad.abs().sum() > 0  # the hooks ran
    return weakref.ref(ddp), weakref.ref(ddp.module)


def test_the_wrapper_and_its_model_are_freed_when_the_layout_is_destroyed(world_of_one):
    from megarl.distributed.layout import ParallelLayout

    ddp, module = _trained_wrapper()
    gc.collect()
    assert ddp() is not None, (
        "without the release the wrapper survives a collection (the cycle runs through C++)"
    )
    ParallelLayout.destroy()
    assert ddp() is None and module() is None
