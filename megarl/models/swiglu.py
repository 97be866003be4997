"""SwiGLU for the local (non-Transformer-Engine) layer spec: `silu(gate) · up` of the fused fc1 output,
with a backward that writes both halves of the gradient into one buffer.

megatron-core's unfused path (`glu` in `MLP.forward`) chunks the fc1 output and leaves the rest to
autograd, whose backward of `chunk` concatenates the two half-gradients: one more pass over the [tokens, 2 ·
ffn] gradient and a fresh allocation of it per layer (torch.profiler's top non-GEMM op of a 25M model's CPU
update, `aten::cat`). Here the same ops (`silu`, `mul`, `silu_backward`) write into the halves of one gradient
tensor, so the results are bitwise those of autograd's; forward + backward at a 25M model's 64 × 147 tokens, 1
thread: 180 → 136 ms per layer, and computing `grad · up` in d_gate's place (no temporary) takes the backward
alone from 92 to 77 ms. Megatron calls it through `MLPSubmodules.activation_func` with
`config.use_te_activation_func` set (the flag only means "apply the spec's activation module to the whole fc1
output"; nothing of Transformer Engine is used).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class _SwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        gate, up = x.chunk(2, dim=-1)
        activated = F.silu(gate)
        ctx.save_for_backward(x, activated)
        return activated * up

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        x, activated = ctx.saved_tensors
        gate, up = x.chunk(2, dim=-1)
        dx = torch.empty_like(x)
        d_gate, d_up = dx.chunk(2, dim=-1)
        torch.mul(grad, activated, out=d_up)
        # grad · up straight into d_gate, which silu_backward then scales in place (elementwise:
        # reading and writing the same element is safe)
        torch.mul(grad, up, out=d_gate)
        torch.ops.aten.silu_backward.grad_input(d_gate, gate, grad_input=d_gate)
        return dx


class SwiGLU(torch.nn.Module):
    """Megatron builds it with `config=`; a gated MLP without clamping or a linear offset."""

    def __init__(self, config=None):
        super().__init__()
        if config is not None and (
            config.activation_func_clamp_value is not None or config.glu_linear_offset
        ):
            raise ValueError("SwiGLU: activation_func_clamp_value and glu_linear_offset are not supported")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _SwiGLU.apply(x)

    def sharded_state_dict(self, prefix: str = "", sharded_offsets: tuple = (), metadata=None) -> dict:
        return {}  # no parameters; megatron's MLP asks every child for its checkpoint entries
