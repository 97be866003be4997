"""Megatron-core's optimizer and LR scheduler for DDP-wrapped chunks, as one small object.

`build_optimizer` turns megarl's OptimizerConfig into megatron's: AdamW with decoupled weight decay
(none on biases and norm weights, megatron's default grouping), global-norm gradient clipping, fp32
main parameters inside the optimizer when the model runs in bf16/fp16 (dynamic loss scaling for fp16),
and optionally the distributed optimizer (optimizer state and main parameters sharded over
data-parallel ranks). Megatron's OptimizerParamScheduler sets the learning rate: linear warm-up from 0
over `lr_warmup_steps` updates, then constant, cosine or linear decay to `min_lr` at `total_steps`.
Megatron's convention holds: update k (counting from 0) uses lr·k/warmup during warm-up, so the first
update of a warmed-up run has lr 0.

Without Transformer Engine or apex (CPU), megatron falls back to torch.optim.AdamW and warns.
"""

from __future__ import annotations

import torch

from megarl.config.schema import OptimizerConfig
from megarl.distributed.platform import platform


class TrainOptimizer:
    """A megatron optimizer plus its LR scheduler, stepped together.

    `optimizer` (a megatron MegatronOptimizer) and `scheduler` (an OptimizerParamScheduler) stay
    public for checkpointing (their sharded_state_dict / state_dict) and for offloading.
    """

    def __init__(self, optimizer, scheduler, chunks: list[torch.nn.Module]) -> None:
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.chunks = chunks

    @property
    def lr(self) -> float:
        """The learning rate the next update will use."""
        from megatron.core.optimizer_param_scheduler import get_canonical_lr_for_logging

        return get_canonical_lr_for_logging(self.optimizer.param_groups)

    @property
    def num_updates(self) -> int:
        """Successful updates so far (the scheduler's step count)."""
        return self.scheduler.num_steps

    def zero_grad(self) -> None:
        """Clear the DDP gradient buffers (and the optimizer's main gradients) before a backward pass."""
        for chunk in self.chunks:
            chunk.zero_grad_buffer()
        self.optimizer.zero_grad()

    def step(self) -> dict[str, float | bool]:
        """Clip, update and advance the LR schedule (only if the update happened: fp16 overflow skips).

        Returns grad_norm (global L2 norm before clipping; NaN when the update was skipped), lr (the
        rate this update used), update_successful, and num_zeros (zeros in the gradient) when the
        optimizer was built with log_num_zeros=True.
        """
        lr = self.lr
        update_successful, grad_norm, num_zeros = self.optimizer.step()
        if update_successful:
            self.scheduler.step(increment=1)
            if grad_norm is None or not self.optimizer.config.clip_grad > 0:
                # Megatron only measures the norm when it clips; the gradients are unchanged then.
                grad_norm = self.optimizer.get_grad_norm()
        result: dict[str, float | bool] = {
            "grad_norm": float("nan") if grad_norm is None else float(grad_norm),
            "lr": lr,
            "update_successful": bool(update_successful),
        }
        if num_zeros is not None and self.optimizer.config.log_num_zeros_in_grad:
            result["num_zeros"] = float(num_zeros)
        return result


def lr_decay_steps(cfg: OptimizerConfig, total_steps: int) -> int:
    """Updates over which the learning rate decays to min_lr (warm-up included, megatron's count)."""
    if cfg.lr_decay_style != "constant" and total_steps <= cfg.lr_warmup_steps:
        raise ValueError(
            f"lr_decay_style={cfg.lr_decay_style!r} decays over total_steps={total_steps}, which must exceed "
            f"lr_warmup_steps={cfg.lr_warmup_steps}; lower the warm-up or raise the number of steps"
        )
    # A constant schedule never reads it, but megatron asserts warmup < decay steps.
    return max(total_steps, cfg.lr_warmup_steps + 1)


def build_optimizer(
    chunks: list[torch.nn.Module], cfg: OptimizerConfig, total_steps: int, log_num_zeros: bool = False
) -> TrainOptimizer:
    """Megatron's Adam(W) and LR scheduler for `chunks` (from `wrap_ddp`, built with the same
    use_distributed_optimizer as `cfg`); precision follows the chunks' TransformerConfig."""
    ddp_config = getattr(chunks[0], "ddp_config", None)
    if ddp_config is None:
        raise ValueError("build_optimizer needs DDP-wrapped chunks: call megarl.models.ddp.wrap_ddp first")
    if ddp_config.use_distributed_optimizer != cfg.use_distributed_optimizer:
        raise ValueError(
            f"optimizer use_distributed_optimizer={cfg.use_distributed_optimizer} but the chunks were "
            f"wrapped with use_distributed_optimizer={ddp_config.use_distributed_optimizer}; pass the same "
            "value to wrap_ddp"
        )
    decay_steps = lr_decay_steps(cfg, total_steps)

    from megatron.core.optimizer import OptimizerConfig as MegatronOptimizerConfig
    from megatron.core.optimizer import get_megatron_optimizer
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    model_config = chunks[0].config
    beta1, beta2 = cfg.betas
    megatron_cfg = MegatronOptimizerConfig(
        optimizer="adam",
        lr=cfg.lr,
        min_lr=cfg.min_lr,
        weight_decay=cfg.weight_decay,
        adam_beta1=beta1,
        adam_beta2=beta2,
        adam_eps=cfg.eps,
        clip_grad=cfg.clip_grad,
        bf16=model_config.bf16,
        fp16=model_config.fp16,
        params_dtype=model_config.params_dtype,
        use_distributed_optimizer=cfg.use_distributed_optimizer,
        log_num_zeros_in_grad=log_num_zeros,
    )
    # Gloo twins of the data-parallel groups exist only where ParallelLayout.initialize made them.
    optimizer = get_megatron_optimizer(
        megatron_cfg, chunks, use_gloo_process_groups=platform().gloo_twin_groups
    )
    # The schedules multiply each loss by the current loss scale (1 unless fp16).
    model_config.grad_scale_func = optimizer.scale_loss
    scheduler = OptimizerParamScheduler(
        optimizer,
        init_lr=0.0,
        max_lr=cfg.lr,
        min_lr=cfg.min_lr,
        lr_warmup_steps=cfg.lr_warmup_steps,
        lr_decay_steps=decay_steps,
        lr_decay_style=cfg.lr_decay_style,
        start_wd=cfg.weight_decay,
        end_wd=cfg.weight_decay,
        wd_incr_steps=decay_steps,
        wd_incr_style="constant",
    )
    return TrainOptimizer(optimizer, scheduler, chunks)
