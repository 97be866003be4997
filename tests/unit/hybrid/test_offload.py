"""Offloading plain modules' parameters and gradients: bit-exact round trips, shared storages moved
once, RSS freed by the disk target, misuse refused. (Megatron DDP and optimizer: tests/multiproc.)"""

import pytest
import torch

from megarl.hybrid.offload import (
    DiskFiles,
    HostMemory,
    offload_grads,
    offload_params,
    offload_state,
    offloaded_states,
    reload_grads,
    reload_params,
    reload_state,
)

pytestmark = pytest.mark.unit


def tied_model(width: int = 64, layers: int = 3) -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    model[-1].weight = model[0].weight  # tied: one storage, two uses
    model(torch.randn(4, width)).square().sum().backward()
    return model


def snapshot(model: torch.nn.Module) -> list[torch.Tensor]:
    return [t.detach().clone() for p in model.parameters() for t in (p, p.grad)]


def distinct_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())  # parameters() dedupes ties


@pytest.mark.parametrize("target", ["host", "disk"])
def test_params_and_grads_round_trip_bit_exact(tmp_path, target):
    model = tied_model()
    before = snapshot(model)
    where = HostMemory() if target == "host" else DiskFiles(tmp_path)
    params, grads = offload_params([model], where), offload_grads([model], where)
    assert all(
        p.untyped_storage().nbytes() == 0 and p.grad.untyped_storage().nbytes() == 0
        for p in model.parameters()
    )
    assert params.bytes == grads.bytes == distinct_bytes(model)
    assert params.storages == 5  # 2 distinct weights (one is tied) + 3 biases
    if target == "disk":
        assert sum(f.stat().st_size for f in tmp_path.iterdir()) == params.bytes + grads.bytes
    reload_params([model]), reload_grads([model])
    assert all(torch.equal(a, b) for a, b in zip(before, snapshot(model)))
    assert model[-1].weight is model[0].weight
    assert list(tmp_path.iterdir()) == []


def test_views_of_one_buffer_move_once_and_still_alias_after_reload():
    buffer = torch.arange(12, dtype=torch.float32)
    module = torch.nn.Module()
    module.a = torch.nn.Parameter(buffer[:4].view(2, 2))  # like DDP's params inside its buffer
    module.b = torch.nn.Parameter(buffer[4:].view(2, 4))
    report = offload_params([module])
    assert (report.storages, report.bytes) == (1, 48)
    reload_params([module])
    assert torch.equal(torch.cat([module.a.flatten(), module.b.flatten()]), torch.arange(12.0))
    buffer[0] = 100.0
    assert module.a[0, 0].item() == 100.0


def test_round_trips_repeat(tmp_path):
    # Exporting a state tensor to numpy would make its storage non-resizable for good.
    model = tied_model()
    before = snapshot(model)
    for where in (DiskFiles(tmp_path), DiskFiles(tmp_path), HostMemory()):
        offload_params([model], where)
        reload_params([model])
    assert all(torch.equal(a, b) for a, b in zip(before, snapshot(model)))


def test_grads_offloaded_without_values_come_back_as_zeros():
    model = tied_model()
    report = offload_grads([model], keep_values=False)
    assert report.target == "dropped" and report.bytes == distinct_bytes(model)
    reload_grads([model])
    assert all(p.grad.abs().sum() == 0 for p in model.parameters())


def test_disk_target_frees_rss(tmp_path):
    model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024, bias=False) for _ in range(12)])  # 48 MiB
    offloaded = offload_params([model], DiskFiles(tmp_path))
    reloaded = reload_params([model])
    assert offloaded.bytes == 12 * 4 << 20
    assert offloaded.device_bytes_freed >= 0.8 * offloaded.bytes
    assert -reloaded.device_bytes_freed >= 0.8 * offloaded.bytes


def test_offloading_twice_or_reloading_nothing_is_refused():
    model = tied_model()
    with pytest.raises(RuntimeError, match="not offloaded"):
        reload_params([model])
    offload_params([model])
    with pytest.raises(RuntimeError, match="already offloaded"):
        offload_params([model])
    reload_params([model])


def test_state_offload_is_recorded_once_and_reload_brings_back_what_was_offloaded(tmp_path):
    model = tied_model()
    before = snapshot(model)
    assert offloaded_states([model]) == []
    first = offload_state([model], None, {"params"}, DiskFiles(tmp_path))
    assert [r.state for r in first] == ["params"] and offloaded_states([model]) == ["params"]
    assert offload_state([model], None, {"params"}) == []  # already offloaded: skipped
    assert [r.state for r in reload_state([model])] == ["params"]
    assert offloaded_states([model]) == [] and reload_state([model]) == []
    assert all(torch.equal(a, b) for a, b in zip(before, snapshot(model)))


def test_a_frozen_model_has_no_training_state_to_offload():
    with pytest.raises(ValueError, match="frozen model"):
        offload_state([tied_model()], None, {"params", "grads"})
