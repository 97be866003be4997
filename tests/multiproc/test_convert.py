"""`megarl convert`: HF -> megatron dist-checkpoint at a TP/PP layout -> HF is bit-exact."""

import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

pytestmark = pytest.mark.multiproc


def megarl(*argv):
    return subprocess.run(
        [sys.executable, "-m", "megarl.cli", *map(str, argv)], capture_output=True, text=True
    )


@pytest.mark.parametrize("family, tp, pp", [("qwen2", 2, 2), ("llama", 2, 1)])
def test_hf_to_mcore_to_hf_round_trip_is_bit_exact(tiny_models, tmp_path, family, tp, pp):
    ckpt, back = tmp_path / "mcore", tmp_path / "hf"
    to_mcore = megarl(
        "convert", "hf-to-mcore", "--hf", tiny_models[family], "--out", ckpt, "--tp", tp, "--pp", pp
    )
    assert to_mcore.returncode == 0, to_mcore.stderr[-3000:]
    assert not (tmp_path / "mcore.partial").exists()
    to_hf = megarl("convert", "mcore-to-hf", "--ckpt", ckpt, "--out", back)
    assert to_hf.returncode == 0, to_hf.stderr[-3000:]

    original = load_file(tiny_models[family] / "model.safetensors")
    restored = load_file(back / "model.safetensors")
    assert original.keys() == restored.keys()
    for name, tensor in original.items():
        assert restored[name].dtype == tensor.dtype and torch.equal(restored[name], tensor), name
    assert (back / "tokenizer.json").read_bytes() == (tiny_models[family] / "tokenizer.json").read_bytes()
