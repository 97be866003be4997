"""megarl's SwiGLU against megatron's unfused gated MLP activation (chunk, silu, multiply under autograd)."""

import pytest
import torch
import torch.nn.functional as F

from megarl.models.swiglu import SwiGLU

pytestmark = pytest.mark.unit


def megatron_glu(x):
    gate, up = torch.chunk(x, 2, dim=-1)
    return F.silu(gate) * up


@pytest.mark.parametrize("shape", [(7, 3, 10), (5, 2, 64)])
def test_output_and_gradient_are_bitwise_megatrons(shape):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(*shape, generator=g)
    grad = torch.randn(*shape[:-1], shape[-1] // 2, generator=g)
    outs, grads = [], []
    for fn in (megatron_glu, SwiGLU()):
        leaf = x.clone().requires_grad_()
        out = fn(leaf)
        out.backward(grad)
        outs.append(out.detach())
        grads.append(leaf.grad)
    assert torch.equal(outs[0], outs[1])
    assert torch.equal(grads[0], grads[1])
    assert grads[1].is_contiguous()
