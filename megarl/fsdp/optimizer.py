"""The optimizer of an FSDP role: torch's AdamW, Adam or SGD over the FSDP2 shards, with megatron's LR
schedule, so the same `<role>.optimizer.*` keys mean the same thing on either backend.

    opt = build_fsdp_optimizer(model, cfg, total_steps)
    opt.zero_grad(); ...backward...; metrics = opt.step()   # grad_norm, lr, update_successful, nonfinite

What matches the Megatron roles (megarl.models.optimizer): "adamw" is Adam with decoupled weight decay,
"adam" adds the decay to the gradient (L2), "sgd" has `momentum`; biases and 1-D weights (norms) get no
weight decay (megatron's grouping; verl's FSDP decays every parameter); the learning rate follows
megatron's OptimizerParamScheduler (linear warm-up from 0, then constant / cosine / linear to min_lr), and
its state_dict is the same; the global gradient norm is measured once before clipping, and a NaN/inf norm
skips the update on every rank alike (parameters, moments and schedule untouched, gradients zeroed).

The parameters stay fp32 shards: a bf16/fp16 model computes in that dtype through FSDP2's mixed-precision
policy (megarl.fsdp.model), so the optimizer always updates fp32 master weights, as megatron's does.
"""

from __future__ import annotations

import math

import torch

from megarl.config.schema import OptimizerConfig
from megarl.models.optimizer import lr_scheduler


class FSDPOptimizer:
    """A torch optimizer over an FSDP2 model's sharded parameters, plus megatron's LR scheduler.

    `optimizer` (torch.optim) and `scheduler` (megatron's OptimizerParamScheduler) stay public for
    checkpointing and offloading."""

    def __init__(self, optimizer: torch.optim.Optimizer, scheduler, model: torch.nn.Module, clip_grad: float):
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.model = model
        self.clip_grad = clip_grad

    @property
    def lr(self) -> float:
        """The learning rate the next update will use."""
        return float(self.optimizer.param_groups[0]["lr"])

    @property
    def num_updates(self) -> int:
        """Successful updates so far (the scheduler's step count)."""
        return self.scheduler.num_steps

    def parameters(self) -> list[torch.nn.Parameter]:
        return [p for group in self.optimizer.param_groups for p in group["params"]]

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def grad_norm(self) -> float:
        """The global L2 norm of the gradients over every shard of every rank (collective)."""
        grads = [p.grad for p in self.parameters() if p.grad is not None]
        if not grads:
            return 0.0
        norm = torch.nn.utils.get_total_norm(grads, norm_type=2.0, foreach=False)
        full = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
        return float(full)

    def step(self) -> dict[str, float | bool]:
        """Clip, update and advance the LR schedule — unless the gradient norm is NaN/inf: then nothing
        changes but the gradients, which are zeroed. Returns grad_norm (before clipping), lr (the rate this
        update used), update_successful and nonfinite, the keys megarl.models.optimizer's step returns."""
        lr = self.lr
        grad_norm = self.grad_norm()
        nonfinite = not math.isfinite(grad_norm)
        if nonfinite:
            self.zero_grad()
        else:
            if self.clip_grad > 0:
                coeff = self.clip_grad / (grad_norm + 1e-6)  # megatron's clip_grad_by_total_norm_fp32
                if coeff < 1.0:
                    for p in self.parameters():
                        if p.grad is not None:
                            p.grad.mul_(coeff)
            self.optimizer.step()
            self.scheduler.step(increment=1)
        return {"grad_norm": grad_norm, "lr": lr, "update_successful": not nonfinite, "nonfinite": nonfinite}


def _param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Megatron's grouping: no weight decay on biases and 1-D parameters (norm weights)."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if name.endswith(".bias") or p.ndim == 1 else decay).append(p)
    groups = [{"params": decay, "wd_mult": 1.0}, {"params": no_decay, "wd_mult": 0.0}]
    return [g for g in groups if g["params"]]


def build_fsdp_optimizer(model: torch.nn.Module, cfg: OptimizerConfig, total_steps: int) -> FSDPOptimizer:
    """torch's AdamW / Adam / SGD for `model` (after fully_shard) with megatron's LR schedule of `cfg`."""
    groups = _param_groups(model, cfg.weight_decay)
    beta1, beta2 = cfg.betas
    optimizer: torch.optim.Optimizer
    if cfg.name == "adamw":
        optimizer = torch.optim.AdamW(
            groups, lr=cfg.lr, betas=(beta1, beta2), eps=cfg.eps, weight_decay=cfg.weight_decay
        )
    elif cfg.name == "adam":
        optimizer = torch.optim.Adam(
            groups, lr=cfg.lr, betas=(beta1, beta2), eps=cfg.eps, weight_decay=cfg.weight_decay
        )
    else:
        optimizer = torch.optim.SGD(groups, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    return FSDPOptimizer(optimizer, lr_scheduler(optimizer, cfg, total_steps), model, cfg.clip_grad)
