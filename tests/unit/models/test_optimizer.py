"""build_optimizer's checks that need no processes: the LR decay horizon, DDP-wrapped input, fused AdamW."""

import pytest
import torch

from megarl.config.schema import OptimizerConfig
from megarl.models.optimizer import _use_fused_torch_adam, build_optimizer, lr_decay_steps

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


def test_megatrons_torch_adamw_fallback_runs_fused_with_the_same_update():
    """Megatron's optimizers hold torch's AdamW as `.optimizer` (chained: `.chained_optimizers`)."""
    params = [
        torch.nn.Parameter(torch.randn(3, 5, generator=torch.Generator().manual_seed(i))) for i in (0, 1)
    ]
    twins = [torch.nn.Parameter(p.detach().clone()) for p in params]
    start = [p.detach().clone() for p in params]
    parts = [
        type("Part", (), {"optimizer": torch.optim.AdamW(ps, lr=0.1, weight_decay=0.1)})()
        for ps in (params, twins)
    ]
    _use_fused_torch_adam(type("Chained", (), {"chained_optimizers": [parts[0]]})())
    assert parts[0].optimizer.param_groups[0]["fused"] is True
    assert not parts[1].optimizer.param_groups[0]["fused"]
    for _ in range(3):
        for p, t in zip(params, twins):
            p.grad = t.grad = torch.sin(p.detach() * 3)
        for part in parts:
            part.optimizer.step()
    for p, t, s in zip(params, twins, start):
        assert (p - s).abs().min() > 0.05  # three steps of lr 0.1 moved every element
        assert torch.allclose(p, t, rtol=1e-6, atol=1e-7)
