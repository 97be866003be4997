"""One 4-rank launch shared by the modules whose checks are 4-rank rank programs (shared_launch.py).

A module takes part by defining SHARED_PART = (name, "module[:function]", argv_of), argv_of(request) giving
its program's argv (it may ask for fixtures: request.getfixturevalue); its tests read
`shared_result(shared_launch, name)`. Only the modules with selected tests run their part, in ORDER.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

# spmd first: it checks worker groups on ranks that hold no megatron state yet; every later part sets up
# its own megatron layout (ParallelLayout.initialize replaces the one before) and closes its vLLM engines
ORDER = ("spmd", "reshard", "policy", "parity", "checkpoint", "vllm_tp", "hybrid")


@pytest.fixture(scope="session")
def shared_launch(request, torchrun) -> dict:
    """{part name: {"result": …} or {"error": …, "traceback": …}} of one launch of every selected part."""
    modules = {item.module for item in request.session.items if item.module is not None}
    parts = [part for module in modules if (part := getattr(module, "SHARED_PART", None))]
    unknown = [name for name, _, _ in parts if name not in ORDER]
    assert not unknown, f"tests/multiproc/conftest.py: add {unknown} to ORDER"
    parts.sort(key=lambda part: ORDER.index(part[0]))
    spec = [[name, target, [str(a) for a in argv_of(request)]] for name, target, argv_of in parts]
    return torchrun("tests.multiproc.shared_launch", [json.dumps(spec)], nproc=4, timeout=1500).results[0]


def shared_result(shared_launch: dict, name: str):
    """What part `name` returned on rank 0 of the shared launch (the test fails with its error)."""
    if name not in shared_launch:
        pytest.fail(f"part {name} did not run in the shared launch (is its module's SHARED_PART set?)")
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
    """test_checkpoint's argv (HF OTHER_HF DIR): its save side runs in the shared launch, its load side
    in a 2-rank launch of its own reading the same DIR, so both must see one spec."""
    from megarl.models.tiny import build_tiny_hf

    other = build_tiny_hf(tmp_path_factory.mktemp("other") / "llama", hidden_size=64, num_hidden_layers=2)
    return [tiny_models["llama"], other, tmp_path_factory.mktemp("ckpt")]
