"""build_optimizer's checks that need no processes: the LR decay horizon and DDP-wrapped input."""

import pytest
import torch

from megarl.config.schema import OptimizerConfig
from megarl.models.optimizer import build_optimizer, lr_decay_steps

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("style", ["cosine", "linear"])
def test_decay_needs_more_steps_than_warmup(style):
    cfg = OptimizerConfig(lr_warmup_steps=10, lr_decay_style=style)
    with pytest.raises(ValueError, match="total_steps=10, which must exceed lr_warmup_steps=10"):
        lr_decay_steps(cfg, total_steps=10)
    assert lr_decay_steps(cfg, total_steps=11) == 11


def test_constant_schedule_accepts_any_number_of_steps():
    assert lr_decay_steps(OptimizerConfig(lr_warmup_steps=10), total_steps=3) == 11


def test_unwrapped_chunks_are_refused_before_megatron_is_touched():
    with pytest.raises(ValueError, match="call megarl.models.ddp.wrap_ddp first"):
        build_optimizer([torch.nn.Linear(2, 2)], OptimizerConfig(), total_steps=10)
