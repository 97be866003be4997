"""Two launches shared by the modules whose checks are rank programs (shared_launch.py): one of 4 ranks,
one of 2 (on 2 cores a launch costs ≈ 8 s at 2 ranks, ≈ 15–20 s at 4, before its first check).

A module takes part by defining SHARED_PART (4 ranks) or SHARED_PART_2 (2 ranks) = (name,
"module[:function]", argv_of), argv_of(request) giving its program's argv (it may ask for session
fixtures: request.getfixturevalue); its tests read `shared_result(shared_launch, name)` (or
shared_launch_2). Only the modules with selected tests run their part, in ORDER.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

# 4 ranks: spmd first, it checks worker groups on ranks that hold no megatron state yet; every later part
# sets up its own megatron layout (ParallelLayout.initialize replaces the one before) and closes its vLLM
# engines. 2 ranks: cpu_shims first, it needs ranks on which no megatron call ran yet (each shim's call
# must fail without it).
ORDER = ("spmd", "reshard", "fsdp_sync", "policy", "parity", "checkpoint", "vllm_tp", "hybrid")
ORDER_2 = ("cpu_shims", "train_state", "reward_hf_dp", "fsdp")


def _launch(request, torchrun, attribute: str, order: tuple[str, ...], nproc: int) -> dict:
    """{part name: {"result": …} or {"error": …, "traceback": …}} of one launch of every selected part."""
    modules = {item.module for item in request.session.items if item.module is not None}
    parts = [part for module in modules if (part := getattr(module, attribute, None))]
    unknown = [name for name, _, _ in parts if name not in order]
    assert not unknown, f"tests/multiproc/conftest.py: add {unknown} to the ORDER of {attribute}"
    parts.sort(key=lambda part: order.index(part[0]))
    spec = [[name, target, [str(a) for a in argv_of(request)]] for name, target, argv_of in parts]
    return torchrun("tests.multiproc.shared_launch", [json.dumps(spec)], nproc=nproc, timeout=1500).results[0]


@pytest.fixture(scope="session")
def shared_launch(request, torchrun) -> dict:
    """The 4-rank launch of every selected module's SHARED_PART."""
    return _launch(request, torchrun, "SHARED_PART", ORDER, 4)


@pytest.fixture(scope="session")
def shared_launch_2(request, torchrun) -> dict:
    """The 2-rank launch of every selected module's SHARED_PART_2."""
    return _launch(request, torchrun, "SHARED_PART_2", ORDER_2, 2)


def shared_result(shared_launch: dict, name: str):
    """What part `name` returned on rank 0 of a shared launch (the test fails with its error)."""
    if name not in shared_launch:
        pytest.fail(f"part {name} did not run in the shared launch (is its module's SHARED_PART(_2) set?)")
    part = shared_launch[name]
    if "error" in part:
        pytest.fail(f"part {name} of the shared launch raised {part['error']}\n{part['traceback']}")
    return part["result"]


@pytest.fixture(scope="session")
def perturbed_qwen2(tiny_models, tmp_path_factory) -> Path:
    """The tiny Qwen2 with every weight moved by ~5% of its mean magnitude (the "trained" policy of
    test_vllm_rollout; a session fixture so that its shared-launch part can ask for it)."""
    from transformers import AutoModelForCausalLM

    src, out = tiny_models["qwen2"], tmp_path_factory.mktemp("qwen2_perturbed")
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * p.abs().mean() * torch.randn(p.shape, generator=g))
    model.save_pretrained(out)
    for f in src.iterdir():
        if f.name.startswith(("tokenizer", "chat_template")):
            shutil.copy(f, out / f.name)
    return out


@pytest.fixture(scope="session")
def vllm_single(torchrun, tiny_models, perturbed_qwen2) -> dict:
    """Rank 0's results of vllm_rollout_checks' one-rank engine (test_vllm_rollout, and the partial
    rollouts of test_partial_rollout on the same engine: one engine start for both)."""
    args = [tiny_models["qwen2"], perturbed_qwen2, "single"]
    return torchrun("tests.multiproc.vllm_rollout_checks", args, nproc=1, timeout=300).results[0]


@pytest.fixture(scope="session")
def checkpoint_spec(tiny_models, tmp_path_factory) -> list:
    """test_checkpoint's argv (HF OTHER_HF DIR): its save side runs in the shared launch, its load side
    in a 2-rank launch of its own reading the same DIR, so both must see one spec."""
    from megarl.models.tiny import build_tiny_hf

    other = build_tiny_hf(tmp_path_factory.mktemp("other") / "llama", hidden_size=64, num_hidden_layers=2)
    return [tiny_models["llama"], other, tmp_path_factory.mktemp("ckpt")]
