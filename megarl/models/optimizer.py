"""Megatron-core's optimizer and LR scheduler for DDP-wrapped chunks, as one small object.

`build_optimizer` turns megarl's OptimizerConfig into megatron's: AdamW (decoupled weight decay), Adam
(L2 weight decay) or SGD (momentum, L2 weight decay) as `OptimizerConfig.name` says (MEGATRON_OPTIMIZERS);
no weight decay on biases and norm weights (megatron's default grouping), global-norm gradient clipping, fp32
main parameters inside the optimizer when the model runs in bf16/fp16 (dynamic loss scaling for fp16),
and optionally the distributed optimizer (optimizer state and main parameters sharded over
data-parallel ranks). Megatron's OptimizerParamScheduler sets the learning rate: linear warm-up from 0
over `lr_warmup_steps` updates, then constant, cosine or linear decay to `min_lr` at `total_steps`.
Megatron's convention holds: update k (counting from 0) uses lr·k/warmup during warm-up, so the first
update of a warmed-up run has lr 0.

Without Transformer Engine or apex (CPU), megatron falls back to torch.optim.AdamW / Adam / SGD and warns;
megarl then switches a torch Adam(W) to torch's fused kernel (`fused=True`: one kernel per parameter instead of a
dozen element-wise passes; the same update up to float rounding), 3–4× faster on CPU.
"""

from __future__ import annotations

import math
import warnings

import torch

from megarl.config.schema import OptimizerConfig
from megarl.distributed.platform import platform

# megarl's OptimizerConfig.name -> the fields of megatron's OptimizerConfig that select it
MEGATRON_OPTIMIZERS: dict[str, dict[str, str | bool]] = {
    "adamw": {"optimizer": "adam", "decoupled_weight_decay": True},
    "adam": {"optimizer": "adam", "decoupled_weight_decay": False},
    "sgd": {"optimizer": "sgd"},
}


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
        with warnings.catch_warnings():
            # megatron's DistributedOptimizer.zero_grad reads `.grad` of its fp32 shards, views of the
            # main params (not leaves: torch warns; megatron's own comment says "throws grad-access
            # warning"); those views never get a .grad, so the read is harmless
            warnings.filterwarnings("ignore", message=r"The \.grad attribute of a Tensor that is not a leaf")
            self.optimizer.zero_grad()

    def step(self) -> dict[str, float | bool]:
        """Clip, update and advance the LR schedule — unless the update must be skipped.

        Megatron's `step()` split in its parts (prepare_grads, the global grad norm, clipping,
        step_with_ready_grads), so the norm is measured once and checked before anything changes: a
        NaN/inf norm (a NaN/inf loss or gradient anywhere: the norm is all-reduced over the
        model-parallel ranks, and over data-parallel ranks too with the distributed optimizer, whose
        replicas hold the same all-reduced gradients otherwise) skips the update on every rank alike —
        parameters, Adam state and LR schedule untouched, gradients zeroed. fp16 overflow skips as before.

        Returns grad_norm (global L2 norm before clipping; NaN when fp16 overflow skipped the update), lr
        (the rate this update used), update_successful, nonfinite (skipped for a NaN/inf norm), and
        num_zeros (zeros in the gradient) when the optimizer was built with log_num_zeros=True.
        """
        from megatron.core.optimizer.clip_grads import clip_grad_by_total_norm_fp32

        opt = self.optimizer
        lr = self.lr
        grad_norm, num_zeros, nonfinite = None, None, False
        update_successful = not opt.prepare_grads()  # False: fp16 loss-scale overflow
        if update_successful:
            grad_norm = float(opt.get_grad_norm())
            nonfinite = not math.isfinite(grad_norm)
        if nonfinite:
            update_successful = False
            self.zero_grad()
        elif update_successful:
            for part in getattr(opt, "chained_optimizers", [opt]):
                params = part.get_parameters()
                if part.config.clip_grad > 0 and params and not getattr(part, "is_stub_optimizer", False):
                    clip_grad_by_total_norm_fp32(
                        params,
                        part.config.clip_grad,
                        grad_norm,
                        part.config.use_precision_aware_optimizer_no_fp8_or_ds_fp8,
                    )
            if opt.config.log_num_zeros_in_grad:
                num_zeros = opt.count_zeros()
            update_successful = bool(opt.step_with_ready_grads())
        if update_successful:
            self.scheduler.step(increment=1)
        result: dict[str, float | bool] = {
            "grad_norm": float("nan") if grad_norm is None else grad_norm,
            "lr": lr,
            "update_successful": bool(update_successful),
            "nonfinite": nonfinite,
        }
        if num_zeros is not None:
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
    """Megatron's AdamW, Adam or SGD and LR scheduler for `chunks` (from `wrap_ddp`, built with the same
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
    if cfg.name == "sgd" and cfg.use_distributed_optimizer:
        # megatron's DistributedOptimizer asserts Adam: its sharded state and checkpoints are Adam's moments
        raise ValueError(
            "optimizer name='sgd' needs use_distributed_optimizer=False (megatron shards Adam only)"
        )
    lr_decay_steps(cfg, total_steps)  # a schedule that cannot work is refused before anything is built

    from megatron.core.optimizer import OptimizerConfig as MegatronOptimizerConfig
    from megatron.core.optimizer import get_megatron_optimizer

    model_config = chunks[0].config
    beta1, beta2 = cfg.betas
    megatron_cfg = MegatronOptimizerConfig(
        **MEGATRON_OPTIMIZERS[cfg.name],
        lr=cfg.lr,
        min_lr=cfg.min_lr,
        weight_decay=cfg.weight_decay,
        adam_beta1=beta1,
        adam_beta2=beta2,
        adam_eps=cfg.eps,
        sgd_momentum=cfg.momentum,
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
    _use_fused_torch_adam(optimizer)
    _allow_loading_sgd_state(optimizer)
    # The schedules multiply each loss by the current loss scale (1 unless fp16).
    model_config.grad_scale_func = optimizer.scale_loss
    return TrainOptimizer(optimizer, lr_scheduler(optimizer, cfg, total_steps), chunks)


def lr_scheduler(optimizer, cfg: OptimizerConfig, total_steps: int):
    """Megatron's OptimizerParamScheduler of `cfg` over `optimizer` (megatron's, or a torch optimizer of
    an FSDP role): linear warm-up from 0, then constant / cosine / linear to min_lr; constant decay."""
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    decay_steps = lr_decay_steps(cfg, total_steps)
    return OptimizerParamScheduler(
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


def _use_fused_torch_adam(optimizer) -> None:
    """Where megatron fell back to torch's AdamW or Adam, run it fused (torch reads `fused` per group at each step).
    Skipped when a group holds a tensor its fused kernel does not take (another device or dtype)."""
    for part in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = getattr(part, "optimizer", None)
        if not isinstance(inner, torch.optim.Adam):  # AdamW included (its subclass)
            continue
        for group in inner.param_groups:
            params = group["params"]
            if params and all(p.device.type in ("cpu", "cuda") and p.is_floating_point() for p in params):
                group["foreach"], group["fused"] = False, True


def _allow_loading_sgd_state(optimizer) -> None:
    """Megatron gives SGD no `init_state_fn` (None), which its sharded_state_dict(is_loading=True) calls;
    torch's SGD makes its momentum buffers at its first step, as megarl.checkpoint does before a load."""
    for part in getattr(optimizer, "chained_optimizers", [optimizer]):
        if hasattr(part, "init_state_fn") and part.init_state_fn is None:
            part.init_state_fn = lambda opt, config=None: None
