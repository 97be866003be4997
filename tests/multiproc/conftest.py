"""Three launches shared by the modules whose checks are rank programs (shared_launch.py): one of 4 ranks,
one of 2 and one of 1 (on 2 cores a launch costs ≈ 6–8 s at 1 rank, ≈ 8 s at 2, ≈ 15–20 s at 4, before its
first check).

A module takes part by defining SHARED_PART (4 ranks), SHARED_PART_2 (2 ranks) or SHARED_PART_1 (1 rank)
= (name, "module[:function]", argv_of), argv_of(request) giving its program's argv (it may ask for session
fixtures: request.getfixturevalue — a part that reads what another launch wrote asks for that launch
first); its tests read `shared_result(shared_launch, name)` (or shared_launch_2, shared_launch_1). Only the
modules with selected tests run their part, in ORDER.
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
# must fail without it); checkpoint_load reads what the 4-rank checkpoint part saved. 1 rank:
# fsdp_checkpoint reads what its 2-rank part saved. vLLM engines last (an engine start leaves the process's
# thread count to vLLM until it closes): vllm_single first among them, it checks the engine leaves the
# global RNG and thread settings alone in a process where no engine ran before.
ORDER = (
    "spmd",
    "reshard",
    "fsdp_sync",
    "policy",
    "moe_replay",
    "parity",
    "moe_train",
    "checkpoint",
    "vllm_tp",
    "hybrid",
)
ORDER_2 = (
    "cpu_shims",
    "train_state",
    "moe_packing",
    "reward_hf_dp",
    "fsdp",
    "checkpoint_load",
    "lora_checkpoint",
    "fsdp_checkpoint",
    "vllm_moe_ep",
    "fsdp_sync_engine",
)
ORDER_1 = (
    "critic_init",
    "optimizer_mapping",
    "fsdp",
    "fsdp_checkpoint",
    "vllm_single",
    "vllm_lora",
    "vllm_moe",
    "agentic",
    "tiny_archs",
)


def _launch(request, torchrun, attribute: str, order: tuple[str, ...], nproc: int) -> dict:
    """{part name: {"result": …} or {"error": …, "traceback": …}} of one launch of every selected part."""
    modules = {item.module for item in request.session.items if item.module is not None}
    parts = [part for module in modules if (part := getattr(module, attribute, None))]
    unknown = [name for name, _, _ in parts if name not in order]
    assert not unknown, f"tests/multiproc/conftest.py: add {unknown} to the ORDER of {attribute}"
    parts.sort(key=lambda part: order.index(part[0]))
    spec = [[name, target, [str(a) for a in argv_of(request)]] for name, target, argv_of in parts]
    results = torchrun(
        "tests.multiproc.shared_launch", [json.dumps(spec)], nproc=nproc, timeout=1500
    ).results[0]
    # what each part costs (pytest -s shows it): where to look when the launch grows
    print(
        f"\nshared {nproc}-rank launch:",
        ", ".join(
            f"{name} {part['seconds']} s ({part['threads']} threads)" for name, part in results.items()
        ),
    )
    return results


@pytest.fixture(scope="session")
def shared_launch(request, torchrun) -> dict:
    """The 4-rank launch of every selected module's SHARED_PART."""
    return _launch(request, torchrun, "SHARED_PART", ORDER, 4)


@pytest.fixture(scope="session")
def shared_launch_2(request, torchrun) -> dict:
    """The 2-rank launch of every selected module's SHARED_PART_2."""
    return _launch(request, torchrun, "SHARED_PART_2", ORDER_2, 2)


@pytest.fixture(scope="session")
def shared_launch_1(request, torchrun) -> dict:
    """The 1-rank launch of every selected module's SHARED_PART_1."""
    return _launch(request, torchrun, "SHARED_PART_1", ORDER_1, 1)


def shared_result(shared_launch: dict, name: str):
    """What part `name` returned on rank 0 of a shared launch (the test fails with its error)."""
    if name not in shared_launch:
        pytest.fail(f"part {name} did not run in the shared launch (is its module's SHARED_PART(_1/_2) set?)")
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
def checkpoint_spec(tiny_models, tmp_path_factory) -> list:
    """test_checkpoint's argv (HF OTHER_HF DIR MOE_HF): its save side runs in the shared 4-rank launch, its
    load side in the shared 2-rank launch reading the same DIR, so both must see one spec."""
    from megarl.models.tiny import build_tiny_hf

    other = build_tiny_hf(tmp_path_factory.mktemp("other") / "llama", hidden_size=64, num_hidden_layers=2)
    moe = build_tiny_hf(
        tmp_path_factory.mktemp("moe") / "qwen3_moe",
        family="qwen3_moe",
        num_hidden_layers=2,
        initializer_range=0.1,
    )
    return [tiny_models["llama"], other, tmp_path_factory.mktemp("ckpt"), moe]


@pytest.fixture(scope="session")
def fsdp_checkpoint_work(tmp_path_factory) -> list:
    """test_fsdp_checkpoint's HF_DIR and WORK_DIR (a tiny 2-layer Llama): its world-2 part (2-rank launch)
    saves into WORK_DIR, its world-1 part (1-rank launch) loads from it."""
    from megarl.models.tiny import build_tiny_hf

    root = tmp_path_factory.mktemp("fsdp_ckpt")
    hf = build_tiny_hf(root / "llama", family="llama", num_hidden_layers=2, initializer_range=0.1)
    return [hf, root]
