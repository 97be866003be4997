"""The platform object: what this CPU machine gets, and what a CUDA platform would choose."""

import psutil
import pytest
import torch
from megatron.core.tensor_parallel.layers import ColumnParallelLinear

from megarl.distributed import cpu_shims
from megarl.distributed.layout import ParallelLayout
from megarl.distributed.platform import Platform, platform
from megarl.models import backends, from_hf
from megarl.models.from_hf import ModelArchitecture

pytestmark = pytest.mark.unit

CPU, CUDA = Platform("cpu"), Platform("cuda")

ARCH = {
    "model_type": "llama",
    "num_hidden_layers": 4,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 96,
    "vocab_size": 1001,
}


def test_the_process_platform_is_chosen_once():
    assert platform() is platform()
    assert platform() == Platform.detect() == Platform("cuda" if torch.cuda.is_available() else "cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU answers")
def test_this_machine_is_the_cpu_platform():
    assert platform() == CPU


def test_cpu_runs_gloo_with_the_shims_and_no_twin_groups():
    assert CPU.backend == "gloo"
    assert CPU.device == torch.device("cpu")
    assert CPU.needs_cpu_shims
    assert not CPU.gloo_twin_groups
    assert not CPU.pin_memory
    assert not CPU.transformer_engine


def test_cuda_runs_nccl_with_twin_groups_and_pinned_host_memory():
    assert CUDA.backend == "nccl"
    assert not CUDA.needs_cpu_shims
    assert CUDA.gloo_twin_groups
    assert CUDA.pin_memory


def test_unbatched_p2p_is_for_gloo_only_and_shapes_are_fixed_per_call_everywhere():
    assert CPU.pipeline_p2p == dict(batch_p2p_comm=False, batch_p2p_sync=False, variable_seq_lengths=False)
    assert CUDA.pipeline_p2p == dict(batch_p2p_comm=True, batch_p2p_sync=True, variable_seq_lengths=False)


@pytest.mark.parametrize("chosen", [CPU, CUDA], ids=["cpu", "cuda"])
def test_megatron_accepts_each_platforms_p2p_settings(monkeypatch, chosen):
    monkeypatch.setattr(from_hf, "platform", lambda: chosen)
    arch = ModelArchitecture.from_hf_config(ARCH)
    config = arch.transformer_config(ParallelLayout(world_size=4, pp=2, vpp=2))
    for name, value in chosen.pipeline_p2p.items():
        assert getattr(config, name) == value


def test_cpu_memory_probe_is_the_process_rss():
    rss = psutil.Process().memory_info().rss
    assert abs(CPU.memory_in_use() - rss) < 64 << 20
    CPU.release_cached_memory()
    CPU.synchronize()


def test_transformer_engine_is_asked_only_on_cuda(monkeypatch):
    # Importing TE without CUDA raises RuntimeError, not ImportError: the probe must survive either.
    assert isinstance(CUDA.transformer_engine, bool)
    monkeypatch.setattr(backends, "platform", lambda: CPU)
    backends.spec_provider.cache_clear()
    try:
        spec = backends.spec_provider().layer_spec(ModelArchitecture.from_hf_config(ARCH))
    finally:
        backends.spec_provider.cache_clear()
    assert issubclass(spec.submodules.self_attention.submodules.linear_qkv, ColumnParallelLinear)


def test_cpu_shims_are_not_applied_on_cuda(monkeypatch):
    monkeypatch.setattr(cpu_shims, "platform", lambda: CUDA)
    applied = set(cpu_shims._applied)
    assert cpu_shims.apply_cpu_shims() == []
    assert cpu_shims._applied == applied


_FAULTS_OF_REALLOCATIONS = """
import resource, sys, torch
from megarl.distributed.platform import Platform
applied = Platform("cpu").reuse_freed_host_memory() if sys.argv[1] == "reuse" else False
faults = []
for _ in range(12):  # 64 MiB allocated, touched and freed, again and again
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    torch.ones(64 << 18).add_(1)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(applied, sum(faults[-4:]))
"""


@pytest.mark.parametrize("mode", ["default", "reuse"])
def test_freed_host_memory_is_reused_without_page_faults_on_cpu(mode):
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", _FAULTS_OF_REALLOCATIONS, mode], capture_output=True, text=True
    )
    applied, faults = out.stdout.split()
    pages = (64 << 20) // 4096
    if mode == "reuse":  # glibc hands the freed memory out again (after a few rounds of memalign slack)
        assert applied == "True" and int(faults) <= 1.5 * pages
    else:  # every round maps a fresh 64 MiB, and the kernel zero-fills each page on first touch
        assert int(faults) >= 3.5 * pages
    assert CUDA.reuse_freed_host_memory() is False
