"""The layer spec providers: megarl's torch layers are megatron's local spec with megarl's modules,
the platform picks the provider once, and building a model patches nothing process-wide."""

import json
import socket
import subprocess
import sys

import pytest
from megatron.core.models.backends import LocalSpecProvider
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear

from megarl.distributed.platform import Platform
from megarl.models import backends, cpu_gemm
from megarl.models.backends import TorchSpecProvider, local_layer_spec, spec_provider
from megarl.models.from_hf import ModelArchitecture
from megarl.models.openblas_linear import OpenBlasColumnParallelLinear, OpenBlasRowParallelLinear
from megarl.models.rms_norm import CPURMSNorm, RMSNorm
from megarl.models.sdpa_attention import SdpaDotProductAttention
from megarl.models.swiglu import SwiGLU

pytestmark = pytest.mark.unit

HF = {
    "model_type": "llama",
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "intermediate_size": 128,
    "vocab_size": 100,
}


@pytest.mark.parametrize("qk_norm", [False, True])
def test_assembled_from_megatrons_local_provider_it_is_megatrons_local_spec(qk_norm):
    expected = get_gpt_layer_local_spec(qk_layernorm=qk_norm, normalization="RMSNorm")
    assert local_layer_spec(LocalSpecProvider(), qk_norm) == expected


@pytest.mark.parametrize("qk_norm", [False, True])
def test_the_torch_layers_are_megatrons_local_spec_with_megarls_modules(qk_norm):
    """What megarl's builder used to make by editing megatron's local spec in place."""
    expected = get_gpt_layer_local_spec(qk_layernorm=qk_norm, normalization="RMSNorm")
    layer, attention = expected.submodules, expected.submodules.self_attention.submodules
    attention.core_attention = SdpaDotProductAttention
    layer.mlp.submodules.activation_func = SwiGLU
    layer.input_layernorm = layer.pre_mlp_layernorm = CPURMSNorm
    if qk_norm:
        attention.q_layernorm = attention.k_layernorm = CPURMSNorm
    arch = ModelArchitecture.from_hf_config({**HF, "model_type": "qwen3" if qk_norm else "llama"})
    assert arch.qk_norm is qk_norm
    assert TorchSpecProvider().layer_spec(arch) == expected


def test_megatron_applies_the_torch_layers_swiglu_to_the_whole_fc1_output_and_their_rope():
    from megarl.distributed.layout import ParallelLayout
    from megarl.models.rotary import fill_megatron_rope_slots

    fill_megatron_rope_slots()  # what spec_provider() does on a platform without Transformer Engine
    config = ModelArchitecture.from_hf_config(HF).transformer_config(ParallelLayout(world_size=1))
    TorchSpecProvider().configure(config)
    assert config.use_te_activation_func and config.apply_rope_fusion
    config.rotary_interleaved = True
    TorchSpecProvider().configure(config)
    assert not config.apply_rope_fusion


def _choose(monkeypatch, chosen: Platform, gemm: str):
    monkeypatch.setattr(backends, "platform", lambda: chosen)
    monkeypatch.setattr(cpu_gemm, "platform", lambda: chosen)
    monkeypatch.setenv("MEGARL_CPU_GEMM", gemm)
    spec_provider.cache_clear()
    try:
        return spec_provider()
    finally:
        spec_provider.cache_clear()


@pytest.mark.parametrize("gemm", ["openblas", "torch"])
def test_the_cpu_platform_gets_megarls_layers_with_the_chosen_gemm(monkeypatch, gemm):
    provider = _choose(monkeypatch, Platform("cpu"), gemm)
    assert isinstance(provider, TorchSpecProvider) and provider.gemm == gemm
    openblas = gemm == "openblas"
    assert provider.column_parallel_linear() is (
        OpenBlasColumnParallelLinear if openblas else ColumnParallelLinear
    )
    assert provider.row_parallel_linear() is (OpenBlasRowParallelLinear if openblas else RowParallelLinear)
    assert provider.layer_norm(rms_norm=True) is CPURMSNorm


def test_a_gpu_without_transformer_engine_gets_torchs_norm_and_gemm(monkeypatch):
    cuda = Platform("cuda")
    if cuda.transformer_engine:
        pytest.skip("Transformer Engine is installed here")
    provider = _choose(monkeypatch, cuda, "openblas")
    assert provider.layer_norm(rms_norm=True) is RMSNorm and provider.gemm == "torch"
    assert provider.column_parallel_linear() is ColumnParallelLinear


_BUILD = """
import json, sys, torch
from megatron.core.models.common.embeddings import rope_utils
from megatron.core.tensor_parallel import layers
from megarl.distributed.backend import init_distributed
from megarl.distributed.env import detect_env
from megarl.distributed.layout import ParallelLayout
from megarl.models.backends import TorchSpecProvider
from megarl.models.build import build_model_chunks
from megarl.models.forward import run_microbatches
from megarl.models.from_hf import ModelArchitecture
from megarl.models.openblas_linear import gemm_of

init_distributed(detect_env(0, 1, "127.0.0.1", int(sys.argv[1])))
layout = ParallelLayout(world_size=1)
layout.initialize()
functions = (layers.linear_with_grad_accumulation_and_async_allreduce, layers.linear_with_frozen_weight)
arch = ModelArchitecture.from_hf_config(%r)
blas = build_model_chunks(arch, layout, layers=TorchSpecProvider(openblas=True))
plain = build_model_chunks(arch, layout, layers=TorchSpecProvider(openblas=False))
plain[0].load_state_dict(blas[0].state_dict())
outs = []
for chunks in (blas, plain):
    tokens = torch.arange(16).reshape(2, 8) %% 100
    got = run_microbatches(chunks, [{"input_ids": tokens}], lambda mb, out: (out.sum(), {"out": out.detach()}), forward_only=False)
    grads = [p.grad.clone() if p.grad is not None else p.main_grad.clone() for p in chunks[0].parameters()]
    outs.append((got[0]["out"], grads))
(a, ga), (b, gb) = outs
print(json.dumps({
    "gemm": [gemm_of(blas), gemm_of(plain)],
    "output_layer": type(blas[0].output_layer).__name__,
    "megatron_functions_unchanged": functions == (layers.linear_with_grad_accumulation_and_async_allreduce, layers.linear_with_frozen_weight),
    "rope_slots": [rope_utils.fused_apply_rotary_pos_emb is None, rope_utils.fused_apply_rotary_pos_emb_thd is None],
    "max_out_diff": (a - b).abs().max().item(),
    "max_grad_diff": max((x - y).abs().max().item() for x, y in zip(ga, gb)),
}))
"""


def test_building_with_openblas_layers_patches_nothing_and_matches_torchs_gemm(tmp_path):
    """One process, no spec_provider(): what a model built from a given provider does to megatron."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = subprocess.run(
        [sys.executable, "-c", _BUILD % HF, str(port)], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["gemm"] == ["openblas", "torch"]
    assert result["output_layer"] == "OpenBlasColumnParallelLinear"
    assert result["megatron_functions_unchanged"]
    assert result["rope_slots"] == [True, True]  # no TE here, and only spec_provider() fills them
    assert result["max_out_diff"] < 1e-4 and result["max_grad_diff"] < 1e-4
