"""megarl's CPURMSNorm (the CPU layer spec's norm) against torch.nn.RMSNorm, the norm megatron builds."""

import types

import pytest
import torch

from megarl.models.rms_norm import CPURMSNorm, RMSNorm

pytestmark = pytest.mark.unit


def config(**overrides):
    fields = dict(normalization="RMSNorm", layernorm_zero_centered_gamma=False, sequence_parallel=False)
    return types.SimpleNamespace(**{**fields, **overrides})


def pair(hidden: int, eps: float = 1e-6):
    ours, torchs = CPURMSNorm(config(), hidden, eps=eps), torch.nn.RMSNorm(hidden, eps=eps)
    with torch.no_grad():
        ours.weight.copy_(torch.linspace(0.5, 1.5, hidden))
        torchs.weight.copy_(ours.weight)
    return ours, torchs


@pytest.mark.parametrize("shape", [(9, 4, 64), (7, 3, 4, 16)])  # hidden states; q/k heads (qk-norm)
def test_output_is_torchs_and_gradients_match(shape):
    g = torch.Generator().manual_seed(0)
    x, grad = torch.randn(*shape, generator=g) * 3, torch.randn(*shape, generator=g)
    results = []
    for norm in pair(shape[-1]):
        leaf = x.clone().requires_grad_()
        out = norm(leaf)
        out.backward(grad)
        results.append((out.detach(), leaf.grad, norm.weight.grad))
    (out, dx, dw), (ref_out, ref_dx, ref_dw) = results
    assert torch.equal(out, ref_out)
    torch.testing.assert_close(dx, ref_dx, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(dw, ref_dw, rtol=1e-5, atol=1e-6)
    assert dx.abs().max() > 0.1 and dw.abs().max() > 0.1


def test_without_grad_it_is_torchs_forward():
    ours, torchs = pair(32)
    x = torch.randn(5, 32)
    with torch.no_grad():
        assert torch.equal(ours(x), torchs(x))


def test_sequence_parallel_tags_the_weight_and_other_norms_are_refused():
    assert RMSNorm(config(sequence_parallel=True), 8).weight.sequence_parallel is True
    with pytest.raises(ValueError, match="is not RMSNorm"):
        RMSNorm(config(normalization="LayerNorm"), 8)
