"""megarl's OpenBLAS linear layer against torch's: values and every gradient, strided operands, frozen
weights, the thread count it multiplies with, and when `MEGARL_CPU_GEMM` picks it."""

import pytest
import torch
import torch.nn.functional as F

from megarl.models import cpu_gemm

pytestmark = pytest.mark.unit


def _values_and_grads(fn, *inputs, seed: int = 1):
    inputs = [t.detach().requires_grad_(t.requires_grad) for t in inputs]
    out = fn(*inputs)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed))
    wanted = [t for t in inputs if t.requires_grad]
    return [out.detach(), *torch.autograd.grad(out, wanted, g)]


def _tensor(*shape, seed=0, grad=True):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).requires_grad_(grad)


@pytest.mark.parametrize("bias", [True, False])
def test_linear_equals_torch_values_and_gradients(bias):
    x, w = _tensor(6, 3, 64), _tensor(96, 64, seed=1)  # [s, b, h] as megatron passes it
    args = (x, w, _tensor(96, seed=2)) if bias else (x, w)
    got = _values_and_grads(
        lambda *t: cpu_gemm._Linear.apply(*t, *([None] * (3 - len(t))), False, None, True), *args
    )
    expected = _values_and_grads(F.linear, *args)
    assert len(got) == len(expected) == 1 + len(args)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_strided_input_and_frozen_weight():
    """A transposed (non-contiguous) input is multiplied as it is; a frozen weight gets no gradient."""
    x = _tensor(3, 6, 64).transpose(0, 1)
    w = _tensor(32, 64, seed=1, grad=False)
    got = _values_and_grads(lambda a: cpu_gemm._Linear.apply(a, w, None, False, None, False), x)
    expected = _values_and_grads(lambda a: F.linear(a, w), x)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("transpose", [(False, False), (True, False), (False, True), (True, True)])
def test_mm_reads_transposed_operands(transpose):
    a, b = _tensor(40, 24, grad=False), _tensor(24, 56, seed=1, grad=False)
    a = a.t().contiguous().t() if transpose[0] else a  # column-major storage, same values
    b = b.t().contiguous().t() if transpose[1] else b
    torch.testing.assert_close(cpu_gemm.mm(a, b), a @ b, rtol=1e-5, atol=1e-5)


def test_mm_copies_operands_blas_cannot_read_and_keeps_them_alive():
    """An expanded operand (stride 0, as `out.sum()`'s gradient arrives) is copied, and the copy outlives
    the product."""
    a, b = torch.ones(()).expand(40, 24), _tensor(24, 56, seed=1, grad=False)
    torch.testing.assert_close(cpu_gemm.mm(a, b), a @ b, rtol=1e-5, atol=1e-5)
    ours, torchs = [(_tensor(5, 2, 16), _tensor(8, 16, seed=1)) for _ in range(2)]
    cpu_gemm.linear(*ours, None, False, None, True).sum().backward()
    F.linear(*torchs).sum().backward()
    for a, b in zip(ours, torchs):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-5)


def test_operands_results_and_gradients_stay_resizable():
    """Offload frees parameters and gradients with `storage.resize_(0)`; multiplying through numpy must
    not pin them (torch's `Tensor.numpy()` would mark the storage as never resizable)."""
    x, w = _tensor(5, 2, 16), _tensor(8, 16, seed=1)
    out = cpu_gemm._Linear.apply(x, w, None, False, None, True)
    out.sum().backward()
    for t in (x, w, out, x.grad, w.grad):
        assert t.untyped_storage().resizable()
    w.data.untyped_storage().resize_(0)


def test_mm_of_empty_operands():
    torch.testing.assert_close(cpu_gemm.mm(torch.ones(0, 4), torch.ones(4, 3)), torch.zeros(0, 3))
    torch.testing.assert_close(cpu_gemm.mm(torch.ones(2, 0), torch.ones(0, 3)), torch.zeros(2, 3))


def test_mm_multiplies_with_torchs_thread_count():
    threads = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            cpu_gemm.mm(torch.ones(4, 4), torch.ones(4, 4))
            assert cpu_gemm._openblas().num_threads == n
    finally:
        torch.set_num_threads(threads)


def test_choice_follows_the_environment_and_the_cpu_vendor(monkeypatch):
    monkeypatch.setenv("MEGARL_CPU_GEMM", "torch")
    assert not cpu_gemm.openblas_chosen()
    monkeypatch.setenv("MEGARL_CPU_GEMM", "openblas")
    assert cpu_gemm.openblas_chosen()  # numpy's PyPI wheels link OpenBLAS
    monkeypatch.setenv("MEGARL_CPU_GEMM", "auto")
    for vendor, chosen in (("AuthenticAMD", True), ("GenuineIntel", False)):
        monkeypatch.setattr(cpu_gemm, "_cpu_vendor", lambda v=vendor: v)
        assert cpu_gemm.openblas_chosen() is chosen
    monkeypatch.setenv("MEGARL_CPU_GEMM", "mkl")
    with pytest.raises(ValueError, match="MEGARL_CPU_GEMM='mkl': expected one of auto, openblas, torch"):
        cpu_gemm.openblas_chosen()
